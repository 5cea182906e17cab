// The noise model of the statistical leg (docs/numerics.md "Statistical leg"): the variance of
// the difference between the reference in Exact mode and an implementation of the kernels'
// contract, predicted from the formats alone. Activation quantisation to q8_1: each value's error
// x - q d16 is the rounding error x - q d (uniform on [-d/2, d/2]: variance d^2 / 12, independent
// per value) plus q (d - d16) (the f16 rounding of the block's scale, uniform on half an f16
// ulp of d either side: variance hulp^2 / 3, shared by the block's 32 values). Q2_K weights: the
// reference's f32 dequantisation rounds once (uniform on half an f32 ulp of w); Q3_K and bf16 are
// exact. bf16 rounding of h (the dense shared expert): uniform on half a bf16 ulp of h. No
// fitted constants.
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace moecheck::stat_noise {

// Variance of sum_k w_k (x_k - q_k d16) over K values x quantised to the blocks a (the scale d
// is the quantiser's, amax / 127 of each block of x; its f16 rounding error is bounded by half
// the f16 spacing at d, subnormal and underflowing scales included).
double q8_dot_variance(const float* w, const BlockQ8_1* a, const float* x, int64_t K);
// Covariance of the same noise seen through two rows w1, w3 (gate and up of one token).
double q8_dot_covariance(const float* w1, const float* w3, const BlockQ8_1* a, const float* x,
                         int64_t K);
// Variance of sum_k (w_k^f32 - w_k) x_k: the reference's Q2_K dequantisation rounding (0 for
// other types).
double dequant_variance(GgmlType t, const float* w, const float* x, int64_t K);
// Variance of one value's bf16 rounding.
double bf16_round_variance(double v);

}  // namespace moecheck::stat_noise
