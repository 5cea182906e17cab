// model.py's Linear as the reference runs it: y = x . W^T on exactly dequantised weights
// (core/kquant.h dequantize_row: F32, F16, BF16, Q2_K, Q3_K). Rows are dequantised a chunk
// at a time, so a 2304 x 5120 expert never exists as one f32 matrix. Contract: docs/reference.md
// "Model mode's sums".
#pragma once

#include <cstdint>

#include "core/layer_weights.h"

namespace moecheck::ref {

// y[n, w.rows] = x[n, w.cols] . W^T, unrounded. f32: one Eigen f32 matrix-vector product per token
// and row chunk (Eigen's summation order; the same for every token count, so a token's result
// does not depend on which other tokens share the expert). Host threads split the row chunks;
// no bit depends on the split. f64: the same in double.
void linear_f32(const MatView& w, const float* x, int64_t n, float* y);
void linear_f64(const MatView& w, const double* x, int64_t n, double* y);

}  // namespace moecheck::ref
