// validate_taps (compare/bounds_detail.h): the taps a leg reads must hold every stage with the
// shapes of the layer's config; otherwise an InputError naming the layer and the stage.
#include "compare/bounds_detail.h"
#include "core/error.h"

namespace moecheck::bounds_detail {
namespace {

void need(bool ok, const LayerTaps& t, const std::string& stage, size_t expected, size_t found) {
  if (!ok)
    throw InputError("bounds check, layer " + std::to_string(t.layer) + ": stage " + stage +
                     ": expected " + std::to_string(expected) + " values, found " +
                     std::to_string(found) + " (the emulation must run with every stage tapped)");
}

// h_q8 exists only where the down projection is a K-quant MMVQ (not for a bf16 shared expert).
void validate_expert(const LayerTaps& t, const ExpertTaps& e, const std::string& name,
                     const MoeConfig& c, bool q8) {
  const size_t n = e.tokens.size();
  for (int32_t tok : e.tokens)
    if (tok < 0 || tok >= t.tokens)
      throw InputError("bounds check, layer " + std::to_string(t.layer) + ": " + name + ": token " +
                       std::to_string(tok) + " out of range [0, " + std::to_string(t.tokens) + ")");
  const size_t ni = n * static_cast<size_t>(c.inter), nd = n * static_cast<size_t>(c.dim);
  need(e.gate.size() == ni, t, name + ".gate", ni, e.gate.size());
  need(e.up.size() == ni, t, name + ".up", ni, e.up.size());
  need(e.h.size() == ni, t, name + ".h", ni, e.h.size());
  if (q8) need(e.h_q8.size() == ni / kQK8_1, t, name + ".h_q8", ni / kQK8_1, e.h_q8.size());
  need(e.down.size() == nd, t, name + ".down", nd, e.down.size());
}

}  // namespace

void validate_taps(const LayerWeights& w, const LayerTaps& t) {
  const MoeConfig& c = w.config;
  const auto T = static_cast<size_t>(t.tokens), dim = static_cast<size_t>(c.dim);
  const auto E = static_cast<size_t>(c.n_routed), K = static_cast<size_t>(c.topk);
  need(t.input.size() == T * dim, t, "input", T * dim, t.input.size());
  need(t.image_mask.empty() || t.image_mask.size() == T, t, "image_mask (or none)", T,
       t.image_mask.size());
  need(t.router_logits.size() == T * E, t, "router_logits", T * E, t.router_logits.size());
  need(t.topk_ids.size() == T * K, t, "topk_ids", T * K, t.topk_ids.size());
  need(t.topk_weights.size() == t.topk_ids.size(), t, "topk_weights", t.topk_ids.size(),
       t.topk_weights.size());
  need(t.x_q8.size() == T * dim / kQK8_1, t, "x_q8", T * dim / kQK8_1, t.x_q8.size());
  need(t.acc.size() == T * dim, t, "acc", T * dim, t.acc.size());
  need(t.output.size() == T * dim, t, "output", T * dim, t.output.size());
  need(t.shared.tokens.size() == T, t, "shared.tokens", T, t.shared.tokens.size());
  validate_expert(t, t.shared, "shared", c, w.shared_down.type != GgmlType::kBF16);
  for (const ExpertTaps& e : t.experts) {
    if (e.expert < 0 || e.expert >= c.n_routed)
      throw InputError("bounds check, layer " + std::to_string(t.layer) + ": expert id " +
                       std::to_string(e.expert) + " out of range [0, " +
                       std::to_string(c.n_routed) + ")");
    validate_expert(t, e, "experts." + std::to_string(e.expert), c, true);
  }
}

}  // namespace moecheck::bounds_detail
