// Pieces shared by the steps of the bounds check (internal to compare/): the per-stage counter,
// the f64 score functions, the SwiGLU propagation bound and the per-expert down differences the
// accumulate bound needs. Contract: docs/numerics.md "Error bounds vs the reference's Exact mode".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "core/config.h"

namespace moecheck::bounds_detail {

// Every stage present with the config's shapes (the implementation ran with every stage
// tapped); InputError naming the layer and stage otherwise.
void validate_taps(const LayerWeights& w, const LayerTaps& t);

// score_func(z) in f64 (softmax has no per-expert form: NaN; score_band handles it).
double score64(ScoreFunc f, double z);

// The routing scores' error model (compare/score_band.cpp; docs/numerics.md "Error bounds vs the
// reference's Exact mode", routing). kScoreRel: the relative error of one monotone score or key
// evaluated in f32 (the quotient by gate_temp, the score function of core/score_math.h, + bias;
// a loose bound: those are within 0.5 ulp each);
// score_abs_err: the absolute error where f32 underflows (sqrt(2^-149) after sqrt-softplus,
// 2^-126 for sigmoid, 2^-148 for a softmax term).
inline constexpr double kScoreRel = 0x1p-19;
double score_abs_err(ScoreFunc f);

// One token's scores: s[e] the f64 score of model.py's formula on logits z (every expert; softmax
// over the row), err[e] the bound on |s_f32 - s[e]| for route_from_logits's f32 score of any
// logits within dz[e] of z (dz nullptr: the same logits, only the f32 evaluation).
struct ScoreBand {
  std::vector<double> s, err;
};
ScoreBand score_band(const MoeConfig& c, const double* z, const double* dz);

// The bound on |w_f32 - w| of the routing weight of a picked expert with score s (error err), the
// token's picked scores summing to `sum` (their errors to err_sum): renormalised (+1e-20) when
// the config says so, then scaled.
double weight_bound(const MoeConfig& c, double s, double err, double sum, double err_sum);

// Whether the f32 keys could order expert e (picked by one side) at or above f (picked by the
// other): s + err + b of e against s - err + b of f, each key add rounding once.
bool key_flip_explained(double s_e, double err_e, float b_e, double s_f, double err_f, float b_f);

// "SwiGLU", the stage's own rounding: |h_f32 - h| for the f32 SwiGLU of the same g', u' whose
// exact value is h (|u'| the clamped up). Relative: pexp's 2 P_exp u, then add, div, mul. Absolute:
// kSiluAbs for silu where f32 leaves the normal range (pexp(-g') overflows to +Inf for
// -g' >= 88.7228, so silu = -0 where the exact |silu| = |g'| e^g' / (1 + e^g') is at most
// 88.73 e^-88.72 = 2.61e-37 < 2^-121; or a subnormal quotient), and 2^-149 for a subnormal product.
inline constexpr double kSiluAbs = 0x1p-121;
double swiglu_own_bound(double h, double uc);

// "SwiGLU", propagated: the emulation's h from its own g, u against the reference's h from its
// g, u (taps rounded to f32 from f64: each tap value is within u |tap| of the exact one).
double h_bound(float ge, float ue, float gr, float ur, float hr, float L);

// Per (token, column) of one expert's down output: the reference's exact value, |emu - exact| and
// the magnitude the accumulate bound scales (sum |w2 h| plus the propagated input error).
struct ExpertDiff {
  std::vector<double> down_ref, down_err, down_mag;
  std::vector<double> down_var;  // the statistical leg's predicted variance of down (when run)
};

// One expert's stages (routed, or the shared one when `shared`) on the tokens of its taps:
// gate, up, h and down against the reference's Exact Expert on the same tokens.
// With `stat`, also the statistical leg on the same rows (check_expert_noise).
void check_expert(const LayerWeights& w, const MatView& w1, const MatView& w3, const MatView& w2,
                  const ExpertTaps& e, const std::vector<BlockQ8_1>& x_q8,
                  const std::vector<float>& xf, bool shared, Checker& ck, ExpertDiff& out,
                  Checker* stat = nullptr);

// The statistical leg on one expert (compare/stat_expert.cpp): e's gate, up, h and down against
// the reference's taps rt on the same tokens (unweighted), as z-scores; fills out.down_var.
void check_expert_noise(const MoeConfig& c, const MatView& w1, const MatView& w3, const MatView& w2,
                        const ExpertTaps& e, const ExpertTaps& rt,
                        const std::vector<BlockQ8_1>& x_q8, const std::vector<float>& xf,
                        bool shared, Checker& stat, ExpertDiff& out);

}  // namespace moecheck::bounds_detail
