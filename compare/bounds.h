// The emulation's layer forward against the reference in Exact mode (f64), stage by stage, each
// within the bound derived in docs/numerics.md "Error bounds vs the reference's Exact mode" given
// the measured difference of the stage's inputs. One implementation of those bounds, called by the
// layer tests (tests/emu_layer_check.h, a gtest wrapper) and by `moecheck check` (docs/cli.md).
// Applies to any taps that follow the emulation's contract (emu, or cuda, which equals it bitwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// "MMVQ" for one (row, token): the exact value on the dequantised weights, the bound on
// |y_emu - exact|, and sum |w_k x_k|. x: the f32 activation the q8_1 blocks `a` came from;
// eblk: its per-block q8_1 step bounds, or nullptr to compute them.
struct MmvqBound {
  double exact = 0, bound = 0, mag = 0;
};
MmvqBound mmvq_exact_bound(GgmlType t, const uint8_t* row, const BlockQ8_1* a, const float* x,
                           int64_t K, const double* eblk = nullptr);

// One stage's verdict: router_logits, topk_weights, experts.{gate,up,h,down},
// shared.{gate,up,h,down}, acc, output.
struct StageCheck {
  Stage stage = Stage::kOutput;
  int64_t checked = 0;          // values compared
  int64_t violations = 0;       // values with |emu - exact| > bound (or NaN)
  double worst_ratio = 0;       // max |emu - exact| / bound (inf for a difference on a zero bound)
  std::string first_violation;  // layer, token, expert, row / column, both values and the bound
};

struct BoundsReport {
  int layer = 0;
  std::vector<StageCheck> stages;  // pipeline order
  int64_t flips = 0;              // (emulation-only, reference-only) expert pairs of flipped tokens
  int64_t unexplained_flips = 0;  // pairs the logit bound cannot explain (any flip under softmax)
  std::vector<std::string>
      flip_lines;  // one line per pair: exact keys, margin, what the bound allows
  bool ok() const;
  // The first stage in pipeline order with a violation; topk_ids when a flip is unexplained
  // (routing comes before the weights). Meaningful when !ok().
  Stage first_failing() const;
  const StageCheck* stage(Stage s) const;  // nullptr for a stage this check does not judge
};

// Runs the reference in Exact mode on emu.input and checks every stage of `emu` (taps of a
// forward with every stage tapped; `router` the router GEMV variant it ran). Tokens whose pick
// sets differ are left out of the weights, acc and output checks (their sums are different sums);
// their expert stages are still checked (the reference recomputes each (expert, token) the
// emulation computed). exact_taps, when given, receives the Exact reference's taps. Throws
// InputError when the taps are missing or have the wrong shape (naming the layer and stage).
BoundsReport check_emu_against_exact(const LayerWeights& w, const LayerTaps& emu,
                                     RouterVariant router, LayerTaps* exact_taps = nullptr);

}  // namespace moecheck
