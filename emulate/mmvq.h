// Emulation twin of MMVQ for Q2_K and Q3_K weights times q8_1 activations: one warp per
// (row, token), lane l taking units l, l + 32, ..., then the butterfly.
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k".
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "core/layer_plan.h"

namespace moecheck::emu {

// t: GgmlType::kQ2K or kQ3K. w: rows consecutive rows of K / 256 blocks (read in place);
// a: [T, K / 32]; y: f32 [T, rows]. K a multiple of 256. Any T (the result per (row, token)
// does not depend on T or grouping).
void mmvq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
          int64_t T);

// The one-token form over several experts: expert i's matrix [rows, K] starts at expert_w[i]
// (slot pointers, never assumed contiguous). a is [n, K / 32] when a_per_expert (the down
// projection: each expert has its own h) else [1, K / 32] shared by all. y: [n, rows].
void mmvq_experts(GgmlType t, const uint8_t* const* expert_w, int64_t n, const BlockQ8_1* a,
                  bool a_per_expert, float* y, int64_t rows, int64_t K);

// The layer's form (cuda::mmvq_groups): n_groups groups against the slot table `slots` (host
// pointers; core/layer_plan.h). Rows [r0, r1) of every group's matrix (r1 < 0: all rows), so a
// caller's threads can split the rows; no (row, token) result depends on the split.
// Consecutive groups of one slot (the plan's groups of one expert) are computed together, each
// weight row decoded once for all their tokens.
void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                 const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int64_t r0 = 0,
                 int64_t r1 = -1);

// The same results as mmvq_groups, computed the straightforward way: group by group, each weight
// row decoded again per group, one (row, token) at a time in scalar code. Kept as the oracle the
// fast path is tested against (tests/emu_mmvq_fast_test.cpp).
void mmvq_groups_plain(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                       int64_t n_groups, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
                       int64_t r0 = 0, int64_t r1 = -1);

// The integer kernel of the fast paths (mmvq, mmvq_groups, mmvq_experts): kAuto uses AVX2 when
// the CPU has it, kPortable a plain loop. Process-wide, for the tests; no bit depends on it.
enum class MmvqIntKernel { kAuto, kPortable };
void set_mmvq_int_kernel(MmvqIntKernel k);

}  // namespace moecheck::emu
