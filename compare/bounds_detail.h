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

// score_func(z) in f64 (softmax has no per-expert form: NaN).
double score64(ScoreFunc f, double z);

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
