// MMVQ unit arithmetic: per q8_1 unit of a Q2_K / Q3_K weight row, the exact integer parts
// (masked dp4a for the 2-bit quant planes and the Q3_K high bits; dp2a for the scale and min
// products) and the float part t, from the tile bytes staged in shared memory. Used by
// cuda/mmvq_rows.cuh's row_dot (any token count), row_pair (one token, two rows per warp) and
// row_pair_n (two rows per warp, up to 8 tokens).
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k": integer parts are exact, so they may be
// computed in any way; t is the contract's float expression, bit for bit (mmvq_unit_q2k /
// mmvq_unit_q3k of core/portable_math.h, shared with the emulation).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/blocks.h"
#include "core/portable_math.h"
#include "cuda/device_util.cuh"

namespace moecheck::cuda::mmvq_units {

// Unsigned bytes of a times signed bytes of b, summed into c (PTX dp4a.u32.s32): the masked
// weight quants below are 0..192 and must not be read as signed.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int r;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

__device__ __forceinline__ float f16_arith(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// One weight unit decoded for the integer parts: the quant words masked to unit b's bit pair
// (Q3_K also the high-bit words masked to bit b), the two sub-block scales (Q2_K also the
// mins) and the f16 factors widened. Any exact decoding is allowed (numerics.md: integer parts
// are exact); the f16 widenings are exact.
struct WeightUnit {
  uint32_t q[8], hm[8];
  int sc0, sc1, mn0, mn1;
  float d, dmin;
};

template <GgmlType kType, bool kAligned4>
__device__ __forceinline__ WeightUnit decode_unit(const uint8_t* buf, int blk, int b) {
  WeightUnit u;
  const uint32_t mask = 0x03030303u << (2 * (b & 3));
  if constexpr (kType == GgmlType::kQ2K) {
    if constexpr (kAligned4) {
      lds_words_aligned<8>(buf, blk + 16 + 32 * (b >> 2), u.q);
      const uint32_t dd = *reinterpret_cast<const uint32_t*>(buf + blk + 80);  // d, dmin
      u.d = f16_arith(static_cast<uint16_t>(dd & 0xFFFF));
      u.dmin = f16_arith(static_cast<uint16_t>(dd >> 16));
    } else {
      lds_words<8>(buf, blk + 16 + 32 * (b >> 2), u.q);
      u.d = f16_arith(lds_u16(buf, blk + 80));
      u.dmin = f16_arith(lds_u16(buf, blk + 82));
    }
    const uint32_t sc = lds_u16(buf, blk + 2 * b);  // scales[2b], scales[2b + 1]
    u.sc0 = sc & 0xF;
    u.mn0 = (sc >> 4) & 0xF;
    u.sc1 = (sc >> 8) & 0xF;
    u.mn1 = (sc >> 12) & 0xF;
  } else {
    lds_words<8>(buf, blk + 32 + 32 * (b >> 2), u.q);
    lds_words<8>(buf, blk, u.hm);
#pragma unroll
    for (int k = 0; k < 8; ++k) u.hm[k] &= 0x01010101u << b;  // high bit of unit b: bit b
    // Sub-blocks j = 2b, 2b + 1: low nibbles in scales[j & 7] >> 4 (j >> 3), i.e. the two
    // bytes at 2 (b & 3), shifted by 4 (b >> 2); high pairs in scales[8 + (j & 3)] >> 2 (j >> 2),
    // i.e. the two bytes at 8 + 2 (b & 1), shifted by 2 (b >> 1). Two 16-bit reads.
    const uint32_t lo =
        static_cast<uint32_t>(lds_u16(buf, blk + 96 + 2 * (b & 3))) >> (4 * (b >> 2));
    const uint32_t hi =
        static_cast<uint32_t>(lds_u16(buf, blk + 104 + 2 * (b & 1))) >> (2 * (b >> 1));
    u.sc0 = static_cast<int>((lo & 0xF) | ((hi & 3) << 4)) - 32;
    u.sc1 = static_cast<int>(((lo >> 8) & 0xF) | (((hi >> 8) & 3) << 4)) - 32;
    u.mn0 = u.mn1 = 0;
    u.d = f16_arith(lds_u16(buf, blk + 108));
    u.dmin = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) u.q[k] &= mask;
  return u;
}

// The 32 activation quants of a staged unit (values 0-15 in x0, 16-31 in x1) as the eight words
// the dp4a dots read.
__device__ __forceinline__ void act_words(const uint4& x0, const uint4& x1, int (&aq)[8]) {
  aq[0] = static_cast<int>(x0.x);
  aq[1] = static_cast<int>(x0.y);
  aq[2] = static_cast<int>(x0.z);
  aq[3] = static_cast<int>(x0.w);
  aq[4] = static_cast<int>(x1.x);
  aq[5] = static_cast<int>(x1.y);
  aq[6] = static_cast<int>(x1.z);
  aq[7] = static_cast<int>(x1.w);
}

// The float part t of numerics.md for unit b of a decoded weight unit against one staged
// activation unit (quants x0, x1, half sums hs). Integer parts by masked dp4a: the quants of
// unit b sit at bits 2 (b % 4) of each byte, so q & (3 << 2 (b % 4)) dotted with a is
// 4^(b % 4) times the true dot, shifted back exactly.
template <GgmlType kType>
__device__ __forceinline__ float unit_t(const WeightUnit& u, int b, const uint4& x0,
                                        const uint4& x1, const int2& hs) {
  const int sh = 2 * (b & 3);
  int aq[8];
  act_words(x0, x1, aq);
  int p0 = 0, p1 = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    p0 = dp4a_us(u.q[k], aq[k], p0);
    p1 = dp4a_us(u.q[k + 4], aq[k + 4], p1);
  }
  p0 >>= sh;
  p1 >>= sh;
  if constexpr (kType == GgmlType::kQ3K) {  // quant = low - 4 + 4 high
    int h0 = 0, h1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      h0 = dp4a_us(u.hm[k], aq[k], h0);
      h1 = dp4a_us(u.hm[k + 4], aq[k + 4], h1);
    }
    p0 += 4 * ((h0 >> b) - hs.x);
    p1 += 4 * ((h1 >> b) - hs.y);
  }
  const int A = u.sc0 * p0 + u.sc1 * p1;
  if constexpr (kType == GgmlType::kQ2K)
    return mmvq_unit_q2k(u.d, u.dmin, A, u.mn0 * hs.x + u.mn1 * hs.y);
  else return mmvq_unit_q3k(u.d, A);
}

// Per-lane constants of unit position b = g % 8: they do not change as g steps by 32.
struct UnitPos {
  int b, sh;          // position, bit shift of its quant pair
  uint32_t mask;      // its quant pair in every byte
  int q_off;          // its 32 quant bytes in the block
  int sc_off, sc_sh;  // Q2_K: scales[2b] (16 bits); Q3_K: low nibbles (16 bits) and their shift
  int hi_off, hi_sh;  // Q3_K: high scale bits (16 bits) and their shift
};

template <GgmlType kType>
__device__ __forceinline__ UnitPos unit_pos(int b) {
  UnitPos u;
  u.b = b;
  u.sh = 2 * (b & 3);
  u.mask = 0x03030303u << u.sh;
  if constexpr (kType == GgmlType::kQ2K) {
    u.q_off = 16 + 32 * (b >> 2);
    u.sc_off = 2 * b;
    u.sc_sh = u.hi_off = u.hi_sh = 0;
  } else {
    // Sub-blocks j = 2b, 2b + 1: low nibbles in scales[j & 7] >> 4 (j >> 3), i.e. the two bytes
    // at 2 (b & 3) shifted by 4 (b >> 2); high pairs in scales[8 + (j & 3)] >> 2 (j >> 2), i.e.
    // the two bytes at 8 + 2 (b & 1) shifted by 2 (b >> 1).
    u.q_off = 32 + 32 * (b >> 2);
    u.sc_off = 96 + 2 * (b & 3);
    u.sc_sh = 4 * (b >> 2);
    u.hi_off = 104 + 2 * (b & 1);
    u.hi_sh = 2 * (b >> 1);
  }
  return u;
}

// n words at a 2-byte aligned shared offset given as its 4-byte aligned part wb and the funnel
// shift fs = 8 (offset % 4): both are fixed per lane and row across the unit loop.
template <int N>
__device__ __forceinline__ void lds_words_fs(const uint8_t* smem, int wb, int fs,
                                             uint32_t (&out)[N]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + wb);
  uint32_t raw[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) raw[i] = w[i];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(raw[i], raw[i + 1], fs);
}

// The weight side of unit u of the block at blk (wb = blk & ~3, fs = 8 (blk & 3)): its quant
// words masked to its bit pair (Q3_K also the high-bit words masked to its bit), its two
// sub-blocks' scale bytes ready for dp2a and the f16 factors widened (exact). Decoded once per
// (row, unit), it feeds every token of a group.
struct PosWeights {
  uint32_t q[8], hm[8];
  int sa;  // Q2_K: the two scales as bytes 0 and 1; Q3_K: the two 6-bit scales plus 32
  int sb;  // Q2_K: the two mins as bytes 0 and 1
  float d, dmin;
};

template <GgmlType kType, bool kAligned4>
__device__ __forceinline__ PosWeights pos_weights(const uint8_t* buf, int blk, int wb, int fs,
                                                  const UnitPos& u) {
  PosWeights w;
  if constexpr (kType == GgmlType::kQ2K && kAligned4) lds_words_aligned<8>(buf, blk + u.q_off, w.q);
  else lds_words_fs<8>(buf, wb + u.q_off, fs, w.q);
#pragma unroll
  for (int k = 0; k < 8; ++k) w.q[k] &= u.mask;
  if constexpr (kType == GgmlType::kQ2K) {
    const int sc = lds_u16(buf, blk + u.sc_off);  // scales[2b], scales[2b + 1]: scale | min << 4
    w.sa = sc & 0x0F0F;
    w.sb = (sc >> 4) & 0x0F0F;
    if constexpr (kAligned4) {
      const uint32_t dd = *reinterpret_cast<const uint32_t*>(buf + blk + 80);  // d, dmin
      w.d = f16_arith(static_cast<uint16_t>(dd & 0xFFFF));
      w.dmin = f16_arith(static_cast<uint16_t>(dd >> 16));
    } else {
      w.d = f16_arith(lds_u16(buf, blk + 80));
      w.dmin = f16_arith(lds_u16(buf, blk + 82));
    }
  } else {
    lds_words_fs<8>(buf, wb, fs, w.hm);
    const uint32_t hbit = 0x01010101u << u.b;
#pragma unroll
    for (int k = 0; k < 8; ++k) w.hm[k] &= hbit;
    const uint32_t lo = static_cast<uint32_t>(lds_u16(buf, blk + u.sc_off)) >> u.sc_sh;
    const uint32_t hi = static_cast<uint32_t>(lds_u16(buf, blk + u.hi_off)) >> u.hi_sh;
    w.sa = static_cast<int>((lo & 0x0F0Fu) | ((hi << 4) & 0x3030u));
    w.sb = 0;
    w.d = f16_arith(lds_u16(buf, blk + 108));
    w.dmin = 0.0f;
  }
  return w;
}

// t of numerics.md for a decoded weight unit against one activation unit (quants aq, half sums
// hs; hs16 = the half sums as two 16-bit halves, low = first). Integer parts exact: masked dp4a
// as in unit_t; the scale products by dp2a (16-bit p halves times the two scale bytes): |p| <=
// 8192 and |half sum| <= 2048 fit 16 bits, so A and B are the same integers as sc0 p0 + sc1 p1
// and m0 a0 + m1 a1.
template <GgmlType kType>
__device__ __forceinline__ float pos_dot(const PosWeights& w, const UnitPos& u, const int (&aq)[8],
                                         const int2& hs, int hs16) {
  int p0 = 0, p1 = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    p0 = dp4a_us(w.q[k], aq[k], p0);
    p1 = dp4a_us(w.q[k + 4], aq[k + 4], p1);
  }
  p0 >>= u.sh;
  p1 >>= u.sh;
  if constexpr (kType == GgmlType::kQ2K) {
    const int A = __dp2a_lo(static_cast<int>(__byte_perm(p0, p1, 0x5410)), w.sa, 0);
    const int B = __dp2a_lo(hs16, w.sb, 0);
    return mmvq_unit_q2k(w.d, w.dmin, A, B);
  } else {
    int h0 = 0, h1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      h0 = dp4a_us(w.hm[k], aq[k], h0);
      h1 = dp4a_us(w.hm[k + 4], aq[k + 4], h1);
    }
    p0 += 4 * ((h0 >> u.b) - hs.x);  // quant = low - 4 + 4 high
    p1 += 4 * ((h1 >> u.b) - hs.y);
    // The two 6-bit scales plus 32 as bytes 0 and 1: A = sum (s + 32) p - 32 (p0 + p1).
    const int A =
        __dp2a_lo(static_cast<int>(__byte_perm(p0, p1, 0x5410)), w.sa, 0) - 32 * (p0 + p1);
    return mmvq_unit_q3k(w.d, A);
  }
}

// t of the unit at position u of the block at blk against one activation unit: pos_dot of
// pos_weights.
template <GgmlType kType, bool kAligned4>
__device__ __forceinline__ float pos_t(const uint8_t* buf, int blk, int wb, int fs,
                                       const UnitPos& u, const int (&aq)[8], const int2& hs,
                                       int hs16) {
  return pos_dot<kType>(pos_weights<kType, kAligned4>(buf, blk, wb, fs, u), u, aq, hs, hs16);
}

}  // namespace moecheck::cuda::mmvq_units
