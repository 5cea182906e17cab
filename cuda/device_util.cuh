// Device helpers shared by the token-path kernels: the warp butterfly of docs/numerics.md
// "Conventions", exact f16 / bf16 widening, 2-byte-aligned word reads from shared memory and
// the stream cast of the void* wrappers. Arithmetic helpers only re-spell emulate/ helpers
// (fp_ops.h, numfmt.h) with identical bits; none of them rounds differently.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/schedule.h"

namespace moecheck::cuda {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Exact int -> float at full rate: for |v| < 2^22 the float with bits v + kBias is 1.5 * 2^23 + v
// exactly, and subtracting 1.5 * 2^23 (exact) gives float(v), the value of a conversion
// instruction (whose rate is a fraction of an add's). Callers fold kBias into an integer sum
// they form anyway (cuda/mmq_tile.cuh: an mma's accumulator input, or the first term of the
// scale products).
constexpr int kBias = 0x4B400000;
__device__ __forceinline__ float biased_float(int v_plus_bias) {
  return sub_rn(__int_as_float(v_plus_bias), 12582912.0f);
}

// The multiprocessors of the current device (the persistent grids' size).
int current_sm_count();

// Before a launch of `kernel` with `bytes` of dynamic shared memory on the current device: the
// kernel's limit (cudaFuncAttributeMaxDynamicSharedMemorySize, 48 KiB unless raised) raised to
// at least `bytes`. The attribute belongs to a (kernel, device) pair, so the record of what was
// set is kept per pair, behind a lock: two host threads, or one thread on two devices, each see
// their launch's limit set. Sizes up to 48 KiB need nothing and set nothing.
void allow_dynamic_smem(const void* kernel, int bytes);

// Blocks of `kernel` resident at once on one multiprocessor of the current device at `threads`
// a block and `smem` dynamic bytes (cudaOccupancyMaxActiveBlocksPerMultiprocessor), computed
// once per (kernel, device, threads, smem) and kept behind the same lock.
int resident_blocks_per_sm(const void* kernel, int threads, int smem);

// Before a launch of `kernel` on the current device: its preferred shared-memory carveout set to
// the largest (cuda::set_max_shared_carveout, on by default) or back to the driver's default,
// once per kernel, device and setting. A multiprocessor's carveout changes only when it is idle,
// so a kernel with a small carveout waits for an SM whose resident blocks configured it
// smaller than it needs (measured: the router behind the shared expert's GEMV blocks,
// docs/performance.md); with every kernel of the layer at the largest, none waits for that.
void prefer_shared_carveout(const void* kernel);

// butterfly(v): o = 16, 8, 4, 2, 1, v = add_rn(v, partner's v). Every lane ends with lane 0's
// bits because add_rn is commutative (numerics.md "Butterfly").
__device__ __forceinline__ float warp_butterfly(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Integer butterflies: exact and order-free.
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// f16 bits to f32 with numfmt.h's bits: the hardware conversion is exact for every non-NaN
// pattern (subnormals included); NaN goes through numfmt's payload-keeping rule.
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  if ((h & 0x7FFFu) > 0x7C00u) return f16_to_f32(h);
  return __half2float(__ushort_as_half(h));
}

// The two bf16 values of a 32-bit word, as f32 (exact).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// acc over the 8 bf16 values of a 16-byte chunk of w and of x: the products of bf16 values
// are exact in f32, so each fma_rn rounds once, in the addition; values j = 0..7 in order (the
// low half of each little-endian word is the lower index). numerics.md "router_gemv".
// With kF16W the chunk of w holds f16 values (the deepseek4 conventions' F16 routers), widened
// exactly by f16_bits_to_f32: an f16 x bf16 product (11 x 8 significant bits) is exact in f32
// too, so the chain is the same.
template <bool kF16W = false>
__device__ __forceinline__ float bf16_chunk_fma(const uint4& w, const uint4& x, float acc) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xx[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float w_lo = kF16W ? f16_bits_to_f32(static_cast<uint16_t>(ww[i])) : bf16_lo(ww[i]);
    const float w_hi = kF16W ? f16_bits_to_f32(static_cast<uint16_t>(ww[i] >> 16)) : bf16_hi(ww[i]);
    acc = fma_rn(w_lo, bf16_lo(xx[i]), acc);
    acc = fma_rn(w_hi, bf16_hi(xx[i]), acc);
  }
  return acc;
}

// The 8 bf16 values of a 16-byte chunk as f32 (exact), value j = 0..7 in order: the low half of
// each little-endian word is the lower index.
__device__ __forceinline__ void bf16_chunk_unpack(const uint4& x, float (&xf)[kGemvChunk]) {
  const uint32_t xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    xf[2 * i] = bf16_lo(xw[i]);
    xf[2 * i + 1] = bf16_hi(xw[i]);
  }
}

// One chunk of a weight row against the unpacked chunks of N tokens (bf16_chunk_unpack): each
// acc[n] takes the fma steps of bf16_chunk_fma, values j = 0..7 in order; the steps of the N
// chains are interleaved value by value (one weight value widened once for every token). The
// GEMM tiles' inner step (cuda/bf16_gemm.cu, the router's GEMM of cuda/router_gemv.cu).
template <bool kF16W, int N>
__device__ __forceinline__ void bf16_chunk_fma_tokens(const uint4& w,
                                                      const float (&xf)[N][kGemvChunk],
                                                      float (&acc)[N]) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = kF16W ? f16_bits_to_f32(static_cast<uint16_t>(ww[i])) : bf16_lo(ww[i]);
    const float hi = kF16W ? f16_bits_to_f32(static_cast<uint16_t>(ww[i] >> 16)) : bf16_hi(ww[i]);
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n] = fma_rn(lo, xf[n][2 * i], acc[n]);
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n] = fma_rn(hi, xf[n][2 * i + 1], acc[n]);
  }
}

// The 32-bit little-endian word at byte offset off (2-byte aligned) of a 4-byte aligned shared
// buffer: two aligned reads joined by a funnel shift (shift 0 when off is 4-byte aligned).
__device__ __forceinline__ uint32_t lds_u32(const uint8_t* smem, int off) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + (off & ~3));
  return __funnelshift_r(w[0], w[1], 8 * (off & 3));
}

// n consecutive words from a 2-byte aligned shared offset, reading n + 1 aligned words.
template <int N>
__device__ __forceinline__ void lds_words(const uint8_t* smem, int off, uint32_t (&out)[N]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + (off & ~3));
  const int sh = 8 * (off & 3);
  uint32_t raw[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) raw[i] = w[i];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(raw[i], raw[i + 1], sh);
}

// n consecutive words from a 4-byte aligned shared offset.
template <int N>
__device__ __forceinline__ void lds_words_aligned(const uint8_t* smem, int off,
                                                  uint32_t (&out)[N]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + off);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = w[i];
}

__device__ __forceinline__ uint16_t lds_u16(const uint8_t* smem, int off) {
  return *reinterpret_cast<const uint16_t*>(smem + off);
}

}  // namespace moecheck::cuda
