// The spec of a synthetic model, "synthetic:PRESET[,key=value...]", to GenOptions and back
// (golden/synthetic_model.h). Contract: docs/streaming.md "Synthetic models".
#include <algorithm>
#include <set>
#include <vector>

#include "core/error.h"
#include "golden/synthetic_model.h"

namespace moecheck {
namespace {

constexpr const char* kKnownKeys =
    "layers, seed, shared, blocks, alignment, convention, router, vision";

[[noreturn]] void bad_key(const std::string& spec, const std::string& key, const std::string& why) {
  throw InputError(spec + ": key \"" + key + "\": " + why +
                   " (docs/streaming.md \"Synthetic models\")");
}

std::vector<std::string> split_items(const std::string& body) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (true) {
    const size_t comma = body.find(',', pos);
    items.push_back(body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) return items;
    pos = comma + 1;
  }
}

// A decimal whole number in [lo, hi]; else the key's refusal.
uint64_t whole_number(const std::string& spec, const std::string& key, const std::string& v,
                      uint64_t lo, uint64_t hi) {
  std::string why = "expected a whole number in [";
  why.append(std::to_string(lo)).append(", ").append(std::to_string(hi)).append("], found \"");
  why.append(v).append("\"");
  if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos)
    bad_key(spec, key, why);
  uint64_t n = 0;
  for (char ch : v) {
    const uint64_t d = static_cast<uint64_t>(ch - '0');
    if (n > (UINT64_MAX - d) / 10) bad_key(spec, key, why);
    n = n * 10 + d;
  }
  if (n < lo || n > hi) bad_key(spec, key, why);
  return n;
}

// One of `choices`; else the key's refusal listing them.
std::string choice(const std::string& spec, const std::string& key, const std::string& v,
                   const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  bad_key(spec, key, "expected one of " + list + ", found \"" + v + "\"");
}

// Applies one key=value item; `router_given` says whether router= was among them.
void apply_item(const std::string& spec, const std::string& key, const std::string* value,
                GenOptions& o, bool& router_given) {
  if (key == "vision") {
    if (value) bad_key(spec, key, "a flag: takes no value, found \"" + *value + "\"");
    o.vision = true;
    return;
  }
  if (key != "layers" && key != "seed" && key != "shared" && key != "blocks" &&
      key != "alignment" && key != "convention" && key != "router")
    throw InputError(spec + ": unknown key \"" + key + "\" (known: " + kKnownKeys +
                     "; docs/streaming.md \"Synthetic models\")");
  if (!value) bad_key(spec, key, "needs a value (" + key + "=...)");
  const std::string& v = *value;
  if (key == "layers")
    o.n_layers = static_cast<int>(whole_number(spec, key, v, 1, kMaxSyntheticLayers));
  else if (key == "seed") o.seed = whole_number(spec, key, v, 0, UINT64_MAX);
  else if (key == "shared")
    o.shared = choice(spec, key, v, {"bf16", "kquant"}) == "kquant" ? SharedExpertType::kKQuant
                                                                    : SharedExpertType::kBF16;
  else if (key == "blocks")
    o.blocks = choice(spec, key, v, {"quantized", "random"}) == "random"
                   ? ExpertBlocks::kRandomValid
                   : ExpertBlocks::kQuantized;
  else if (key == "alignment") {
    const uint64_t a = whole_number(spec, key, v, kMinGenAlignment, kMaxGenAlignment);
    if ((a & (a - 1)) != 0) bad_key(spec, key, "expected a power of two, found " + v);
    o.alignment = static_cast<uint32_t>(a);
  } else if (key == "convention") {
    choice(spec, key, v, {"deepseek2", "deepseek4", "deepseek41"});
    o.convention = parse_convention(v, spec + ": key \"convention\"");
  } else {
    o.router_type =
        choice(spec, key, v, {"bf16", "f16"}) == "f16" ? GgmlType::kF16 : GgmlType::kBF16;
    router_given = true;
  }
}

}  // namespace

GenOptions parse_synthetic_spec(const std::string& spec) {
  const std::string prefix = kSyntheticPrefix;
  if (!is_synthetic_spec(spec))
    throw InputError(spec + ": not a synthetic model spec (expected " + prefix +
                     "PRESET[,key=value...])");
  const std::vector<std::string> items = split_items(spec.substr(prefix.size()));
  GenOptions o;
  try {
    o = preset_options(items[0]);
  } catch (const InputError&) {
    throw InputError(spec + ": unknown preset \"" + items[0] +
                     "\" (known: tiny, small, ds41; expected " + prefix + "PRESET[,key=value...])");
  }
  std::set<std::string> seen;
  bool router_given = false;
  for (size_t i = 1; i < items.size(); ++i) {
    const size_t eq = items[i].find('=');
    const std::string key = items[i].substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : items[i].substr(eq + 1);
    if (key.empty())
      throw InputError(spec + ": item " + std::to_string(i) + " \"" + items[i] +
                       "\" has no key (expected key=value or vision)");
    if (!seen.insert(key).second) bad_key(spec, key, "given twice");
    apply_item(spec, key, eq == std::string::npos ? nullptr : &value, o, router_given);
  }
  // As `gen`: the deepseek4 / deepseek41 conventions' routers are F16 unless router= says.
  if (!router_given)
    o.router_type = o.convention == Convention::kMoecheck ? GgmlType::kBF16 : GgmlType::kF16;
  try {
    o.validate();
  } catch (const InputError& e) {
    throw InputError(spec + ": " + e.what());
  }
  return o;
}

std::string synthetic_spec(const GenOptions& o) {
  const GenOptions p = preset_options(o.preset);
  const std::string what = "synthetic spec of preset \"" + o.preset + "\"";
  if (!(o.config == p.config) || !o.swiglu_limits.empty() || !o.swiglu_limits_shared.empty() ||
      o.hash_layers != 0)
    throw InputError(what +
                     ": a changed config, per-layer clamps or hash-routed layers have no "
                     "spec key (docs/streaming.md \"Synthetic models\")");
  std::string s = std::string(kSyntheticPrefix) + o.preset +
                  ",layers=" + std::to_string(o.n_layers) + ",seed=" + std::to_string(o.seed);
  if (o.shared != p.shared)
    s += o.shared == SharedExpertType::kKQuant ? ",shared=kquant" : ",shared=bf16";
  if (o.blocks != p.blocks)
    s += o.blocks == ExpertBlocks::kRandomValid ? ",blocks=random" : ",blocks=quantized";
  if (o.alignment != p.alignment) s += ",alignment=" + std::to_string(o.alignment);
  if (o.convention != p.convention)
    s += std::string(",convention=") + architecture_name(o.convention);
  const GgmlType router = o.convention == Convention::kMoecheck ? GgmlType::kBF16 : GgmlType::kF16;
  if (o.router_type != router)
    s += o.router_type == GgmlType::kF16 ? ",router=f16" : ",router=bf16";
  if (o.vision) s += ",vision";
  return s;
}

}  // namespace moecheck
