// The launch parameters of the MMVQ kernel and its tile walk (cuda/mmvq.cu): which matrix and
// token rows a group has (plain, one-token experts, or the layer's groups over a slot table),
// and the (group, row block) cursor whose tiles are copied into shared memory with 16-byte
// cp.async. Loads only: nothing here touches the arithmetic. Contract: docs/numerics.md
// "mmvq_q2k, mmvq_q3k".
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>

#include "core/blocks.h"
#include "core/layer_plan.h"
#include "core/schedule.h"

namespace moecheck::cuda::mmvq_tiles {

enum class Form : int { kPlain, kExperts, kGroups };

struct MmvqParams {
  Form form;
  const uint8_t* w;             // kPlain
  const uint8_t* const* table;  // kExperts, kGroups: device slot table
  const MmvqGroup* groups;      // kGroups
  const BlockQ8_1* a;
  bool a_per_expert;  // kExperts
  float* y;
  int64_t rows;
  int64_t K;
  int64_t T;  // kPlain
  int row_bytes;
  int max_n;  // every group has at most max_n tokens
  int64_t n_groups;
  // kGroups planned on the device (the device route): the live group count G per projection is
  // read from dev_count when the kernel starts, and logical group g of the launch's n_proj * G
  // is the stored group (g / G) * proj_stride + g % G (projections at fixed strides of the
  // plan buffer). nullptr: n_groups groups, stored contiguously.
  const int32_t* dev_count = nullptr;
  int64_t proj_stride = 0;
  int n_proj = 1;
  int sb_warps = 0;  // the streamed engine's warps per block for this launch; 0: the process's
  // The streamed engine's tokens a pass for groups of several tokens (1 or 2; cuda/mmvq.cu sets
  // it from the layer's token count).
  int pass_tokens = 2;
  // The streamed engine's L1 prefetch at its start (mmvq_groups_planned's warm range): warm_lines
  // 128-byte lines from warm (128-byte aligned). nullptr: none.
  const uint8_t* warm = nullptr;
  int warm_lines = 0;
};

// The groups this launch computes (the device route's count, or n_groups). A device count above
// the launch's bound (n_groups = n_proj times the bound per projection: mmvq_groups_planned's
// proj_stride or max_groups) traps: the launch was sized for fewer.
__device__ __forceinline__ int64_t live_groups(const MmvqParams& p) {
  if (p.dev_count == nullptr) return p.n_groups;
  const int64_t g = static_cast<int64_t>(__ldg(p.dev_count)) * p.n_proj;
  if (g > p.n_groups) __trap();
  return g;
}

// The stored group of logical group `group` (< n_proj G): projections are stepped over rather
// than divided by the run-time G (a 64-bit division, and every output row calls this).
__device__ __forceinline__ const MmvqGroup* stored_group(const MmvqParams& p, int64_t group) {
  if (p.dev_count == nullptr) return p.groups + group;
  const int64_t G = __ldg(p.dev_count);
  const MmvqGroup* base = p.groups;
  for (int j = 1; j < p.n_proj && group >= G; ++j) {
    group -= G;
    base += p.proj_stride;
  }
  return base + group;
}

// A group's matrix base and token count, and its token rows (activation row, output row).
// Every thread reads these itself (read-only, cached loads): no thread waits on another's
// pointer load before it can issue its copies.
// A slot pointer from the device table through the read-only path.
__device__ __forceinline__ const uint8_t* load_slot(const uint8_t* const* table, int64_t i) {
  return reinterpret_cast<const uint8_t*>(
      __ldg(reinterpret_cast<const unsigned long long*>(table) + i));
}

struct GroupInfo {
  const uint8_t* base;
  int n;
};

__device__ __forceinline__ GroupInfo group_info(const MmvqParams& p, int64_t group) {
  if (p.form == Form::kPlain) {
    const int64_t t0 = group * kMaxGroupRows;
    return {p.w, static_cast<int>(p.T - t0 < kMaxGroupRows ? p.T - t0 : kMaxGroupRows)};
  }
  if (p.form == Form::kExperts) return {load_slot(p.table, group), 1};
  const MmvqGroup* gr = stored_group(p, group);
  const int n = __ldg(&gr->n);
  if (n < 0 || n > p.max_n) __trap();  // a group larger than the launch was sized for
  return {load_slot(p.table, __ldg(&gr->slot)), n};
}

__device__ __forceinline__ int act_row(const MmvqParams& p, int64_t group, int i) {
  if (p.form == Form::kPlain) return static_cast<int>(group * kMaxGroupRows + i);
  if (p.form == Form::kExperts) return p.a_per_expert ? static_cast<int>(group) : 0;
  return __ldg(&stored_group(p, group)->a_row[i]);
}

__device__ __forceinline__ int out_row(const MmvqParams& p, int64_t group, int i) {
  if (p.form == Form::kPlain) return static_cast<int>(group * kMaxGroupRows + i);
  if (p.form == Form::kExperts) return static_cast<int>(group);
  return __ldg(&stored_group(p, group)->y_row[i]);
}

// Starts the copy of [s, e) (2-byte aligned) into buf as whole 16-byte aligned chunks: byte x
// lands at buf[x - align_down(s, 16)]. The chunks at the two ends may cover up to 15 bytes
// outside the span; an aligned 16-byte chunk never crosses a page, so they are readable, and
// those bytes are never used.
template <int kThreads>
__device__ __forceinline__ void prefetch_span(const uint8_t* s, const uint8_t* e, uint8_t* buf) {
  const uintptr_t A = reinterpret_cast<uintptr_t>(s) & ~uintptr_t{15};
  const uintptr_t B = (reinterpret_cast<uintptr_t>(e) + 15) & ~uintptr_t{15};
  const int nchunk = static_cast<int>((B - A) / 16);
  const uint8_t* src = reinterpret_cast<const uint8_t*>(A);
  for (int c = threadIdx.x; c < nchunk; c += kThreads)
    __pipeline_memcpy_async(buf + 16 * c, src + 16 * c, 16);
}

// Tile buffers of the kernel with kR rows per warp.
__host__ __device__ constexpr int mmvq_buffers(int r) { return r == 1 ? 3 : 2; }

// Bytes of one of the tile buffers: W rows plus the alignment slack at both ends (and the funnel's
// one-word over-read).
__host__ __device__ constexpr int tile_buffer_bytes(int warps, int row_bytes) {
  return (warps * row_bytes + 48 + 15) / 16 * 16;
}

// A tile addressed as (group, row block), advanced one step at a time: no 64-bit division per
// tile.
struct TileCursor {
  int group, rblk;
};

// The walk over one block's tiles: kTileRows rows each, rb row blocks per group; issue() starts
// the copy of a tile into tile buffer k.
template <int kThreads, int kTileRows>
struct TileWalk {
  const MmvqParams& p;
  int rb;
  uint8_t* smem;
  int buf_bytes;

  __device__ __forceinline__ TileCursor advance(TileCursor c) const {
    if (++c.rblk == rb) {
      c.rblk = 0;
      ++c.group;
    }
    return c;
  }
  __device__ __forceinline__ const uint8_t* start(TileCursor c, const GroupInfo& gi) const {
    return gi.base + static_cast<int64_t>(c.rblk) * kTileRows * p.row_bytes;
  }
  __device__ __forceinline__ int rows(TileCursor c) const {
    const int64_t left = p.rows - static_cast<int64_t>(c.rblk) * kTileRows;
    return static_cast<int>(left < kTileRows ? left : kTileRows);
  }
  __device__ __forceinline__ void issue(TileCursor c, const GroupInfo& gi, int k) const {
    const uint8_t* s = start(c, gi);
    prefetch_span<kThreads>(s, s + static_cast<int64_t>(rows(c)) * p.row_bytes,
                            smem + k * buf_bytes);
  }
};

}  // namespace moecheck::cuda::mmvq_tiles
