// HDF5 tensor dumps (golden/dump.h, docs/golden-format.md): write then read is the identity bit
// for bit (NaN payloads, -0, q8_1 bytes included); the write is atomic (no file, no temporary
// left on error); the reader names the file and object path of every missing or mistyped
// object. Synthetic dumps from tests/dump_test_util.h.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "dump_test_util.h"
#include "golden/dump.h"
#include "golden/dump_hdf5.h"

namespace moecheck {
namespace {

namespace fs = std::filesystem;
using testing::make_dump;
using testing::small_config;

class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moecheck_dump_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void expect_same_bytes(const void* a, const void* b, size_t n, const std::string& what) {
  EXPECT_EQ(std::memcmp(a, b, n), 0) << what << " differs after the round trip";
}

template <class T>
void expect_same(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  if (!a.empty()) expect_same_bytes(a.data(), b.data(), a.size() * sizeof(T), what);
}

void expect_same_expert(const ExpertTaps& a, const ExpertTaps& b, const std::string& w) {
  EXPECT_EQ(a.expert, b.expert) << w;
  expect_same(a.tokens, b.tokens, w + " tokens");
  expect_same(a.weights, b.weights, w + " weights");
  expect_same(a.gate, b.gate, w + " gate");
  expect_same(a.up, b.up, w + " up");
  expect_same(a.h, b.h, w + " h");
  expect_same(a.h_q8, b.h_q8, w + " h_q8");
  expect_same(a.down, b.down, w + " down");
}

void expect_same_dump(const Dump& a, const Dump& b) {
  const DumpMeta &x = a.meta, &y = b.meta;
  EXPECT_EQ(x.format_version, y.format_version);
  EXPECT_EQ(x.tool_version, y.tool_version);
  EXPECT_EQ(x.git_commit, y.git_commit);
  EXPECT_EQ(x.implementation, y.implementation);
  EXPECT_EQ(x.variant, y.variant);
  // Knobs come back in attribute-name order (docs/golden-format.md): compare as sets.
  auto kx = x.knobs, ky = y.knobs;
  std::sort(kx.begin(), kx.end());
  std::sort(ky.begin(), ky.end());
  EXPECT_EQ(kx, ky);
  EXPECT_EQ(x.device, y.device);
  EXPECT_EQ(x.model_file, y.model_file);
  EXPECT_EQ(x.model_sha256, y.model_sha256);
  EXPECT_EQ(x.model_header_sha256, y.model_header_sha256);
  EXPECT_TRUE(x.config == y.config);
  EXPECT_EQ(x.has_model_seed, y.has_model_seed);
  EXPECT_EQ(x.model_seed, y.model_seed);
  EXPECT_EQ(x.input_source, y.input_source);
  EXPECT_EQ(x.input_seed, y.input_seed);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.layers, y.layers);
  EXPECT_EQ(x.taps, y.taps);
  EXPECT_EQ(x.routing_weight_at, y.routing_weight_at);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerTaps &s = a.layers[i], &t = b.layers[i];
    const std::string w = "layer " + std::to_string(s.layer);
    EXPECT_EQ(s.layer, t.layer);
    expect_same(s.input, t.input, w + " input");
    expect_same(s.image_mask, t.image_mask, w + " image_mask");
    expect_same(s.output, t.output, w + " output");
    expect_same(s.router_logits, t.router_logits, w + " router_logits");
    expect_same(s.topk_ids, t.topk_ids, w + " topk_ids");
    expect_same(s.topk_weights, t.topk_weights, w + " topk_weights");
    expect_same(s.x_q8, t.x_q8, w + " x_q8");
    expect_same(s.acc, t.acc, w + " acc");
    ASSERT_EQ(s.experts.size(), t.experts.size()) << w;
    for (size_t e = 0; e < s.experts.size(); ++e)
      expect_same_expert(s.experts[e], t.experts[e], w + " expert");
    expect_same_expert(s.shared, t.shared, w + " shared");
  }
  ASSERT_EQ(a.slices.size(), b.slices.size());
  for (size_t i = 0; i < a.slices.size(); ++i) {
    ASSERT_EQ(a.slices[i].size(), b.slices[i].size()) << "layer " << i << " provenance";
    for (size_t k = 0; k < a.slices[i].size(); ++k) {
      EXPECT_TRUE(a.slices[i][k].same_slice(b.slices[i][k])) << "layer " << i << " slice " << k;
      EXPECT_EQ(a.slices[i][k].sha256, b.slices[i][k].sha256) << "layer " << i << " slice " << k;
    }
  }
}

TEST_F(DumpTest, RoundTripIsIdentity_T3_E8_K2_dim256_taps) {
  Dump d = make_dump(small_config(), 3, {0, 2, 5}, 11, true);
  // Special values must survive bit for bit: NaN payloads, -0, Inf, subnormals.
  d.layers[0].output[0] = 0x7FC1;                        // bf16 NaN with payload
  d.layers[0].output[1] = 0x8000;                        // -0
  d.layers[0].router_logits[3] = bits_f32(0x7FA00001u);  // signalling-pattern NaN payload
  d.layers[0].acc[5] = bits_f32(0x00000001u);            // smallest subnormal
  d.layers[1].experts[0].down[7] = -std::numeric_limits<float>::infinity();
  d.meta.knobs.emplace_back("shared_side_stream", "on");
  // Provenance: per layer the tensors and expert slices read, with their digests.
  d.meta.model_header_sha256 = std::string(64, '7');
  d.slices.resize(d.layers.size());
  d.slices[0] = {{LayerTensor::kRouter, -1, std::string(64, 'a')},
                 {LayerTensor::kDownExps, 7, std::string(64, 'b')}};
  d.slices[2] = {
      {LayerTensor::kBias, -1, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}};
  write_dump(path("a.h5"), d);
  const Dump r = read_dump(path("a.h5"));
  expect_same_dump(d, r);
  EXPECT_EQ(r.path, path("a.h5"));
}

TEST_F(DumpTest, WithoutTapsOnlyBasicStagesAreStored_T2_E8_K2) {
  Dump d = make_dump(small_config(), 2, {1}, 3, false);
  write_dump(path("b.h5"), d);
  const Dump r = read_dump(path("b.h5"));
  expect_same_dump(d, r);
  EXPECT_TRUE(r.layers[0].experts.empty());
  EXPECT_TRUE(r.layers[0].acc.empty());
}

TEST_F(DumpTest, WriteIntoMissingDirectoryLeavesNothing) {
  const Dump d = make_dump(small_config(), 1, {0}, 1, false);
  const std::string p = path("no/such/dir/x.h5");
  EXPECT_ANY_THROW(write_dump(p, d));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir_)) << "a temporary file was left behind";
}

TEST_F(DumpTest, WrongStageSizeIsInputErrorAndNoFile) {
  Dump d = make_dump(small_config(), 2, {0}, 1, true);
  d.layers[0].experts[0].down.pop_back();
  try {
    write_dump(path("c.h5"), d);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/layers/0/experts/0/down"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(path("c.h5")));
  EXPECT_TRUE(fs::is_empty(dir_)) << "a temporary file was left behind";
}

// Zeroes a dump's user block: the file as an older moecheck (no integrity stamp) wrote it.
void unstamp(const std::string& file) {
  std::FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << file;
  const std::vector<char> zeros(h5::kUserBlock, 0);
  ASSERT_EQ(std::fwrite(zeros.data(), 1, zeros.size(), f), zeros.size());
  std::fclose(f);
}

// Expects read_dump to throw an InputError naming the file and `needle`.
void expect_read_error(const std::string& file, const std::string& needle) {
  try {
    read_dump(file);
    FAIL() << "expected InputError mentioning " << needle;
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// After an edit with the HDF5 API a dump's integrity stamp no longer matches: the reader reads it
// through the probe process and names `needle`; with the stamp removed (an unstamped dump, as
// older moecheck versions wrote) the same.
void expect_edited_read_error(const std::string& file, const std::string& needle) {
  EXPECT_EQ(h5::verify_stamp(file), h5::Stamp::kMismatch) << file;
  expect_read_error(file, needle);
  unstamp(file);
  EXPECT_EQ(h5::verify_stamp(file), h5::Stamp::kNone) << file;
  expect_read_error(file, needle);
}

TEST_F(DumpTest, ReaderNamesMissingDatasetAttributeAndWrongType) {
  const Dump d = make_dump(small_config(), 2, {0, 1}, 5, true);
  const std::string p = path("d.h5");
  write_dump(p, d);
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Ldelete(f, "/layers/1/output", H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "/layers/1/output: missing dataset");

  write_dump(p, d);
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Adelete(f, "config.topk"), 0);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "missing attribute config.topk");

  write_dump(p, d);
  {
    // Replace topk_ids (int32) by a float32 dataset of the same shape.
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Ldelete(f, "/layers/0/topk_ids", H5P_DEFAULT), 0);
    hsize_t dims[2] = {2, 2};
    hid_t sp = H5Screate_simple(2, dims, nullptr);
    hid_t ds = H5Dcreate2(f, "/layers/0/topk_ids", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT);
    const float v[4] = {0, 1, 1, 2};
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "/layers/0/topk_ids: expected element type int32");

  write_dump(p, d);
  {
    // An expert id out of range in topk_ids.
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/layers/0/topk_ids", H5P_DEFAULT);
    const int32_t v[4] = {0, 1, 1, 99};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "token 1: expert id 99 outside [0, 8)");
}

// The image mask (an input of the routing: bias_vl for image-span tokens) round-trips with or
// without taps, only in the layers that have one; a dump with a mask is format 3, one without
// stays format 2 (what a version-2 reader fully understands).
TEST_F(DumpTest, ImageMaskRoundTripsAndSetsFormat3_T5_E8_K2) {
  for (bool taps : {true, false}) {
    Dump d = make_dump(small_config(), 5, {0, 3}, 13, taps);
    write_dump(path("nomask.h5"), d);
    const Dump r0 = read_dump(path("nomask.h5"));
    EXPECT_EQ(r0.meta.format_version, kDumpFormatVersion) << "taps " << taps;
    for (const LayerTaps& t : r0.layers) EXPECT_TRUE(t.image_mask.empty()) << "taps " << taps;
    d.layers[0].image_mask = {0, 1, 1, 0, 1};  // layer 3: none
    write_dump(path("mask.h5"), d);
    const Dump r = read_dump(path("mask.h5"));
    EXPECT_EQ(r.meta.format_version, kDumpFormatVersionImageMask) << "taps " << taps;
    d.meta.format_version = kDumpFormatVersionImageMask;
    expect_same_dump(d, r);
    EXPECT_EQ(r.layers[0].image_mask, (std::vector<uint8_t>{0, 1, 1, 0, 1})) << "taps " << taps;
    EXPECT_TRUE(r.layers[1].image_mask.empty()) << "taps " << taps;
  }
}

// A mask of the wrong length or with a value other than 0 / 1 is refused on write (no file left)
// and on read, naming the layer's image_mask; so is a mask in a file that claims format 2.
TEST_F(DumpTest, BadImageMaskIsRefusedOnWriteAndRead_T3) {
  Dump d = make_dump(small_config(), 3, {2}, 17, false);
  d.layers[0].image_mask = {0, 1};
  EXPECT_THROW(write_dump(path("short.h5"), d), InputError);
  d.layers[0].image_mask = {0, 2, 1};
  try {
    write_dump(path("two.h5"), d);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/layers/2/image_mask: token 1"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "a file was left behind";
  d.layers[0].image_mask = {0, 1, 1};
  const std::string p = path("m.h5");
  write_dump(p, d);
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/layers/2/image_mask", H5P_DEFAULT);
    const uint8_t v[3] = {0, 7, 1};
    H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "/layers/2/image_mask: token 1: expected 0 or 1, found 7");
  write_dump(p, d);
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    const int64_t two = 2;
    H5Awrite(a, H5T_NATIVE_INT64, &two);
    H5Aclose(a);
    H5Fclose(f);
  }
  expect_edited_read_error(p, "/layers/2/image_mask: an image mask needs format_version 3");
}

// The committed golden set is format version 1 (whole-file digest, no per-slice provenance):
// still read, with no slices and the whole file's digest.
// tests/data/dump_v1_small_emu.h5: the golden small emu dump as format 1 wrote it (commit
// cf2cb16's golden/data/small_emu.h5), kept as the fixture for reading old dumps.
TEST_F(DumpTest, Version1DumpsStillRead_small_emu_fixture) {
  const Dump d = read_dump(std::string(MOECHECK_SOURCE_DIR) + "/tests/data/dump_v1_small_emu.h5");
  EXPECT_EQ(d.meta.format_version, 1);
  EXPECT_TRUE(d.slices.empty());
  EXPECT_EQ(d.meta.model_sha256.size(), 64u);
  EXPECT_TRUE(d.meta.model_header_sha256.empty());
  ASSERT_EQ(d.layers.size(), 1u);
  EXPECT_EQ(d.meta.tokens, 2);
  EXPECT_EQ(d.layers[0].input.size(), static_cast<size_t>(2 * d.meta.config.dim));
  EXPECT_FALSE(d.layers[0].experts.empty());
  EXPECT_TRUE(d.layers[0].image_mask.empty()) << "a version 1 dump has no image mask";
}

TEST_F(DumpTest, ReaderRejectsMissingTruncatedAndForeignFiles) {
  expect_read_error(path("missing.h5"), "cannot open");
  const Dump d = make_dump(small_config(), 2, {0}, 5, true);
  const std::string p = path("t.h5");
  write_dump(p, d);
  fs::resize_file(p, fs::file_size(p) / 2);
  expect_read_error(p, "t.h5");
  {
    std::FILE* f = std::fopen(path("text.h5").c_str(), "wb");
    std::fputs("not hdf5 at all", f);
    std::fclose(f);
  }
  expect_read_error(path("text.h5"), "no HDF5 signature");
}

// Round trip over random shapes: tokens, layers, experts and top-k.
RC_GTEST_PROP(DumpProperty, RoundTripAnyShape, ()) {
  const int64_t n_routed = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t topk = *rc::gen::inRange<int64_t>(1, n_routed + 1);
  const int64_t T = *rc::gen::inRange<int64_t>(1, 5);
  const bool taps = *rc::gen::arbitrary<bool>();
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  const Dump d = make_dump(small_config(n_routed, topk), T, {0, 3}, seed, taps);
  const std::string p =
      (fs::temp_directory_path() / ("moecheck_dump_prop_" + std::to_string(::getpid()) + ".h5"))
          .string();
  write_dump(p, d);
  const Dump r = read_dump(p);
  fs::remove(p);
  RC_ASSERT(r.layers.size() == d.layers.size());
  for (size_t i = 0; i < d.layers.size(); ++i) {
    RC_ASSERT(r.layers[i].output == d.layers[i].output);
    RC_ASSERT(r.layers[i].topk_ids == d.layers[i].topk_ids);
    RC_ASSERT(r.layers[i].experts.size() == d.layers[i].experts.size());
    for (size_t e = 0; e < d.layers[i].experts.size(); ++e) {
      RC_ASSERT(r.layers[i].experts[e].tokens == d.layers[i].experts[e].tokens);
      RC_ASSERT(std::memcmp(r.layers[i].experts[e].down.data(), d.layers[i].experts[e].down.data(),
                            d.layers[i].experts[e].down.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace
}  // namespace moecheck
