// mmvq: Q2_K / Q3_K weight rows read in place times q8_1 activation rows, f32 out; groups of up
// to kMaxGroupRows activation rows per weight matrix, and the one-token form running all
// selected experts of a projection in one launch (base pointers from a device slot table).
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k"; twins: emu::mmvq, emu::mmvq_experts.
// Schedule: a tile is R * W consecutive rows (W = 2, 4, 8 warps per block, R rows per warp).
// A persistent grid walks the tiles, each block a contiguous range; the next tiles are copied
// into shared memory with 16-byte cp.async (three buffers, two at R = 2) while tile t is computed.
// Warp w computes row w of the tile for every token of the group (one-token launches: rows
// 2w, 2w + 1, sharing the activation loads): lane l takes units g = l, l + 32, ... (exact
// dp4a integer parts, the float part of numerics.md), then the butterfly. Loads never change
// the arithmetic. With cuda::MmvqEngine::kTensorCore, one-token launches go to cuda/mmvq_tc.cu
// instead (same bits). Performance: docs/performance.md "GPU".
#include <cuda_pipeline.h>

#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/mmvq_tc.cuh"
#include "cuda/mmvq_tiles.cuh"
#include "cuda/mmvq_units.cuh"

namespace moecheck::cuda {
namespace {

MmvqEngine g_engine = MmvqEngine::kDp4a;
int g_tc_stages = 0, g_tc_mode = 0;
int g_blocks_per_sm = 0;

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
      const int aq[8] = {static_cast<int>(x0.x), static_cast<int>(x0.y), static_cast<int>(x0.z),
                         static_cast<int>(x0.w), static_cast<int>(x1.x), static_cast<int>(x1.y),
                         static_cast<int>(x1.z), static_cast<int>(x1.w)};
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
      const int aq[8] = {static_cast<int>(x0.x), static_cast<int>(x0.y), static_cast<int>(x0.z),
                         static_cast<int>(x0.w), static_cast<int>(x1.x), static_cast<int>(x1.y),
                         static_cast<int>(x1.z), static_cast<int>(x1.w)};
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

// One staged tile of tr rows (its bytes in buf, copied from src) against the group's n staged
// tokens: warp w computes rows kR w (and kR w + 1) of the tile, first_row the tile's first row.
template <GgmlType kType, int kR>
__device__ __forceinline__ void compute_tile(const MmvqParams& p, const uint8_t* smem,
                                             const uint8_t* buf, const ActLayout& L,
                                             const uint8_t* src, int tr, int n, int64_t group,
                                             int64_t first_row) {
  const int first = kR * (threadIdx.x / kWarpSize);  // the warp's first row in the tile
  if (first >= tr) return;
  const int align_off = static_cast<int>(reinterpret_cast<uintptr_t>(src) & 15);
  const int row_off = align_off + first * p.row_bytes;
  const int64_t row = first_row + first;
  // Q2_K blocks are 84 bytes: all 4-byte aligned when the tile's first row is (uniform).
  // One token (the one-token form) gets its own code: no guards for seven absent tokens.
  const bool aligned = kType == GgmlType::kQ2K && ((align_off | p.row_bytes) & 3) == 0;
  if constexpr (kR == 2) {  // launched only with one token per group (n is 0 or 1)
    if (n == 1 && first + 1 < tr) {
      if (aligned) row_pair<kType, true>(p, smem, buf, L, row_off, group, row);
      else row_pair<kType, false>(p, smem, buf, L, row_off, group, row);
    } else if (n == 1) {
      if (aligned) row_dot<kType, true, 1>(p, smem, buf, L, row_off, 1, group, row);
      else row_dot<kType, false, 1>(p, smem, buf, L, row_off, 1, group, row);
    }
  } else if (n == 1) {
    if (aligned) row_dot<kType, true, 1>(p, smem, buf, L, row_off, 1, group, row);
    else row_dot<kType, false, 1>(p, smem, buf, L, row_off, 1, group, row);
  } else {
    if (aligned) row_dot<kType, true, kMaxGroupRows>(p, smem, buf, L, row_off, n, group, row);
    else row_dot<kType, false, kMaxGroupRows>(p, smem, buf, L, row_off, n, group, row);
  }
}

// kR rows per warp (1, or 2 for one-token launches: row_pair), so a tile is kR * kWarps rows.
// kR = 1: 64 registers at most (1024 threads per SM) and three tile buffers (tiles t + 1 and
// t + 2 in flight while tile t is computed). kR = 2: 85 registers at most (768 threads per SM)
// and two buffers of twice the rows (tile t + 1 in flight), so that 24 warps fit an SM: the
// pair loop is issue bound, and occupancy pays more than a deeper copy pipeline. Block b walks
// the contiguous tiles [b * tiles / grid, (b + 1) * tiles / grid): consecutive row blocks of
// mostly one group, so the activation is staged once per group change and the weight reads
// are sequential.
template <GgmlType kType, int kWarps, int kR>
__global__ void __launch_bounds__(kWarps* kWarpSize, kR == 1 ? 32 / kWarps : 24 / kWarps)
    mmvq_kernel(MmvqParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kTileRows = kWarps * kR;
  const int buf_bytes = tile_buffer_bytes(kTileRows, p.row_bytes);
  const int units = static_cast<int>(p.K / kQK8_1);
  const ActLayout L(buf_bytes, mmvq_buffers(kR), units, p.max_n);
  const int rb = static_cast<int>((p.rows + kTileRows - 1) / kTileRows);  // row blocks per group
  const int64_t tiles = static_cast<int64_t>(rb) * live_groups(p);
  const int64_t t_begin = tiles * blockIdx.x / gridDim.x,
                t_end = tiles * (blockIdx.x + 1) / gridDim.x;
  const int n_tiles = static_cast<int>(t_end - t_begin);

  const TileWalk<kThreads, kTileRows> walk{p, rb, smem, buf_bytes};
  TileCursor c0{static_cast<int>(t_begin / rb), static_cast<int>(t_begin % rb)};
  TileCursor c1 = walk.advance(c0), c2 = walk.advance(c1);
  GroupInfo g0{nullptr, 0}, g1{nullptr, 0}, g2{nullptr, 0};
  if (n_tiles > 0) {
    g0 = group_info(p, c0.group);
    walk.issue(c0, g0, 0);
  }
  __pipeline_commit();
  constexpr int kBufs = mmvq_buffers(kR);
  if constexpr (kBufs == 3) {
    if (n_tiles > 1) {
      g1 = group_info(p, c1.group);
      walk.issue(c1, g1, 1);
    }
    __pipeline_commit();
  }
  int k = 0;
  int staged = -1;
  for (int i = 0; i < n_tiles; ++i) {
    if constexpr (kBufs == 3) {
      if (i + 2 < n_tiles) {
        g2 = group_info(p, c2.group);
        walk.issue(c2, g2, k == 0 ? 2 : k - 1);  // the buffer tile i - 1 used
      }
      __pipeline_commit();
      __pipeline_wait_prior(2);  // tile i has landed
    } else {
      if (i + 1 < n_tiles) {
        g1 = group_info(p, c1.group);
        walk.issue(c1, g1, k ^ 1);  // the buffer tile i - 1 used
      }
      __pipeline_commit();
      __pipeline_wait_prior(1);  // tile i has landed
    }
    __syncthreads();
    const int key = p.form == Form::kExperts && !p.a_per_expert ? 0 : c0.group;
    if (key != staged) {  // block-uniform
      stage_act<kThreads>(p, c0.group, g0.n, units, smem, L);
      staged = key;
      __syncthreads();
    }
    compute_tile<kType, kR>(p, smem, smem + k * buf_bytes, L, walk.start(c0, g0), walk.rows(c0),
                            g0.n, c0.group, static_cast<int64_t>(c0.rblk) * kTileRows);
    __syncthreads();  // buffer k and the staged activation are free again
    c0 = c1;
    c1 = c2;
    c2 = walk.advance(c2);
    g0 = g1;
    g1 = g2;
    k = k == kBufs - 1 ? 0 : k + 1;
  }
}

template <GgmlType kType, int kWarps, int kR>
void launch_one(const MmvqParams& p, void* stream) {
  const int smem = ActLayout(tile_buffer_bytes(kWarps * kR, p.row_bytes), mmvq_buffers(kR),
                             static_cast<int>(p.K / kQK8_1), p.max_n)
                       .bytes;
  static int smem_set = 48 * 1024;  // the dynamic shared-memory limit, raised when needed
  if (smem > smem_set) {
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(mmvq_kernel<kType, kWarps, kR>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    smem_set = smem;
  }
  // Persistent grid: as many blocks as fit the device at once (at most g_blocks_per_sm per
  // multiprocessor when set), at most one per tile.
  static int per_sm = 0, sms = 0;
  static int resident_smem = -1;
  if (resident_smem != smem) {
    MOECHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, mmvq_kernel<kType, kWarps, kR>, kWarps * kWarpSize, smem));
    sms = current_sm_count();
    resident_smem = smem;
  }
  const int resident =
      (g_blocks_per_sm > 0 && g_blocks_per_sm < per_sm ? g_blocks_per_sm : per_sm) * sms;
  const int64_t tiles = (p.rows + kWarps * kR - 1) / (kWarps * kR) * p.n_groups;
  const int64_t grid = tiles < resident ? tiles : resident;
  mmvq_kernel<kType, kWarps, kR>
      <<<static_cast<unsigned>(grid), kWarps * kWarpSize, smem, as_stream(stream)>>>(p);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

template <GgmlType kType, int kR>
void launch_warps(const MmvqParams& p, int warps, void* stream) {
  switch (warps) {
    case 2: launch_one<kType, 2, kR>(p, stream); break;
    case 4: launch_one<kType, 4, kR>(p, stream); break;
    default: launch_one<kType, 8, kR>(p, stream); break;
  }
}

void launch(MmvqParams p, GgmlType t, int64_t n_groups, int max_n, int warps, const char* op,
            void* stream) {
  const std::string where = std::string("cuda::") + op + ": ";
  if (t != GgmlType::kQ2K && t != GgmlType::kQ3K)
    throw InputError(where + "weight type must be Q2_K (10) or Q3_K (11), found " +
                     std::to_string(static_cast<uint32_t>(t)));
  if (!expert_warps_allowed(warps))
    throw InputError(where + "warps per block must be 2, 4 or 8, found " + std::to_string(warps));
  if (p.K <= 0 || p.K % kQK_K != 0 || p.rows < 0 || n_groups < 0)
    throw InputError(where + "need K a positive multiple of 256 and rows >= 0, found K=" +
                     std::to_string(p.K) + " rows=" + std::to_string(p.rows));
  p.row_bytes = static_cast<int>(row_bytes(t, p.K));
  if (max_n < 1 || max_n > kMaxGroupRows)
    throw InputError(where + "tokens per group must be in [1, 8], found " + std::to_string(max_n));
  p.max_n = max_n;
  const int64_t smem = p.K > (int64_t{1} << 20)
                           ? int64_t{1} << 40
                           : ActLayout(tile_buffer_bytes(warps, p.row_bytes), mmvq_buffers(1),
                                       static_cast<int>(p.K / kQK8_1), max_n)
                                 .bytes;
  if (smem > 200 * 1024)
    throw InputError(where + "K=" + std::to_string(p.K) + " with " + std::to_string(max_n) +
                     " tokens per group needs " + std::to_string(smem) +
                     " bytes of shared memory at " + std::to_string(warps) +
                     " warps (limit 204800)");
  if (p.rows == 0 || n_groups == 0) return;
  p.n_groups = n_groups;
  require_aligned(p.a, 4, op, "a");
  require_aligned(p.y, 4, op, "y");
  if (g_engine == MmvqEngine::kTensorCore && mmvq_tc::supported(t, p.K, max_n)) {
    mmvq_tc::launch(p, t, g_tc_stages, g_tc_mode, stream);
    return;
  }
  // One token per group: two rows per warp (row_pair) when the doubled tiles fit.
  const bool pair = max_n == 1 && ActLayout(tile_buffer_bytes(2 * warps, p.row_bytes),
                                            mmvq_buffers(2), static_cast<int>(p.K / kQK8_1), 1)
                                          .bytes <= 200 * 1024;
  if (t == GgmlType::kQ2K) {
    if (pair) launch_warps<GgmlType::kQ2K, 2>(p, warps, stream);
    else launch_warps<GgmlType::kQ2K, 1>(p, warps, stream);
  } else {
    if (pair) launch_warps<GgmlType::kQ3K, 2>(p, warps, stream);
    else launch_warps<GgmlType::kQ3K, 1>(p, warps, stream);
  }
}

}  // namespace

void set_mmvq_engine(MmvqEngine e, int tc_stages, int tc_mode) {
  if (tc_stages != 0 && tc_stages != 4 && tc_stages != 6)
    throw InputError("cuda::set_mmvq_engine: tc_stages must be 0, 4 or 6, found " +
                     std::to_string(tc_stages));
  if (tc_mode < 0 || tc_mode > 3)
    throw InputError("cuda::set_mmvq_engine: tc_mode must be 0..3, found " +
                     std::to_string(tc_mode));
  g_engine = e;
  g_tc_stages = tc_stages;
  g_tc_mode = tc_mode;
}

MmvqEngine mmvq_engine() { return g_engine; }

void set_mmvq_blocks_per_sm(int cap) {
  if (cap < 0)
    throw InputError("cuda::set_mmvq_blocks_per_sm: need cap >= 0, found " + std::to_string(cap));
  g_blocks_per_sm = cap;
}

void mmvq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
          int64_t T, int warps, void* stream) {
  if (T < 0) throw InputError("cuda::mmvq: T must be >= 0, found " + std::to_string(T));
  require_aligned(w, 2, "mmvq", "w");
  MmvqParams p{Form::kPlain, w, nullptr, nullptr, a, false, y, rows, K, T, 0, 0, 0};
  launch(p, t, (T + kMaxGroupRows - 1) / kMaxGroupRows,
         static_cast<int>(T < kMaxGroupRows ? T : kMaxGroupRows), warps, "mmvq", stream);
}

void mmvq_experts(GgmlType t, const uint8_t* const* expert_w, int64_t n, const BlockQ8_1* a,
                  bool a_per_expert, float* y, int64_t rows, int64_t K, int warps, void* stream) {
  if (n < 0) throw InputError("cuda::mmvq_experts: n must be >= 0, found " + std::to_string(n));
  if (n > 0) require_aligned(expert_w, 8, "mmvq_experts", "expert_w (pointer table)");
  MmvqParams p{Form::kExperts, nullptr, expert_w, nullptr, a, a_per_expert, y, rows, K, 1, 0, 0, 0};
  launch(p, t, n, 1, warps, "mmvq_experts", stream);
}

void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                 int max_n, const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps,
                 void* stream) {
  if (n_groups > 0) {
    require_aligned(slots, 8, "mmvq_groups", "slots (pointer table)");
    require_aligned(groups, 4, "mmvq_groups", "groups");
  }
  MmvqParams p{Form::kGroups, nullptr, slots, groups, a, false, y, rows, K, 0, 0, 0, 0};
  launch(p, t, n_groups, max_n, warps, "mmvq_groups", stream);
}

void mmvq_groups_planned(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                         const int32_t* count, int n_proj, int64_t proj_stride, int max_n,
                         const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps,
                         void* stream) {
  if (n_proj < 1 || proj_stride < 0)
    throw InputError("cuda::mmvq_groups_planned: need n_proj >= 1 and proj_stride >= 0, found " +
                     std::to_string(n_proj) + ", " + std::to_string(proj_stride));
  if (proj_stride > 0) {
    require_aligned(slots, 8, "mmvq_groups_planned", "slots (pointer table)");
    require_aligned(groups, 4, "mmvq_groups_planned", "groups");
    require_aligned(count, 4, "mmvq_groups_planned", "count");
  }
  MmvqParams p{Form::kGroups, nullptr, slots, groups, a, false, y, rows, K, 0, 0, 0, 0};
  p.dev_count = count;
  p.proj_stride = proj_stride;
  p.n_proj = n_proj;
  launch(p, t, n_proj * proj_stride, max_n, warps, "mmvq_groups_planned", stream);
}

}  // namespace moecheck::cuda
