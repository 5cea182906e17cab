// The ggml K-quant weight quantisers for Q2_K and Q3_K, following ggml's published algorithms
// (quantize_row_q2_K_ref / quantize_row_q3_K_ref, ggml's src/ggml-quants.c at d99724f2), and exact
// row dequantisers. Host only; compiled with -ffp-contract=off so results do not depend on FMA.
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace moecheck {

// ggml's nearest_int: round to nearest, ties to even, for |f| <= 4194303. Outside that range
// it saturates to +-2^22 and NaN gives 0 (ggml asserts instead), so every input is defined.
int nearest_int(float f);

// k a multiple of 256; x has k values, y has k / 256 blocks.
void quantize_row_q2_K_ref(const float* x, BlockQ2K* y, int64_t k);
void quantize_row_q3_K_ref(const float* x, BlockQ3K* y, int64_t k);

void dequantize_row_q2_K(const BlockQ2K* x, float* y, int64_t k);
void dequantize_row_q3_K(const BlockQ3K* x, float* y, int64_t k);

// Dequantises one row of any supported weight type (F32, F16, BF16, Q2_K, Q3_K) to f32.
void dequantize_row(GgmlType type, const uint8_t* row, float* y, int64_t k);

}  // namespace moecheck
