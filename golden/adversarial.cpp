// adversarial_tokens (golden/adversarial.h): tokens crafted from a layer's weights. Dot products
// are taken in f64 on exactly dequantised weights (core/kquant.h) and the routing is the shared
// rule (core/routing.h), so a token is kept only when its edge case is reached on the bf16 token
// itself, not on an approximation of it.
#include "golden/adversarial.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/kquant.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "golden/generator.h"

namespace moecheck {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<double>& v) {
  std::vector<uint16_t> x(v.size());
  for (size_t i = 0; i < v.size(); ++i) x[i] = f32_to_bf16(static_cast<float>(v[i]));
  return x;
}

std::vector<double> widen(const std::vector<uint16_t>& x) {
  std::vector<double> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) v[i] = bf16_to_f32(x[i]);
  return v;
}

// m . x for every row of a matrix view, in f64 on the dequantised rows.
std::vector<double> matvec(const MatView& m, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(m.rows));
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    dequantize_row(m.type, m.row(r), row.data(), m.cols);
    double s = 0;
    for (int64_t k = 0; k < m.cols; ++k) s += row[k] * x[k];
    y[r] = s;
  }
  return y;
}

MatView router_view(const LayerWeights& w) {
  return MatView{w.router_type, w.config.n_routed, w.config.dim,
                 reinterpret_cast<const uint8_t*>(w.router)};
}

// The picks of one token under the shared routing rule, from f64 logits rounded to f32.
std::vector<int32_t> picks(const LayerWeights& w, const std::vector<double>& logits) {
  std::vector<float> z(logits.begin(), logits.end());
  return route_from_logits(z.data(), 1, w.bias, w.config, w.layer).ids;
}

// Whether, in the token's picked experts, gate passes +L and -L and up passes +L and -L.
bool reaches_clamps(const LayerWeights& w, const std::vector<uint16_t>& xb) {
  const std::vector<double> x = widen(xb);
  const double L = w.config.swiglu_limit;
  double gmax = -INFINITY, gmin = INFINITY, umax = -INFINITY, umin = INFINITY;
  for (int32_t e : picks(w, matvec(router_view(w), x))) {
    for (double g : matvec(w.gate_exps.expert(e), x))
      gmax = std::max(gmax, g), gmin = std::min(gmin, g);
    for (double u : matvec(w.up_exps.expert(e), x))
      umax = std::max(umax, u), umin = std::min(umin, u);
  }
  return gmax > L && gmin < -L && umax > L && umin < -L;
}

// A seeded token scaled by 1.5^i until it reaches both clamps of gate and up (or none does: then
// the largest scale tried).
AdversarialToken clamp_token(const LayerWeights& w, uint64_t seed) {
  const std::vector<double> x0 = widen(generate_input(seed, 1, w.config.dim));
  AdversarialToken out{"clamps", false, {}};
  double s = 1.0;
  for (int i = 0; i < 24; ++i, s *= 1.5) {
    std::vector<double> x(x0.size());
    for (size_t k = 0; k < x.size(); ++k) x[k] = s * x0[k];
    out.x = to_bf16(x);
    if (w.config.swiglu_limit > 0 && reaches_clamps(w, out.x)) {
      out.made = true;
      break;
    }
  }
  return out;
}

// A token anti-aligned with every router row, scaled so its largest logit / gate_temp is
// `target` (-75 under sqrt-softplus: scores near e^-37.5, their sum near 1e-16, so model.py's
// +1e-20 moves each weight by about 1e-4 of itself, far above an f32 ulp, and f32 does not
// underflow; -40 under sigmoid likewise).
bool eps_token(const LayerWeights& w, std::vector<uint16_t>& out) {
  const MoeConfig& c = w.config;
  double target = 0;
  if (c.score_func == ScoreFunc::kSqrtSoftplus) target = -75.0;
  else if (c.score_func == ScoreFunc::kSigmoid) target = -40.0;
  else return false;  // softmax scores sum to 1: the 1e-20 never matters
  const MatView r = router_view(w);
  std::vector<double> v(static_cast<size_t>(c.dim), 0.0);
  std::vector<float> row(static_cast<size_t>(c.dim));
  for (int64_t e = 0; e < c.n_routed; ++e) {
    dequantize_row(r.type, r.row(e), row.data(), c.dim);
    for (int64_t k = 0; k < c.dim; ++k) v[k] -= row[k];
  }
  double vmax = 0;
  for (double a : v) vmax = std::max(vmax, std::fabs(a));
  if (!(vmax > 0)) return false;
  for (double& a : v) a /= vmax;
  const std::vector<double> z = matvec(r, widen(to_bf16(v)));
  const double zmax = *std::max_element(z.begin(), z.end());
  if (!(zmax < 0)) return false;
  // Scores this small are far below the bias differences, so the picks are the top-k biases:
  // rescale until the largest *picked* logit / gate_temp sits within 2 of the target (so the
  // largest picked score is far from f32's subnormal exp, where its own rounding would hide the
  // +1e-20), then keep the token when its picked scores (f32, the shared rule) sum to more than
  // 0 and less than 2^20 * 1e-20 (the +1e-20 is then more than 8 f32 ulps of the sum).
  double scale = target * c.gate_temp / zmax;
  std::vector<uint16_t> xb;
  for (int pass = 0; pass < 8; ++pass) {
    std::vector<double> x(v.size());
    for (size_t k = 0; k < x.size(); ++k) x[k] = scale * v[k];
    xb = to_bf16(x);
    const std::vector<double> zb = matvec(r, widen(xb));
    const std::vector<float> zf(zb.begin(), zb.end());
    const Routing rt = route_from_logits(zf.data(), 1, w.bias, c, w.layer);
    double sum = 0, zpick = -INFINITY;
    for (int32_t e : rt.ids) {
      sum += rt.scores[static_cast<size_t>(e)];
      zpick = std::max(zpick, zb[static_cast<size_t>(e)]);
    }
    const bool on_target = std::fabs(zpick / c.gate_temp - target) <= 2.0;
    if (on_target && sum > 0 && sum < 0x1p20 * 1e-20) break;
    if (pass == 7 || !(zpick < 0)) return false;
    scale *= target * c.gate_temp / zpick;
  }
  out = xb;
  return true;
}

}  // namespace

std::vector<AdversarialToken> adversarial_tokens(const LayerWeights& w, uint64_t seed) {
  const int64_t dim = w.config.dim;
  std::vector<AdversarialToken> out;
  out.push_back(
      clamp_token(w, stream_key(seed, static_cast<uint64_t>(w.layer), 0x636c616d70ull, 0)));
  out.push_back({"zero", true, std::vector<uint16_t>(static_cast<size_t>(dim), 0)});
  // The zero token plus 2^-20 of a seeded token: logits of order 1e-6, so the bias tie at the
  // top-k boundary is decided by logit differences a few f32 ulps of the key apart.
  std::vector<double> tiny = widen(
      generate_input(stream_key(seed, static_cast<uint64_t>(w.layer), 0x6e656172ull, 0), 1, dim));
  for (double& a : tiny) a *= 0x1p-20;
  out.push_back({"near-tie", true, to_bf16(tiny)});
  AdversarialToken eps{"eps", false, std::vector<uint16_t>(static_cast<size_t>(dim), 0)};
  eps.made = eps_token(w, eps.x);
  out.push_back(eps);
  return out;
}

}  // namespace moecheck
