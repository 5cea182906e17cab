// Emulation twin of MMVQ for Q2_K and Q3_K weights times q8_1 activations: one warp per
// (row, token), lane l taking units l, l + 32, ..., then the butterfly.
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k".
#pragma once

#include <cstdint>

#include "core/blocks.h"

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

}  // namespace moecheck::emu
