// The routing scores' error model (compare/bounds_detail.h ScoreBand): how far route_from_logits's
// f32 score of an expert can be from the f64 score of model.py's formula, given a bound on each
// logit's error. Contract: docs/numerics.md "Error bounds vs the reference's Exact mode", routing.
#include <algorithm>
#include <cmath>

#include "compare/bounds_detail.h"
#include "core/numfmt.h"

namespace moecheck::bounds_detail {

double score_abs_err(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: return std::sqrt(0x1p-149);
    case ScoreFunc::kSigmoid: return 0x1p-126;
    case ScoreFunc::kSoftmax: return 0x1p-148;
  }
  return 0;
}

double score64(ScoreFunc f, double z) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: return std::sqrt(std::log1p(std::exp(z)));
    case ScoreFunc::kSigmoid: return 1.0 / (1.0 + std::exp(-z));
    case ScoreFunc::kSoftmax: break;
  }
  return NAN;
}

namespace {

// Softmax over the row a = z / temp: s_e = exp(a_e - m) / sum_f exp(a_f - m). Logit errors
// |dz_f| <= dz move log s_e by at most (dz_e + max_f dz_f) / temp. The f32 evaluation (quotient
// by temp, max-subtracted argument, libm exp, a sum of n terms in id order, the division) adds a
// relative error eval_e = (1 + num_e)(1 + u) / ((1 - max_f num_f)(1 - gamma_{n-1})) - 1, with
// num_e = expm1(u (|a_e| + |m| + |a_e - m|)) + kScoreRel (the argument's three roundings, then
// exp); a term under f32's range adds 2^-148 absolute.
void softmax_band(const MoeConfig& c, const double* z, const double* dz, ScoreBand& b) {
  const int64_t n = c.n_routed;
  const double temp = c.gate_temp;
  double m = -INFINITY, dmax = 0;
  for (int64_t e = 0; e < n; ++e) {
    m = std::max(m, z[e] / temp);
    if (dz) dmax = std::max(dmax, dz[e] / std::fabs(temp));
  }
  std::vector<double> num(static_cast<size_t>(n));
  double sum = 0, worst = 0;
  for (int64_t e = 0; e < n; ++e) {
    const double a = z[e] / temp, da = dz ? dz[e] / std::fabs(temp) : 0.0;
    b.s[e] = std::exp(a - m);
    sum += b.s[e];
    num[e] = std::expm1(kU32 *
                        (std::fabs(a) + da + std::fabs(m) + dmax + std::fabs(a - m) + da + dmax)) +
             kScoreRel;
    worst = std::max(worst, num[e]);
  }
  const double g = gamma_f32(n - 1);
  for (int64_t e = 0; e < n; ++e) {
    b.s[e] /= sum;
    const double eval = (1 + num[e]) * (1 + kU32) / ((1 - worst) * (1 - g)) - 1;
    const double prop = std::expm1((dz ? dz[e] / std::fabs(temp) : 0.0) + dmax);
    b.err[e] = b.s[e] * ((1 + prop) * (1 + eval) - 1) + score_abs_err(ScoreFunc::kSoftmax);
  }
}

}  // namespace

ScoreBand score_band(const MoeConfig& c, const double* z, const double* dz) {
  const int64_t n = c.n_routed;
  ScoreBand b;
  b.s.resize(static_cast<size_t>(n));
  b.err.resize(static_cast<size_t>(n));
  if (c.score_func == ScoreFunc::kSoftmax) {
    softmax_band(c, z, dz, b);
    return b;
  }
  // A monotone score: the logit interval maps to a score interval; the f32 chain (quotient,
  // libm, sqrt or add and divide) is within kScoreRel of its value, or score_abs_err where f32
  // underflows.
  const double temp = c.gate_temp;
  for (int64_t e = 0; e < n; ++e) {
    const double d = dz ? dz[e] : 0.0;
    const double s = score64(c.score_func, z[e] / temp);
    const double s1 = score64(c.score_func, (z[e] + d) / temp),
                 s2 = score64(c.score_func, (z[e] - d) / temp);
    const double dev = std::max(std::fabs(s1 - s), std::fabs(s2 - s));
    b.s[e] = s;
    b.err[e] = dev + kScoreRel * (s + dev) + score_abs_err(c.score_func);
  }
  return b;
}

double weight_bound(const MoeConfig& c, double s, double err, double sum, double err_sum) {
  const int64_t K = c.topk;
  const double rs = std::fabs(static_cast<double>(c.route_scale));
  const double round = static_cast<double>(K + 4) * kU32;  // the f32 sum, + 1e-20, divide, scale
  if (!(c.norm_topk_prob && K > 1)) return rs * err + round * rs * (s + err);
  // |a'/b' - a/b| <= (|da| b + a |db|) / (b (b - |db|)) for a = s, b = sum + 1e-20.
  const double S = sum + 1e-20, lo = S - err_sum;
  if (!(lo > 0)) return INFINITY;
  const double dw = rs * (err * S + s * err_sum) / (S * lo);
  return dw + round * (rs * s / S + dw);
}

bool key_flip_explained(double s_e, double err_e, float b_e, double s_f, double err_f, float b_f) {
  const double hi_e = s_e + err_e + b_e, lo_f = s_f - err_f + b_f;
  // The f32 key add s + b rounds once on each side.
  return hi_e + kU32 * std::fabs(hi_e) >= lo_f - kU32 * std::fabs(lo_f);
}

}  // namespace moecheck::bounds_detail
