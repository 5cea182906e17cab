// Emulation twins of the fused SwiGLU + q8_1 kernel and of its bf16 form: h = silu(clamp g) * clamp
// u in f32 (the shared scalar swiglu() of emulate/portable_math.h), then quantize_q8_1 of each h
// row. Contract: docs/numerics.md "swiglu_q8".
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace moecheck::emu {

// g, u, h f32 [R, inter]; hq [R, inter / 32] (may be nullptr when only h is wanted);
// limit = swiglu_limit (no clamp when <= 0). inter a multiple of 32.
void swiglu_q8(const float* g, const float* u, float* h, BlockQ8_1* hq, int64_t R, int64_t inter,
               float limit);

// The bf16 shared expert's form: h f32 (may be nullptr) and hb = f32_to_bf16(h) [R, inter], the
// bf16 down projection's input (model.py's x.to(dtype) before w2).
void swiglu_bf16(const float* g, const float* u, float* h, uint16_t* hb, int64_t R, int64_t inter,
                 float limit);

}  // namespace moecheck::emu
