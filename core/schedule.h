// Tile constants of the token-path kernels and the warp butterfly, included by the kernels
// (cuda/) and by their emulation twins (emulate/) so that both walk the same schedule.
// Contract: docs/numerics.md (every kernel section names the constants it uses). Host and
// device clean.
#pragma once

#include <cstdint>

#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck {

// The router GEMV's schedules (docs/numerics.md "router_gemv"). kPlain: one warp per output row.
// kStaged: 256 threads per row, partials staged in shared memory and folded by warp 0. The two
// give different bits; each is fixed.
enum class RouterVariant { kPlain, kStaged };

inline constexpr int kWarpSize = 32;
inline constexpr int kGemvChunk = 8;              // bf16 values per lane step (router, bf16_gemv)
inline constexpr int kRouterStagedThreads = 256;  // threads per row in RouterVariant::kStaged
inline constexpr int kRouterStagedWarps = kRouterStagedThreads / kWarpSize;
inline constexpr int kMaxGroupRows = 8;     // token rows per MMVQ launch group
inline constexpr int kQ8PerSuperBlock = 8;  // q8_1 blocks (MMVQ units) per 256-value block
inline constexpr int kDefaultExpertWarps = 8;

// Warps per CUDA block in the expert MMVQ kernels; results never depend on the choice.
MOECHECK_HD constexpr bool expert_warps_allowed(int w) { return w == 2 || w == 4 || w == 8; }

// The butterfly of docs/numerics.md "Conventions" over a 32-lane array, as the emulation twins
// replay it: for o = 16, 8, 4, 2, 1 every lane adds its partner's value from before the step.
// Returns lane 0's value (all lanes end equal).
MOECHECK_HD float butterfly(float (&v)[kWarpSize]) {
  for (int o = kWarpSize / 2; o >= 1; o /= 2) {
    float next[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) next[l] = add_rn(v[l], v[l ^ o]);
    for (int l = 0; l < kWarpSize; ++l) v[l] = next[l];
  }
  return v[0];
}

}  // namespace moecheck
