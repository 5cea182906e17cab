// Emulation twin of the shared expert's bf16 GEMV (router's plain schedule on [rows, K]).
// Contract: docs/numerics.md "bf16_gemv".
#pragma once

#include <cstdint>

namespace moecheck::emu {

// w bf16 [rows, K], x bf16 [T, K], y f32 [T, rows]; K a multiple of 8. Any T.
void bf16_gemv(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T);

}  // namespace moecheck::emu
