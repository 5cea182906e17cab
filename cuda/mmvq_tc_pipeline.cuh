// The tensor-core MMVQ engine's copy pipeline (cuda/mmvq_tc.cu): tile and stage geometry, the
// block's shared-memory layout, mbarrier and bulk-copy helpers, the step cursor, the two ways a
// stage is filled (cp.async.bulk from warp 0, 16-byte cp.async from every thread) and the
// activation staging. Loads only: nothing here touches the arithmetic of docs/numerics.md.
// Internal to cuda/mmvq_tc.cu (one translation unit).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/blocks.h"
#include "cuda/bulk_copy.cuh"
#include "cuda/mmvq_tiles.cuh"

namespace moecheck::cuda::mmvq_tc::detail {

using namespace mmvq_tiles;

__device__ __forceinline__ float f16_arith(uint16_t h) { return __half2float(__ushort_as_half(h)); }

constexpr int kTileRows = 16;
constexpr int kChunkBlocks = 4;  // super-blocks per row per stage: the classes sb % 4

template <GgmlType kType>
constexpr int kBlockBytes = kType == GgmlType::kQ2K ? 84 : 110;

// One row's stage slot: 4 super-blocks plus the 16-byte alignment slack at both ends.
__host__ __device__ constexpr int slot_bytes(int block_bytes) {
  return (kChunkBlocks * block_bytes + 30 + 15) / 16 * 16;
}

// Byte offsets in a block's shared memory: the stage buffers, the staged activation row (quants
// [unit][8 words]; per unit d8 as f32 and the two half sums as 16-bit halves), the chains handed
// to warp 0 at the end of a tile ([2 tile parities][4 classes][32 lanes][4]), the mbarriers
// (full: the stage's bytes landed; empty: every warp is done with it).
struct BlockLayout {
  int stage_bytes, act_q, act_f, red, full, empty, bytes;
  __host__ __device__ BlockLayout(int block_bytes, int units, int stages) {
    stage_bytes = kTileRows * slot_bytes(block_bytes);
    act_q = stages * stage_bytes;
    act_f = act_q + units * 32;
    red = act_f + units * 8;
    full = red + 2 * 4 * kWarpSize * 16;
    empty = full + stages * 8;
    bytes = (empty + stages * 8 + 15) / 16 * 16;
  }
};

// The dynamic shared memory of every engine kernel, at namespace scope so that reads through
// byte offsets compile to 32-bit shared-window loads (no generic 64-bit addressing).
extern __shared__ __align__(16) uint8_t tc_smem[];

__device__ __forceinline__ uint32_t s_u32(int off) {
  return *reinterpret_cast<const uint32_t*>(tc_smem + off);
}
__device__ __forceinline__ uint32_t s_u16(int off) {
  return *reinterpret_cast<const uint16_t*>(tc_smem + off);
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }

// A step's tile (group, u-th tile of the group) and stage (chunk), advanced one step at a time
// (no 64-bit division per step).
struct Cursor {
  int64_t group, u;
  int chunk;
};

struct Ctx {
  const MmvqParams& p;
  uint8_t* smem;
  BlockLayout L;
  int nsb, nchunk, stride;
  int64_t tpg;

  __device__ __forceinline__ Cursor at(int64_t tile) const { return {tile / tpg, tile % tpg, 0}; }
  __device__ __forceinline__ void advance(Cursor& q) const {
    if (++q.chunk < nchunk) return;
    q.chunk = 0;
    if (++q.u < tpg) return;
    q.u = 0;
    ++q.group;
  }
  __device__ __forceinline__ int64_t row0(const Cursor& q) const {
    return stride == 1 ? kTileRows * q.u : 2 * kTileRows * (q.u / 2) + (q.u % 2);
  }
};

// The issuing side's group, looked up once per group change.
struct GroupCache {
  int64_t group = -1;
  GroupInfo gi{nullptr, 0};
};

// Starts the copies of the step at cursor q into stage buffer k: lane i < 16 copies row i of the
// tile.
template <GgmlType kType>
__device__ __forceinline__ void issue(const Ctx& c, const Cursor& q, int k, GroupCache& gc) {
  constexpr int kBB = kBlockBytes<kType>;
  const int lane = lane_id();
  if (q.group != gc.group) {
    gc.group = q.group;
    gc.gi = group_info(c.p, q.group);
  }
  uint64_t* bar = reinterpret_cast<uint64_t*>(c.smem + c.L.full) + k;
  uint32_t size = 0;
  uintptr_t a = 0;
  if (lane < kTileRows && gc.gi.n > 0) {
    const int64_t r = c.row0(q) + static_cast<int64_t>(c.stride) * lane;
    if (r < c.p.rows) {
      const int nb = min(kChunkBlocks, c.nsb - kChunkBlocks * q.chunk);
      const uintptr_t s = reinterpret_cast<uintptr_t>(gc.gi.base) +
                          static_cast<uintptr_t>(r * c.p.row_bytes) +
                          static_cast<uintptr_t>(q.chunk * kChunkBlocks * kBB);
      a = s & ~uintptr_t{15};
      size = static_cast<uint32_t>(((s + nb * kBB + 15) & ~uintptr_t{15}) - a);
    }
  }
  const uint32_t total = __reduce_add_sync(0xFFFFFFFFu, size);
  if (lane == 0) bulk::bar_expect_tx(bar, total);
  __syncwarp();
  if (size > 0)
    bulk::copy(c.smem + k * c.L.stage_bytes + lane * slot_bytes(kBB),
               reinterpret_cast<const void*>(a), size, bar);
}

// The same step's bytes by 16-byte cp.async from every thread of the block (kThreads), each
// thread then arriving on the stage's full barrier once its copies have landed (count kThreads).
template <GgmlType kType, int kThreads>
__device__ __forceinline__ void issue_async(const Ctx& c, const Cursor& q, int k, GroupCache& gc) {
  constexpr int kBB = kBlockBytes<kType>;
  constexpr int kChunks = slot_bytes(kBB) / 16;  // 16-byte chunks per row slot
  if (q.group != gc.group) {
    gc.group = q.group;
    gc.gi = group_info(c.p, q.group);
  }
  uint8_t* stage = c.smem + k * c.L.stage_bytes;
  if (gc.gi.n > 0) {
    const int nb = min(kChunkBlocks, c.nsb - kChunkBlocks * q.chunk);
    const uintptr_t first = reinterpret_cast<uintptr_t>(gc.gi.base) +
                            static_cast<uintptr_t>(q.chunk * kChunkBlocks * kBB);
    const int64_t r0 = c.row0(q);
    for (int idx = static_cast<int>(threadIdx.x); idx < kTileRows * kChunks; idx += kThreads) {
      const int i = idx / kChunks, j = idx - i * kChunks;
      const int64_t r = r0 + static_cast<int64_t>(c.stride) * i;
      if (r >= c.p.rows) continue;
      const uintptr_t s = first + static_cast<uintptr_t>(r * c.p.row_bytes);
      const uintptr_t a = s & ~uintptr_t{15};
      if (a + 16 * static_cast<uintptr_t>(j) >= s + nb * kBB) continue;
      bulk::async16(stage + i * slot_bytes(kBB) + 16 * j,
                    reinterpret_cast<const void*>(a + 16 * static_cast<uintptr_t>(j)));
    }
  }
  bulk::async_arrive_noinc(reinterpret_cast<uint64_t*>(c.smem + c.L.full) + k);
}

// Activation row ar into the block's staging (all kThreads threads; the caller synchronises
// before and after): quants by coalesced words, d8 widened, then the exact half sums.
template <int kThreads>
__device__ __forceinline__ void stage_act(const Ctx& c, int ar) {
  const int units = static_cast<int>(c.p.K / kQK8_1);
  uint32_t* aq = reinterpret_cast<uint32_t*>(c.smem + c.L.act_q);
  uint2* af = reinterpret_cast<uint2*>(c.smem + c.L.act_f);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(c.p.a + static_cast<int64_t>(ar) * units);
  for (int w = static_cast<int>(threadIdx.x); w < 9 * units; w += kThreads) {
    const uint32_t v = __ldg(src + w);
    const int g = w / 9, k = w - 9 * g;
    // d8's NaN bits never reach an output unchanged (only through fma_rn): the hardware
    // widening is exact enough, as in cuda/mmvq.cu.
    if (k == 0) af[g].x = __float_as_uint(f16_arith(static_cast<uint16_t>(v & 0xFFFF)));
    else aq[8 * g + k - 1] = v;
  }
  __syncthreads();
  for (int g = static_cast<int>(threadIdx.x); g < units; g += kThreads) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 = __dp4a(static_cast<int>(aq[8 * g + k]), 0x01010101, s0);
      s1 = __dp4a(static_cast<int>(aq[8 * g + 4 + k]), 0x01010101, s1);
    }
    af[g].y = (static_cast<uint32_t>(s0) & 0xFFFFu) | (static_cast<uint32_t>(s1) << 16);
  }
}

}  // namespace moecheck::cuda::mmvq_tc::detail
