// `moecheck run --trace` / `--residual` and `moecheck cache` driven through the built binary
// (docs/cli.md "cache", "run"): the recorded trace against the dump and a direct host
// computation of the predictions, the residual stream's inputs, the cache table and --json
// against the simulator called directly (core/cache_sim.h), the synthetic trace saved, and the
// refusals (a bad trace file naming the field, a missing file, sizes below the minimum, options
// that cannot work). Repro: every expectation prints the command line.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cache_sim.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "emulate/moe_layer.h"
#include "emulate/router_gemv.h"
#include "golden/dump.h"
#include "golden/model_file.h"
#include "golden/synthetic_trace.h"
#include "golden/trace_file.h"
#include "tests/cli_test_util.h"

namespace moecheck {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CliFixture;
using testing::CliResult;

class CliCache : public CliFixture {};

// The cells of the table row whose first cell is `label` (whitespace-separated), empty if none.
std::vector<std::string> row_cells(const std::string& out, const std::string& label) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream cells(line);
    std::vector<std::string> v;
    for (std::string c; cells >> c;) v.push_back(c);
    if (!v.empty() && v[0] == label) return v;
  }
  return {};
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * x);
  return b;
}

TEST_F(CliCache, RunTraceRecordsPicksAndPredictionsOfTheResidualStream) {
  const CliResult r =
      run("run --impl emu --model " + p("tiny.gguf") + " --layers 0-1 --chain --residual --trace " +
          p("t.json") + " -o " + p("d.h5"));
  ASSERT_EQ(r.code, 0) << r.cmd << "\n" << r.err;
  const TraceFile t = read_trace_file(p("t.json"));
  const Dump d = read_dump(p("d.h5"));
  EXPECT_EQ(d.meta.input_source, "seed+chain+residual");
  ASSERT_EQ(t.trace.layers.size(), 2u);
  ASSERT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(t.trace.tokens, 8);
  EXPECT_EQ(t.trace.origin, "tiny.gguf emu 8 tokens seed+chain+residual");
  const ModelFile m = ModelFile::open(p("tiny.gguf"));
  const LayerWeights w1 = m.layer(1);
  EXPECT_EQ(t.trace.n_routed, w1.config.n_routed);
  EXPECT_EQ(t.trace.topk, w1.config.topk);
  EXPECT_EQ(t.expert_bytes, w1.gate_exps.expert_stride() + w1.up_exps.expert_stride() +
                                w1.down_exps.expert_stride());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(t.trace.layers[i].layer, d.layers[i].layer);
    EXPECT_EQ(t.trace.layers[i].picks, d.layers[i].topk_ids) << "layer " << i;
  }
  EXPECT_TRUE(t.trace.layers[0].predicted.empty());
  // Layer 1's prediction: its router and bias on layer 0's input, computed here directly ...
  const std::vector<uint16_t>& x0 = d.layers[0].input;
  std::vector<float> logits(static_cast<size_t>(8 * w1.config.n_routed));
  emu::router_gemv(RouterVariant::kStaged, w1.router, x0.data(), logits.data(), w1.config.n_routed,
                   w1.config.dim, 8, w1.router_type);
  const Routing direct = route_from_logits(logits.data(), 8, w1.bias, w1.config, 1);
  EXPECT_EQ(t.trace.layers[1].predicted, direct.ids);
  // ... and as the emulated layer routes that input.
  LayerTaps taps;
  emu::MoeLayer(w1).forward(x0.data(), 8, &taps);
  EXPECT_EQ(t.trace.layers[1].predicted, taps.topk_ids);
  EXPECT_NE(t.trace.layers[1].predicted, t.trace.layers[1].picks);  // layer 1 saw x0 + y0
  // The residual stream: layer 1's input is bf16(f32(x0) + f32(y0)).
  ASSERT_EQ(d.layers[1].input.size(), x0.size());
  for (size_t i = 0; i < x0.size(); ++i)
    ASSERT_EQ(d.layers[1].input[i],
              f32_to_bf16(bf16_to_f32(x0[i]) + bf16_to_f32(d.layers[0].output[i])))
        << "element " << i;
  // The trace replays.
  const CliResult c = run("cache --trace " + p("t.json") + " --order decode --json");
  EXPECT_EXIT_CODE(c, 0);
  const json j = json::parse(c.out);
  const std::vector<TraceForward> fw = trace_forwards(t.trace, ReplayOrder::kDecode);
  EXPECT_EQ(j["min_slots"], trace_demand(fw).min_slots);
  EXPECT_EQ(j["prefetch"]["recall"].get<double>(), prefetch_accuracy(fw, kPrefetchAll).recall());
}

TEST_F(CliCache, TableAndJsonEqualTheSimulator) {
  const std::string spec = "layers=6,tokens=12,experts=32,topk=4,zipf=1.2,predict=0.6,seed=3";
  const CliResult s = run("cache --synthetic " + spec + " --save-trace " + p("s.json"));
  ASSERT_EQ(s.code, 0) << s.cmd << "\n" << s.err;
  const TraceFile f = read_trace_file(p("s.json"));
  const TraceFile want = synthetic_trace(parse_synthetic_spec(spec, "test"));
  ASSERT_EQ(f.trace.layers.size(), want.trace.layers.size());
  for (size_t i = 0; i < want.trace.layers.size(); ++i) {
    EXPECT_EQ(f.trace.layers[i].picks, want.trace.layers[i].picks);
    EXPECT_EQ(f.trace.layers[i].predicted, want.trace.layers[i].predicted);
  }
  const std::vector<TraceForward> fw = trace_forwards(f.trace, ReplayOrder::kDecode);
  const TraceDemand dm = trace_demand(fw);
  const std::string args =
      "cache --trace " + p("s.json") + " --order decode --prefetch-k 4 --sizes 8,20,50%,0.2GB,2";
  const std::vector<std::pair<std::string, int64_t>> sizes = {
      {"8", 8}, {"20", 20}, {"50%", dm.distinct_keys / 2}, {"0.2GB", 200000000 / f.expert_bytes}};
  const CliResult tj = run(args + " --json");
  ASSERT_EQ(tj.code, 0) << tj.cmd << "\n" << tj.err;
  const json j = json::parse(tj.out);
  EXPECT_EQ(j["distinct_keys"], dm.distinct_keys);
  EXPECT_EQ(j["accesses"], dm.accesses);
  const PrefetchAccuracy acc = prefetch_accuracy(fw, 4);
  EXPECT_EQ(j["prefetch"]["recall"].get<double>(), acc.recall());
  EXPECT_EQ(j["prefetch"]["precision"].get<double>(), acc.precision());
  const CliResult tt = run(args);
  ASSERT_EQ(tt.code, 0) << tt.cmd << "\n" << tt.err;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto& [label, slots] = sizes[i];
    const CacheSimResult x = simulate_cache(fw, slots, 4);
    ASSERT_FALSE(x.below_minimum) << label;
    const json& z = j["sizes"][i];
    EXPECT_EQ(z["size"], label);
    EXPECT_EQ(z["slots"], slots);
    EXPECT_EQ(z["lru"]["hits"], x.lru.hits) << label;
    EXPECT_EQ(z["lru"]["misses"], x.lru.misses) << label;
    EXPECT_EQ(z["lru"]["hit_rate"].get<double>(), x.lru.hit_rate()) << label;
    EXPECT_EQ(z["lru_prefetch"]["hits"], x.lru_prefetch.hits) << label;
    EXPECT_EQ(z["lru_prefetch"]["reads"], x.lru_prefetch.reads) << label;
    EXPECT_EQ(z["belady"]["hits"], x.belady.hits) << label;
    EXPECT_EQ(z["belady"]["hit_rate"].get<double>(), x.belady.hit_rate()) << label;
    EXPECT_EQ(z["bytes"], slots * f.expert_bytes) << label;
    // The row: size, slots, bytes (a number and its unit), then the three hit rates.
    const std::vector<std::string> cells = row_cells(tt.out, label);
    ASSERT_EQ(cells.size(), 7u) << tt.out;
    EXPECT_EQ(cells[1], std::to_string(slots)) << tt.out;
    EXPECT_EQ(cells[4], pct(x.lru.hit_rate())) << label << "\n" << tt.out;
    EXPECT_EQ(cells[5], pct(x.lru_prefetch.hit_rate())) << label << "\n" << tt.out;
    EXPECT_EQ(cells[6], pct(x.belady.hit_rate())) << label << "\n" << tt.out;
  }
  // 2 slots: below the minimum of 4 (a decode forward is one token's 4 picks), not simulated.
  EXPECT_EQ(j["sizes"][4]["below_minimum"], true);
  EXPECT_TRUE(j["sizes"][4]["lru"].is_null());
  EXPECT_CONTAINS(tt.out, "below the minimum of 4 slots (the largest forward): not simulated", tt);
}

TEST_F(CliCache, DefaultSweepRunsFromTheMinimumToEveryDistinctKey) {
  const CliResult c = run("cache --synthetic layers=3,tokens=4,experts=16,topk=2 --json");
  ASSERT_EQ(c.code, 0) << c.cmd << "\n" << c.err;
  const json j = json::parse(c.out);
  const int64_t lo = j["min_slots"].get<int64_t>(), hi = j["distinct_keys"].get<int64_t>();
  std::vector<int64_t> want;
  for (int64_t s = lo; s < hi; s *= 2) want.push_back(s);
  want.push_back(hi);
  std::vector<int64_t> got;
  for (const json& z : j["sizes"]) got.push_back(z["slots"].get<int64_t>());
  EXPECT_EQ(got, want);
}

TEST_F(CliCache, BadInputsExit2NamingTheFileAndField) {
  std::string text = trace_json(synthetic_trace(parse_synthetic_spec("layers=2,tokens=2", "t")));
  text.replace(text.find("\"topk\": 6"), 9, "\"topk\": \"6\"");
  { std::ofstream(p("bad.json")) << text; }
  const CliResult bad = run("cache --trace " + p("bad.json"));
  EXPECT_EXIT_CODE(bad, 2);
  EXPECT_CONTAINS(bad.err, p("bad.json") + ": topk: expected an integer, found string \"6\"", bad);
  const CliResult missing = run("cache --trace " + p("nope.json"));
  EXPECT_EXIT_CODE(missing, 2);
  EXPECT_CONTAINS(missing.err, p("nope.json") + ": trace file does not exist", missing);
  TraceFile nobytes =
      synthetic_trace(parse_synthetic_spec("layers=2,tokens=2,expert_bytes=0", "t"));
  write_trace_file(p("nobytes.json"), nobytes);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cache", "give exactly one of --trace FILE and --synthetic SPEC"},
      {"cache --trace " + p("t.json") + " --synthetic layers=2", "give exactly one of"},
      {"cache --trace " + p("nobytes.json") + " --sizes 1GB",
       "--sizes 1GB: a size in bytes needs the bytes of one expert"},
      {"cache --trace " + p("nobytes.json") + " --sizes 12,x", "piece \"x\" does not start"},
      {"cache --trace " + p("nobytes.json") + " --sizes 120%", "piece \"120%\" is above 100%"},
      {"cache --trace " + p("nobytes.json") + " --sizes 1.5", "is not a whole slot count"},
      {"cache --trace " + p("nobytes.json") + " --sizes 3XB", "unknown unit \"XB\""},
      {"cache --trace " + p("nobytes.json") + " --prefetch-k -1", "--prefetch-k -1: expected"},
      {"cache --trace " + p("nobytes.json") + " --save-trace " + p("x.json"),
       "only a --synthetic trace is saved"},
      {"cache --synthetic layers=1,tokens=2 --prefetch-k 3", "has no predictions"},
      {"cache --synthetic colour=red", "--synthetic: unknown key \"colour\""},
      {"run --impl emu --model " + p("tiny.gguf") + " --residual -o " + p("r.h5"),
       "--residual: the residual stream feeds layer L's input + output to the next layer run; it "
       "needs --chain"},
      {"run --impl emu --model " + p("tiny.gguf") + " --chain --trace " + p("r.h5") + " -o " +
           p("r.h5"),
       "is the same file as -o"},
      {"run --impl emu --model " + p("tiny.gguf") + " --chain --trace " + p("nodir/t.json") +
           " -o " + p("r.h5"),
       "--trace " + p("nodir/t.json") + ": directory"},
  };
  for (const auto& [args, want] : cases) {
    const CliResult c = run(args);
    EXPECT_EXIT_CODE(c, 2);
    EXPECT_CONTAINS(c.err, want, c);
  }
  EXPECT_FALSE(fs::exists(p("r.h5")));  // refused before anything was written
  EXPECT_FALSE(fs::exists(p("x.json")));
}

}  // namespace
}  // namespace moecheck
