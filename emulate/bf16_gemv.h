// Emulation twin of the shared expert's bf16 GEMV (router's plain schedule on [rows, K]).
// Contract: docs/numerics.md "bf16_gemv".
#pragma once

#include <cstdint>

namespace moecheck::emu {

// w bf16 [rows, K], x bf16 [T, K], y f32 [T, rows]; K a multiple of 8. Any T.
void bf16_gemv(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T);

// Two matrices of one shape on the same x (the shared expert's gate and up): each output equals
// bf16_gemv of its matrix.
void bf16_gemv_pair(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, float* y0, float* y1,
                    int64_t rows, int64_t K, int64_t T);

}  // namespace moecheck::emu
