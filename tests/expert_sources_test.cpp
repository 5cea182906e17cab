// The expert sources over files and synthetic models (golden/expert_sources.h, docs/streaming.md
// "Sources"): every read equals the bytes of the file `gen` wrote (through the file's mapping),
// from one thread or many; a file cut after it was opened gives a short read naming the file,
// tensor, layer and expert for the experts past the cut and the right bytes before it; an
// expert or layer outside the model, a stack of another type or shape, a missing stack and a
// hash-routed layer are refused by name; an I/O error injected by the shim (tests/shim/fail_io.c)
// names errno's text.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "golden/expert_sources.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/sha256.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

namespace fs = std::filesystem;
using testutil::expect_error;

// A file of its own per call, removed when the test's scope ends.
struct TempModel {
  explicit TempModel(const std::string& tag) {
    static int n = 0;
    path = std::string(MOECHECK_BINARY_DIR) + "/expert_sources_test-" + std::to_string(::getpid()) +
           "-" + tag + "-" + std::to_string(n++) + ".gguf";
  }
  ~TempModel() { std::remove(path.c_str()); }
  std::string path;
};

GenOptions tiny(int layers) {
  GenOptions o = preset_options("tiny");
  o.n_layers = layers;
  return o;
}

// Projection p of expert e as the file's mapping holds it.
const uint8_t* mapped(const LayerWeights& w, int64_t e, Proj p) {
  return expert_layout(w).stack(p).expert(e).data;
}

// Reads every listed expert of every layer and projection and compares it with the mapping.
void expect_reads_equal_file(const ExpertSource& src, const ModelFile& m,
                             const std::vector<int64_t>& experts, const std::string& ctx) {
  for (int L = 0; L < m.n_layers(); ++L) {
    const LayerWeights w = m.layer(L);
    const ExpertLayout l = src.layout(L);
    EXPECT_TRUE(l.same_shape(expert_layout(w))) << ctx << " layer " << L << ": " << l.describe();
    EXPECT_EQ(l.n_experts(), w.config.n_routed) << ctx;
    for (Proj p : kAllProjs) EXPECT_EQ(l.stack(p).data, nullptr) << ctx;
    for (int64_t e : experts)
      for (Proj p : kAllProjs) {
        std::vector<uint8_t> got(static_cast<size_t>(l.bytes(p)), 0xA5);
        src.read(L, e, p, got.data());
        EXPECT_EQ(std::memcmp(got.data(), mapped(w, e, p), got.size()), 0)
            << ctx << ": layer " << L << " expert " << e << " " << proj_name(p);
      }
  }
}

std::vector<int64_t> all_experts(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t e = 0; e < n; ++e) v.push_back(e);
  return v;
}

TEST(FileExpertSource, ReadsEqualTheMappedFile_TinyEveryExpert_SmallSome_Deepseek41) {
  TempModel t("tiny");
  write_model(tiny(2), t.path);
  const ModelFile m = ModelFile::open(t.path);
  const FileExpertSource src(t.path);
  EXPECT_EQ(src.name(), "file " + t.path);
  EXPECT_EQ(src.file_size(), fs::file_size(t.path));
  EXPECT_EQ(src.view(0, 0, Proj::kGate), nullptr);
  expect_reads_equal_file(src, m, all_experts(16), "tiny");

  GenOptions so = preset_options("small");
  so.blocks = ExpertBlocks::kRandomValid;  // the layout is what matters here, not the sampling
  TempModel s("small");
  write_model(so, s.path);
  expect_reads_equal_file(FileExpertSource(s.path), ModelFile::open(s.path), {0, 17, 63}, "small");

  GenOptions v4 = tiny(2);
  v4.convention = Convention::kDeepseek41;
  v4.router_type = GgmlType::kF16;
  v4.swiglu_limits = {7.0f, 9.0f};
  TempModel d("ds41conv");
  write_model(v4, d.path);
  const ModelFile dm = ModelFile::open(d.path);
  // The source of a model already open (ModelFile::expert_source) reads the same.
  expect_reads_equal_file(*dm.expert_source(), dm, {0, 5, 15}, "deepseek41");
}

TEST(SyntheticExpertSource, ReadsEqualTheWrittenFile) {
  for (const bool kq : {false, true}) {
    GenOptions o = tiny(2);
    if (kq) o.shared = SharedExpertType::kKQuant;
    o.vision = kq;
    o.seed = 7;
    TempModel t("syn");
    write_model(o, t.path);
    const SyntheticExpertSource src(o);
    EXPECT_EQ(src.name(), "synthetic tiny seed 7");
    expect_reads_equal_file(src, ModelFile::open(t.path), all_experts(16),
                            kq ? "kquant vision" : "bf16");
  }
  GenOptions so = preset_options("small");
  so.n_layers = 1;
  TempModel s("small");
  write_model(so, s.path);
  expect_reads_equal_file(SyntheticExpertSource(so), ModelFile::open(s.path), {3, 40},
                          "small quantized");
}

// The file source of a copy cut at `cut` bytes after the source was opened.
struct CutCopy {
  CutCopy(const std::string& from, const std::string& tag) : copy(tag) {
    fs::copy_file(from, copy.path);
  }
  void cut(uint64_t size) { fs::resize_file(copy.path, size); }
  TempModel copy;
};

TEST(FileExpertSource, FileCutAfterOpenGivesShortReadsPastTheCut) {
  TempModel t("full");
  write_model(tiny(2), t.path);
  const ModelFile m = ModelFile::open(t.path);
  const LayerWeights w0 = m.layer(0);
  const gguf::TensorInfo* gate = m.gguf().find_tensor("blk.0.ffn_gate_exps.weight");
  const uint64_t eb = gate->nbytes / 16, gate_at = m.gguf().data_offset() + gate->offset;
  for (const uint64_t cut : {gate_at + 2 * eb + eb / 2, m.gguf().data_offset()}) {
    CutCopy c(t.path, "cut");
    const FileExpertSource src(c.copy.path);  // opened whole: its checks at open pass
    c.cut(cut);
    const int64_t intact = static_cast<int64_t>((cut - gate_at) / eb);  // 2, or 0 at the header
    std::vector<uint8_t> buf(static_cast<size_t>(eb));
    for (int64_t e = 0; e < (cut > gate_at ? intact : 0); ++e) {
      src.read(0, e, Proj::kGate, buf.data());
      EXPECT_EQ(std::memcmp(buf.data(), mapped(w0, e, Proj::kGate), eb), 0) << "expert " << e;
    }
    const int64_t first_cut = cut > gate_at ? intact : 0;
    const uint64_t at = gate_at + static_cast<uint64_t>(first_cut) * eb;
    const uint64_t got = cut > at ? cut - at : 0;
    expect_error([&] { src.read(0, first_cut, Proj::kGate, buf.data()); },
                 {"file " + c.copy.path, "tensor blk.0.ffn_gate_exps.weight", "layer 0",
                  "expert " + std::to_string(first_cut),
                  "short read: got " + std::to_string(got) + " of " + std::to_string(eb) +
                      " bytes at offset " + std::to_string(at)},
                 "the expert at the cut");
    expect_error([&] { src.read(1, 15, Proj::kDown, buf.data()); },
                 {"file " + c.copy.path, "tensor blk.1.ffn_down_exps.weight", "layer 1",
                  "expert 15", "short read: got 0 of"},
                 "the last expert");
  }
}

TEST(FileExpertSource, RangeOutsideTheSizeAtOpenIsRefusedBeforeAnyRead) {
  TempModel t("full");
  write_model(tiny(2), t.path);
  std::ifstream f(t.path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  // The tensor infos of the whole file over a copy cut before layer 1: the size the source
  // checks against is the copy's, as fstat found it at open.
  const ModelFile whole = ModelFile::open(t.path);
  const gguf::TensorInfo* r1 = whole.gguf().find_tensor("blk.1.ffn_gate_inp.weight");
  const uint64_t cut = whole.gguf().data_offset() + r1->offset;
  TempModel c("cut");
  fs::copy_file(t.path, c.path);
  fs::resize_file(c.path, cut);
  const FileExpertSource src(ModelFile::from_gguf(gguf::Reader::from_bytes(bytes, c.path)));
  EXPECT_EQ(src.file_size(), cut);
  std::vector<uint8_t> buf(1 << 20);
  src.read(0, 15, Proj::kDown, buf.data());  // layer 0 lies wholly before the cut
  expect_error([&] { src.read(1, 0, Proj::kGate, buf.data()); },
               {"file " + c.path, "tensor blk.1.ffn_gate_exps.weight", "layer 1", "expert 0",
                "end past the file's " + std::to_string(cut) + " bytes (its size when opened)"},
               "past the size at open");
}

TEST(ExpertSources, ExpertOrLayerOutsideTheModelIsRefusedByName) {
  TempModel t("tiny");
  write_model(tiny(2), t.path);
  const FileExpertSource file(t.path);
  const SyntheticExpertSource syn(tiny(2));
  std::vector<uint8_t> buf(1 << 20);
  for (const ExpertSource* s :
       {static_cast<const ExpertSource*>(&file), static_cast<const ExpertSource*>(&syn)}) {
    for (const int64_t e : {int64_t{-1}, int64_t{16}, int64_t{1} << 40})
      expect_error([&] { s->read(1, e, Proj::kUp, buf.data()); },
                   {s->name(), "tensor blk.1.ffn_up_exps.weight", "layer 1",
                    "expert " + std::to_string(e), "outside the stack's 16 experts"},
                   s->name() + " expert " + std::to_string(e));
    for (const int L : {-1, 2}) {
      expect_error([&] { s->layout(L); },
                   {s->name(), "layer " + std::to_string(L), "no such layer"},
                   s->name() + " layer " + std::to_string(L));
      expect_error([&] { s->read(L, 0, Proj::kGate, buf.data()); },
                   {s->name(), "layer " + std::to_string(L), "no such layer"},
                   s->name() + " read layer " + std::to_string(L));
    }
  }
}

// A model whose tensor specs the test edits: write_model's writer with `edit` applied to each
// spec (a changed size gets zero bytes), or the spec left out when edit returns false.
void write_edited(const GenOptions& o, const std::string& path,
                  const std::function<bool(gguf::TensorSpec&)>& edit) {
  const gguf::Writer full = model_writer(o);
  gguf::Writer w;
  w.set_alignment(o.alignment);
  write_model_metadata(w, o.config, o.layout());
  for (gguf::TensorSpec s : full.tensors()) {
    const std::vector<int64_t> ne = s.ne;
    const uint32_t type = s.type;
    if (!edit(s)) continue;
    if (s.ne != ne || s.type != type) {
      s.chunk_bytes = 0;
      s.fill = [](uint64_t, uint8_t* out, uint64_t n) { std::memset(out, 0, n); };
    }
    w.add_tensor(std::move(s));
  }
  w.write(path);
}

TEST(FileExpertSource, StacksOfAnotherTypeOrShapeMissingOrHashRoutedAreRefusedByName) {
  TempModel t("edited");
  write_edited(tiny(3), t.path, [](gguf::TensorSpec& s) {
    if (s.name == "blk.0.ffn_up_exps.weight") s.type = 12;  // Q4_K
    if (s.name == "blk.1.ffn_down_exps.weight") s.ne = {256, 512, 8};
    return s.name != "blk.2.ffn_gate_exps.weight";
  });
  const FileExpertSource src(t.path);  // opening refuses nothing: the layers are refused by name
  std::vector<uint8_t> buf(1 << 20);
  const std::string f = "file " + t.path;
  const std::vector<std::pair<int, std::vector<std::string>>> cases = {
      {0, {f, "layer 0", "tensor blk.0.ffn_up_exps.weight", "type Q4_K, expected Q2_K"}},
      {1,
       {f, "layer 1", "tensor blk.1.ffn_down_exps.weight", "ne [256, 512, 8]",
        "expected Q3_K [256, 512, 16]"}},
      {2, {f, "layer 2", "tensor blk.2.ffn_gate_exps.weight is missing"}}};
  for (const auto& [L, parts] : cases) {
    for (const std::string& part : parts) {
      expect_error([&, L = L] { src.layout(L); }, {part}, "layout " + std::to_string(L));
      expect_error([&, L = L] { src.read(L, 0, Proj::kGate, buf.data()); }, {part},
                   "read " + std::to_string(L));
    }
  }

  GenOptions h = tiny(2);
  h.convention = Convention::kDeepseek4;
  h.router_type = GgmlType::kF16;
  h.hash_layers = 1;
  TempModel ht("hash");
  write_model(h, ht.path);
  const FileExpertSource hs(ht.path);
  expect_error(
      [&] { hs.layout(0); },
      {"file " + ht.path, "layer 0", "tensor blk.0.ffn_gate_tid2eid.weight", "hash-routed"},
      "hash-routed file layer");
  EXPECT_EQ(hs.layout(1).n_experts(), 16);
  const SyntheticExpertSource syn(h);
  expect_error([&] { syn.read(0, 0, Proj::kGate, buf.data()); },
               {"synthetic tiny seed 1", "layer 0", "blk.0.ffn_gate_tid2eid.weight", "hash-routed"},
               "hash-routed synthetic layer");
  EXPECT_EQ(syn.layout(1).n_experts(), 16);
}

TEST(ExpertSources, ManyThreadsReadTheRightBytes) {
  TempModel t("tiny");
  GenOptions o = tiny(2);
  o.blocks = ExpertBlocks::kRandomValid;  // the synthetic source makes each read: keep it quick
  write_model(o, t.path);
  const ModelFile m = ModelFile::open(t.path);
  const LayerWeights w[2] = {m.layer(0), m.layer(1)};
  const FileExpertSource file(t.path);
  const SyntheticExpertSource syn(o);
  for (const ExpertSource* s :
       {static_cast<const ExpertSource*>(&file), static_cast<const ExpertSource*>(&syn)}) {
    std::atomic<int> wrong{0}, reads{0};
    std::vector<std::thread> pool;
    for (int k = 0; k < 8; ++k)
      pool.emplace_back([&, k] {
        std::vector<uint8_t> buf(1 << 20);
        for (int i = 0; i < 96; ++i) {  // each thread its own order over (layer, expert, proj)
          const int j = (i * 37 + k * 11) % 96;
          const int L = j / 48;
          const int64_t e = (j / 3) % 16;
          const Proj p = kAllProjs[j % 3];
          s->read(L, e, p, buf.data());
          const size_t n = static_cast<size_t>(s->layout(L).bytes(p));
          if (std::memcmp(buf.data(), mapped(w[L], e, p), n) != 0) ++wrong;
          ++reads;
        }
      });
    for (std::thread& th : pool) th.join();
    EXPECT_EQ(reads.load(), 8 * 96) << s->name();
    EXPECT_EQ(wrong.load(), 0) << s->name();
  }
}

// The probe (tests/shim/expert_read_probe.cpp) under the shim: exit code, stdout, stderr.
struct ProbeRun {
  int code = -1;
  std::string out, err;
};
ProbeRun run_probe(const std::string& env, const std::string& args) {
  const std::string base =
      std::string(MOECHECK_BINARY_DIR) + "/expert_sources_test-" + std::to_string(::getpid());
  const std::string cmd = "LD_PRELOAD=" MOECHECK_BINARY_DIR
                          "/tests/fail_io_shim.so ASAN_OPTIONS=verify_asan_link_order=0 " +
                          env + " " MOECHECK_BINARY_DIR "/tests/expert_read_probe " + args + " >" +
                          base + ".out 2>" + base + ".err";
  const int st = std::system(cmd.c_str());
  ProbeRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    std::remove(p.c_str());
    return s.str();
  };
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

TEST(FileExpertSource, InjectedIoErrorNamesFileTensorLayerExpertAndErrno) {
  TempModel t("tiny");
  write_model(tiny(2), t.path);
  const ModelFile m = ModelFile::open(t.path);
  const LayerWeights w = m.layer(1);
  std::string want;  // the probe's lines for experts 4 and 5 of layer 1, from the mapping
  for (int64_t e : {4, 5})
    for (Proj p : kAllProjs)
      want += std::to_string(e) + " " + proj_name(p) + " " +
              sha256_hex(mapped(w, e, p), static_cast<size_t>(expert_layout(w).bytes(p))) + "\n";
  const ProbeRun clean = run_probe("", t.path + " 1 4 2");
  EXPECT_EQ(clean.code, 0) << clean.err;
  EXPECT_EQ(clean.out, want);
  // The fifth pread is expert 5's up slice: four slices come back right, then the error.
  const ProbeRun eio = run_probe("MOECHECK_SHIM_PREAD_EIO_AFTER=5", t.path + " 1 4 2");
  EXPECT_EQ(eio.code, 2) << eio.err;
  EXPECT_EQ(eio.out, want.substr(0, want.find("5 up")));
  for (const std::string& part :
       std::vector<std::string>{"file " + t.path, "tensor blk.1.ffn_up_exps.weight", "layer 1",
                                "expert 5", std::string("failed after 0: ") + std::strerror(EIO)})
    EXPECT_NE(eio.err.find(part), std::string::npos) << eio.err << "\nlacks " << part;
}

}  // namespace
}  // namespace moecheck
