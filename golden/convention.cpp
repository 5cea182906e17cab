// The metadata conventions (golden/convention.h). Facts: llama.cpp's DeepSeek-V4 loader
// (src/models/deepseek4.cpp at ggml-org/llama.cpp 00395eb285c7c6821ff372e3ca41dae9da33c2c7) and
// its V4.1 loader (src/models/deepseek41.cpp at 16ffdb3a94c4ecef5a5f0104f0c71d29cc1e9894), which
// reads the same keys under the "deepseek41" prefix. docs/gguf.md "Conventions" lists them.
#include "golden/convention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "core/error.h"
#include "golden/model_file.h"

namespace moecheck {

using gguf::Value;
using gguf::ValueType;

const Value* metadata_value(const gguf::Reader& r, const std::string& key, ValueType type,
                            bool required) {
  const gguf::KeyValue* kv = r.find(key);
  if (!kv) {
    if (required)
      throw InputError(r.name() + ": metadata key \"" + key + "\" (" + gguf::type_name(type) +
                       ") is missing");
    return nullptr;
  }
  if (kv->value.type != type)
    throw InputError(r.name() + ": metadata key \"" + key + "\" at offset " +
                     std::to_string(kv->file_offset) + ": expected " + gguf::type_name(type) +
                     ", found " + gguf::describe(kv->value));
  return &kv->value;
}

namespace {

int64_t get_count(const gguf::Reader& r, const std::string& key) {
  return static_cast<int64_t>(metadata_value(r, key, ValueType::kUint32, true)->as_uint());
}

Value count_value(int64_t v, const std::string& key) {
  if (v < 0 || v > std::numeric_limits<uint32_t>::max())
    throw InputError("model metadata: " + key + " = " + std::to_string(v) + " does not fit uint32");
  return gguf::make_uint32(static_cast<uint32_t>(v));
}

std::string fmt(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
  return b;
}

// llama.cpp's llama_expert_gating_func_type ids.
constexpr uint32_t kGatingSoftmax = 1, kGatingSigmoid = 2, kGatingSqrtSoftplus = 4;

uint32_t gating_id(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::kSoftmax: return kGatingSoftmax;
    case ScoreFunc::kSigmoid: return kGatingSigmoid;
    case ScoreFunc::kSqrtSoftplus: return kGatingSqrtSoftplus;
  }
  return 0;
}

ScoreFunc score_of_gating(const gguf::Reader& r, const std::string& key, uint64_t id) {
  if (id == kGatingSoftmax) return ScoreFunc::kSoftmax;
  if (id == kGatingSigmoid) return ScoreFunc::kSigmoid;
  if (id == kGatingSqrtSoftplus) return ScoreFunc::kSqrtSoftplus;
  throw InputError(r.name() + ": metadata key \"" + key + "\" = " + std::to_string(id) +
                   ": expected 1 (softmax), 2 (sigmoid) or 4 (sqrtsoftplus)");
}

// A per-layer float key: one float32 for every layer, or an array of float32 with one entry per
// block (llama.cpp's get_key_or_arr). Empty when absent and not required.
std::vector<float> per_layer_floats(const gguf::Reader& r, const std::string& key, int64_t blocks,
                                    bool required) {
  const gguf::KeyValue* kv = r.find(key);
  if (!kv) {
    if (required) metadata_value(r, key, ValueType::kFloat32, true);  // throws "missing"
    return {};
  }
  const Value& v = kv->value;
  const std::string where = r.name() + ": metadata key \"" + key + "\" at offset " +
                            std::to_string(kv->file_offset) + ": ";
  if (v.type == ValueType::kFloat32)
    return std::vector<float>(static_cast<size_t>(blocks), v.as_f32());
  if (v.type != ValueType::kArray || v.elem_type != ValueType::kFloat32)
    throw InputError(where + "expected float32 or array<float32>, found " + gguf::describe(v));
  if (static_cast<int64_t>(v.items.size()) != blocks)
    throw InputError(where + "expected one entry per block (" + std::to_string(blocks) +
                     "), found " + std::to_string(v.items.size()));
  std::vector<float> out;
  for (const Value& x : v.items) out.push_back(x.as_f32());
  return out;
}

void read_moecheck(const gguf::Reader& r, MoeConfig& c, ModelLayout& l) {
  const std::string& file = r.name();
  const int64_t blocks = get_count(r, keys::kBlockCount);
  if (blocks < 1 || blocks > std::numeric_limits<int>::max())
    throw InputError(file + ": metadata key \"" + keys::kBlockCount +
                     "\": expected at least 1 layer, found " + std::to_string(blocks));
  l.n_layers = static_cast<int>(blocks);
  c.dim = get_count(r, keys::kDim);
  c.inter = get_count(r, keys::kInter);
  c.n_routed = get_count(r, keys::kNRouted);
  c.topk = get_count(r, keys::kTopk);
  c.n_shared = get_count(r, keys::kNShared);
  c.route_scale = metadata_value(r, keys::kRouteScale, ValueType::kFloat32, true)->as_f32();
  c.norm_topk_prob = metadata_value(r, keys::kNormTopk, ValueType::kBool, true)->as_bool();
  c.score_func =
      parse_score_func(metadata_value(r, keys::kScoreFunc, ValueType::kString, true)->str,
                       file + ": metadata key \"" + keys::kScoreFunc + "\"");
  c.swiglu_limit = metadata_value(r, keys::kSwigluLimit, ValueType::kFloat32, true)->as_f32();
  if (const Value* v = metadata_value(r, keys::kSwigluLimitShared, ValueType::kFloat32, false))
    c.swiglu_limit_shared = v->as_f32();
  if (const Value* t = metadata_value(r, keys::kGateTemp, ValueType::kFloat32, false))
    c.gate_temp = t->as_f32();
  else l.defaulted.push_back({keys::kGateTemp, "1"});
  if (const Value* g = metadata_value(r, keys::kGatingFunc, ValueType::kUint32, false)) {
    const uint64_t id = g->as_uint();
    if (id != gating_id(c.score_func))
      throw InputError(file + ": metadata key \"" + keys::kGatingFunc +
                       "\" = " + std::to_string(id) +
                       " (1 softmax, 2 sigmoid, 4 sqrtsoftplus) disagrees with \"" +
                       keys::kScoreFunc + "\" = \"" + to_string(c.score_func) + "\"");
  }
}

// deepseek4 / deepseek41: llama.cpp's keys under the architecture's prefix.
void read_deepseek4(const gguf::Reader& r, const std::string& p, MoeConfig& c, ModelLayout& l) {
  const std::string& file = r.name();
  const int64_t blocks = get_count(r, p + "block_count");
  int64_t nextn = 0;
  if (const Value* v = metadata_value(r, p + "nextn_predict_layers", ValueType::kUint32, false))
    nextn = static_cast<int64_t>(v->as_uint());
  if (blocks < 1 || nextn >= blocks || blocks > std::numeric_limits<int>::max())
    throw InputError(file + ": metadata keys \"" + p + "block_count\" = " + std::to_string(blocks) +
                     " and \"" + p + "nextn_predict_layers\" = " + std::to_string(nextn) +
                     " leave no MoE layer");
  l.n_layers = static_cast<int>(blocks - nextn);
  l.nextn_layers = static_cast<int>(nextn);
  c.dim = get_count(r, p + "embedding_length");
  c.inter = get_count(r, p + "expert_feed_forward_length");
  c.n_routed = get_count(r, p + "expert_count");
  c.topk = get_count(r, p + "expert_used_count");
  c.n_shared = get_count(r, p + "expert_shared_count");
  c.route_scale =
      metadata_value(r, p + "expert_weights_scale", ValueType::kFloat32, true)->as_f32();
  const std::string gk = p + "expert_gating_func";
  c.score_func = score_of_gating(r, gk, metadata_value(r, gk, ValueType::kUint32, true)->as_uint());
  if (const Value* v = metadata_value(r, p + "expert_weights_norm", ValueType::kBool, false))
    c.norm_topk_prob = v->as_bool();
  else l.defaulted.push_back({p + "expert_weights_norm", "true"});
  if (const Value* v = metadata_value(r, keys::kGateTemp, ValueType::kFloat32, false))
    c.gate_temp = v->as_f32();
  else l.defaulted.push_back({keys::kGateTemp, "1"});
  if (const Value* v = metadata_value(r, p + "hash_layer_count", ValueType::kUint32, false))
    l.hash_layers =
        static_cast<int>(std::min<uint64_t>(v->as_uint(), static_cast<uint64_t>(blocks)));
  else l.defaulted.push_back({p + "hash_layer_count", "0"});
  l.clamp_exp = per_layer_floats(r, p + "swiglu_clamp_exp", blocks, true);
  l.clamp_shexp = per_layer_floats(r, p + "swiglu_clamp_shexp", blocks, false);
  if (l.clamp_shexp.empty()) {
    l.clamp_shexp = l.clamp_exp;
    l.defaulted.push_back({p + "swiglu_clamp_shexp", "swiglu_clamp_exp"});
  }
  for (int L = 0; L < blocks; ++L) {
    const size_t i = static_cast<size_t>(L);
    for (const auto& [name, v] : {std::pair{"swiglu_clamp_exp", l.clamp_exp[i]},
                                  std::pair{"swiglu_clamp_shexp", l.clamp_shexp[i]}})
      if (!std::isfinite(v))
        throw InputError(file + ": metadata key \"" + p + name + "\": layer " + std::to_string(L) +
                         " holds " + fmt(v) + ", expected a finite limit");
  }
  c = l.layer_config(c, 0);
}

}  // namespace

const char* architecture_name(Convention c) {
  switch (c) {
    case Convention::kMoecheck: return "deepseek2";
    case Convention::kDeepseek4: return "deepseek4";
    case Convention::kDeepseek41: return "deepseek41";
  }
  return "?";
}

Convention parse_convention(const std::string& name, const std::string& where) {
  for (Convention c : {Convention::kMoecheck, Convention::kDeepseek4, Convention::kDeepseek41})
    if (name == architecture_name(c)) return c;
  throw InputError(where + ": expected \"deepseek2\" (moecheck's convention), \"deepseek4\" or " +
                   "\"deepseek41\", found \"" + name + "\"");
}

MoeConfig ModelLayout::layer_config(const MoeConfig& file, int L) const {
  MoeConfig c = file;
  if (clamp_exp.empty() || L < 0 || static_cast<size_t>(L) >= clamp_exp.size()) return c;
  c.swiglu_limit = clamp_exp[static_cast<size_t>(L)];
  const float sh = clamp_shexp[static_cast<size_t>(L)];
  c.swiglu_limit_shared = sh == c.swiglu_limit ? std::nullopt : std::optional<float>(sh);
  return c;
}

void read_model_metadata(const gguf::Reader& r, MoeConfig& config, ModelLayout& layout) {
  const std::string arch = metadata_value(r, keys::kArchitecture, ValueType::kString, true)->str;
  const Convention conv =
      parse_convention(arch, r.name() + ": metadata key \"" + keys::kArchitecture + "\"");
  layout.convention = conv;
  if (conv == Convention::kMoecheck) read_moecheck(r, config, layout);
  else read_deepseek4(r, arch + ".", config, layout);
  config.validate(r.name());
}

void write_model_metadata(gguf::Writer& w, const MoeConfig& c, const ModelLayout& l) {
  if (l.convention == Convention::kMoecheck) {
    add_config_metadata(w, c, l.n_layers);  // writes the architecture and version too
    return;
  }
  const std::string arch = architecture_name(l.convention);
  w.set(keys::kArchitecture, gguf::make_string(arch));
  w.set(keys::kQuantVersion, gguf::make_uint32(2));
  const std::string p = arch + ".";
  w.set(p + "block_count", count_value(l.n_layers, p + "block_count"));
  w.set(p + "embedding_length", count_value(c.dim, p + "embedding_length"));
  w.set(p + "expert_feed_forward_length", count_value(c.inter, p + "expert_feed_forward_length"));
  w.set(p + "expert_count", count_value(c.n_routed, p + "expert_count"));
  w.set(p + "expert_used_count", count_value(c.topk, p + "expert_used_count"));
  w.set(p + "expert_shared_count", count_value(c.n_shared, p + "expert_shared_count"));
  w.set(p + "expert_weights_scale", gguf::make_float32(c.route_scale));
  w.set(p + "expert_weights_norm", gguf::make_bool(c.norm_topk_prob));
  w.set(p + "expert_gating_func", gguf::make_uint32(gating_id(c.score_func)));
  w.set(p + "hash_layer_count", count_value(l.hash_layers, p + "hash_layer_count"));
  auto arr = [&](const std::vector<float>& v, float fallback) {
    std::vector<Value> items;
    for (int L = 0; L < l.n_layers; ++L)
      items.push_back(gguf::make_float32(v.empty() ? fallback : v[static_cast<size_t>(L)]));
    return gguf::make_array(ValueType::kFloat32, std::move(items));
  };
  w.set(p + "swiglu_clamp_exp", arr(l.clamp_exp, c.swiglu_limit));
  w.set(p + "swiglu_clamp_shexp", arr(l.clamp_shexp, c.shared_swiglu_limit()));
  // model.py's gate_temp has no llama.cpp key; written only when it is not model.py's default.
  if (c.gate_temp != 1.0f) w.set(keys::kGateTemp, gguf::make_float32(c.gate_temp));
}

}  // namespace moecheck
