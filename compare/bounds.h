// The emulation's layer forward against the reference in Exact mode (f64), stage by stage, each
// within the bound derived in docs/numerics.md "Error bounds vs the reference's Exact mode" given
// the measured difference of the stage's inputs. One implementation of those bounds, called by the
// layer tests (tests/emu_layer_check.h, a gtest wrapper) and by `moecheck check` (docs/cli.md).
// Applies to any taps that follow the emulation's contract (emu, or cuda, which equals it bitwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compare/leg_report.h"
#include "core/blocks.h"
#include "core/layer_weights.h"
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck {

// Rounding-error constants of docs/numerics.md: u = 2^-24, gamma_n = n u / (1 - n u), and the
// same for f64 (u64 = 2^-53).
inline constexpr double kU32 = 0x1p-24;
inline double gamma_f32(int64_t n) {
  return static_cast<double>(n) * kU32 / (1.0 - static_cast<double>(n) * kU32);
}
inline double gamma_f64(int64_t n) {
  return static_cast<double>(n) * 0x1p-53 / (1.0 - static_cast<double>(n) * 0x1p-53);
}

// "q8_1 step": the largest |x_i - q_i d16| over one block of 32 f32 values.
double q8_block_bound(const float* x);

// docs/numerics.md "Depth", MMVQ: the roundings on the longest path of one (row, token) over
// `units` q8_1 blocks: a lane's chain of ceil(units / 32) steps, each an fma or (a legal split) a
// multiply and an add, the butterfly's 5, and the unit's own float part (up to 3 with its fma
// split). For D_M = 2 ceil(units / 32) + 8.
inline int64_t mmvq_depth(int64_t units) { return 2 * ((units + 31) / 32) + 5 + 3; }

// "MMVQ" for one (row, token): the exact value on the dequantised weights, the bound on
// |y_emu - exact|, and sum |w_k x_k|. x: the f32 activation the q8_1 blocks `a` came from;
// eblk: its per-block q8_1 step bounds, or nullptr to compute them.
struct MmvqBound {
  double exact = 0, bound = 0, mag = 0;
};
MmvqBound mmvq_exact_bound(GgmlType t, const uint8_t* row, const BlockQ8_1* a, const float* x,
                           int64_t K, const double* eblk = nullptr);

// "Stage-local legs", MMVQ: the exact value of one (row, token) on the q8_1 blocks the
// implementation used (sum over units of d8 (d A - dmin B), exact integers, f64), and the bound
// of the contract's own rounding only: gamma_{D_M} sum_g |d8| (|d A| + |dmin B|).
struct MmvqLocal {
  double exact = 0, bound = 0;
};
MmvqLocal mmvq_local(GgmlType t, const uint8_t* row, const BlockQ8_1* a, int64_t K);

// Runs the reference in Exact mode on emu.input and checks every stage of `emu` (taps of a
// forward with every stage tapped; `router` the router GEMV variant it ran). Tokens whose pick
// sets differ are left out of the weights, acc and output checks (their sums are different sums);
// their expert stages are still checked (the reference recomputes each (expert, token) the
// emulation computed). exact_taps, when given, receives the Exact reference's taps. Throws
// InputError when the taps are missing or have the wrong shape (naming the layer and stage).
// Stages judged: router_logits, topk_weights, experts.{gate,up,down} and shared.{gate,up,down}
// (accumulated bounds), experts.h, shared.h, acc and output (consistency checks: the measured
// input differences propagated plus the stage's own rounding).
// With `stat`, also the statistical leg (docs/numerics.md "Statistical leg") on the same
// Exact reference: gate, up, h, down, acc and output as z-scores against the noise the formats
// predict.
LegReport check_emu_against_exact(const LayerWeights& w, const LayerTaps& emu, RouterVariant router,
                                  LayerTaps* exact_taps = nullptr, LegReport* stat = nullptr);

}  // namespace moecheck
