// Emulation twin of the fused SwiGLU + q8_1 kernel: the shared scalar swiglu() per value, then
// quantize_q8_1 of each 32-value block of h. Contract: docs/numerics.md "swiglu_q8".
// Element-wise: no reduction order to replay beyond the quantiser's.
#include "emulate/swiglu_q8.h"

#include <string>

#include "core/error.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "emulate/quantize_q8_1.h"

namespace moecheck::emu {

void swiglu_q8(const float* g, const float* u, float* h, BlockQ8_1* hq, int64_t R, int64_t inter,
               float limit) {
  if (inter % kQK8_1 != 0 || R < 0) {
    throw InputError("emu::swiglu_q8: inter = " + std::to_string(inter) +
                     " must be a multiple of 32 (rows " + std::to_string(R) + ")");
  }
  for (int64_t i = 0; i < R * inter; ++i) h[i] = swiglu(g[i], u[i], limit);
  if (hq != nullptr) quantize_q8_1(h, hq, R, inter);
}

void swiglu_bf16(const float* g, const float* u, float* h, uint16_t* hb, int64_t R, int64_t inter,
                 float limit) {
  if (inter % kQK8_1 != 0 || R < 0) {
    throw InputError("emu::swiglu_bf16: inter = " + std::to_string(inter) +
                     " must be a multiple of 32 (rows " + std::to_string(R) + ")");
  }
  for (int64_t i = 0; i < R * inter; ++i) {
    const float v = swiglu(g[i], u[i], limit);
    if (h != nullptr) h[i] = v;
    hb[i] = f32_to_bf16(v);
  }
}

}  // namespace moecheck::emu
