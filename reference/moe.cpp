// model.py MoE (lines 854-904) in the reference: route, run each picked expert on the tokens that
// picked it (ascending expert id, as model.py's loop), add the shared expert, round once to bf16.
// Also the one-rounding f64 -> bf16 conversion. Contract:
// reference/moe.h and docs/reference.md.
#include "reference/moe.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/numfmt.h"

namespace moecheck::ref {
namespace {

// Per expert, the tokens that picked it (ascending) and their weights: torch.where(indices == i).
template <typename W>
void group_by_expert(const std::vector<int32_t>& ids, const std::vector<W>& weights, int64_t T,
                     int64_t k, int64_t n, std::vector<std::vector<int32_t>>& tok,
                     std::vector<std::vector<W>>& wt) {
  tok.assign(static_cast<size_t>(n), {});
  wt.assign(static_cast<size_t>(n), {});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[static_cast<size_t>(t * k + j)];
      tok[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t));
      wt[static_cast<size_t>(e)].push_back(weights[static_cast<size_t>(t * k + j)]);
    }
}

// The taps of one routed expert (its tokens and their routing weights) and of the shared expert
// (every token, weight 1), filled the same way by both precision modes.
template <typename W>
ExpertTaps* expert_taps(LayerTaps* taps, int64_t e, const std::vector<int32_t>& tokens,
                        const std::vector<W>& w) {
  if (!taps) return nullptr;
  ExpertTaps* et = &taps->experts.emplace_back();
  et->expert = static_cast<int32_t>(e);
  et->tokens = tokens;
  et->weights.assign(w.begin(), w.end());
  return et;
}

ExpertTaps* shared_taps(LayerTaps* taps, int64_t T) {
  if (!taps) return nullptr;
  fill_shared_taps(taps->shared, T);
  return &taps->shared;
}

}  // namespace

uint16_t f64_to_bf16(double v) {
  if (std::isnan(v)) return f32_to_bf16(static_cast<float>(v));
  // Round to odd into f32 (truncate toward zero, set the last bit when inexact), then nearest
  // even to bf16: with 16 extra bits the odd bit only breaks exact-looking ties, so the result is
  // the correctly rounded bf16 of v (Boldo and Melquiond's round-to-odd argument).
  float f = static_cast<float>(v);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != v) {
    uint32_t u = f32_bits(f) | 1u;
    f = bits_f32(u);
  }
  return f32_to_bf16(f);
}

MoE::MoE(const LayerWeights& w, Precision p) : w_(w), p_(p) {
  validate_layer_weights(w, "ref::MoE", WeightTypes::kDequantized);
}

Expert MoE::routed(int64_t e) const {
  return Expert(w_.gate_exps.expert(e), w_.up_exps.expert(e), w_.down_exps.expert(e),
                w_.config.swiglu_limit);
}

Expert MoE::shared() const {
  return Expert(w_.shared_gate, w_.shared_up, w_.shared_down, w_.config.shared_swiglu_limit());
}

std::vector<uint16_t> MoE::forward(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                   const uint8_t* image_mask) const {
  return to_bf16(forward_exact(x_bf16, T, taps, image_mask));
}

std::vector<uint16_t> MoE::to_bf16(const std::vector<double>& y) const {
  std::vector<uint16_t> out(y.size());
  // return y.type_as(x): Model mode's y is f32 (the double holds it exactly); Exact rounds once.
  for (size_t i = 0; i < y.size(); ++i)
    out[i] = p_ == Precision::kModel ? f32_to_bf16(static_cast<float>(y[i])) : f64_to_bf16(y[i]);
  return out;
}

std::vector<double> MoE::forward_exact(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                       const uint8_t* image_mask) const {
  if (T < 0)
    throw InputError("layer " + std::to_string(w_.layer) + ": negative token count " +
                     std::to_string(T));
  if (taps) {
    *taps = LayerTaps{};
    taps->layer = w_.layer;
    taps->tokens = T;
    taps->input.assign(x_bf16, x_bf16 + T * w_.config.dim);
    if (image_mask != nullptr) taps->image_mask.assign(image_mask, image_mask + T);
  }
  std::vector<double> y = p_ == Precision::kModel ? forward_model(x_bf16, T, taps, image_mask)
                                                  : forward_f64(x_bf16, T, taps, image_mask);
  if (taps) {
    taps->acc.assign(y.begin(), y.end());
    taps->output = to_bf16(y);
  }
  return y;
}

std::vector<double> MoE::forward_model(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                       const uint8_t* image_mask) const {
  const MoeConfig& c = w_.config;
  const int64_t dim = c.dim;
  std::vector<float> x(static_cast<size_t>(T * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x_bf16[i]);
  // weights, indices = self.gate(x, image_mask): bias_vl for the image-span tokens
  const Gate gate(w_);
  const std::vector<float> logits = gate.logits(x_bf16, T);
  const Routing r =
      route_from_logits(logits.data(), T, RouteBias{w_.bias, w_.bias_vl, image_mask}, c, w_.layer);
  if (taps) {
    taps->router_logits = logits;
    taps->topk_ids = r.ids;
    taps->topk_weights = r.weights;
  }
  // y = torch.zeros_like(x, dtype=torch.float32)
  std::vector<float> y(static_cast<size_t>(T * dim), 0.0f);
  std::vector<std::vector<int32_t>> tok;
  std::vector<std::vector<float>> wt;
  group_by_expert(r.ids, r.weights, T, c.topk, c.n_routed, tok, wt);
  std::vector<float> xe;
  for (int64_t e = 0; e < c.n_routed; ++e) {  // for i in range(...): if counts[i] == 0: continue
    const auto& idx = tok[static_cast<size_t>(e)];
    if (idx.empty()) continue;
    const int64_t n = static_cast<int64_t>(idx.size());
    xe.resize(static_cast<size_t>(n * dim));
    for (int64_t i = 0; i < n; ++i)  // x[idx]
      std::memcpy(xe.data() + i * dim, x.data() + idx[static_cast<size_t>(i)] * dim,
                  sizeof(float) * dim);
    ExpertTaps* et = expert_taps(taps, e, idx, wt[static_cast<size_t>(e)]);
    const std::vector<float> out =
        routed(e).forward(xe.data(), n, wt[static_cast<size_t>(e)].data(), et);
    for (int64_t i = 0; i < n; ++i)  // y[idx] += expert(x[idx], weights[idx, top, None]), f32
      for (int64_t d = 0; d < dim; ++d)
        y[idx[static_cast<size_t>(i)] * dim + d] += out[i * dim + d];
  }
  // y += self.shared_experts(x)
  ExpertTaps* st = shared_taps(taps, T);
  const std::vector<float> sh = shared().forward(x.data(), T, nullptr, st);
  for (size_t i = 0; i < y.size(); ++i) y[i] += sh[i];
  return std::vector<double>(y.begin(), y.end());
}

std::vector<double> MoE::forward_f64(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                     const uint8_t* image_mask) const {
  const MoeConfig& c = w_.config;
  const int64_t dim = c.dim;
  std::vector<double> x(static_cast<size_t>(T * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x_bf16[i]);
  const Gate gate(w_);
  const std::vector<double> logits = gate.logits_exact(x_bf16, T);
  const ExactRouting r = route_from_logits_exact(
      logits.data(), T, RouteBias{w_.bias, w_.bias_vl, image_mask}, c, w_.layer);
  if (taps) {
    taps->router_logits.assign(logits.begin(), logits.end());
    taps->topk_ids = r.ids;
    taps->topk_weights.assign(r.weights.begin(), r.weights.end());
  }
  std::vector<double> y(static_cast<size_t>(T * dim), 0.0);
  std::vector<std::vector<int32_t>> tok;
  std::vector<std::vector<double>> wt;
  group_by_expert(r.ids, r.weights, T, c.topk, c.n_routed, tok, wt);
  std::vector<double> xe;
  for (int64_t e = 0; e < c.n_routed; ++e) {
    const auto& idx = tok[static_cast<size_t>(e)];
    if (idx.empty()) continue;
    const int64_t n = static_cast<int64_t>(idx.size());
    xe.resize(static_cast<size_t>(n * dim));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xe.data() + i * dim, x.data() + idx[static_cast<size_t>(i)] * dim,
                  sizeof(double) * dim);
    ExpertTaps* et = expert_taps(taps, e, idx, wt[static_cast<size_t>(e)]);
    const std::vector<double> out =
        routed(e).forward_exact(xe.data(), n, wt[static_cast<size_t>(e)].data(), et);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < dim; ++d)
        y[idx[static_cast<size_t>(i)] * dim + d] += out[i * dim + d];
  }
  ExpertTaps* st = shared_taps(taps, T);
  const std::vector<double> sh = shared().forward_exact(x.data(), T, nullptr, st);
  for (size_t i = 0; i < y.size(); ++i) y[i] += sh[i];
  return y;
}

}  // namespace moecheck::ref
