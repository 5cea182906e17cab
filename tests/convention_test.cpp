// The deepseek4 / deepseek41 conventions (golden/convention.h, docs/gguf.md "Conventions"):
// generated files read back with their convention, F16 router, per-layer clamps and hash-routed
// layers; keys model.py defaults are optional and reported as defaulted; every malformed key
// (wrong type, wrong array length, unknown gating function, non-finite clamp) and every layer
// moecheck cannot run (hash-routed, routed experts of another type) is refused by name.
// Repro: --gtest_filter=Convention.*
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/numfmt.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

using testutil::expect_error;

std::string temp_path(const std::string& tag) {
  static int n = 0;
  return std::string(MOECHECK_BINARY_DIR) + "/convention_test-" + std::to_string(::getpid()) + "-" +
         tag + "-" + std::to_string(n++) + ".gguf";
}

// tiny, 3 layers, deepseek4, F16 router, layer 0 hash-routed, clamps that vary by layer and
// differ between the routed and the shared experts.
GenOptions v4_options() {
  GenOptions o = preset_options("tiny");
  o.n_layers = 3;
  o.seed = 7;
  o.blocks = ExpertBlocks::kRandomValid;  // fast; the blocks' bytes are not what is tested here
  o.convention = Convention::kDeepseek4;
  o.router_type = GgmlType::kF16;
  o.hash_layers = 1;
  o.swiglu_limits = {10.0f, 2.0f, 0.5f};
  o.swiglu_limits_shared = {10.0f, 1.0f, 3.0f};
  return o;
}

TEST(Convention, Deepseek4RoundTrip_F16Router_PerLayerClamps_HashLayer) {
  const GenOptions o = v4_options();
  const std::string path = temp_path("v4");
  write_model(o, path);
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  EXPECT_EQ(m.convention(), Convention::kDeepseek4);
  EXPECT_EQ(m.n_layers(), 3);
  EXPECT_TRUE(m.hash_routed(0));
  EXPECT_FALSE(m.hash_routed(1));
  expect_error([&] { m.layer(0); },
               {"layer 0 is hash-routed", "blk.0.ffn_gate_tid2eid.weight",
                "deepseek4.hash_layer_count 1", "choose layers from 1 on"},
               "hash layer");
  for (int L = 1; L < 3; ++L) {
    const LayerWeights f = m.layer(L), g = generate_layer(o, L);
    const std::string ctx = "layer " + std::to_string(L);
    EXPECT_EQ(f.router_type, GgmlType::kF16) << ctx;
    EXPECT_EQ(f.config.swiglu_limit, o.swiglu_limits[L]) << ctx;
    EXPECT_EQ(f.config.shared_swiglu_limit(), o.swiglu_limits_shared[L]) << ctx;
    EXPECT_EQ(f.config, g.config) << ctx;
    const int64_t n = f.config.n_routed * f.config.dim;
    EXPECT_EQ(std::memcmp(f.router, g.router, static_cast<size_t>(n) * 2), 0) << ctx;
    // The F16 router holds the same draws as the BF16 one, rounded to f16: every value within
    // half an f16 ulp of the bf16 value's f32 source, so at most one bf16 ulp apart.
    GenOptions b = o;
    b.router_type = GgmlType::kBF16;
    const LayerWeights gb = generate_layer(b, L);
    for (int64_t i = 0; i < n; ++i) {
      const float h = f16_to_f32(f.router[i]), bf = bf16_to_f32(gb.router[i]);
      ASSERT_LE(std::fabs(h - bf), std::fabs(bf) * 0x1p-8f + 0x1p-24f) << ctx << " value " << i;
    }
  }
  const GenOptions back = options_from_model(m);
  EXPECT_EQ(back.convention, o.convention);
  EXPECT_EQ(back.router_type, o.router_type);
  EXPECT_EQ(back.hash_layers, o.hash_layers);
  EXPECT_EQ(back.hash_vocab, o.hash_vocab);
  EXPECT_EQ(back.swiglu_limits, o.swiglu_limits);
  EXPECT_EQ(back.swiglu_limits_shared, o.swiglu_limits_shared);
  ASSERT_EQ(m.layout().defaulted.size(), 1u);
  EXPECT_EQ(m.layout().defaulted[0].key, "moecheck.gate_temp");
  expect_error([&] { generate_layer(o, 0); }, {"layer 0 is hash-routed"}, "generate hash layer");
}

TEST(Convention, Deepseek41RoundTrip_SameClampsEveryLayer) {
  GenOptions o = preset_options("tiny");
  o.convention = Convention::kDeepseek41;
  o.router_type = GgmlType::kF16;
  o.vision = true;  // V4.1's exp_probs_b_vl.bias
  const std::string path = temp_path("v41");
  write_model(o, path);
  const ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  EXPECT_EQ(m.convention(), Convention::kDeepseek41);
  EXPECT_EQ(m.config(), o.config);
  EXPECT_EQ(m.gguf().find(std::string("deepseek41.swiglu_clamp_exp"))->value.items.size(), 2u);
  const LayerWeights w = m.layer(1);
  EXPECT_NE(w.bias_vl, nullptr);
  EXPECT_FALSE(w.config.swiglu_limit_shared.has_value());
  const GenOptions back = options_from_model(m);
  EXPECT_TRUE(back.swiglu_limits.empty());  // equal on every layer: the config's
  EXPECT_EQ(back.convention, Convention::kDeepseek41);
}

// Rewrites a generated deepseek4 file with metadata edits (nullopt drops the key) and tensor type
// or name edits; tensors keep their bytes (a type change keeps the byte count: the reader checks
// shapes, not contents, before layer()).
struct Edits {
  std::map<std::string, std::optional<gguf::Value>> meta;
  std::map<std::string, std::string> rename;  // tensor name -> new name
  std::map<std::string, std::pair<uint32_t, std::vector<int64_t>>> retype;
};

std::string rewrite(const Edits& e, const std::string& tag) {
  GenOptions o = v4_options();
  o.hash_layers = 0;
  const std::string src = temp_path(tag + "-src");
  write_model(o, src);
  const gguf::Reader r = gguf::Reader::open(src);
  std::remove(src.c_str());
  gguf::Writer w;
  for (const gguf::KeyValue& kv : r.kvs()) {
    if (kv.key == gguf::kAlignmentKey) continue;
    const auto it = e.meta.find(kv.key);
    if (it == e.meta.end()) w.set(kv.key, kv.value);
    else if (it->second) w.set(kv.key, *it->second);
  }
  for (const auto& [k, v] : e.meta)
    if (!r.find(k) && v) w.set(k, *v);
  for (const gguf::TensorInfo& t : r.tensors()) {
    gguf::TensorSpec s{t.name, t.type, {t.ne.begin(), t.ne.begin() + t.n_dims}, 0, {}};
    if (const auto it = e.rename.find(t.name); it != e.rename.end()) s.name = it->second;
    if (const auto it = e.retype.find(t.name); it != e.retype.end())
      s.type = it->second.first, s.ne = it->second.second;
    const uint8_t* data = r.data(t);
    const uint64_t nbytes = t.nbytes;
    s.fill = [data, nbytes](uint64_t off, uint8_t* out, uint64_t n) {
      for (uint64_t i = 0; i < n; ++i) out[i] = off + i < nbytes ? data[off + i] : 0;
    };
    w.add_tensor(s);
  }
  const std::string path = temp_path(tag);
  w.write(path);
  return path;
}

Edits meta(const std::string& key, std::optional<gguf::Value> v) {
  Edits e;
  e.meta["deepseek4." + key] = std::move(v);
  return e;
}

void expect_open_error(const Edits& e, const std::string& tag,
                       std::initializer_list<std::string> parts) {
  const std::string path = rewrite(e, tag);
  expect_error([&] { ModelFile::open(path); }, parts, tag);
  std::remove(path.c_str());
}

ModelFile open_edited(const Edits& e, const std::string& tag) {
  const std::string path = rewrite(e, tag);
  ModelFile m = ModelFile::open(path);
  std::remove(path.c_str());
  return m;
}

gguf::Value f32_array(std::initializer_list<float> v) {
  std::vector<gguf::Value> items;
  for (float x : v) items.push_back(gguf::make_float32(x));
  return gguf::make_array(gguf::ValueType::kFloat32, std::move(items));
}

TEST(Convention, Deepseek4MetadataErrorsNameFileAndKey) {
  using namespace gguf;
  expect_open_error(meta("expert_gating_func", make_uint32(3)), "gating3",
                    {"\"deepseek4.expert_gating_func\" = 3",
                     "expected 1 (softmax), 2 (sigmoid) or 4 (sqrtsoftplus)"});
  expect_open_error(meta("expert_gating_func", std::nullopt), "no_gating",
                    {"\"deepseek4.expert_gating_func\" (uint32) is missing"});
  expect_open_error(meta("swiglu_clamp_exp", f32_array({10, 10})), "short_array",
                    {"\"deepseek4.swiglu_clamp_exp\"", "one entry per block (3), found 2"});
  expect_open_error(
      meta("swiglu_clamp_exp",
           make_array(ValueType::kFloat64, {make_float64(10), make_float64(10), make_float64(10)})),
      "f64_array", {"\"deepseek4.swiglu_clamp_exp\"", "expected float32 or array<float32>"});
  expect_open_error(meta("swiglu_clamp_shexp", f32_array({10, NAN, 10})), "nan_clamp",
                    {"\"deepseek4.swiglu_clamp_shexp\": layer 1 holds nan"});
  expect_open_error(meta("swiglu_clamp_exp", std::nullopt), "no_clamp",
                    {"\"deepseek4.swiglu_clamp_exp\" (float32) is missing"});
  expect_open_error(meta("expert_count", make_uint64(16)), "u64_count",
                    {"\"deepseek4.expert_count\"", "expected uint32, found uint64 16"});
  expect_open_error(meta("nextn_predict_layers", make_uint32(3)), "all_mtp",
                    {"leave no MoE layer"});
  Edits arch;
  arch.meta["general.architecture"] = make_string("deepseek5");
  expect_open_error(arch, "arch", {"\"general.architecture\"", "found \"deepseek5\""});
}

TEST(Convention, Deepseek4OptionalKeysAreDefaultedAndReported) {
  using namespace gguf;
  Edits e = meta("swiglu_clamp_shexp", std::nullopt);
  e.meta["deepseek4.expert_weights_norm"] = std::nullopt;
  e.meta["deepseek4.hash_layer_count"] = std::nullopt;
  e.meta["deepseek4.swiglu_clamp_exp"] = make_float32(4.0f);  // one value for every layer
  e.meta["deepseek4.expert_gating_func"] = make_uint32(2);
  const ModelFile m = open_edited(e, "defaults");
  EXPECT_EQ(m.config().score_func, ScoreFunc::kSigmoid);
  EXPECT_TRUE(m.config().norm_topk_prob);
  std::map<std::string, std::string> d;
  for (const DefaultedKey& k : m.layout().defaulted) d[k.key] = k.value;
  EXPECT_EQ(d.size(), 4u);
  EXPECT_EQ(d["deepseek4.expert_weights_norm"], "true");
  EXPECT_EQ(d["deepseek4.hash_layer_count"], "0");
  EXPECT_EQ(d["deepseek4.swiglu_clamp_shexp"], "swiglu_clamp_exp");
  EXPECT_EQ(d["moecheck.gate_temp"], "1");
  for (int L = 0; L < 3; ++L) {
    const LayerWeights w = m.layer(L);
    EXPECT_EQ(w.config.swiglu_limit, 4.0f);
    EXPECT_FALSE(w.config.swiglu_limit_shared.has_value());
  }
  const ModelFile mtp = open_edited(meta("nextn_predict_layers", make_uint32(1)), "mtp");
  EXPECT_EQ(mtp.n_layers(), 2);
  expect_error([&] { mtp.layer(2); }, {"layer 2 out of range", "1 MTP blocks"}, "mtp layer");
}

TEST(Convention, LayersMoecheckCannotRunAreRefusedByName) {
  Edits iq2;  // V4 Flash's 2-bit builds: IQ2_XXS (66-byte blocks) gate experts
  iq2.retype["blk.1.ffn_gate_exps.weight"] = {16, {512, 256, 16}};
  iq2.retype["blk.1.ffn_up_exps.weight"] = {16, {512, 256, 16}};
  const ModelFile m = open_edited(iq2, "iq2");
  expect_error([&] { m.layer(1); },
               {"layer 1: tensor \"blk.1.ffn_gate_exps.weight\": type IQ2_XXS, expected Q2_K",
                "routed experts of other types are not supported"},
               "iq2_xxs experts");
  Edits hash;  // a token-id table where hash_layer_count says 0
  hash.rename["blk.2.exp_probs_b.bias"] = "blk.2.ffn_gate_tid2eid.weight";
  const ModelFile h = open_edited(hash, "hash");
  EXPECT_TRUE(h.hash_routed(2));
  expect_error([&] { h.layer(2); }, {"layer 2 is hash-routed", "blk.2.ffn_gate_tid2eid.weight"},
               "hash table");
  Edits bf;  // F32 router
  bf.retype["blk.1.ffn_gate_inp.weight"] = {0, {256, 16}};
  const ModelFile r = open_edited(bf, "router_f32");
  expect_error([&] { r.layer(1); }, {"blk.1.ffn_gate_inp.weight", "type F32, expected BF16 or F16"},
               "f32 router");
}

TEST(Convention, GeneratorRefusesOptionsNoFileCanHold) {
  GenOptions o = preset_options("tiny");
  o.swiglu_limits = {10, 5};
  expect_error([&] { o.validate(); }, {"per-layer SwiGLU limits need the deepseek4"}, "moecheck");
  o.convention = Convention::kDeepseek4;
  o.swiglu_limits = {10};
  expect_error([&] { o.validate(); }, {"1 per-layer SwiGLU limit(s) for 2 layer(s)"}, "length");
  o.swiglu_limits.clear();
  o.hash_layers = 2;
  expect_error([&] { o.validate(); }, {"hash-routed layers (2)"}, "all hash");
  o.convention = Convention::kDeepseek41;
  o.hash_layers = 1;
  expect_error([&] { o.validate(); }, {"need the deepseek4 convention"}, "v41 hash");
  expect_error([] { parse_convention("llama", "--convention"); },
               {"--convention", "found \"llama\""}, "parse");
}

}  // namespace
}  // namespace moecheck
