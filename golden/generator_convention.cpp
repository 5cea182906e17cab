// The generator's convention options (golden/generator.h GenOptions: convention, router type,
// per-layer clamps, hash-routed layers): their checks, how they are read back from a written
// file, and the hash table tensor. Contract: docs/gguf.md "Conventions" and "Synthetic models".
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "golden/generator.h"

namespace moecheck {

void generate_hash_table(const GenOptions& o, int32_t* out) {
  const MoeConfig& c = o.config;
  const int64_t stride = std::max<int64_t>(1, c.n_routed / c.topk);
  for (int64_t t = 0; t < o.hash_vocab; ++t)
    for (int64_t j = 0; j < c.topk; ++j)
      out[t * c.topk + j] = static_cast<int32_t>((t + j * stride) % c.n_routed);
}

namespace detail {

void validate_convention(const GenOptions& o, const std::string& where) {
  if (o.router_type != GgmlType::kBF16 && o.router_type != GgmlType::kF16)
    throw InputError(where + ": router type must be BF16 or F16");
  const bool moecheck = o.convention == Convention::kMoecheck;
  for (const auto* v : {&o.swiglu_limits, &o.swiglu_limits_shared}) {
    if (v->empty()) continue;
    if (moecheck)
      throw InputError(where + ": per-layer SwiGLU limits need the deepseek4 or deepseek41 " +
                       "convention (moecheck's deepseek2 files hold one limit)");
    if (static_cast<int>(v->size()) != o.n_layers)
      throw InputError(where + ": " + std::to_string(v->size()) +
                       " per-layer SwiGLU limit(s) for " + std::to_string(o.n_layers) +
                       " layer(s)");
    for (float x : *v)
      if (!std::isfinite(x)) throw InputError(where + ": a per-layer SwiGLU limit is not finite");
  }
  if (o.hash_layers < 0 || o.hash_layers >= o.n_layers ||
      (o.hash_layers > 0 && o.convention != Convention::kDeepseek4))
    throw InputError(where + ": hash-routed layers (" + std::to_string(o.hash_layers) +
                     ") need the deepseek4 convention and at least one routed layer after them (" +
                     std::to_string(o.n_layers) + " layer(s))");
  if (o.hash_layers > 0 && (o.hash_vocab < 1 || o.hash_vocab > (int64_t{1} << 24)))
    throw InputError(where + ": hash table vocabulary must be in [1, 2^24]");
}

void conventions_from_model(const ModelFile& m, GenOptions& o) {
  const ModelLayout& l = m.layout();
  o.convention = l.convention;
  o.hash_layers = l.hash_layers;
  if (l.hash_layers > 0) {
    const gguf::TensorInfo* t = m.gguf().find_tensor(hash_table_name(0));
    if (t && t->n_dims == 2) o.hash_vocab = t->ne[1];
  }
  // Written as arrays by every non-moecheck convention; kept per layer only where they vary or
  // the shared expert's differs, so the options compare equal to what wrote the file.
  const bool varies = std::adjacent_find(l.clamp_exp.begin(), l.clamp_exp.end(),
                                         std::not_equal_to<>()) != l.clamp_exp.end() ||
                      std::adjacent_find(l.clamp_shexp.begin(), l.clamp_shexp.end(),
                                         std::not_equal_to<>()) != l.clamp_shexp.end();
  if (varies) {
    o.swiglu_limits = l.clamp_exp;
    o.swiglu_limits_shared = l.clamp_shexp;
  }
  const int L0 = std::min(l.hash_layers, m.n_layers() - 1);
  const gguf::TensorInfo* r = m.gguf().find_tensor(tensor_name(L0, LayerTensor::kRouter));
  if (r) o.router_type = static_cast<GgmlType>(r->type);
}

void add_hash_table(gguf::Writer& w, const GenOptions& o, int layer) {
  const int64_t K = o.config.topk;
  const uint64_t bytes = static_cast<uint64_t>(K * o.hash_vocab) * 4;
  constexpr uint32_t kGgmlI32 = 26;  // ggml's GGML_TYPE_I32
  w.add_tensor(gguf::TensorSpec{hash_table_name(layer),
                                kGgmlI32,
                                {K, o.hash_vocab},
                                bytes,
                                [&o](uint64_t, uint8_t* out, uint64_t) {
                                  generate_hash_table(o, reinterpret_cast<int32_t*>(out));
                                }});
}

}  // namespace detail
}  // namespace moecheck
