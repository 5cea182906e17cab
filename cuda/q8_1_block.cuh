// One q8_1 block per warp, lane i holding x_i: the rule of docs/numerics.md "quantize_q8_1"
// (twin: emu::quantize_block_q8_1). Shared by cuda/quantize_q8_1.cu and cuda/swiglu_q8.cu.
// The maximum and the integer sum are butterflies of exact operations, so their order is free.
#pragma once

#include "core/blocks.h"
#include "cuda/device_util.cuh"

namespace moecheck::cuda::detail {

inline constexpr uint16_t kQ8NaN = 0x7E00;  // f16 NaN: d and s of a block holding NaN or Inf

// Every lane of the warp calls this with its value; all 32 lanes must be active.
__device__ __forceinline__ void quantize_block_warp(float x, int lane, BlockQ8_1* out) {
  const bool bad = (__float_as_uint(x) & 0x7F800000u) == 0x7F800000u;  // NaN or Inf
  if (__any_sync(0xFFFFFFFFu, bad)) {                                  // step 1
    out->qs[lane] = 0;
    if (lane == 0) {
      out->d = kQ8NaN;
      out->s = kQ8NaN;
    }
    return;
  }
  float amax = fabsf(x);  // step 2: exact
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float d = div_rn(amax, 127.0f);  // step 4
  int q = 0;
  if (d != 0.0f) {  // step 3 (all zero, or amax / 127 underflowed): quants 0, d = s = 0
    q = __float2int_rn(div_rn(x, d));  // step 5: correctly rounded quotient, ties to even
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
  }
  const int sum = warp_sum_int(q);
  out->qs[lane] = static_cast<int8_t>(q);
  if (lane == 0) {  // step 6
    out->d = d != 0.0f ? f32_to_f16(d) : uint16_t{0};
    out->s = d != 0.0f ? f32_to_f16(mul_rn(d, static_cast<float>(sum))) : uint16_t{0};
  }
}

}  // namespace moecheck::cuda::detail
