// Emulation twin of the router GEMV: bf16 router weights times bf16 activations, f32 logits,
// replaying the kernel's lanes, chunks, shared-memory stage and butterfly.
// Contract: docs/numerics.md "router_gemv".
#pragma once

#include <cstdint>

namespace moecheck {

// kPlain: one warp per output row. kStaged: 256 threads per row, partials staged in shared
// memory and folded by warp 0. The two give different bits; each is fixed.
enum class RouterVariant { kPlain, kStaged };

namespace emu {

// w bf16 [rows, K], x bf16 [T, K], y f32 [T, rows]; K a multiple of 8. Any T.
void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T);

}  // namespace emu
}  // namespace moecheck
