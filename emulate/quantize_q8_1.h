// Emulation twin of the q8_1 activation quantiser (one warp per 32-value block).
// Contract: docs/numerics.md "quantize_q8_1".
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace moecheck::emu {

// One block of 32 values; the scalar rule both sides follow (exposed for tests).
BlockQ8_1 quantize_block_q8_1(const float* x);

// x f32 [R, K] (K a multiple of 32) -> y [R, K / 32].
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t R, int64_t K);

// x bf16 [R, K], widened exactly, then quantize_q8_1 (the layer's input x).
void quantize_q8_1_bf16(const uint16_t* x, BlockQ8_1* y, int64_t R, int64_t K);

}  // namespace moecheck::emu
