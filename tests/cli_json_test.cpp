// The `--json` output parsed back with nlohmann/json and checked against values computed here
// from the files themselves (docs/cli.md "Output"): inspect of a model and of metadata that JSON
// cannot hold as numbers, run's output norms against the dump, diff's worst element against both
// dumps, and an error object. Numbers are compared exactly: the output round-trips doubles.
// Repro: the failing command line is printed with every expectation.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/numfmt.h"
#include "golden/dump.h"
#include "golden/gguf.h"

namespace moecheck::testing {
namespace {

using nlohmann::ordered_json;

class CliJson : public CliFixture {
 protected:
  // Runs `args`, requires exit code `code` and one JSON document on stdout, and returns it.
  static ordered_json run_json(const std::string& args, int code = 0) {
    const CliResult r = run(args);
    EXPECT_EXIT_CODE(r, code);
    ordered_json j = ordered_json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON; repro: " << r.cmd << "\n" << r.out;
    return j;
  }
};

std::vector<std::string> keys_of(const ordered_json& o) {
  std::vector<std::string> k;
  for (const auto& [name, v] : o.items()) k.push_back(name);
  return k;
}

// A GGUF model: the metadata values and tensor shapes of docs/gguf.md, the file size from the
// file system, the keys in the documented order.
TEST_F(CliJson, InspectModelHoldsTheFilesValues) {
  const std::string cmd = "inspect " + p("tiny.gguf") + " --json";
  const ordered_json j = run_json(cmd);
  ASSERT_TRUE(j.is_object()) << "repro: moecheck " << cmd;
  const std::vector<std::string> top = {
      "file",        "kind",        "version",    "alignment",        "file_size",
      "metadata",    "tensors",     "layers",     "config",           "convention",
      "router_type", "hash_layers", "mtp_layers", "swiglu_clamp_exp", "swiglu_clamp_shexp",
      "defaulted",   "generator"};
  EXPECT_EQ(keys_of(j), top) << "repro: moecheck " << cmd;
  EXPECT_EQ(j["kind"], "gguf");
  EXPECT_EQ(j["version"].get<int64_t>(), 3);
  EXPECT_EQ(j["file_size"].get<uint64_t>(), fs::file_size(p("tiny.gguf")));
  const ordered_json& m = j["metadata"];
  EXPECT_EQ(m["general.architecture"]["value"], "deepseek2");
  EXPECT_EQ(m["deepseek2.expert_count"]["type"], "uint32");
  EXPECT_EQ(m["deepseek2.expert_count"]["value"].get<int64_t>(), 16);
  EXPECT_EQ(m["deepseek2.expert_weights_scale"]["value"].get<double>(), 1.5);
  EXPECT_EQ(m["deepseek2.expert_weights_norm"]["value"], true);
  EXPECT_EQ(m["moecheck.generator.seed"]["value"].get<uint64_t>(), 1u);
  ASSERT_EQ(j["tensors"].size(), 16u) << "2 layers x 8 tensors; repro: moecheck " << cmd;
  bool seen_down = false;
  for (const ordered_json& t : j["tensors"]) {
    if (t["name"] != "blk.1.ffn_down_exps.weight") continue;
    seen_down = true;
    EXPECT_EQ(t["type"], "Q3_K");
    EXPECT_EQ(t["shape"], ordered_json::parse("[256,512,16]"));
    EXPECT_EQ(t["bytes"].get<uint64_t>(), 256u / 256 * 110 * 512 * 16);
  }
  EXPECT_TRUE(seen_down) << "repro: moecheck " << cmd;
  EXPECT_EQ(j["config"]["topk"].get<int64_t>(), 4);
  EXPECT_EQ(j["config"]["swiglu_limit"].get<double>(), 10.0);
  // moecheck's own convention: one clamp for every layer, nothing defaulted (gen writes gate_temp).
  EXPECT_EQ(j["convention"], "deepseek2");
  EXPECT_EQ(j["router_type"], "BF16");
  EXPECT_EQ(j["hash_layers"].get<int64_t>(), 0);
  EXPECT_TRUE(j["swiglu_clamp_exp"].empty());
  EXPECT_TRUE(j["defaulted"].empty()) << "repro: moecheck " << cmd;
}

// Metadata floats JSON cannot hold are the strings of docs/cli.md; a finite float32 is its exact
// value as a number (1e-20f, not a decimal rounded to 9 digits).
TEST_F(CliJson, NonFiniteNumbersAreTheDocumentedStrings) {
  gguf::Writer w;
  const float inf = std::numeric_limits<float>::infinity();
  w.set("test.nan", gguf::make_float32(std::numeric_limits<float>::quiet_NaN()));
  w.set("test.inf", gguf::make_float32(inf));
  w.set("test.minus_inf", gguf::make_float64(-std::numeric_limits<double>::infinity()));
  w.set("test.eps", gguf::make_float32(1e-20f));
  w.add_tensor({"t", 0, {4, 2}, 0, [](uint64_t, uint8_t* out, uint64_t n) {
                  std::memset(out, 0, static_cast<size_t>(n));
                }});
  w.write(p("nonfinite.gguf"));
  const std::string cmd = "inspect " + p("nonfinite.gguf") + " --json";
  const ordered_json m = run_json(cmd)["metadata"];
  EXPECT_EQ(m["test.nan"]["value"], ordered_json("NaN")) << "repro: moecheck " << cmd;
  EXPECT_EQ(m["test.inf"]["value"], ordered_json("Infinity")) << "repro: moecheck " << cmd;
  EXPECT_EQ(m["test.minus_inf"]["value"], ordered_json("-Infinity")) << "repro: moecheck " << cmd;
  EXPECT_EQ(m["test.minus_inf"]["type"], "float64");
  ASSERT_TRUE(m["test.eps"]["value"].is_number_float()) << "repro: moecheck " << cmd;
  EXPECT_EQ(m["test.eps"]["value"].get<double>(), static_cast<double>(1e-20f));
}

double l2_of(const std::vector<uint16_t>& bf16) {
  double s = 0;
  for (uint16_t v : bf16) {
    const double x = bf16_to_f32(v);
    s += x * x;
  }
  return std::sqrt(s);
}

// run --json: the per-layer output norm is the dump's own output's, to the last bit.
TEST_F(CliJson, RunReportsTheNormsOfTheDumpItWrote) {
  const std::string cmd = "run --impl emu --model " + p("tiny.gguf") + " -o " + p("j.h5");
  const ordered_json j = run_json(cmd + " --json");
  EXPECT_EQ(j["implementation"], "emu");
  EXPECT_EQ(j["tokens"].get<int64_t>(), 8);
  EXPECT_EQ(j["taps"], false);
  const Dump d = read_dump(p("j.h5"));
  ASSERT_EQ(j["layers"].size(), d.layers.size()) << "repro: moecheck " << cmd << " --json";
  for (size_t i = 0; i < d.layers.size(); ++i) {
    EXPECT_EQ(j["layers"][i]["layer"].get<int>(), d.layers[i].layer);
    const double want = l2_of(d.layers[i].output);
    EXPECT_GT(want, 0.0);
    EXPECT_EQ(j["layers"][i]["output_l2"].get<double>(), want)
        << "layer " << i << "; repro: moecheck " << cmd << " --json";
  }
}

// The largest |a - b| of a float32 stage of two dumps, and where it is (first of equals).
struct Worst {
  double abs = -1;
  size_t at = 0;
};
Worst worst_of(const std::vector<float>& a, const std::vector<float>& b) {
  Worst w;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (d > w.abs) w = {d, i};
  }
  return w;
}

// diff ref emu --json: router_logits' max_abs is the largest difference of the two dumps, and
// its worst element holds both dumps' values and bits.
TEST_F(CliJson, DiffNamesTheWorstElementOfBothDumps) {
  for (const char* impl : {"ref", "emu"}) {
    const CliResult r = run(std::string("run --impl ") + impl + " --model " + p("tiny.gguf") +
                            " -o " + p(std::string("d_") + impl + ".h5"));
    ASSERT_EQ(r.code, 0) << r.cmd << "\n" << r.err;
  }
  const std::string cmd = "diff " + p("d_ref.h5") + " " + p("d_emu.h5") + " --json";
  const ordered_json j = run_json(cmd, 1);
  EXPECT_EQ(j["same"], false);
  const Dump a = read_dump(p("d_ref.h5")), b = read_dump(p("d_emu.h5"));
  const int64_t n_routed = a.meta.config.n_routed;
  for (size_t li = 0; li < a.layers.size(); ++li) {
    const ordered_json* s = nullptr;
    for (const ordered_json& st : j["layers"][li]["stages"])
      if (st["stage"] == "router_logits") s = &st;
    ASSERT_NE(s, nullptr) << "no router_logits stage; repro: moecheck " << cmd;
    const Worst w = worst_of(a.layers[li].router_logits, b.layers[li].router_logits);
    ASSERT_GT(w.abs, 0.0) << "ref and emu router logits are the same bits";
    EXPECT_EQ((*s)["compared"].get<size_t>(), a.layers[li].router_logits.size());
    EXPECT_EQ((*s)["max_abs"].get<double>(), w.abs) << "repro: moecheck " << cmd;
    const ordered_json& e = (*s)["worst_abs"];
    const int64_t token = e["token"].get<int64_t>(), col = e["index"].get<int64_t>();
    const size_t at = static_cast<size_t>(token * n_routed + col);
    EXPECT_EQ(at, w.at) << "repro: moecheck " << cmd;
    EXPECT_EQ(e["a"].get<double>(), static_cast<double>(a.layers[li].router_logits[at]));
    EXPECT_EQ(e["b"].get<double>(), static_cast<double>(b.layers[li].router_logits[at]));
    EXPECT_EQ(e["a_bits"].get<uint32_t>(), f32_bits(a.layers[li].router_logits[at]));
  }
}

// An error with --json: one object whose message is the stderr line's.
TEST_F(CliJson, ErrorObjectCarriesTheStderrMessage) {
  const CliResult r = run("inspect " + p("absent.gguf") + " --json");
  EXPECT_EXIT_CODE(r, 2);
  const ordered_json j = ordered_json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "repro: " << r.cmd << "\n" << r.out;
  EXPECT_EQ(keys_of(j), (std::vector<std::string>{"error", "exit"}));
  EXPECT_EQ(j["exit"].get<int>(), 2);
  EXPECT_EQ("moecheck: error: " + j["error"].get<std::string>() + "\n", r.err)
      << "repro: " << r.cmd;
}

}  // namespace
}  // namespace moecheck::testing
