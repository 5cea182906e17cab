// Synthetic models with no file (golden/synthetic_model.h, docs/streaming.md "Synthetic models"):
// ModelFile::open("synthetic:...") holds, byte for byte, the file write_model writes for the same
// options (header, every tensor, the padding; the whole-file SHA-256), whatever the fill thread
// count; a layer's pages are made on first use and given back when its last LayerWeights ends
// (mincore says which pages are resident), and refilled the same; resident_layer makes no expert;
// opening ds41 at 40 layers makes nothing; bad specs are refused naming the key; the slice hasher
// hashes an expert without filling its layer and takes digests handed in.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/provenance.h"
#include "golden/synthetic_model.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

using testutil::expect_error;

struct TempModel {
  explicit TempModel(const std::string& tag) {
    static int n = 0;
    path = std::string(MOECHECK_BINARY_DIR) + "/synthetic_model_test-" +
           std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++) + ".gguf";
  }
  ~TempModel() { std::remove(path.c_str()); }
  std::string path;
};

// Pages of [p, p + n) resident in memory now (mincore).
int64_t resident_pages(const void* p, uint64_t n) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  std::vector<unsigned char> vec((hi - lo) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(lo), hi - lo, vec.data()), 0);
  int64_t count = 0;
  for (unsigned char v : vec) count += v & 1;
  return count;
}

const gguf::TensorInfo& info(const ModelFile& m, int L, LayerTensor t) {
  return *m.gguf().find_tensor(tensor_name(L, t));
}

// Resident pages wholly inside layer L's three stacks (a page a stack shares with a neighbouring
// tensor is that tensor's too, and left out).
int64_t stack_pages(const ModelFile& m, int L) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  int64_t n = 0;
  for (LayerTensor t : {LayerTensor::kGateExps, LayerTensor::kUpExps, LayerTensor::kDownExps}) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(m.gguf().data(info(m, L, t)));
    const uintptr_t lo = (at + page - 1) / page * page;
    const uintptr_t hi = (at + info(m, L, t).nbytes) / page * page;
    if (hi > lo) n += resident_pages(reinterpret_cast<const void*>(lo), hi - lo);
  }
  return n;
}

// The spec's model holds the file write_model writes from parse_synthetic_spec(spec): the same
// size, header, tensor infos and every byte once all layers are held; the same SHA-256; the
// options read back.
void expect_same_as_written(const std::string& spec, int fill_threads) {
  const GenOptions o = parse_synthetic_spec(spec);
  TempModel t("file");
  const std::string file_sha = write_model(o, t.path);
  const ModelFile f = ModelFile::open(t.path);
  const ModelFile s = open_synthetic(spec, gguf::MapMode::kReadOnly, fill_threads);
  EXPECT_EQ(s.path(), spec);
  ASSERT_EQ(s.gguf().file_size(), f.gguf().file_size()) << spec;
  ASSERT_EQ(s.gguf().data_offset(), f.gguf().data_offset()) << spec;
  EXPECT_EQ(std::memcmp(s.gguf().header_bytes(), f.gguf().header_bytes(), f.gguf().data_offset()),
            0)
      << spec << ": header bytes";
  ASSERT_EQ(s.gguf().tensors().size(), f.gguf().tensors().size());
  for (size_t i = 0; i < f.gguf().tensors().size(); ++i) {
    EXPECT_EQ(s.gguf().tensors()[i].name, f.gguf().tensors()[i].name);
    EXPECT_EQ(s.gguf().tensors()[i].offset, f.gguf().tensors()[i].offset);
  }
  std::vector<LayerWeights> held;
  for (int L = 0; L < s.n_layers(); ++L) held.push_back(s.layer(L));
  EXPECT_EQ(std::memcmp(s.gguf().bytes(), f.gguf().bytes(), f.gguf().file_size()), 0)
      << spec << ": the image differs from the file";
  for (int L = 0; L < s.n_layers(); ++L)  // and the views point at the same offsets
    EXPECT_EQ(held[L].down_exps.data - s.gguf().bytes(),
              f.layer(L).down_exps.data - f.gguf().bytes());
  EXPECT_EQ(s.sha256(), file_sha) << spec;  // with the layers held: nothing is made again
  held.clear();
  const GenOptions back = options_from_model(s);
  EXPECT_EQ(back.config, o.config);
  EXPECT_EQ(back.n_layers, o.n_layers);
  EXPECT_EQ(back.seed, o.seed);
  EXPECT_EQ(back.shared, o.shared);
  EXPECT_EQ(back.blocks, o.blocks);
  EXPECT_EQ(back.vision, o.vision);
  EXPECT_EQ(back.alignment, o.alignment);
  EXPECT_EQ(back.convention, o.convention);
  EXPECT_EQ(back.router_type, o.router_type);
  EXPECT_EQ(synthetic_spec(back), synthetic_spec(o));
}

TEST(SyntheticModel, EveryByteEqualsTheWrittenFile_Tiny) {
  expect_same_as_written("synthetic:tiny,layers=3", 0);
  expect_same_as_written("synthetic:tiny,layers=2,shared=kquant,vision,seed=11", 0);
  expect_same_as_written("synthetic:tiny,convention=deepseek41,alignment=64,blocks=random", 0);
  expect_same_as_written("synthetic:tiny,layers=2,convention=deepseek4,router=bf16", 0);
}

TEST(SyntheticModel, EveryByteEqualsTheWrittenFile_SmallVision) {
  expect_same_as_written("synthetic:small,layers=2,vision", 0);
}

TEST(SyntheticModel, EveryByteEqualsTheWrittenFile_SmallKQuantRandomBlocks) {
  expect_same_as_written("synthetic:small,layers=3,shared=kquant,blocks=random,seed=5", 0);
}

TEST(SyntheticModel, BytesDoNotDependOnTheFillThreadCount) {
  const std::string spec = "synthetic:small,layers=1,blocks=random";
  expect_same_as_written(spec, 1);
  expect_same_as_written(spec, 7);
}

TEST(SyntheticModel, LayerPagesAreGivenBackWhenTheLastWeightsEndAndRefilledTheSame) {
  const ModelFile m = ModelFile::open("synthetic:tiny,layers=2");
  const detail::SyntheticImage& img = *m.synthetic_image();
  const gguf::TensorInfo& gate = info(m, 1, LayerTensor::kGateExps);
  EXPECT_EQ(stack_pages(m, 1), 0);
  std::vector<uint8_t> first;
  {
    const LayerWeights w = m.layer(1);
    const LayerWeights again = m.layer(1);  // a second holder: no second fill
    EXPECT_EQ(img.stats().stack_fills, 1);
    EXPECT_EQ(img.stats().layers_full, 1);
    EXPECT_EQ(img.stats().layers_resident, 1);
    EXPECT_GE(stack_pages(m, 1), 550);  // every inner page of the 2.3 MB of stacks
    first.assign(w.gate_exps.data, w.gate_exps.data + gate.nbytes);
  }
  EXPECT_EQ(img.stats().layers_full, 0);
  EXPECT_EQ(img.stats().layers_resident, 0);
  EXPECT_EQ(img.stats().releases, 2);
  EXPECT_EQ(stack_pages(m, 1), 0);
  const uint8_t* mid = m.gguf().data(gate) + gate.nbytes / 2;  // a page given back reads zero
  EXPECT_EQ(std::count(mid, mid + 1024, 0), 1024);
  const LayerWeights w = m.layer(1);
  EXPECT_EQ(img.stats().stack_fills, 2);
  EXPECT_EQ(std::memcmp(w.gate_exps.data, first.data(), first.size()), 0) << "refill differs";
}

TEST(SyntheticModel, ResidentLayerHasNullStacksAndMakesNoExpert) {
  const std::string spec = "synthetic:tiny,layers=2,vision";
  const ModelFile s = ModelFile::open(spec);
  TempModel t("file");
  write_model(parse_synthetic_spec(spec), t.path);
  const ModelFile f = ModelFile::open(t.path);
  for (const ModelFile* m : {&s, &f}) {
    const LayerWeights r = m->resident_layer(1);
    const LayerWeights full = f.layer(1);
    for (const ExpertStackView* st : {&r.gate_exps, &r.up_exps, &r.down_exps})
      EXPECT_EQ(st->data, nullptr) << m->path();
    EXPECT_TRUE(expert_layout(r).same_shape(expert_layout(full)));
    EXPECT_EQ(r.down_exps.n_experts, 16);
    const MoeConfig& c = r.config;
    EXPECT_EQ(std::memcmp(r.router, full.router, static_cast<size_t>(c.n_routed * c.dim * 2)), 0);
    EXPECT_EQ(std::memcmp(r.bias, full.bias, static_cast<size_t>(c.n_routed * 4)), 0);
    EXPECT_EQ(std::memcmp(r.bias_vl, full.bias_vl, static_cast<size_t>(c.n_routed * 4)), 0);
    EXPECT_EQ(std::memcmp(r.shared_down.data, full.shared_down.data,
                          static_cast<size_t>(c.dim * c.inter * 2)),
              0);
  }
  const LayerWeights r = s.resident_layer(0);
  EXPECT_EQ(s.synthetic_image()->stats().stack_fills, 0);
  EXPECT_EQ(stack_pages(s, 0), 0);
  EXPECT_EQ(stack_pages(s, 1), 0);
  expect_error([&] { s.resident_layer(2); }, {spec, "layer 2 out of range"}, "layer 2");
}

TEST(SyntheticModel, Ds41FortyLayersOpensWithoutMakingAnything) {
  const ModelFile m = ModelFile::open("synthetic:ds41,layers=40");
  EXPECT_EQ(m.n_layers(), 40);
  EXPECT_EQ(m.config(), ds41_config());
  EXPECT_EQ(m.gguf().tensors().size(), 320u);
  EXPECT_EQ(m.gguf().file_size(), 199753812064u);  // 197 GB of address space
  const SyntheticStats st = m.synthetic_image()->stats();
  EXPECT_EQ(st.chunks, 0);
  EXPECT_EQ(st.resident_fills + st.stack_fills, 0);
  // No page of the data section is resident but the one it may share with the header.
  const uint64_t data = m.gguf().data_offset();
  EXPECT_LE(resident_pages(m.gguf().bytes() + data, m.gguf().file_size() - data), 1);
  // Layer 39's router, bias and shared expert (74 MB) are made; none of its 4.9 GB of experts.
  const LayerWeights r = m.resident_layer(39);
  EXPECT_EQ(m.synthetic_image()->stats().stack_fills, 0);
  EXPECT_EQ(stack_pages(m, 39), 0);
  const gguf::TensorInfo& sh = info(m, 39, LayerTensor::kGateShexp);
  const int64_t sh_pages = static_cast<int64_t>(sh.nbytes / ::sysconf(_SC_PAGESIZE));
  EXPECT_GE(resident_pages(m.gguf().data(sh), sh.nbytes), sh_pages - 1);  // made: every page
  EXPECT_LE(resident_pages(m.gguf().bytes() + data, m.gguf().file_size() - data),
            (int64_t{80} << 20) / ::sysconf(_SC_PAGESIZE));
}

TEST(SyntheticModel, AWalkOverTheLayersHoldsOneLayerAtATime) {
  const ModelFile m = ModelFile::open("synthetic:small,layers=3,blocks=random");
  const uint64_t data = m.gguf().data_offset(), size = m.gguf().file_size();
  const int64_t layer_pages = static_cast<int64_t>((size - data) / 3 / ::sysconf(_SC_PAGESIZE));
  for (int L = 0; L < 3; ++L) {
    const LayerWeights w = m.layer(L);
    EXPECT_EQ(m.synthetic_image()->stats().layers_full, 1) << "layer " << L;
    const int64_t pages = resident_pages(m.gguf().bytes() + data, size - data);
    EXPECT_GE(pages, layer_pages - 2);
    // Beside the layer held, at most the pages earlier layers' pieces share with a neighbour.
    EXPECT_LE(pages, layer_pages + 40) << "layer " << L << ": more than one layer resident";
  }
  EXPECT_EQ(m.synthetic_image()->stats().layers_full, 0);
  EXPECT_LE(resident_pages(m.gguf().bytes() + data, size - data), 40);
}

TEST(SyntheticModel, ManyThreadsTakingAndDroppingLayersSeeTheRightBytes) {
  const std::string spec = "synthetic:tiny,layers=3,blocks=random";
  TempModel t("file");
  write_model(parse_synthetic_spec(spec), t.path);
  const ModelFile f = ModelFile::open(t.path);
  const ModelFile s = open_synthetic(spec, gguf::MapMode::kReadOnly, 2);
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int k = 0; k < 6; ++k)
    pool.emplace_back([&, k] {
      for (int i = 0; i < 40; ++i) {
        const int L = (i + k) % 3;
        const LayerWeights a = s.layer(L), b = f.layer(L);
        const size_t n = static_cast<size_t>(info(f, L, LayerTensor::kDownExps).nbytes);
        if (std::memcmp(a.down_exps.data, b.down_exps.data, n) != 0 ||
            std::memcmp(a.router, b.router, static_cast<size_t>(16 * 512 * 2)) != 0)
          ++wrong;
      }
    });
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s.synthetic_image()->stats().layers_full, 0);
  EXPECT_GE(s.synthetic_image()->stats().stack_fills, 3);
}

TEST(SyntheticModel, BadSpecsAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"synthetic:", "unknown preset \"\""},
      {"synthetic:huge", "unknown preset \"huge\""},
      {"synthetic:tiny,layerz=2", "unknown key \"layerz\""},
      {"synthetic:tiny,layers=0", "key \"layers\": expected a whole number in [1, 1024]"},
      {"synthetic:tiny,layers=1025", "key \"layers\""},
      {"synthetic:tiny,layers=two", "key \"layers\""},
      {"synthetic:tiny,layers", "key \"layers\": needs a value"},
      {"synthetic:tiny,seed=-1", "key \"seed\""},
      {"synthetic:tiny,seed=18446744073709551616", "key \"seed\""},
      {"synthetic:tiny,shared=fp8", "key \"shared\": expected one of bf16, kquant"},
      {"synthetic:tiny,blocks=x", "key \"blocks\": expected one of quantized, random"},
      {"synthetic:tiny,vision=1", "key \"vision\": a flag"},
      {"synthetic:tiny,alignment=48", "key \"alignment\": expected a power of two"},
      {"synthetic:tiny,alignment=4", "key \"alignment\""},
      {"synthetic:tiny,convention=llama", "key \"convention\""},
      {"synthetic:tiny,router=f32", "key \"router\""},
      {"synthetic:tiny,seed=1,seed=2", "key \"seed\": given twice"},
      {"synthetic:tiny,,seed=1", "has no key"},
      {"synthetic:tiny,=3", "has no key"}};
  for (const auto& [spec, part] : cases) {
    expect_error([&, spec = spec] { ModelFile::open(spec); }, {spec + ": ", part}, spec);
    expect_error([&, spec = spec] { parse_synthetic_spec(spec); }, {part}, spec);
  }
}

// The child of the test below: opens ds41 at 40 layers with 8 GiB of address space left beyond
// what the process maps now (a sanitizer's shadow included).
[[noreturn]] void open_ds41_in_8_gib() {
  std::ifstream status("/proc/self/status");
  rlim_t now = 0;
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) now = std::stoull(line.substr(7)) << 10;  // kB
  const rlimit lim{now + (rlim_t{8} << 30), now + (rlim_t{8} << 30)};
  ::setrlimit(RLIMIT_AS, &lim);
  try {
    ModelFile::open("synthetic:ds41,layers=40");
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(2);
  }
  std::_Exit(0);
}

// Address space the process may not have: the image cannot be mapped, an InputError naming the
// spec and the size (in a child, whose address-space limit leaves it 8 GiB more).
TEST(SyntheticModel, AnImageBeyondTheAddressSpaceLimitIsRefusedNamingTheSize) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(open_ds41_in_8_gib(), ::testing::ExitedWithCode(2),
              "synthetic:ds41,layers=40: cannot map the synthetic model's 199753812064 bytes of "
              "address space: Cannot allocate memory");
}

TEST(SyntheticModel, SpecsRoundTripAndOpenModesAreKept) {
  const GenOptions o = parse_synthetic_spec("synthetic:small,vision,seed=9,layers=4,shared=kquant");
  EXPECT_EQ(o.n_layers, 4);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_TRUE(o.vision);
  EXPECT_EQ(o.shared, SharedExpertType::kKQuant);
  EXPECT_EQ(synthetic_spec(o), "synthetic:small,layers=4,seed=9,shared=kquant,vision");
  const GenOptions d = parse_synthetic_spec("synthetic:ds41,convention=deepseek41");
  EXPECT_EQ(d.router_type, GgmlType::kF16);  // gen's default for the convention
  EXPECT_EQ(d.blocks, ExpertBlocks::kRandomValid);
  EXPECT_EQ(parse_synthetic_spec(synthetic_spec(d)).router_type, GgmlType::kF16);
  GenOptions hash = d;
  hash.hash_layers = 1;
  expect_error([&] { synthetic_spec(hash); }, {"hash-routed"}, "hash layers have no key");

  const ModelFile ro = ModelFile::open("synthetic:tiny");
  const LayerWeights w = ro.layer(0);
  EXPECT_THROW(ro.writable(w.bias, 4), std::logic_error);
  const ModelFile cow = ModelFile::open("synthetic:tiny", gguf::MapMode::kCopyOnWrite);
  const LayerWeights c = cow.layer(0);
  cow.writable(c.bias, 4)[0] ^= 1;  // this image only
  EXPECT_NE(std::memcmp(c.bias, w.bias, 4), 0);
}

TEST(SyntheticModel, SliceHasherHashesExpertsWithoutFillingAndTakesRecordedDigests) {
  const std::string spec = "synthetic:tiny,layers=2,vision";
  TempModel t("file");
  write_model(parse_synthetic_spec(spec), t.path);
  SliceHasher fh(ModelFile::open(t.path));
  const ModelFile s = ModelFile::open(spec);
  SliceHasher sh(s);
  EXPECT_EQ(sh.header(), fh.header());
  const std::vector<int32_t> experts = {0, 3, 15};
  for (int L = 0; L < 2; ++L) {
    const std::vector<SliceHash> a = sh.layer_slices(L, experts, true);
    const std::vector<SliceHash> b = fh.layer_slices(L, experts, true);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].same_slice(b[i]));
      EXPECT_EQ(a[i].sha256, b[i].sha256) << slice_name(L, a[i].tensor, a[i].expert);
    }
  }
  EXPECT_EQ(s.synthetic_image()->stats().stack_fills, 0);  // experts made through the source
  {
    const LayerWeights w = s.layer(1);  // held: a fresh hasher reads the image in place
    SliceHasher again(s);
    for (int32_t e : experts)
      EXPECT_EQ(again.slice(1, LayerTensor::kGateExps, e), fh.slice(1, LayerTensor::kGateExps, e));
  }
  EXPECT_EQ(sh.slice(1, LayerTensor::kUpExps, -1), fh.slice(1, LayerTensor::kUpExps, -1));

  const std::string zeros(64, '0');
  sh.record(0, LayerTensor::kDownExps, 7, zeros);
  EXPECT_EQ(sh.slice(0, LayerTensor::kDownExps, 7), zeros);  // returned, not read
  sh.record(0, LayerTensor::kDownExps, 7, zeros);            // the same again: accepted
  expect_error([&] { sh.record(0, LayerTensor::kDownExps, 3, zeros); },
               {spec, "blk.0.ffn_down_exps.weight[expert 3]", "was hashed as", zeros},
               "a different digest");
  EXPECT_THROW(sh.record(0, LayerTensor::kUpExps, 1, "abc"), std::invalid_argument);
  EXPECT_THROW(sh.record(0, LayerTensor::kUpExps, 1, std::string(64, 'A')), std::invalid_argument);
}

}  // namespace
}  // namespace moecheck
