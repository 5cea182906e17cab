// Routing trace files (golden/trace_file.h, docs/streaming.md "Traces"): the round trip keeps
// every field; every malformed variant of a valid document (syntax, duplicate and unknown keys,
// a missing field, a wrong type, shape or range, each in the header and in a layer) is an
// InputError naming the file and the JSON path of the field; the writer refuses a bad trace
// and leaves no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "golden/trace_file.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TraceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moecheck_trace_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  std::string put(const std::string& name, const std::string& text) const {
    std::ofstream(p(name), std::ios::binary) << text;
    return p(name);
  }
  fs::path dir_;
};

TraceFile sample() {
  TraceFile f;
  f.trace.n_routed = 4;
  f.trace.topk = 2;
  f.trace.tokens = 2;
  f.trace.origin = "tiny.gguf emu 2 tokens \"quoted\" \xc3\xa9";
  f.trace.layers = {TraceLayer{0, {0, 1, 2, 3}, {}}, TraceLayer{1, {1, 0, 3, 2}, {1, 2, 0, 3}},
                    TraceLayer{0, {3, 0, 1, 2}, {3, 1, 2, 1}}};
  f.expert_bytes = 12810240;
  return f;
}

void expect_same(const TraceFile& a, const TraceFile& b) {
  EXPECT_EQ(a.expert_bytes, b.expert_bytes);
  EXPECT_EQ(a.trace.n_routed, b.trace.n_routed);
  EXPECT_EQ(a.trace.topk, b.trace.topk);
  EXPECT_EQ(a.trace.tokens, b.trace.tokens);
  EXPECT_EQ(a.trace.origin, b.trace.origin);
  ASSERT_EQ(a.trace.layers.size(), b.trace.layers.size());
  for (size_t i = 0; i < a.trace.layers.size(); ++i) {
    EXPECT_EQ(a.trace.layers[i].layer, b.trace.layers[i].layer) << i;
    EXPECT_EQ(a.trace.layers[i].picks, b.trace.layers[i].picks) << i;
    EXPECT_EQ(a.trace.layers[i].predicted, b.trace.layers[i].predicted) << i;
  }
}

TEST_F(TraceFileTest, RoundTripKeepsEveryField) {
  const TraceFile f = sample();
  write_trace_file(p("t.json"), f);
  const TraceFile g = read_trace_file(p("t.json"));
  expect_same(f, g);
  TraceFile u = sample();
  u.expert_bytes = 0;  // unknown: no key
  write_trace_file(p("u.json"), u);
  const std::string text = read_trace_file(p("u.json")).trace.origin;
  EXPECT_EQ(text, u.trace.origin);
  EXPECT_EQ(read_trace_file(p("u.json")).expert_bytes, 0);
  const json doc = json::parse(trace_json(u));
  EXPECT_FALSE(doc.contains("expert_bytes"));
  EXPECT_EQ(doc["format"], "moecheck-routing-trace");
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["layers"][1]["picks"], json::parse("[[1,0],[3,2]]"));
  EXPECT_EQ(doc["layers"][0]["predicted"], json::array());
  // A layer without "predicted" reads as one without predictions.
  json d2 = doc;
  d2["layers"][1].erase("predicted");
  EXPECT_TRUE(parse_trace_json(d2.dump(), "x").trace.layers[1].predicted.empty());
  for (const fs::directory_entry& e : fs::directory_iterator(dir_))  // no temporary left
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

struct Bad {
  const char* name;
  std::function<void(json&)> edit;
  std::vector<std::string> expect;  // in the message, after the file name
};

// The document and its header fields.
std::vector<Bad> header_variants() {
  auto set = [](const char* ptr, json v) {
    return [p = std::string(ptr), v](json& d) { d[json::json_pointer(p)] = v; };
  };
  auto erase = [](const char* key) { return [k = std::string(key)](json& d) { d.erase(k); }; };
  return {
      {"top_not_object", [](json& d) { d = json::array(); }, {"the document", "object"}},
      {"missing_format", erase("format"), {"format: missing"}},
      {"missing_version", erase("version"), {"version: missing"}},
      {"missing_origin", erase("origin"), {"origin: missing"}},
      {"missing_n_routed", erase("n_routed"), {"n_routed: missing"}},
      {"missing_topk", erase("topk"), {"topk: missing"}},
      {"missing_tokens", erase("tokens"), {"tokens: missing"}},
      {"missing_layers", erase("layers"), {"layers: missing"}},
      {"unknown_top_key", set("/tokenz", 3), {"tokenz: unknown key"}},
      {"format_other", set("/format", "other"), {"format: expected \"moecheck-routing-trace\""}},
      {"format_number", set("/format", 1), {"format:", "number"}},
      {"version_2", set("/version", 2), {"version: version 2 is not one"}},
      {"version_string", set("/version", "1"), {"version: expected an integer", "string"}},
      {"version_float", set("/version", 1.0), {"version: expected an integer", "number"}},
      {"origin_number", set("/origin", 5), {"origin: expected a string"}},
      {"n_routed_zero", set("/n_routed", 0), {"n_routed: expected an integer in [1,"}},
      {"n_routed_negative", set("/n_routed", -3), {"n_routed:", "found -3"}},
      {"n_routed_float", set("/n_routed", 4.5), {"n_routed: expected an integer"}},
      {"n_routed_huge", set("/n_routed", 1 << 21), {"n_routed must be in [1, 2^20]"}},
      {"n_routed_2e70", set("/n_routed", 1e70), {"n_routed: expected an integer"}},
      {"topk_above_n_routed", set("/topk", 5), {"topk must be in [1, n_routed = 4]"}},
      {"tokens_zero", set("/tokens", 0), {"tokens: expected an integer in [1,"}},
      {"tokens_bool", set("/tokens", true), {"tokens: expected an integer", "boolean"}},
      {"expert_bytes_zero", set("/expert_bytes", 0), {"expert_bytes: expected an integer in [1,"}},
      {"expert_bytes_string", set("/expert_bytes", "12 MB"), {"expert_bytes: expected an integer"}},
  };
}

// The layers and their fields.
std::vector<Bad> layer_variants() {
  auto set = [](const char* ptr, json v) {
    return [p = std::string(ptr), v](json& d) { d[json::json_pointer(p)] = v; };
  };
  return {
      {"layers_object", set("/layers", json::object()), {"layers: expected a non-empty array"}},
      {"layers_empty", set("/layers", json::array()), {"layers: expected a non-empty array"}},
      {"layer_not_object", set("/layers/1", 7), {"layers[1]: expected a JSON object"}},
      {"layer_missing_id",
       [](json& d) { d["layers"][2].erase("layer"); },
       {"layers[2].layer: missing"}},
      {"layer_missing_picks",
       [](json& d) { d["layers"][0].erase("picks"); },
       {"layers[0].picks: missing"}},
      {"layer_unknown_key", set("/layers/1/pick", json::array()), {"layers[1].pick: unknown key"}},
      {"layer_negative",
       set("/layers/1/layer", -1),
       {"layers[1].layer: expected an integer in [0,"}},
      {"layer_string", set("/layers/1/layer", "1"), {"layers[1].layer: expected an integer"}},
      {"layer_2e31", set("/layers/1/layer", int64_t{1} << 31), {"layers[1].layer:", "2147483648"}},
      {"picks_not_array", set("/layers/0/picks", "0,1"), {"layers[0].picks: expected an array"}},
      {"picks_one_token",
       set("/layers/0/picks", json::parse("[[0,1]]")),
       {"layers[0].picks: expected 2 tokens' arrays", "found 1"}},
      {"picks_row_number", set("/layers/0/picks/1", 3), {"layers[0].picks[1]: expected an array"}},
      {"picks_row_short",
       set("/layers/0/picks/1", json::parse("[2]")),
       {"layers[0].picks[1]: expected 2 expert ids", "found 1"}},
      {"pick_string",
       set("/layers/1/picks/1/0", "3"),
       {"layers[1].picks[1][0]: expected an integer"}},
      {"pick_float",
       set("/layers/1/picks/1/0", 3.0),
       {"layers[1].picks[1][0]: expected an integer"}},
      {"pick_null", set("/layers/1/picks/1/0", nullptr), {"layers[1].picks[1][0]:", "null"}},
      {"pick_negative",
       set("/layers/1/picks/0/1", -1),
       {"layers[1].picks[0][1]: expected an integer in [0, 3]"}},
      {"pick_n_routed", set("/layers/1/picks/0/1", 4), {"layers[1].picks[0][1]:", "found 4"}},
      {"pick_twice",
       set("/layers/1/picks/0/1", 1),
       {"layers[1] (layer 1) picks token 0: expert 1 picked twice"}},
      {"predicted_not_array",
       set("/layers/1/predicted", 1),
       {"layers[1].predicted: expected an array"}},
      {"predicted_short",
       set("/layers/1/predicted", json::parse("[[1,2]]")),
       {"layers[1].predicted: expected 2 tokens' arrays"}},
      {"predicted_out_of_range",
       set("/layers/2/predicted/1/1", 9),
       {"layers[2].predicted[1][1]:", "found 9"}},
      {"predicted_twice",
       set("/layers/2/predicted/1/1", 2),
       {"layers[2] (layer 0) predicted token 1: expert 2 picked twice"}},
  };
}

TEST_F(TraceFileTest, EveryMalformedVariantNamesTheFileAndField) {
  const json good = json::parse(trace_json(sample()));
  ASSERT_NO_THROW(parse_trace_json(good.dump(), "good"));
  std::vector<Bad> all = header_variants();
  for (Bad& b : layer_variants()) all.push_back(std::move(b));
  ASSERT_EQ(all.size(), 48u);  // the count docs/streaming.md and docs/reliability.md give
  for (const Bad& b : all) {
    json d = good;
    b.edit(d);
    const std::string path = put(std::string(b.name) + ".json", d.dump());
    try {
      read_trace_file(path);
      ADD_FAILURE() << b.name << ": no InputError for " << d.dump();
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << b.name << ": " << m;
      for (const std::string& want : b.expect)
        EXPECT_NE(m.find(want), std::string::npos)
            << b.name << ": \"" << m << "\" lacks \"" << want << "\"";
    }
  }
}

TEST_F(TraceFileTest, SyntaxDuplicatesAndFilesAreRefusedByName) {
  const std::string good = trace_json(sample());
  struct Text {
    const char* name;
    std::string text;
    std::string expect;
  };
  const std::string dup_top = "{\"topk\": 2, " + good.substr(1);
  std::string dup_layer = good;
  dup_layer.replace(dup_layer.find("{\"layer\": 1,"), 12, "{\"layer\": 1, \"layer\": 1,");
  const std::vector<Text> cases = {
      {"empty", "", "not valid JSON"},
      {"truncated", good.substr(0, good.size() / 2), "not valid JSON"},
      {"trailing", good + "x", "not valid JSON"},
      {"null", "null", "the document: expected a JSON object"},
      {"dup_top", dup_top, "topk: key appears twice"},
      {"dup_layer", dup_layer, "layers[1].layer: key appears twice"},
  };
  for (const Text& c : cases)
    testutil::expect_error([&] { read_trace_file(put(std::string(c.name) + ".json", c.text)); },
                           {p(std::string(c.name) + ".json"), c.expect}, c.name);
  testutil::expect_error([&] { read_trace_file(p("missing.json")); },
                         {p("missing.json"), "does not exist"}, "missing");
  testutil::expect_error([&] { read_trace_file(dir_.string()); }, {"not a regular file"}, "dir");
}

TEST_F(TraceFileTest, WriterRefusesABadTraceAndLeavesNoFile) {
  TraceFile f = sample();
  f.trace.layers[1].picks[0] = 7;  // outside [0, 4)
  testutil::expect_error([&] { write_trace_file(p("bad.json"), f); },
                         {p("bad.json"), "layers[1] (layer 1) picks token 0: expert 7"}, "bad id");
  EXPECT_FALSE(fs::exists(p("bad.json")));
  TraceFile e = sample();
  e.trace.layers.clear();
  testutil::expect_error([&] { write_trace_file(p("empty.json"), e); }, {"at least one layer"},
                         "no layers");
  testutil::expect_error([&] { write_trace_file(p("nodir/t.json"), sample()); },
                         {p("nodir/t.json")}, "no directory");
  EXPECT_FALSE(fs::exists(p("empty.json")));
}

}  // namespace
}  // namespace moecheck
