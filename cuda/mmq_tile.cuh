// MMQ tile arithmetic (cuda/mmq.cu): one q8_1 unit of 16 Q2_K / Q3_K weight rows against one or
// two 8-token-column halves of an item, integer parts on the int8 tensor cores, then the float part
// of docs/numerics.md "mmvq_q2k, mmvq_q3k" folded into the unit's contract-lane chain.
//
// Fragments (PTX ISA "mma.m16n8k32" / "mma.m16n8k16", integer types): lane (g, c) = (lane / 4,
// lane % 4) holds A rows g and g + 8, bytes 4c..4c+3 of each 16-value half, B (the activation
// quants) of token column g at the same bytes, and the results D for rows g, g + 8 and token
// columns 2c, 2c + 1. Integer products and sums are exact (numerics.md "Conventions"), so any
// split of a unit's dot products gives the contract's A and B.
// - Q2_K: A bytes = scale * quant (4-bit scale, 2-bit quant: at most 45, u8), one k32 mma gives
//   A = sc[j0] p0 + sc[j1] p1; a second k32 mma with the mins broadcast over each half gives
//   B = m[j0] a0 + m[j1] a1.
// - Q3_K: scale * quant reaches 128 (s = -32, q = -4), one past s8, so two k16 mmas give p0 and
//   p1 (quants in [-4, 3], s8) and A = s[j0] p0 + s[j1] p1 is formed in int32.
// f16 scales (d, dmin, d8) widen by the hardware conversion: exact for every number; a NaN's
// payload may differ from numfmt's rule, but these values only enter fma_rn / mul_rn, whose NaN
// result is the canonical 0x7FFFFFFF on both sides (numerics.md "Conventions").
// float(A), float(B) by biased_float (cuda/device_util.cuh): the bias kBias enters as the mma's
// accumulator input (Q2_K) or the first term of the scale products (Q3_K), so the conversion
// costs one full-rate subtraction.
// Q3_K rows sit at 2-byte aligned offsets in shared memory (110-byte blocks): each word is read
// as two aligned words and a funnel shift fixed per (row, block), at immediate offsets.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/fp_ops.h"
#include "cuda/device_util.cuh"

namespace moecheck::cuda::mmq_tile {

// D = C + A (16 x 32 u8, row) * B (32 x 8 s8, col), s32, every C entry c: exact (no wrap for
// the operands here).
__device__ __forceinline__ void mma_k32_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1, int c) {
  // C in its own operands (the same value four times), so the compiler keeps one constant quad
  // for every product instead of writing c into each D first.
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// D = A (16 x 16 s8, row) * B (16 x 8 s8, col), s32: exact.
__device__ __forceinline__ void mma_k16_s8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  d[0] = d[1] = d[2] = d[3] = 0;
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ float f16_operand(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// 0xFF in every byte whose bit 7 is set, else 0x00 (PTX prmt, sign-replicating selectors).
__device__ __forceinline__ uint32_t byte_signs(uint32_t x) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(r) : "r"(x));
  return r;
}

// Byte i of x as an integer 0..255.
template <int kI>
__device__ __forceinline__ int byte_of(uint32_t x) {
  return static_cast<int>(__byte_perm(x, 0u, 0x4440u + kI));
}

// Byte i of x broadcast to all four bytes.
template <int kI>
__device__ __forceinline__ uint32_t byte_bcast(uint32_t x) {
  return __byte_perm(x, 0u, 0x1111u * kI);
}

// One weight row's words of a super-block for the lane's bytes 4c (w[0]) and 16 + 4c (w[1])
// of the unit pair the warp owns (units b = 2 wc, 2 wc + 1 share their quant bytes), with the
// scales, mins and the f16 factors widened.
struct RowSb {
  uint32_t q[2];  // quant bytes, all four bit pairs
  uint32_t h[2];  // Q3_K: high-bit bytes (bit b of byte l is unit b's)
  int sc[4];      // scales of sub-blocks 4 wc .. 4 wc + 3 (Q3_K: signed)
  uint32_t mn;    // Q2_K: the mins of the same sub-blocks, one per byte
  float d, dmin;
  // The factor of the biased conversion (Q2_K: dmin, Q3_K: d) times -1.5 * 2^23, exact when the
  // factor is finite (an f16's 11 significant bits times 1.5's two); `finite` says it is.
  float cm;
  bool finite;
};

// Row data of super-block `blk` (byte offset of the block in shared memory `s`, 2-byte aligned
// for Q3_K), for class warp wc and lane quarter c.
template <bool kQ2K>
__device__ __forceinline__ RowSb row_sb(const uint8_t* s, int blk, int wc, int c) {
  RowSb r;
  if constexpr (kQ2K) {  // scales[16] | qs[64] @16 | d @80 | dmin @82; blocks 4-byte aligned
    const int qo = blk + 16 + 32 * (wc >> 1) + 4 * c;
    r.q[0] = *reinterpret_cast<const uint32_t*>(s + qo);
    r.q[1] = *reinterpret_cast<const uint32_t*>(s + qo + 16);
    const uint32_t scw = *reinterpret_cast<const uint32_t*>(s + blk + 4 * wc);
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(s + blk + 80);
    const uint32_t lo = scw & 0x0F0F0F0Fu;
    r.sc[0] = byte_of<0>(lo);
    r.sc[1] = byte_of<1>(lo);
    r.sc[2] = byte_of<2>(lo);
    r.sc[3] = byte_of<3>(lo);
    r.mn = (scw >> 4) & 0x0F0F0F0Fu;
    r.d = f16_operand(static_cast<uint16_t>(dd & 0xFFFF));
    r.dmin = f16_operand(static_cast<uint16_t>(dd >> 16));
    r.cm = mul_rn(r.dmin, -12582912.0f);
    r.finite = (dd & 0x7C000000u) != 0x7C000000u;
    r.h[0] = r.h[1] = 0;
  } else {  // hmask[32] | qs[64] @32 | scales[12] @96 | d @108; blocks 2-byte aligned
    const uint32_t* w = reinterpret_cast<const uint32_t*>(s + (blk & ~3));
    const int fs = 8 * (blk & 3);  // 0 or 16, fixed for the row's block
    const auto word = [&](int i) { return __funnelshift_r(w[i], w[i + 1], fs); };
    r.h[0] = word(c);
    r.h[1] = word(4 + c);
    r.q[0] = word(8 + 8 * (wc >> 1) + c);
    r.q[1] = word(12 + 8 * (wc >> 1) + c);
    // Sub-block j = 4 wc + i: low nibble in scales[j & 7] >> 4 (j >> 3), high pair in
    // scales[8 + (j & 3)] >> 2 (j >> 2); packed as s + 32 per byte.
    const uint32_t lo = word(24 + (wc & 1)) >> (4 * (wc >> 1));
    const uint32_t hi = word(26) >> (2 * wc);
    const uint32_t sp = (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0x30303030u);
    r.sc[0] = byte_of<0>(sp) - 32;
    r.sc[1] = byte_of<1>(sp) - 32;
    r.sc[2] = byte_of<2>(sp) - 32;
    r.sc[3] = byte_of<3>(sp) - 32;
    r.mn = 0;
    const uint16_t dh = lds_u16(s, blk + 108);
    r.d = f16_operand(dh);
    r.dmin = 0.0f;
    r.cm = mul_rn(r.d, -12582912.0f);
    r.finite = (dh & 0x7C00u) != 0x7C00u;
  }
  return r;
}

// Whether every row of the warp's 16-row tile has a finite conversion factor (RowSb::cm) in this
// super-block: the condition of unit_chain's kFast form (warp-uniform).
__device__ __forceinline__ bool tile_finite(const RowSb& r0, const RowSb& r1) {
  return __all_sync(0xFFFFFFFFu, r0.finite && r1.finite);
}

// Unit b = 2 wc + bb of rows r0 (g) and r1 (g + 8) against the token columns of B (b0[h], b1[h]
// for the 8-column half h < kH, 1 or 2), its float part chained into acc0 (half 0) and acc1
// (half 1; untouched when kH is 1), each in D order: (g, 2c), (g, 2c + 1), (g + 8, 2c),
// (g + 8, 2c + 1); d8[h][2] are the activation scales of half h's token columns 2c, 2c + 1 for
// this unit. The weight fragment is built once for both halves.
// kFast (every row's factor finite, tile_finite): the biased integer X + kBias times the factor
// f plus RowSb::cm = -1.5 * 2^23 f is f * X exactly before its one rounding, so a single fma_rn
// gives mul_rn(f, float(X)) (Q2_K: dmin * B, Q3_K: d * A) without the subtraction. The two can
// differ only in the sign of a zero, which no chain can see: a chain starts at +0, so it is
// never -0, and adding a product of either zero to it leaves it unchanged (docs/numerics.md
// "mmvq_q2k, mmvq_q3k"). An infinite or NaN factor takes the plain form.
template <bool kQ2K, int kBb, int kH, bool kFast>
__device__ __forceinline__ void unit_chain(const RowSb& r0, const RowSb& r1, int b,
                                           const uint32_t (&b0)[2], const uint32_t (&b1)[2],
                                           const float (&d8)[2][2], float (&acc0)[4],
                                           float (&acc1)[4]) {
  static_assert(kH == 1 || kH == 2);
  const int sh = 2 * (b & 3);
  const RowSb* rr[2] = {&r0, &r1};
  if constexpr (kQ2K) {
    uint32_t a[4], am[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // i: bit 0 the row (g, g + 8), bit 1 the half
      const RowSb& r = *rr[i & 1];
      a[i] = ((r.q[i >> 1] >> sh) & 0x03030303u) * static_cast<uint32_t>(r.sc[2 * kBb + (i >> 1)]);
      am[i] = (i >> 1) == 0 ? byte_bcast<2 * kBb>(r.mn) : byte_bcast<2 * kBb + 1>(r.mn);
    }
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      float(&acc)[4] = h == 0 ? acc0 : acc1;
      int dA[4], dB[4];  // A + kBias, B + kBias
      mma_k32_u8s8(dA, a, b0[h], b1[h], kBias);
      mma_k32_u8s8(dB, am, b0[h], b1[h], kBias);
#pragma unroll
      for (int o = 0; o < 4; ++o) {
        const RowSb& r = *rr[o >> 1];
        const float m = kFast ? fma_rn(r.dmin, __int_as_float(dB[o]), r.cm)
                              : mul_rn(r.dmin, biased_float(dB[o]));
        const float t = fma_rn(r.d, biased_float(dA[o]), -m);
        acc[o] = fma_rn(d8[h][o & 1], t, acc[o]);
      }
    }
  } else {
    uint32_t a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // The signed quant low - 4 + 4 high as an s8 byte: the low pair when the high bit is set,
      // else the low pair with bits 2..7 set (low - 4).
      const RowSb& r = *rr[i & 1];
      const uint32_t hs = byte_signs(r.h[i >> 1] << (7 - b));
      a[i] = ((r.q[i >> 1] >> sh) & 0x03030303u) | (~hs & 0xFCFCFCFCu);
    }
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      float(&acc)[4] = h == 0 ? acc0 : acc1;
      int p0[4], p1[4];
      mma_k16_s8s8(p0, a[0], a[1], b0[h]);
      mma_k16_s8s8(p1, a[2], a[3], b1[h]);
#pragma unroll
      for (int o = 0; o < 4; ++o) {
        const RowSb& r = *rr[o >> 1];
        const int A = r.sc[2 * kBb] * p0[o] + (r.sc[2 * kBb + 1] * p1[o] + kBias);  // A + kBias
        const float t = kFast ? fma_rn(r.d, __int_as_float(A), r.cm) : mul_rn(r.d, biased_float(A));
        acc[o] = fma_rn(d8[h][o & 1], t, acc[o]);
      }
    }
  }
}

}  // namespace moecheck::cuda::mmq_tile
