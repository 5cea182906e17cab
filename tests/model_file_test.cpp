// Model files (golden/model_file.h, docs/gguf.md "Metadata keys", "Tensors"): a generated model
// written to disk reads back as the same config and the same bytes as the in-memory layer; a
// missing key, a key of the wrong type, a config that cannot work, a missing tensor, a wrong
// type or shape, misaligned data each give an InputError naming the file and the key or tensor.
// Also SHA-256 on the FIPS 180-4 test vectors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>

#include "core/error.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/sha256.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

std::string temp_path(const std::string& tag) {
  static int n = 0;
  return std::string(MOECHECK_BINARY_DIR) + "/model_file_test-" + std::to_string(::getpid()) + "-" +
         tag + "-" + std::to_string(n++) + ".gguf";
}

using testutil::expect_error;

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the buffering.
  Sha256 h;
  const std::string a(1000, 'a');
  for (size_t done = 0, step = 1; done < 1000000; done += step, step = step % 997 + 1)
    h.update(a.data(), std::min(step, 1000000 - done));
  EXPECT_EQ(to_hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, FileMatchesBytes) {
  const std::string path = temp_path("sha");
  std::string content(5 << 20, 'x');  // spans two read chunks
  for (size_t i = 0; i < content.size(); i += 4099) content[i] = static_cast<char>(i);
  { std::ofstream(path, std::ios::binary) << content; }
  EXPECT_EQ(sha256_file(path), sha256_hex(content.data(), content.size()));
  std::remove(path.c_str());
  expect_error([&] { sha256_file(path); }, {path + ": cannot open"}, "missing");
}

void expect_same_bytes(const uint8_t* a, const uint8_t* b, int64_t n, const std::string& what) {
  EXPECT_TRUE(std::equal(a, a + n, b)) << what;
}

// A file written by write_model is the generator's in-memory layer, byte for byte.
void check_round_trip(const GenOptions& o, const std::string& name) {
  const std::string path = temp_path(name);
  write_model(o, path);
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());  // the mapping stays valid
  EXPECT_EQ(m.config(), o.config) << name;
  EXPECT_EQ(m.n_layers(), o.n_layers) << name;
  ASSERT_TRUE(m.provenance().has_value()) << name;
  EXPECT_EQ(m.provenance()->seed, o.seed);
  EXPECT_EQ(m.provenance()->preset, o.preset);
  EXPECT_EQ(m.provenance()->version, kGeneratorVersion);
  EXPECT_EQ(m.provenance()->fast_blocks, o.blocks == ExpertBlocks::kRandomValid);
  EXPECT_EQ(m.gguf().alignment(), o.alignment);
  const GenOptions back = options_from_model(m);
  EXPECT_EQ(back.config, o.config);
  EXPECT_EQ(back.seed, o.seed);
  EXPECT_EQ(back.shared, o.shared);
  EXPECT_EQ(back.blocks, o.blocks);
  EXPECT_EQ(back.vision, o.vision);
  const MoeConfig& c = o.config;
  for (int L = 0; L < o.n_layers; ++L) {
    const LayerWeights f = m.layer(L);
    const LayerWeights g = generate_layer(o, L);
    const std::string ctx = name + " layer " + std::to_string(L);
    EXPECT_EQ(f.layer, L);
    expect_same_bytes(reinterpret_cast<const uint8_t*>(f.router),
                      reinterpret_cast<const uint8_t*>(g.router), c.n_routed * c.dim * 2,
                      ctx + " router");
    expect_same_bytes(reinterpret_cast<const uint8_t*>(f.bias),
                      reinterpret_cast<const uint8_t*>(g.bias), c.n_routed * 4, ctx + " bias");
    ASSERT_EQ(f.bias_vl != nullptr, o.vision) << ctx << " bias_vl present";
    ASSERT_EQ(g.bias_vl != nullptr, o.vision) << ctx << " generated bias_vl present";
    if (o.vision)
      expect_same_bytes(reinterpret_cast<const uint8_t*>(f.bias_vl),
                        reinterpret_cast<const uint8_t*>(g.bias_vl), c.n_routed * 4,
                        ctx + " bias_vl");
    for (auto [fs, gs, tag] :
         {std::tuple{f.gate_exps, g.gate_exps, "gate"}, std::tuple{f.up_exps, g.up_exps, "up"},
          std::tuple{f.down_exps, g.down_exps, "down"}}) {
      EXPECT_EQ(fs.type, gs.type);
      EXPECT_EQ(fs.rows, gs.rows);
      EXPECT_EQ(fs.cols, gs.cols);
      EXPECT_EQ(fs.n_experts, c.n_routed);
      expect_same_bytes(fs.data, gs.data, c.n_routed * fs.expert_stride(),
                        ctx + " " + tag + "_exps");
    }
    for (auto [fs, gs, tag] : {std::tuple{f.shared_gate, g.shared_gate, "gate"},
                               std::tuple{f.shared_up, g.shared_up, "up"},
                               std::tuple{f.shared_down, g.shared_down, "down"}}) {
      EXPECT_EQ(fs.type, gs.type) << ctx << " shared " << tag;
      EXPECT_EQ(fs.rows, gs.rows);
      EXPECT_EQ(fs.cols, gs.cols);
      expect_same_bytes(fs.data, gs.data, fs.rows * fs.row_stride(), ctx + " shared " + tag);
    }
  }
  expect_error([&] { m.layer(o.n_layers); },
               {"layer " + std::to_string(o.n_layers) + " out of range"}, name);
}

TEST(ModelFile, RoundTrip_tiny_quantized_bf16shared_seed3) {
  GenOptions o = preset_options("tiny");
  o.seed = 3;
  check_round_trip(o, "tiny_q_seed3");
}

TEST(ModelFile, RoundTrip_tiny_randomvalid_kquantshared_3layers_align64_seed4) {
  GenOptions o = preset_options("tiny");
  o.seed = 4;
  o.n_layers = 3;
  o.blocks = ExpertBlocks::kRandomValid;
  o.shared = SharedExpertType::kKQuant;
  o.alignment = 64;
  o.config.score_func = ScoreFunc::kSigmoid;  // also writes deepseek2.expert_gating_func = 2
  o.config.norm_topk_prob = false;
  o.config.gate_temp = 0.5f;
  check_round_trip(o, "tiny_rv_kq_seed4");
}

// `gen --vision`: each layer's bias_vl (blk.N.exp_probs_b_vl.bias) is written and read back.
TEST(ModelFile, RoundTrip_tiny_vision_bias_vl_seed5) {
  GenOptions o = preset_options("tiny");
  o.seed = 5;
  o.vision = true;
  check_round_trip(o, "tiny_vision_seed5");
}

// ---- error cases: a small valid model (dim 256, inter 256, 4 experts, top 2) with one change ----

struct Variant {
  std::map<std::string, std::optional<gguf::Value>> meta;  // replaced value, or nullopt = dropped
  std::map<std::string, std::pair<uint32_t, std::vector<int64_t>>> tensors;  // replaced type and ne
  std::vector<std::string> dropped_tensors;
  uint32_t alignment = 32;
  int64_t leading_pad = 0;  // an I8 tensor of this many bytes placed before everything
};

Variant with_meta(const std::string& key, std::optional<gguf::Value> value) {
  Variant v;
  v.meta[key] = std::move(value);
  return v;
}
Variant with_tensor(const std::string& name, uint32_t type, std::vector<int64_t> ne) {
  Variant v;
  v.tensors[name] = {type, std::move(ne)};
  return v;
}
Variant without_tensor(const std::string& name) {
  Variant v;
  v.dropped_tensors.push_back(name);
  return v;
}

MoeConfig small_config() {
  MoeConfig c = ds41_config();
  c.dim = 256, c.inter = 256, c.n_routed = 4, c.topk = 2;
  return c;
}

std::string write_variant(const Variant& v, const std::string& tag) {
  // The standard keys come from add_config_metadata, read back, then edited.
  gguf::Writer base;
  add_config_metadata(base, small_config(), 1);
  const std::string base_path = temp_path(tag + "-base");
  base.write(base_path);
  const gguf::Reader meta = gguf::Reader::open(base_path);
  std::remove(base_path.c_str());
  gguf::Writer w;
  w.set_alignment(v.alignment);
  for (const gguf::KeyValue& kv : meta.kvs()) {
    const auto it = v.meta.find(kv.key);
    if (it == v.meta.end()) w.set(kv.key, kv.value);
    else if (it->second) w.set(kv.key, *it->second);
  }
  for (const auto& [key, value] : v.meta)
    if (!meta.find(key) && value) w.set(key, *value);
  auto zero = [](uint64_t, uint8_t* out, uint64_t n) { std::fill(out, out + n, 0); };
  if (v.leading_pad > 0) w.add_tensor({"pad", 24, {v.leading_pad}, 0, zero});
  std::vector<LayerTensor> all(kLayerTensors.begin(), kLayerTensors.end());
  all.insert(all.end(), kOptionalLayerTensors.begin(), kOptionalLayerTensors.end());
  for (const LayerTensor t : all) {
    const std::string name = tensor_name(0, t);
    const bool optional = std::find(kLayerTensors.begin(), kLayerTensors.end(), t) ==
                          kLayerTensors.end();  // written only when the variant names it
    if (std::find(v.dropped_tensors.begin(), v.dropped_tensors.end(), name) !=
            v.dropped_tensors.end() ||
        (optional && v.tensors.count(name) == 0))
      continue;
    const TensorShape s = expected_tensor(small_config(), t, SharedExpertType::kBF16);
    gguf::TensorSpec spec{name, static_cast<uint32_t>(s.type), s.ne, 0, zero};
    if (const auto it = v.tensors.find(name); it != v.tensors.end())
      spec.type = it->second.first, spec.ne = it->second.second;
    w.add_tensor(spec);
  }
  const std::string path = temp_path(tag);
  w.write(path);
  return path;
}

void expect_open_error(const Variant& v, const std::string& tag,
                       std::initializer_list<std::string> parts) {
  const std::string path = write_variant(v, tag);
  expect_error([&] { ModelFile::open(path); }, parts, tag);
  std::remove(path.c_str());
}

void expect_layer_error(const Variant& v, const std::string& tag,
                        std::initializer_list<std::string> parts) {
  const std::string path = write_variant(v, tag);
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  expect_error([&] { m.layer(0); }, parts, tag);
}

TEST(ModelFile, BaselineVariantOpens_dim256_E4_K2) {
  const std::string path = write_variant({}, "baseline");
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  EXPECT_EQ(m.config(), small_config());
  EXPECT_FALSE(m.provenance().has_value());
  const LayerWeights w = m.layer(0);
  EXPECT_EQ(w.shared_gate.type, GgmlType::kBF16);
  expect_error([&] { options_from_model(m); }, {"no moecheck.generator.* keys"}, "provenance");
}

TEST(ModelFile, MetadataErrorsNameFileAndKey) {
  using namespace gguf;
  expect_open_error(with_meta(keys::kNRouted, std::nullopt), "missing_key",
                    {"metadata key \"deepseek2.expert_count\" (uint32) is missing"});
  expect_open_error(
      with_meta(keys::kNRouted, make_int32(4)), "int32_count",
      {"metadata key \"deepseek2.expert_count\" at offset", "expected uint32, found int32 4"});
  expect_open_error(with_meta(keys::kNormTopk, make_uint8(1)), "uint8_bool",
                    {"\"deepseek2.expert_weights_norm\"", "expected bool, found uint8 1"});
  expect_open_error(with_meta(keys::kRouteScale, make_float64(1.5)), "f64_scale",
                    {"\"deepseek2.expert_weights_scale\"", "expected float32, found float64"});
  expect_open_error(with_meta(keys::kScoreFunc, make_string("relu")), "score_func",
                    {"\"moecheck.score_func\"", "found \"relu\""});
  expect_open_error(with_meta(keys::kSwigluLimit, std::nullopt), "no_swiglu",
                    {"\"moecheck.swiglu_limit\" (float32) is missing"});
  expect_open_error(with_meta(keys::kArchitecture, make_string("llama")), "arch",
                    {"metadata key \"general.architecture\"", "\"deepseek4\"", "found \"llama\""});
  expect_open_error(with_meta(keys::kBlockCount, make_uint32(0)), "no_layers",
                    {"at least 1 layer, found 0"});
  expect_open_error(with_meta(keys::kGatingFunc, make_uint32(2)), "gating",
                    {"\"deepseek2.expert_gating_func\" = 2", "disagrees", "\"sqrtsoftplus\""});
  // Configs that cannot work: MoeConfig::validate names the field.
  expect_open_error(with_meta(keys::kTopk, make_uint32(5)), "topk", {"config field topk"});
  expect_open_error(with_meta(keys::kDim, make_uint32(300)), "dim300", {"config field dim"});
  expect_open_error(with_meta(keys::kNShared, make_uint32(2)), "shared2",
                    {"config field n_shared"});
  expect_open_error(with_meta(keys::kGateTemp, make_float32(0.0f)), "temp0",
                    {"config field gate_temp"});
  expect_open_error(with_meta(keys::kGenSeed, make_uint64(1)), "half_provenance",
                    {"\"moecheck.generator.preset\" (string) is missing"});
}

TEST(ModelFile, TensorErrorsNameFileAndTensor) {
  expect_layer_error(without_tensor("blk.0.ffn_up_exps.weight"), "missing_tensor",
                     {"layer 0: tensor \"blk.0.ffn_up_exps.weight\" is missing"});
  expect_layer_error(with_tensor("blk.0.ffn_gate_exps.weight", 11, {256, 256, 4}), "wrong_type",
                     {"layer 0: tensor \"blk.0.ffn_gate_exps.weight\": type Q3_K, expected Q2_K",
                      "routed experts of other types are not supported"});
  expect_layer_error(with_tensor("blk.0.ffn_down_exps.weight", 11, {256, 256, 3}), "wrong_shape",
                     {"tensor \"blk.0.ffn_down_exps.weight\": ne [256, 256, 3] (ggml order), "
                      "expected [256, 256, 4]"});
  expect_layer_error(
      with_tensor("blk.0.ffn_gate_inp.weight", 0, {256, 4}), "router_f32",
      {"layer 0: tensor \"blk.0.ffn_gate_inp.weight\": type F32, expected BF16 or F16"});
  expect_layer_error(with_tensor("blk.0.exp_probs_b.bias", 0, {4, 1}), "bias_2d",
                     {"\"blk.0.exp_probs_b.bias\": ne [4, 1] (ggml order), expected [4]"});
  expect_layer_error(with_tensor("blk.0.ffn_gate_shexp.weight", 12, {256, 256}), "shexp_q4k",
                     {"\"blk.0.ffn_gate_shexp.weight\": type Q4_K, expected BF16 or Q2_K"});
  expect_layer_error(with_tensor("blk.0.ffn_down_shexp.weight", 10, {256, 256}), "shexp_down_q2k",
                     {"\"blk.0.ffn_down_shexp.weight\": type Q2_K, expected BF16 or Q3_K"});
  expect_layer_error(with_tensor("blk.0.ffn_up_shexp.weight", 30, {256, 512}), "shexp_shape",
                     {"\"blk.0.ffn_up_shexp.weight\": ne [256, 512]"});
}

// bias_vl (model.py Gate.bias_vl) is optional: absent it is nullptr; present it is validated as
// exp_probs_b.bias is (F32, ne [n_routed]), the error naming the file and the tensor.
TEST(ModelFile, OptionalBiasVlIsReadAndValidated_E4) {
  const std::string name = "blk.0.exp_probs_b_vl.bias";
  {
    const std::string path = write_variant({}, "no_bias_vl");
    const ModelFile m = ModelFile::open(path);
    std::remove(path.c_str());
    EXPECT_FALSE(m.has_tensor(0, LayerTensor::kBiasVl));
    EXPECT_EQ(m.layer(0).bias_vl, nullptr);
  }
  {
    const std::string path = write_variant(with_tensor(name, 0, {4}), "bias_vl");
    const ModelFile m = ModelFile::open(path);
    std::remove(path.c_str());
    const LayerWeights w = m.layer(0);
    ASSERT_NE(w.bias_vl, nullptr);
    EXPECT_NE(w.bias_vl, w.bias);
    EXPECT_EQ(reinterpret_cast<const uint8_t*>(w.bias_vl),
              m.gguf().data(*m.gguf().find_tensor(name)));
    for (int e = 0; e < 4; ++e) EXPECT_EQ(w.bias_vl[e], 0.0f) << "expert " << e;
  }
  const std::string path = write_variant(with_tensor(name, 1, {4}), "bias_vl_f16");
  expect_error(
      [&] {
        const ModelFile m = ModelFile::open(path);
        m.layer(0);
      },
      {path, "tensor \"blk.0.exp_probs_b_vl.bias\": type F16, expected F32"}, "bias_vl_f16");
  std::remove(path.c_str());
  expect_layer_error(with_tensor(name, 0, {5}), "bias_vl_5",
                     {"\"blk.0.exp_probs_b_vl.bias\": ne [5] (ggml order), expected [4]"});
  expect_layer_error(with_tensor(name, 0, {4, 1}), "bias_vl_2d",
                     {"\"blk.0.exp_probs_b_vl.bias\": ne [4, 1] (ggml order), expected [4]"});
}

TEST(ModelFile, KQuantSharedExpertAccepted) {
  Variant v = with_tensor("blk.0.ffn_gate_shexp.weight", 10, {256, 256});
  v.tensors["blk.0.ffn_up_shexp.weight"] = {10, {256, 256}};
  v.tensors["blk.0.ffn_down_shexp.weight"] = {11, {256, 256}};
  const std::string path = write_variant(v, "kquant_shared");
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  const LayerWeights w = m.layer(0);
  EXPECT_EQ(w.shared_gate.type, GgmlType::kQ2K);
  EXPECT_EQ(w.shared_up.type, GgmlType::kQ2K);
  EXPECT_EQ(w.shared_down.type, GgmlType::kQ3K);
  EXPECT_EQ(w.shared_down.rows, 256);
}

// With general.alignment 1 a tensor can start at an odd address, which a bf16 view cannot use.
TEST(ModelFile, MisalignedViewIsAnError_alignment1) {
  Variant v;
  v.alignment = 1;
  // The pad tensor's size makes the router (right after it) start at an odd file offset.
  v.leading_pad = 1;
  const std::string path0 = write_variant(v, "align1_probe");
  const uint64_t router_at = gguf::Reader::open(path0).data_offset() + 1;
  std::remove(path0.c_str());
  if (router_at % 2 == 0) v.leading_pad = 2;
  expect_layer_error(
      v, "align1", {"\"blk.0.ffn_gate_inp.weight\": data at file offset", "is not 2-byte aligned"});
}

}  // namespace
}  // namespace moecheck
