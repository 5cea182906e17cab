// mmvq: Q2_K / Q3_K weight rows read in place times q8_1 activation rows, f32 out; groups of up
// to kMaxGroupRows activation rows per weight matrix, and the one-token form running all
// selected experts of a projection in one launch (base pointers from a device slot table).
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k"; twins: emu::mmvq, emu::mmvq_experts.
// Schedule: a tile is R * W consecutive rows (W = 2, 4, 8 warps per block, R rows per warp).
// A persistent grid walks the tiles, each block a contiguous range; the next tiles are copied
// into shared memory with 16-byte cp.async (three buffers, two at R = 2) while tile t is computed.
// Warp w computes rows 2w, 2w + 1 of the tile for every token of the group (sharing each
// activation load between the two rows and each decoded weight unit between the tokens; R = 1,
// row w, where the doubled tiles do not fit): lane l takes units g = l, l + 32, ... (exact dp4a
// integer parts, the float part of numerics.md), then the butterfly. Row routines:
// cuda/mmvq_rows.cuh. Loads never change
// the arithmetic. One-token launches and the groups of layers of up to 8 tokens go to the
// streamed engine of cuda/mmvq_sb.cu by default (cuda::MmvqEngine::kStreamed), or with kTensorCore
// one-token launches to cuda/mmvq_tc.cu (same bits). Performance: docs/performance.md "GPU".
#include <cuda_pipeline.h>

#include <limits>
#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/mmvq_rows.cuh"
#include "cuda/mmvq_sb.cuh"
#include "cuda/mmvq_tc.cuh"
#include "cuda/mmvq_tiles.cuh"
#include "cuda/mmvq_units.cuh"

namespace moecheck::cuda {
namespace {

MmvqEngine g_engine = MmvqEngine::kStreamed;
int g_tc_stages = 0, g_tc_mode = 0;
int g_sb_warps = 0, g_sb_stages = 0;
int g_blocks_per_sm = 0;
int g_rows_per_warp = 0;
// The largest layer (tokens) whose groups launches take the streamed engine, per weight type
// (defaults below; set_mmvq_stream_layer_tokens(8) gives larger layers the dp4a kernel, as
// before 2026-12-03's tenth session).
constexpr int64_t kEveryLayer = std::numeric_limits<int64_t>::max();
// Per weight type: [0] Q2_K, [1] Q3_K (set_mmvq_stream_layer_tokens with a type sets one; 0
// restores the default). Q2_K's groups launches of layers above 341 tokens take the dp4a
// kernel, which decodes a row once for a group's tokens where the streamed engine reads it once
// per pass of two: ds41 at T = 512 (groups of about 6 pairs) took 8.08 ms with Q2_K on the dp4a
// kernel against 8.35 streamed, at T = 256 5.23 against 5.08 (docs/performance.md, "MMQ items of
// 16 tokens"); 341 is where the streamed engine's group prefix ended before its bound came from
// the experts. Q3_K's decode costs more: the streamed engine wins at every T up to 512 and ties
// at 4096 (its MMVQ groups are few there).
constexpr int64_t kDefaultStreamLayerTokens[2] = {341, kEveryLayer};
int64_t g_stream_layer_tokens[2] = {kDefaultStreamLayerTokens[0], kDefaultStreamLayerTokens[1]};

bool streamed_layer(GgmlType t, int64_t layer_tokens) {
  return layer_tokens <= g_stream_layer_tokens[t == GgmlType::kQ2K ? 0 : 1];
}

using namespace mmvq_tiles;
using namespace mmvq_units;
using namespace mmvq_rows;

// One staged tile of tr rows (its bytes in buf, copied from src) against the group's n staged
// tokens (n <= kN): warp w computes rows kR w (and kR w + 1) of the tile, first_row the tile's
// first row.
template <GgmlType kType, bool kAligned4, int kR, int kN>
__device__ __forceinline__ void warp_rows(const MmvqParams& p, const uint8_t* smem,
                                          const uint8_t* buf, const ActLayout& L, int row_off,
                                          bool two, int n, int64_t group, int64_t row) {
  // One token gets its own code: no guards for seven absent tokens.
  if (n == 1) {
    if (kR == 2 && two) row_pair<kType, kAligned4>(p, smem, buf, L, row_off, group, row);
    else row_dot<kType, kAligned4, 1>(p, smem, buf, L, row_off, 1, group, row);
  } else if constexpr (kN > 1) {
    if (n <= 0) return;
    if (kR == 2 && two) {
      // Each token count its own code (a warp-uniform switch): no guards between the tokens.
      static_assert(kN == kMaxGroupRows, "groups of 2 .. kMaxGroupRows tokens");
      switch (n) {
        case 2: row_pair_n<kType, kAligned4, 2>(p, smem, buf, L, row_off, group, row); break;
        case 3: row_pair_n<kType, kAligned4, 3>(p, smem, buf, L, row_off, group, row); break;
        case 4: row_pair_n<kType, kAligned4, 4>(p, smem, buf, L, row_off, group, row); break;
        case 5: row_pair_n<kType, kAligned4, 5>(p, smem, buf, L, row_off, group, row); break;
        case 6: row_pair_n<kType, kAligned4, 6>(p, smem, buf, L, row_off, group, row); break;
        case 7: row_pair_n<kType, kAligned4, 7>(p, smem, buf, L, row_off, group, row); break;
        default: row_pair_n<kType, kAligned4, kN>(p, smem, buf, L, row_off, group, row);
      }
    } else {
      row_dot<kType, kAligned4, kN>(p, smem, buf, L, row_off, n, group, row);
    }
  }
}

template <GgmlType kType, int kR, int kN>
__device__ __forceinline__ void compute_tile(const MmvqParams& p, const uint8_t* smem,
                                             const uint8_t* buf, const ActLayout& L,
                                             const uint8_t* src, int tr, int n, int64_t group,
                                             int64_t first_row) {
  const int first = kR * (threadIdx.x / kWarpSize);  // the warp's first row in the tile
  if (first >= tr) return;
  const int align_off = static_cast<int>(reinterpret_cast<uintptr_t>(src) & 15);
  const int row_off = align_off + first * p.row_bytes;
  const int64_t row = first_row + first;
  const bool two = first + 1 < tr;  // kR = 2: both of the warp's rows exist
  // Q2_K blocks are 84 bytes: all 4-byte aligned when the tile's first row is (uniform).
  if (kType == GgmlType::kQ2K && ((align_off | p.row_bytes) & 3) == 0)
    warp_rows<kType, true, kR, kN>(p, smem, buf, L, row_off, two, n, group, row);
  else warp_rows<kType, false, kR, kN>(p, smem, buf, L, row_off, two, n, group, row);
}

// kR rows per warp (1, or 2: row_pair / row_pair_n), so a tile is kR * kWarps rows; groups of
// at most kN tokens. kR = 1: 64 registers at most (1024 threads per SM) and three tile buffers
// (tiles t + 1 and t + 2 in flight while tile t is computed). kR = 2: two buffers of twice the
// rows (tile t + 1 in flight); one token (kN = 1) at 85 registers at most (768 threads per SM),
// so that 24 warps fit an SM: the pair loop is issue bound, and occupancy pays more than a
// deeper copy pipeline; up to 8 tokens (kN = 8) at 128 (512 threads per SM: the 2 x 8 chains
// and two decoded weight units stay in registers, and the staged activation of 8 tokens limits
// a ds41 gate block to two per SM anyway). Block b walks a contiguous range of tiles
// (block_tiles): consecutive row blocks of mostly one group, so the activation is staged once
// per group change and the weight reads are sequential.
constexpr int mmvq_min_blocks(int warps, int r, int n) {
  return (r == 1 ? 32 : n == 1 ? 24 : 16) / warps;
}

// The work of a groups-form tile of n tokens, in units of one token's dots: its rows' units
// are decoded once (about two tokens' worth: mmq_bench's dp4a kernel at 2 - 8 tokens a group
// fits 2.0 + n for Q2_K and 2.5 + n for Q3_K, 2026-12-04) and then dotted with each token.
constexpr int kTileDecodeCost = 2;
// Above this many groups the blocks split the tiles evenly by count (each block would read
// every group's n).
constexpr int64_t kWeighedGroupsMax = 8192;

// Block blockIdx.x's tiles [begin, end) of the launch's rb * G (group-major). Groups-form
// launches whose groups may hold several tokens split them by work, kTileDecodeCost + n a
// tile, so that a block of 8-token groups does not take as many tiles as one of 1-token groups
// (ncu, 2026-12-04: the ds41 gate / up launch at T = 512 kept its multiprocessors active 70 %
// of its span with tiles split by count); other launches, the one-token kernels and the
// one-row-a-warp ones (kWeigh false: at 64 registers the scan made them spill) split them by
// count. Block b starts at the first tile whose work before it reaches W b / grid (W the
// launch's total), so the ranges of consecutive blocks meet and cover every tile once whatever
// the groups' sizes. Which block computes a tile never changes its arithmetic.
struct TileRange {
  int64_t begin, end;
};
template <int kThreads, bool kWeigh>
__device__ __forceinline__ TileRange block_tiles(const MmvqParams& p, int rb, int64_t G) {
  const int64_t tiles = static_cast<int64_t>(rb) * G;
  if (!kWeigh || p.form != Form::kGroups || p.max_n == 1 || G > kWeighedGroupsMax) {
    return {tiles * blockIdx.x / gridDim.x, tiles * (blockIdx.x + 1) / gridDim.x};
  }
  constexpr int kWarpsB = kThreads / kWarpSize;
  __shared__ int warp_sum[kWarpsB];
  __shared__ int64_t bound[2];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize, warp = tid / kWarpSize;
  // Thread tid sums the work of groups [g_lo, g_hi), then an exclusive scan over the threads.
  // G <= kWeighedGroupsMax: the sums (at most 8192 x (2 + 8)) fit an int.
  const int chunk = (static_cast<int>(G) + kThreads - 1) / kThreads;
  const int g_lo = tid * chunk < G ? tid * chunk : static_cast<int>(G);
  const int g_hi = g_lo + chunk < G ? g_lo + chunk : static_cast<int>(G);
  int mine = 0;
#pragma unroll 1
  for (int g = g_lo; g < g_hi; ++g) mine += kTileDecodeCost + __ldg(&stored_group(p, g)->n);
  int incl = mine;
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == kWarpSize - 1) warp_sum[warp] = incl;
  __syncthreads();
  int before = incl - mine, total = 0;
  for (int w = 0; w < kWarpsB; ++w) {
    if (w < warp) before += warp_sum[w];
    total += warp_sum[w];
  }
  // Work is counted per tile: group g's rb tiles span [rb C_g, rb C_(g+1)), C its exclusive sum.
  const int64_t W = static_cast<int64_t>(total) * rb;
  for (int k = 0; k < 2; ++k) {
    const int64_t target = W * (blockIdx.x + k) / gridDim.x;
    if (target >= W) {
      if (tid == 0) bound[k] = tiles;
      continue;
    }
    const int64_t lo = static_cast<int64_t>(rb) * before;
    if (target < lo || target >= lo + static_cast<int64_t>(rb) * mine) continue;  // its owner
    int64_t c = lo;  // work before group g
#pragma unroll 1
    for (int g = g_lo; g < g_hi; ++g) {
      const int cost = kTileDecodeCost + __ldg(&stored_group(p, g)->n);
      const int64_t next = c + static_cast<int64_t>(rb) * cost;
      if (target < next) {
        // The first tile of g at or past the target.
        bound[k] = static_cast<int64_t>(g) * rb + (target - c + cost - 1) / cost;
        break;
      }
      c = next;
    }
  }
  __syncthreads();
  return {bound[0], bound[1]};
}

template <GgmlType kType, int kWarps, int kR, int kN>
__global__ void __launch_bounds__(kWarps* kWarpSize, mmvq_min_blocks(kWarps, kR, kN))
    mmvq_kernel(MmvqParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kTileRows = kWarps * kR;
  const int buf_bytes = tile_buffer_bytes(kTileRows, p.row_bytes);
  const int units = static_cast<int>(p.K / kQK8_1);
  const ActLayout L(buf_bytes, mmvq_buffers(kR), units, p.max_n);
  const int rb = static_cast<int>((p.rows + kTileRows - 1) / kTileRows);  // row blocks per group
  const TileRange range = block_tiles<kThreads, (kR == 2 && kN > 1)>(p, rb, live_groups(p));
  const int64_t t_begin = range.begin;
  const int n_tiles = static_cast<int>(range.end - t_begin);

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
    compute_tile<kType, kR, kN>(p, smem, smem + k * buf_bytes, L, walk.start(c0, g0), walk.rows(c0),
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

template <GgmlType kType, int kWarps, int kR, int kN>
void launch_one(const MmvqParams& p, void* stream) {
  const int smem = ActLayout(tile_buffer_bytes(kWarps * kR, p.row_bytes), mmvq_buffers(kR),
                             static_cast<int>(p.K / kQK8_1), p.max_n)
                       .bytes;
  const void* kernel = reinterpret_cast<const void*>(mmvq_kernel<kType, kWarps, kR, kN>);
  allow_dynamic_smem(kernel, smem);
  // Persistent grid: as many blocks as fit the device at once (at most g_blocks_per_sm per
  // multiprocessor when set), at most one per tile.
  const int per_sm = resident_blocks_per_sm(kernel, kWarps * kWarpSize, smem);
  const int sms = current_sm_count();
  const int resident =
      (g_blocks_per_sm > 0 && g_blocks_per_sm < per_sm ? g_blocks_per_sm : per_sm) * sms;
  const int64_t tiles = (p.rows + kWarps * kR - 1) / (kWarps * kR) * p.n_groups;
  const int64_t grid = tiles < resident ? tiles : resident;
  mmvq_kernel<kType, kWarps, kR, kN>
      <<<static_cast<unsigned>(grid), kWarps * kWarpSize, smem, as_stream(stream)>>>(p);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

template <GgmlType kType, int kR, int kN>
void launch_warps(const MmvqParams& p, int warps, void* stream) {
  switch (warps) {
    case 2: launch_one<kType, 2, kR, kN>(p, stream); break;
    case 4: launch_one<kType, 4, kR, kN>(p, stream); break;
    default: launch_one<kType, 8, kR, kN>(p, stream); break;
  }
}

// Two rows per warp whenever the doubled tiles fit (row_pair for one-token launches, row_pair_n
// for groups of up to 8 tokens), else one row per warp (row_dot).
template <GgmlType kType>
void launch_type(const MmvqParams& p, int warps, void* stream) {
  const bool pair =
      g_rows_per_warp != 1 && ActLayout(tile_buffer_bytes(2 * warps, p.row_bytes), mmvq_buffers(2),
                                        static_cast<int>(p.K / kQK8_1), p.max_n)
                                      .bytes <= 200 * 1024;
  if (!pair) launch_warps<kType, 1, kMaxGroupRows>(p, warps, stream);
  else if (p.max_n == 1) launch_warps<kType, 2, 1>(p, warps, stream);
  else launch_warps<kType, 2, kMaxGroupRows>(p, warps, stream);
}

void launch(MmvqParams p, GgmlType t, int64_t n_groups, int max_n, int warps, const char* op,
            void* stream, bool streamed_ok = true) {
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
  if (g_engine == MmvqEngine::kStreamed && streamed_ok && mmvq_sb::supported(p, t)) {
    mmvq_sb::launch(p, t, p.sb_warps != 0 ? p.sb_warps : g_sb_warps, g_sb_stages, stream);
    return;
  }
  if (g_engine == MmvqEngine::kTensorCore && mmvq_tc::supported(t, p.K, max_n)) {
    mmvq_tc::launch(p, t, g_tc_stages, g_tc_mode, stream);
    return;
  }
  if (t == GgmlType::kQ2K) launch_type<GgmlType::kQ2K>(p, warps, stream);
  else launch_type<GgmlType::kQ3K>(p, warps, stream);
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

void set_mmvq_stream_shape(int warps, int stages) {
  if (!stream_warps_allowed(warps) || (stages != 0 && (stages < 2 || stages > 8)))
    throw InputError(std::string("cuda::set_mmvq_stream_shape: need warps ") +
                     kStreamWarpsAllowedText + " and stages 0 or 2..8, found warps=" +
                     std::to_string(warps) + " stages=" + std::to_string(stages));
  g_sb_warps = warps;
  g_sb_stages = stages;
}

void set_mmvq_stream_layer_tokens(int64_t n) {
  if (n < 0)
    throw InputError("cuda::set_mmvq_stream_layer_tokens: need n >= 0, found " + std::to_string(n));
  for (int i = 0; i < 2; ++i) g_stream_layer_tokens[i] = n == 0 ? kDefaultStreamLayerTokens[i] : n;
}

void set_mmvq_stream_layer_tokens(int64_t n, GgmlType t) {
  if (n < 0 || (t != GgmlType::kQ2K && t != GgmlType::kQ3K))
    throw InputError(
        "cuda::set_mmvq_stream_layer_tokens: need n >= 0 and type Q2_K or Q3_K, "
        "found n=" +
        std::to_string(n) + " type " + std::to_string(static_cast<uint32_t>(t)));
  const int i = t == GgmlType::kQ2K ? 0 : 1;
  g_stream_layer_tokens[i] = n == 0 ? kDefaultStreamLayerTokens[i] : n;
}

// One in layers of up to 32 tokens, whose groups mostly hold one and where the one-token pass's
// lighter code wins (ds41: 0.51 against 0.57 ms at T = 16, 0.93 against 0.96 at T = 32); two
// above (1.63 against 1.75 ms at T = 64), and where the layer's size is not known
// (docs/performance.md, "The streamed engine for the batched layers' MMVQ groups").
int mmvq_stream_pass_tokens(int64_t layer_tokens) {
  return layer_tokens >= 1 && layer_tokens <= 4 * kMaxGroupRows ? 1 : 2;
}

void set_mmvq_stream_pass_shape(int pass_tokens, bool whole_sm) {
  mmvq_sb::set_pass_shape(pass_tokens, whole_sm);
}

void set_mmvq_stream_step(int blocks) { mmvq_sb::set_step(blocks); }
void set_mmvq_stream_head(int steps) { mmvq_sb::set_head(steps); }

void set_mmvq_stream_diagnostic(int mode, uint64_t* buffer, int64_t capacity_warps) {
  mmvq_sb::set_diagnostic(mode, buffer, capacity_warps);
}

void set_mmvq_rows_per_warp(int r) {
  if (r != 0 && r != 1)
    throw InputError("cuda::set_mmvq_rows_per_warp: r must be 0 (two where they fit) or 1, found " +
                     std::to_string(r));
  g_rows_per_warp = r;
}

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
  // The streamed engine at one token: a group of several streams the rows once per token.
  launch(p, t, (T + kMaxGroupRows - 1) / kMaxGroupRows,
         static_cast<int>(T < kMaxGroupRows ? T : kMaxGroupRows), warps, "mmvq", stream, T == 1);
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
                 void* stream, int64_t layer_tokens) {
  if (n_groups > 0) {
    require_aligned(slots, 8, "mmvq_groups", "slots (pointer table)");
    require_aligned(groups, 4, "mmvq_groups", "groups");
  }
  MmvqParams p{Form::kGroups, nullptr, slots, groups, a, false, y, rows, K, 0, 0, 0, 0};
  p.pass_tokens = mmvq_stream_pass_tokens(layer_tokens);
  launch(p, t, n_groups, max_n, warps, "mmvq_groups", stream, streamed_layer(t, layer_tokens));
}

void mmvq_groups_planned(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                         const int32_t* count, int n_proj, int64_t proj_stride, int max_n,
                         const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps,
                         void* stream, int64_t layer_tokens, int stream_warps, const void* warm,
                         int64_t warm_bytes, int64_t max_groups) {
  if (!stream_warps_allowed(stream_warps))
    throw InputError(std::string("cuda::mmvq_groups_planned: stream_warps must be ") +
                     kStreamWarpsAllowedText + ", found " + std::to_string(stream_warps));
  if (n_proj < 1 || proj_stride < 0 || max_groups < 0)
    throw InputError("cuda::mmvq_groups_planned: need n_proj >= 1, proj_stride >= 0 and " +
                     std::string("max_groups >= 0, found ") + std::to_string(n_proj) + ", " +
                     std::to_string(proj_stride) + ", " + std::to_string(max_groups));
  if (proj_stride > 0) {
    require_aligned(slots, 8, "mmvq_groups_planned", "slots (pointer table)");
    require_aligned(groups, 4, "mmvq_groups_planned", "groups");
    require_aligned(count, 4, "mmvq_groups_planned", "count");
  }
  MmvqParams p{Form::kGroups, nullptr, slots, groups, a, false, y, rows, K, 0, 0, 0, 0};
  p.dev_count = count;
  p.proj_stride = proj_stride;
  p.n_proj = n_proj;
  p.sb_warps = stream_warps;
  p.pass_tokens = mmvq_stream_pass_tokens(layer_tokens);
  if (warm != nullptr && warm_bytes > 0) {
    const uintptr_t w0 = reinterpret_cast<uintptr_t>(warm) & ~uintptr_t{127};
    const uintptr_t w1 = reinterpret_cast<uintptr_t>(warm) + static_cast<uintptr_t>(warm_bytes);
    p.warm = reinterpret_cast<const uint8_t*>(w0);
    p.warm_lines = static_cast<int>((w1 - w0 + 127) / 128);
  }
  // The launch's group bound: each projection's live count is at most proj_stride (the plan's
  // capacity) and at most max_groups when given; live_groups traps above it.
  const int64_t per_proj = max_groups > 0 && max_groups < proj_stride ? max_groups : proj_stride;
  launch(p, t, n_proj * per_proj, max_n, warps, "mmvq_groups_planned", stream,
         streamed_layer(t, layer_tokens));
}

}  // namespace moecheck::cuda
