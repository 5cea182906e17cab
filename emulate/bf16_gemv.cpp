// Emulation twin of the shared expert's bf16 GEMV: the router's plain schedule (one warp per
// row, lane l taking chunks l, l + 32, ..., then the butterfly) on [rows, K] weights.
// Contract: docs/numerics.md "bf16_gemv".
#include "emulate/bf16_gemv.h"

#include "emulate/router_gemv.h"

namespace moecheck::emu {

void bf16_gemv(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
  router_gemv(RouterVariant::kPlain, w, x, y, rows, K, T);
}

void bf16_gemv_pair(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, float* y0, float* y1,
                    int64_t rows, int64_t K, int64_t T) {
  bf16_gemv(w0, x, y0, rows, K, T);
  bf16_gemv(w1, x, y1, rows, K, T);
}

}  // namespace moecheck::emu
