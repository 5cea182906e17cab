// `moecheck import`, `export` and `check --against` end to end on the built binary: an engine's
// output (the emulation's, exported to .npy) imported and judged PASS against the reference; the
// same with every stage (taps); an engine whose SwiGLU clamps silu's output (min(silu(g), L), one
// public llama.cpp fork) instead of model.py's gate input (silu(min(g, L))) judged FAIL at
// experts.h with taps and at the output without; the legs not run listed; bad input exit 2 with
// nothing written.
#include <cmath>

#include "cli_test_util.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "golden/dump.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/tensor_file.h"

namespace moecheck::testing {
namespace {

void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

class CliImport : public CliFixture {
 protected:
  // Runs emu with taps on `model` and exports layer 0 to <stem>.npz.
  static void emu_npz(const std::string& model, const std::string& stem) {
    const CliResult r = run("run --impl emu --model " + model +
                            " --layers 0 --taps --adversarial -o " + p(stem + ".h5"));
    ASSERT_EQ(r.code, 0) << r.cmd << r.err;
    const CliResult e = run("export " + p(stem + ".h5") + " -o " + p(stem + ".npz"));
    ASSERT_EQ(e.code, 0) << e.cmd << e.err;
  }
};

double silu(double g) { return g / (1.0 + std::exp(-g)); }
// The fork's SwiGLU: silu's output clamped from above, up clamped both ways.
float fork_swiglu(float g, float u, float L) {
  return static_cast<float>(std::min(silu(g), static_cast<double>(L)) * std::clamp(u, -L, L));
}

TEST_F(CliImport, OutputOnlyNpyPassesAndListsTheLegsNotRun) {
  ASSERT_NO_FATAL_FAILURE(emu_npz(p("tiny.gguf"), "e1"));
  for (const char* s : {"input", "output"})
    ASSERT_EQ(
        run("export " + p("e1.h5") + " --stage " + s + " -o " + p(std::string("e1_") + s + ".npy"))
            .code,
        0);
  const CliResult im = run("import --model " + p("tiny.gguf") + " --layer 0 --input " +
                           p("e1_input.npy") + " --dtype bf16 --map output=" + p("e1_output.npy") +
                           " --engine emu-npy -o " + p("imp1.h5"));
  EXPECT_EXIT_CODE(im, 0);
  const Dump d = read_dump(p("imp1.h5"));
  EXPECT_EQ(d.meta.implementation, "import");
  EXPECT_EQ(d.meta.stages, (std::vector<std::string>{"input", "output"}));
  // diff needs the routing on both sides: an output-only import is sent to check --against.
  const CliResult nd = run("diff " + p("imp1.h5") + " " + p("imp1.h5"));
  EXPECT_EXIT_CODE(nd, 2);
  EXPECT_CONTAINS(nd.err, "diff needs router_logits, topk_ids and topk_weights", nd);
  const CliResult c = run("check --model " + p("tiny.gguf") + " --against " + p("imp1.h5"));
  EXPECT_EXIT_CODE(c, 0);
  EXPECT_CONTAINS(c.out, "ref~import stat: agree", c);
  EXPECT_CONTAINS(
      c.out, "not run: import local: needs every stage (taps); the import holds input, output", c);
  EXPECT_CONTAINS(c.out, "not run: emu=cuda: not applicable to an imported dump", c);
  EXPECT_CONTAINS(c.out, "not run: ref~import x_q8, experts.*, shared.* (bounds, stat): no taps",
                  c);
  EXPECT_CONTAINS(c.out, "result: PASS", c);
  const CliResult j =
      run("check --model " + p("tiny.gguf") + " --against " + p("imp1.h5") + " --json");
  EXPECT_EXIT_CODE(j, 0);
  EXPECT_CONTAINS(j.out, "\"legs_not_run\":[\"import local: needs every stage", j);
}

// The fork's SwiGLU recomputed on the emulation's own gate and up: h changes wherever gate > L.
int64_t perturb_h(std::map<std::string, HostTensor>& t, float L) {
  const std::vector<float> g = tensor_to_f32(t.at("experts.gate")),
                           u = tensor_to_f32(t.at("experts.up"));
  std::vector<float> h = tensor_to_f32(t.at("experts.h"));
  int64_t changed = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    if (!(g[i] > L)) continue;
    const float v = fork_swiglu(g[i], u[i], L);
    changed += v != h[i];
    h[i] = v;
  }
  std::memcpy(t.at("experts.h").bytes.data(), h.data(), h.size() * 4);
  return changed;
}

// A dim-major engine's safetensors file: the input as BF16 and the output as F32, both [dim, T],
// imported with --transpose; the imported output is the exported one bit for bit and passes.
TEST_F(CliImport, SafetensorsTransposedBf16InputF32OutputPasses) {
  ASSERT_NO_FATAL_FAILURE(emu_npz(p("tiny.gguf"), "e3"));
  auto t = read_tensor_file(p("e3.npz"), U16As::kBF16);
  const HostTensor &x = t.at("input"), &y = t.at("output");
  ASSERT_EQ(x.dtype, TensorDtype::kBF16);
  const int64_t T = x.shape[0], dim = x.shape[1];
  const std::vector<uint16_t> xb = tensor_to_bf16(x), yb = tensor_to_bf16(y);
  std::vector<uint8_t> data;
  for (int64_t c = 0; c < dim; ++c)  // input^T, bf16
    for (int64_t r = 0; r < T; ++r) {
      const uint16_t v = xb[r * dim + c];
      data.push_back(static_cast<uint8_t>(v)), data.push_back(static_cast<uint8_t>(v >> 8));
    }
  const size_t x_end = data.size();
  for (int64_t c = 0; c < dim; ++c)  // output^T, f32
    for (int64_t r = 0; r < T; ++r) {
      const uint32_t v = f32_bits(bf16_to_f32(yb[r * dim + c]));
      for (int k = 0; k < 4; ++k) data.push_back(static_cast<uint8_t>(v >> (8 * k)));
    }
  const std::string shape = "[" + std::to_string(dim) + "," + std::to_string(T) + "]";
  std::string h = "{\"hidden_in\":{\"dtype\":\"BF16\",\"shape\":" + shape +
                  ",\"data_offsets\":[0," + std::to_string(x_end) +
                  "]},\"layer_out\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
                  std::to_string(x_end) + "," + std::to_string(data.size()) + "]}}";
  std::string file(8, '\0');
  for (int k = 0; k < 8; ++k) file[k] = static_cast<char>(h.size() >> (8 * k));
  file += h;
  file.append(reinterpret_cast<const char*>(data.data()), data.size());
  std::ofstream(p("e3.safetensors"), std::ios::binary) << file;
  const CliResult im = run("import --model " + p("tiny.gguf") + " --layer 0 --transpose --input " +
                           p("e3.safetensors") + ":hidden_in --map output=" + p("e3.safetensors") +
                           ":layer_out -o " + p("st.h5"));
  EXPECT_EXIT_CODE(im, 0);
  const Dump d = read_dump(p("st.h5"));
  ASSERT_EQ(d.layers.size(), 1u);
  EXPECT_EQ(d.layers[0].input, xb) << "repro: " << im.cmd;
  EXPECT_EQ(d.layers[0].output, yb) << "repro: " << im.cmd;
  const CliResult c = run("check --model " + p("tiny.gguf") + " --against " + p("st.h5"));
  EXPECT_EXIT_CODE(c, 0);
  EXPECT_CONTAINS(c.out, "result: PASS", c);
  // Without --transpose the [dim, T] tensors do not fit the model's [T, dim]: refused by name.
  const CliResult no =
      run("import --model " + p("tiny.gguf") + " --layer 0 --input " + p("e3.safetensors") +
          ":hidden_in --map output=" + p("e3.safetensors") + ":layer_out -o " + p("st2.h5"));
  EXPECT_EXIT_CODE(no, 2);
  EXPECT_CONTAINS(no.err, "hidden_in", no);
  EXPECT_FALSE(fs::exists(p("st2.h5"))) << no.cmd;
}

TEST_F(CliImport, EveryStagePassesAndTheForkClampFailsAtExpertsH) {
  ASSERT_NO_FATAL_FAILURE(emu_npz(p("tiny.gguf"), "e2"));
  const std::string base = "import --model " + p("tiny.gguf") + " --dtype bf16 --input " +
                           p("e2.npz") + ":input --from ";
  const CliResult ok = run(base + p("e2.npz") + " -o " + p("full.h5"));
  EXPECT_EXIT_CODE(ok, 0);
  const CliResult c = run("check --model " + p("tiny.gguf") + " --against " + p("full.h5"));
  EXPECT_EXIT_CODE(c, 0);
  EXPECT_CONTAINS(c.out, "import local: agree", c);
  // Every stage imported: diff aligns it with the dump it came from, bit for bit.
  const CliResult d = run("diff " + p("e2.h5") + " " + p("full.h5"));
  EXPECT_EXIT_CODE(d, 0);
  auto t = read_tensor_file(p("e2.npz"), U16As::kBF16);
  const int64_t changed = perturb_h(t, 10.0f);
  ASSERT_GT(changed, 0) << "no gate above L: the adversarial clamp token did not reach it";
  std::map<std::string, std::vector<uint8_t>> members;
  for (const auto& [k, v] : t) members.emplace(k, make_npy(v));
  write_bytes(p("fork.npz"), make_npz_stored(members));
  ASSERT_EQ(run(base + p("fork.npz") + " -o " + p("fork.h5")).code, 0);
  const CliResult f = run("check --model " + p("tiny.gguf") + " --against " + p("fork.h5"));
  EXPECT_EXIT_CODE(f, 1);
  EXPECT_CONTAINS(f.out, "import local: BROKE first at experts.h", f);
  EXPECT_CONTAINS(f.out, "result: FAIL", f);
}

// Output only, on a model with swiglu_limit 2: there the fork's clamp moves h by up to
// L / (1 + e^L) |u'| = 0.24 |u'| (at the DeepSeek limit 10, 4.5e-4 |u'|: far below a q8_1
// engine's output noise, so only the taps show it). The fork's output: the emulation's acc plus
// each pick's weight times w2 . (h_fork - h), in f64, rounded to bf16 once.
TEST_F(CliImport, ForkClampOutputOnlyFailsAtTheOutput) {
  GenOptions o = preset_options("tiny");
  o.n_layers = 1;
  o.config.swiglu_limit = 2.0f;
  write_model(o, p("l2.gguf"));
  ASSERT_NO_FATAL_FAILURE(emu_npz(p("l2.gguf"), "e3"));
  const Dump d = read_dump(p("e3.h5"));
  const LayerTaps& t = d.layers[0];
  const MoeConfig& c = d.meta.config;
  const ModelFile m = ModelFile::open(p("l2.gguf"));
  const LayerWeights w = m.layer(0);
  std::vector<double> acc(t.acc.begin(), t.acc.end());
  std::vector<float> row(static_cast<size_t>(c.inter));
  int64_t changed = 0;
  for (const ExpertTaps& e : t.experts) {
    const MatView w2 = w.down_exps.expert(e.expert);
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      std::vector<double> dh(static_cast<size_t>(c.inter), 0.0);
      for (int64_t i = 0; i < c.inter; ++i) {
        const size_t q = j * c.inter + i;
        if (e.gate[q] > c.swiglu_limit)
          dh[i] = fork_swiglu(e.gate[q], e.up[q], c.swiglu_limit) - static_cast<double>(e.h[q]),
          ++changed;
      }
      for (int64_t r = 0; r < c.dim; ++r) {
        dequantize_row(w2.type, w2.row(r), row.data(), c.inter);
        double s = 0;
        for (int64_t i = 0; i < c.inter; ++i) s += row[i] * dh[i];
        acc[e.tokens[j] * c.dim + r] += e.weights[j] * s;
      }
    }
  }
  ASSERT_GT(changed, 0);
  HostTensor y;
  y.dtype = TensorDtype::kBF16;
  y.shape = {t.tokens, c.dim};
  for (double v : acc) {
    const uint16_t b = f32_to_bf16(static_cast<float>(v));
    y.bytes.push_back(static_cast<uint8_t>(b & 0xff)),
        y.bytes.push_back(static_cast<uint8_t>(b >> 8));
  }
  write_bytes(p("fork_y.npy"), make_npy(y));
  ASSERT_EQ(run("export " + p("e3.h5") + " --stage output -o " + p("e3_y.npy")).code, 0);
  const std::string base = "import --model " + p("l2.gguf") + " --dtype bf16 --input " +
                           p("e3.npz") + ":input --map output=";
  ASSERT_EQ(run(base + p("e3_y.npy") + " -o " + p("l2_ok.h5")).code, 0);
  ASSERT_EQ(run(base + p("fork_y.npy") + " -o " + p("l2_fork.h5")).code, 0);
  const CliResult ok = run("check --model " + p("l2.gguf") + " --against " + p("l2_ok.h5"));
  EXPECT_EXIT_CODE(ok, 0);  // the same model and input without the fork's clamp pass
  const CliResult f = run("check --model " + p("l2.gguf") + " --against " + p("l2_fork.h5"));
  EXPECT_EXIT_CODE(f, 1);
  EXPECT_CONTAINS(f.out, "ref~import stat: BROKE first at output", f);
}

TEST_F(CliImport, BadInputIsExit2AndWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(emu_npz(p("tiny.gguf"), "e4"));
  const std::string base =
      "import --model " + p("tiny.gguf") + " --dtype bf16 --input " + p("e4.npz") + ":input ";
  struct Case {
    std::string args, needle;
  };
  HostTensor bad;
  bad.dtype = TensorDtype::kF32;
  bad.shape = {3, 7};
  bad.bytes.assign(3 * 7 * 4, 0);
  write_bytes(p("bad.npy"), make_npy(bad));
  write_bytes(p("trunc.npy"), std::vector<uint8_t>{0x93, 'N', 'U', 'M'});
  const std::vector<Case> cases = {
      {"--map output=" + p("bad.npy"),
       "stage output (" + p("bad.npy") + "): shape [3, 7], expected [12, 512]"},
      {"--map output=" + p("trunc.npy"), p("trunc.npy") + ": header: truncated"},
      {"--map output=" + p("e4.npz") + ":nope", "has no member or tensor \"nope\""},
      {"--map frob=" + p("e4.npz") + ":output", "--map frob="},
      {"--map output=" + p("e4.npz") + ":output --map experts.h=" + p("e4.npz") + ":experts.h",
       "tap stages are imported with the routing"},
      {"--map output=" + p("e4.npz") + ":output --map topk_ids=" + p("e4.npz") + ":topk_ids",
       "map both or neither"},
      {"--map output=" + p("e4.npz") + ":output --map topk_ids=" + p("e4.npz") +
           ":topk_weights --map topk_weights=" + p("e4.npz") + ":topk_weights",
       "expected integer ids"},
  };
  for (const Case& k : cases) {
    const CliResult r = run(base + k.args + " -o " + p("never.h5"));
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, k.needle, r);
    EXPECT_FALSE(fs::exists(p("never.h5"))) << r.cmd;
  }
  const CliResult none = run("import --model " + p("tiny.gguf") + " --map output=" + p("e4.npz") +
                             ":output -o " + p("never.h5"));
  EXPECT_EXIT_CODE(none, 2);
  EXPECT_CONTAINS(none.err, "--input", none);
  const CliResult notimp = run("check --model " + p("tiny.gguf") + " --against " + p("e4.h5"));
  EXPECT_EXIT_CODE(notimp, 2);
  EXPECT_CONTAINS(notimp.err, "--against takes a dump written by moecheck import", notimp);
  // The import fixes layer, tokens, input and mask: options that would be ignored are refused.
  for (const char* opt : {"--tokens 4", "--layers 1", "--input-seed 3", "--precision exact",
                          "--adversarial off", "--image-tokens 1", "--route device"}) {
    const CliResult r =
        run("check --model " + p("tiny.gguf") + " --against " + p("e4.h5") + " " + opt);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "excludes --against", r);
  }
}

}  // namespace
}  // namespace moecheck::testing
