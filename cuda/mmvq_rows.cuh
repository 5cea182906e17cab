// MMVQ row routines (cuda/mmvq.cu's kernel computes a staged tile with them): the group's
// activation rows staged into shared memory, and the lane chains of one row against up to 8
// tokens (row_dot), of two rows against one token (row_pair) and of two rows against up to 8
// tokens (row_pair_n). Every routine computes the contract's chains and butterflies unchanged;
// they differ only in which loads and decodes they share. Contract: docs/numerics.md
// "mmvq_q2k, mmvq_q3k".
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "core/portable_math.h"
#include "cuda/device_util.cuh"
#include "cuda/mmvq_tiles.cuh"
#include "cuda/mmvq_units.cuh"

namespace moecheck::cuda::mmvq_rows {

using namespace mmvq_tiles;
using namespace mmvq_units;

// The group's activation rows staged once per block and group: per (token, unit) the 32
// quants, d8 widened to f32 and the exact sums of the two halves. The quants are stored as two
// arrays of 16-byte words (values 0-15, then 16-31), unit-contiguous, so that a warp's lanes
// (consecutive units) read consecutive 16-byte words: no shared-memory bank conflicts.
struct ActLayout {
  int q, d, s, bytes;
  __host__ __device__ ActLayout(int buf_bytes, int n_bufs, int units, int max_n) {
    q = n_bufs * buf_bytes;
    d = q + max_n * units * 32;
    s = d + max_n * units * 4;
    bytes = s + max_n * units * 8;
  }
};

// Two passes: the rows' 36-byte blocks are read as consecutive 4-byte words (coalesced: a
// warp reads 128 contiguous bytes) and scattered into the layout, then each (token, unit)
// sums its halves from shared memory. The caller synchronises after.
template <int kThreads>
__device__ __forceinline__ void stage_act(const MmvqParams& p, int64_t group, int n, int units,
                                          uint8_t* smem, const ActLayout& L) {
  uint32_t* q_lo = reinterpret_cast<uint32_t*>(smem + L.q);  // words 0-3 of every (token, unit)
  uint32_t* q_hi = q_lo + 4 * n * units;                     // words 4-7
  float* act_d = reinterpret_cast<float*>(smem + L.d);
  const int words = 9 * units;  // one row of q8_1 blocks
  for (int i = 0; i < n; ++i) {
    const uint32_t* src =
        reinterpret_cast<const uint32_t*>(p.a + static_cast<int64_t>(act_row(p, group, i)) * units);
    for (int w = threadIdx.x; w < words; w += kThreads) {
      const uint32_t v = __ldg(src + w);
      const int g = w / 9, k = w - 9 * g;
      const int it = i * units + g;
      // NaN bits of d8 never reach an output unchanged (only through fma_rn, which returns the
      // canonical NaN on both sides), so the hardware conversion is exact enough here.
      if (k == 0) act_d[it] = __half2float(__ushort_as_half(static_cast<uint16_t>(v & 0xFFFF)));
      else if (k <= 4) q_lo[4 * it + k - 1] = v;
      else q_hi[4 * it + k - 5] = v;
    }
  }
  __syncthreads();
  int2* act_s = reinterpret_cast<int2*>(smem + L.s);
  for (int it = threadIdx.x; it < n * units; it += kThreads) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 = __dp4a(0x01010101, static_cast<int>(q_lo[4 * it + k]), s0);
      s1 = __dp4a(0x01010101, static_cast<int>(q_hi[4 * it + k]), s1);
    }
    act_s[it] = make_int2(s0, s1);
  }
}

// Row `row_off` (byte offset in buf) against the n staged tokens: the lane chains and the
// butterfly; lane 0 writes y[out_row(i) * rows + row].
template <GgmlType kType, bool kAligned4, int kMaxN>
__device__ __forceinline__ void row_dot(const MmvqParams& p, const uint8_t* smem,
                                        const uint8_t* buf, const ActLayout& L, int row_off, int n,
                                        int64_t group, int64_t row) {
  constexpr int kBB = kType == GgmlType::kQ2K ? 84 : 110;  // block bytes
  const int lane = threadIdx.x % kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const uint4* act_q = reinterpret_cast<const uint4*>(smem + L.q);
  const float* act_d = reinterpret_cast<const float*>(smem + L.d);
  const int2* act_s = reinterpret_cast<const int2*>(smem + L.s);
  float acc[kMaxN];
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) acc[i] = 0.0f;
  for (int g = lane; g < units; g += kWarpSize) {
    const int b = g & (kQ8PerSuperBlock - 1);
    const WeightUnit u =
        decode_unit<kType, kAligned4>(buf, row_off + (g / kQ8PerSuperBlock) * kBB, b);
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      if (i < n) {
        const int ai = i * units + g;
        acc[i] = fma_rn(act_d[ai], unit_t<kType>(u, b, act_q[ai], act_q[n * units + ai], act_s[ai]),
                        acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) {
    if (i < n) {
      const float v = warp_butterfly(acc[i]);
      if (lane == 0) p.y[static_cast<int64_t>(out_row(p, group, i)) * p.rows + row] = v;
    }
  }
}

// Two rows (row, row + 1 at row_off, row_off + row_bytes) against one staged token: each
// activation load and its addressing feed both rows; the two lane chains are independent and
// unchanged. Tail (units % 32 = r, 0 < r <= 16): lanes 0..r-1 compute t of the first row's
// units, lanes r..2r-1 those of the second row, and the second row's t moves to its owning
// lane by a shuffle (t is a pure function of its unit: the same bits on any lane).
template <GgmlType kType, bool kAligned4>
__device__ __forceinline__ void row_pair(const MmvqParams& p, const uint8_t* smem,
                                         const uint8_t* buf, const ActLayout& L, int row_off,
                                         int64_t group, int64_t row) {
  constexpr int kBB = kType == GgmlType::kQ2K ? 84 : 110;
  constexpr int kStep = kWarpSize / kQ8PerSuperBlock * kBB;  // bytes per 32 units
  const int lane = threadIdx.x % kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const int rb = p.row_bytes;
  const uint4* act_q = reinterpret_cast<const uint4*>(smem + L.q);
  const float* act_d = reinterpret_cast<const float*>(smem + L.d);
  const int2* act_s = reinterpret_cast<const int2*>(smem + L.s);
  const int tail = units % kWarpSize;
  const int split =
      tail <= kWarpSize / 2 ? units - tail : units;  // units below: both rows per lane
  float acc0 = 0.0f, acc1 = 0.0f;
  {
    const UnitPos u = unit_pos<kType>(lane & (kQ8PerSuperBlock - 1));
    int blk = row_off + (lane / kQ8PerSuperBlock) * kBB;
    int wb = blk & ~3;  // kStep is a multiple of 4: the alignments stay fixed
    const int fs0 = 8 * (blk & 3), fs1 = 8 * ((blk + rb) & 3);
    const int wb1 = ((blk + rb) & ~3) - wb;
    for (int g = lane; g < split; g += kWarpSize, blk += kStep, wb += kStep) {
      const uint4 x0 = act_q[g], x1 = act_q[units + g];
      int aq[8];
      act_words(x0, x1, aq);
      const int2 hs = act_s[g];
      const int hs16 = static_cast<int>(__byte_perm(hs.x, hs.y, 0x5410));
      const float d8 = act_d[g];
      const float t0 = pos_t<kType, kAligned4>(buf, blk, wb, fs0, u, aq, hs, hs16);
      const float t1 = pos_t<kType, kAligned4>(buf, blk + rb, wb + wb1, fs1, u, aq, hs, hs16);
      acc0 = fma_rn(d8, t0, acc0);
      acc1 = fma_rn(d8, t1, acc1);
    }
  }
  if (split < units) {  // warp-uniform
    const int second = lane >= tail ? 1 : 0;
    const int g = split + lane - second * tail;
    float t = 0.0f;
    if (lane < 2 * tail) {
      const UnitPos u = unit_pos<kType>(g & (kQ8PerSuperBlock - 1));
      const uint4 x0 = act_q[g], x1 = act_q[units + g];
      int aq[8];
      act_words(x0, x1, aq);
      const int2 hs = act_s[g];
      const int blk = row_off + second * rb + (g / kQ8PerSuperBlock) * kBB;
      t = pos_t<kType, kAligned4>(buf, blk, blk & ~3, 8 * (blk & 3), u, aq, hs,
                                  static_cast<int>(__byte_perm(hs.x, hs.y, 0x5410)));
    }
    const float t1 = __shfl_down_sync(0xFFFFFFFFu, t, tail);
    if (lane < tail) {
      const float d8 = act_d[g];
      acc0 = fma_rn(d8, t, acc0);
      acc1 = fma_rn(d8, t1, acc1);
    }
  }
  const float v0 = warp_butterfly(acc0);
  const float v1 = warp_butterfly(acc1);
  if (lane == 0) {
    float* y = p.y + static_cast<int64_t>(out_row(p, group, 0)) * p.rows + row;
    y[0] = v0;
    y[1] = v1;
  }
}

// Two rows (as row_pair) against the n <= kMaxN staged tokens of a group: each row's weight
// unit is decoded once (pos_weights) and feeds every token; each token's activation load feeds
// both rows. The 2 n lane chains are the contract's, unchanged. The tail (units % 32 = r, 0 < r
// <= 16) as in row_pair: lanes r..2r-1 compute the second row's t of each token and shuffle it
// to its owning lane. The group holds exactly kN tokens: each count has its own code, so the
// token loop has no guards and the compiler interleaves the tokens' chains (cuda/mmvq.cu's
// warp_rows picks the count).
template <GgmlType kType, bool kAligned4, int kN>
__device__ __forceinline__ void row_pair_n(const MmvqParams& p, const uint8_t* smem,
                                           const uint8_t* buf, const ActLayout& L, int row_off,
                                           int64_t group, int64_t row) {
  constexpr int n = kN;  // tokens
  constexpr int kBB = kType == GgmlType::kQ2K ? 84 : 110;
  constexpr int kStep = kWarpSize / kQ8PerSuperBlock * kBB;  // bytes per 32 units
  const int lane = threadIdx.x % kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const int rb = p.row_bytes;
  const uint4* act_q = reinterpret_cast<const uint4*>(smem + L.q);
  const float* act_d = reinterpret_cast<const float*>(smem + L.d);
  const int2* act_s = reinterpret_cast<const int2*>(smem + L.s);
  const int hi = n * units;  // act_q[hi + ai]: values 16-31 of (token, unit) ai
  const int tail = units % kWarpSize;
  const int split = tail <= kWarpSize / 2 ? units - tail : units;
  float acc0[kN], acc1[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) acc0[i] = acc1[i] = 0.0f;
  {
    const UnitPos u = unit_pos<kType>(lane & (kQ8PerSuperBlock - 1));
    int blk = row_off + (lane / kQ8PerSuperBlock) * kBB;
    int wb = blk & ~3;
    const int fs0 = 8 * (blk & 3), fs1 = 8 * ((blk + rb) & 3);
    const int wb1 = ((blk + rb) & ~3) - wb;
    for (int g = lane; g < split; g += kWarpSize, blk += kStep, wb += kStep) {
      const PosWeights w0 = pos_weights<kType, kAligned4>(buf, blk, wb, fs0, u);
      const PosWeights w1 = pos_weights<kType, kAligned4>(buf, blk + rb, wb + wb1, fs1, u);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const int ai = i * units + g;
        const uint4 x0 = act_q[ai], x1 = act_q[hi + ai];
        int aq[8];
        act_words(x0, x1, aq);
        const int2 hs = act_s[ai];
        const int hs16 = static_cast<int>(__byte_perm(hs.x, hs.y, 0x5410));
        const float d8 = act_d[ai];
        acc0[i] = fma_rn(d8, pos_dot<kType>(w0, u, aq, hs, hs16), acc0[i]);
        acc1[i] = fma_rn(d8, pos_dot<kType>(w1, u, aq, hs, hs16), acc1[i]);
      }
    }
  }
  if (split < units) {  // warp-uniform
    const int second = lane >= tail ? 1 : 0;
    const int g = split + lane - second * tail;
    const bool active = lane < 2 * tail;
    const UnitPos u = unit_pos<kType>(g & (kQ8PerSuperBlock - 1));
    PosWeights w{};
    if (active) {
      const int blk = row_off + second * rb + (g / kQ8PerSuperBlock) * kBB;
      w = pos_weights<kType, kAligned4>(buf, blk, blk & ~3, 8 * (blk & 3), u);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int ai = i * units + g;
      float t = 0.0f;
      if (active) {
        const uint4 x0 = act_q[ai], x1 = act_q[hi + ai];
        int aq[8];
        act_words(x0, x1, aq);
        const int2 hs = act_s[ai];
        t = pos_dot<kType>(w, u, aq, hs, static_cast<int>(__byte_perm(hs.x, hs.y, 0x5410)));
      }
      const float t1 = __shfl_down_sync(0xFFFFFFFFu, t, tail);
      if (lane < tail) {
        const float d8 = act_d[ai];
        acc0[i] = fma_rn(d8, t, acc0[i]);
        acc1[i] = fma_rn(d8, t1, acc1[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float v0 = warp_butterfly(acc0[i]);
    const float v1 = warp_butterfly(acc1[i]);
    if (lane == 0) {
      float* y = p.y + static_cast<int64_t>(out_row(p, group, i)) * p.rows + row;
      y[0] = v0;
      y[1] = v1;
    }
  }
}

}  // namespace moecheck::cuda::mmvq_rows
