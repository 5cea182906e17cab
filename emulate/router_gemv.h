// Emulation twin of the router GEMV: bf16 or f16 router weights times bf16 activations, f32 logits,
// replaying the kernel's lanes, chunks, shared-memory stage and butterfly.
// Contract: docs/numerics.md "router_gemv".
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "core/schedule.h"

namespace moecheck::emu {

// w [rows, K] of w_type (BF16 or F16), x bf16 [T, K], y f32 [T, rows]; K a multiple of 8. Any T.
void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T, GgmlType w_type = GgmlType::kBF16);

}  // namespace moecheck::emu
