// model.py Gate (lines 792-827) in the reference: router logits in f32 (Model) or f64 (Exact),
// and the f64 twin of the shared f32 routing rule (core/routing.cpp). Contract:
// docs/reference.md "Routing".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/numfmt.h"
#include "reference/linear.h"
#include "reference/moe.h"

namespace moecheck::ref {
namespace {

MatView router_view(const LayerWeights& w) {
  return MatView{w.router_type, w.config.n_routed, w.config.dim,
                 reinterpret_cast<const uint8_t*>(w.router)};
}

// softplus(z) = log(1 + e^z) without torch's threshold (Exact mode computes the function itself);
// written so that neither branch overflows.
double softplus_f64(double z) {
  return z > 0.0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

ExactRouting route_from_logits_exact(const double* logits, int64_t tokens, const RouteBias& rb,
                                     const MoeConfig& c, int layer) {
  const int64_t n = c.n_routed;
  const int64_t k = c.topk;
  const std::string where = "layer " + std::to_string(layer);
  if (n <= 0 || k <= 0 || k > n)
    throw InputError(where + ": routing needs 1 <= topk <= n_routed, found topk " +
                     std::to_string(k) + ", n_routed " + std::to_string(n));
  ExactRouting r;
  r.tokens = tokens;
  r.topk = k;
  r.ids.resize(static_cast<size_t>(tokens * k));
  r.weights.resize(static_cast<size_t>(tokens * k));
  r.scores.resize(static_cast<size_t>(tokens * n));
  std::vector<double> keys(static_cast<size_t>(n));
  std::vector<int32_t> order(static_cast<size_t>(n));
  const double temp = c.gate_temp;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* z = logits + t * n;
    const float* bias = rb.of(t);  // torch.where(image_mask, bias_vl, bias)
    double* s = r.scores.data() + t * n;
    // scores = linear(...) / self.gate_temp, then the score_func branch.
    for (int64_t e = 0; e < n; ++e) s[e] = z[e] / temp;
    if (c.score_func == ScoreFunc::kSqrtSoftplus) {
      for (int64_t e = 0; e < n; ++e) s[e] = std::sqrt(softplus_f64(s[e]));
    } else if (c.score_func == ScoreFunc::kSigmoid) {
      for (int64_t e = 0; e < n; ++e) s[e] = 1.0 / (1.0 + std::exp(-s[e]));
    } else {
      double m = s[0];
      for (int64_t e = 1; e < n; ++e) m = std::max(m, s[e]);
      double sum = 0.0;
      for (int64_t e = 0; e < n; ++e) sum += (s[e] = std::exp(s[e] - m));
      for (int64_t e = 0; e < n; ++e) s[e] /= sum;
    }
    // (scores + bias): a NaN key anywhere is an error, as in the f32 rule.
    for (int64_t e = 0; e < n; ++e) keys[e] = s[e] + static_cast<double>(bias[e]);
    int64_t bad = -1;
    for (int64_t e = 0; e < n && bad < 0; ++e)
      if (std::isnan(z[e]) || std::isnan(bias[e])) bad = e;
    for (int64_t e = 0; e < n && bad < 0; ++e)
      if (std::isnan(keys[e])) bad = e;
    if (bad >= 0)
      throw InputError(where + " token " + std::to_string(t) + " expert " + std::to_string(bad) +
                       ": routing key is NaN (logit " + fmt(z[bad]) + ", score " + fmt(s[bad]) +
                       ", bias " + fmt(bias[bad]) + ")");
    // .topk(): descending keys, exact ties to the lower id.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
    });
    int32_t* ids = r.ids.data() + t * k;
    double* w = r.weights.data() + t * k;
    for (int64_t j = 0; j < k; ++j) w[j] = s[ids[j] = order[j]];  // scores.gather(1, indices)
    if (c.norm_topk_prob && k > 1) {  // weights /= weights.sum(...) + 1e-20
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += w[j];
      sum += 1e-20;
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
    }
    for (int64_t j = 0; j < k; ++j) w[j] *= static_cast<double>(c.route_scale);  // *= route_scale
  }
  return r;
}

std::vector<float> Gate::logits(const uint16_t* x_bf16, int64_t T) const {
  // linear(x.float(), self.weight.float()): bf16 widened exactly, products and sums in f32.
  const int64_t dim = w_.config.dim;
  std::vector<float> x(static_cast<size_t>(T * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x_bf16[i]);
  std::vector<float> z(static_cast<size_t>(T * w_.config.n_routed));
  linear_f32(router_view(w_), x.data(), T, z.data());
  return z;
}

std::vector<double> Gate::logits_exact(const uint16_t* x_bf16, int64_t T) const {
  const int64_t dim = w_.config.dim;
  std::vector<double> x(static_cast<size_t>(T * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x_bf16[i]);
  std::vector<double> z(static_cast<size_t>(T * w_.config.n_routed));
  linear_f64(router_view(w_), x.data(), T, z.data());
  return z;
}

Routing Gate::forward(const uint16_t* x_bf16, int64_t T, const uint8_t* image_mask) const {
  const std::vector<float> z = logits(x_bf16, T);
  return route_from_logits(z.data(), T, RouteBias{w_.bias, w_.bias_vl, image_mask}, w_.config,
                           w_.layer);
}

ExactRouting Gate::forward_exact(const uint16_t* x_bf16, int64_t T,
                                 const uint8_t* image_mask) const {
  const std::vector<double> z = logits_exact(x_bf16, T);
  return route_from_logits_exact(z.data(), T, RouteBias{w_.bias, w_.bias_vl, image_mask}, w_.config,
                                 w_.layer);
}

}  // namespace moecheck::ref
