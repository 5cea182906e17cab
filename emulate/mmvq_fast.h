// Internal to emulate/: the fast MMVQ path behind emu::mmvq, emu::mmvq_groups and
// emu::mmvq_experts. One weight matrix against a list of token rows: each weight row is decoded
// once for all the tokens, the integer parts use AVX2 when the CPU has it (a plain loop
// otherwise), and the float part of every (row, token) is docs/numerics.md "mmvq_q2k, mmvq_q3k"
// to the bit: the unit scalars of core/portable_math.h, lane l's fma chain over units l, l + 32,
// ... in increasing order, then the butterfly.
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace moecheck::emu::detail {

// Rows [r0, r1) of the Q2_K / Q3_K matrix w ([rows, K], K a positive multiple of 256) against
// n token rows: a[i] is token i's q8_1 row ([K / 32] blocks), and its result for row r goes to
// y[i][r]. Tokens are written in index order, so a repeated destination keeps the last one.
void mmvq_rows(GgmlType t, const uint8_t* w, int64_t K, const BlockQ8_1* const* a, float* const* y,
               int64_t n, int64_t r0, int64_t r1);

// True when the AVX2 integer kernel is in use (the CPU has AVX2 and the tests did not pin the
// portable one through emu::set_mmvq_int_kernel).
bool mmvq_uses_avx2();

}  // namespace moecheck::emu::detail
