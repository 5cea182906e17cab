// router_gemv: bf16 or f16 router weights [rows, K] times bf16 tokens [T, K], f32 logits [T, rows].
// Contract: docs/numerics.md "router_gemv"; twin: emu::router_gemv (emulate/router_gemv.h).
// kPlain runs the plain schedule of cuda/gemv_plain.cuh (kernel in cuda/bf16_gemv.cu); kStaged
// is here: one block of kRouterStagedThreads per row (above 8 tokens, per tile of 8 rows x 8
// tokens: router_gemm_kernel, or for K <= 6144 router_gemm_resident_kernel, whose blocks walk
// the tiles), thread t taking chunks t, t + 256, ...,
// partials staged in shared memory, folded by warp 0 (p = part[l], then part[l + 32 w] for
// w = 1..7 in order) and finished by the butterfly; meanwhile warps 1..7 of every block may
// write q8_1 of x (cuda/q8_1_block.cuh, the bytes of quantize_q8_1_bf16), one 32-value block
// per warp.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/bulk_copy.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/gemv_plain.cuh"
#include "cuda/kernels.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_1_block.cuh"

namespace moecheck::cuda {
namespace {

// Chunks per thread loaded before the first use (K = 5120 has 640 chunks: 2 or 3 per thread, so
// one round trip). No bit depends on it: a thread's chunks are taken in increasing order.
constexpr int kStagedUnroll = 3;

// At most 64 registers (four blocks a multiprocessor): three blocks fit beside one block of the
// shared expert's streaming GEMV, so the 384 rows of ds41 start in one wave. kN: the tokens of
// every block of the launch (1 - 8; a launch over more than 8 tokens has only full groups), with
// no per-token guard, so that a chunk's kN x loads issue together and the tokens' chains
// interleave (a run-time count made each token's step a branch around one load and its chain:
// the eight tokens' router took twice the one token's time, docs/performance.md).
template <bool kF16W, int kN>
__global__ void __launch_bounds__(kRouterStagedThreads, 4)
    router_staged_kernel(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K,
                         int64_t T, int64_t t_first, BlockQ8_1* xq) {
  __shared__ float part[kN][kRouterStagedThreads];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int64_t t0 = t_first + static_cast<int64_t>(blockIdx.y) * kMaxGroupRows;
  const uint16_t* wrow = w + row * K;
  const int64_t nchunks = K / kGemvChunk;
  pdl::wait();  // a no-op unless launched programmatically (cuda/pdl.cuh)
  pdl::launch_dependents();  // the selection may start and wait for the logits

  float acc[kN];
#pragma unroll
  for (int t = 0; t < kN; ++t) acc[t] = 0.0f;
  for (int64_t c0 = tid; c0 < nchunks; c0 += kStagedUnroll * kRouterStagedThreads) {
    // The weight chunks and the first token's x chunks in flight together (one round trip, not
    // one for the weights and one per chunk of x).
    uint4 wv[kStagedUnroll], x0[kStagedUnroll];
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const int64_t c = c0 + u * kRouterStagedThreads;
      if (c < nchunks) {
        wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + c * kGemvChunk));
        x0[u] = __ldg(reinterpret_cast<const uint4*>(x + t0 * K + c * kGemvChunk));
      }
    }
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const int64_t c = c0 + u * kRouterStagedThreads;
      if (c >= nchunks) break;
      uint4 xv[kN > 1 ? kN - 1 : 1];
#pragma unroll
      for (int t = 1; t < kN; ++t)
        xv[t - 1] = __ldg(reinterpret_cast<const uint4*>(x + (t0 + t) * K + c * kGemvChunk));
      acc[0] = bf16_chunk_fma<kF16W>(wv[u], x0[u], acc[0]);
#pragma unroll
      for (int t = 1; t < kN; ++t) acc[t] = bf16_chunk_fma<kF16W>(wv[u], xv[t - 1], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kN; ++t) part[t][tid] = acc[t];
  __syncthreads();
  if (tid >= kWarpSize) {
    if (xq == nullptr) return;
    // q8_1 block j of x (row-major [T, K / 32]) on warp j % 7 + 1 of flat block j / 7 (and
    // every such block again a grid's width on): whole warps, independent of the fold.
    constexpr int kQ = kRouterStagedWarps - 1;
    const int64_t n_q8 = T * (K / kQK8_1);
    const int64_t step = static_cast<int64_t>(gridDim.x) * gridDim.y * kQ;
    const int lane = tid % kWarpSize;
    for (int64_t j = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kQ +
                     (tid / kWarpSize - 1);
         j < n_q8; j += step)
      detail::quantize_block_warp(bf16_to_f32(__ldg(x + j * kQK8_1 + lane)), lane, xq + j);
    return;
  }
#pragma unroll
  for (int t = 0; t < kN; ++t) {
    float v = part[t][tid];
#pragma unroll
    for (int ww = 1; ww < kRouterStagedWarps; ++ww) v = add_rn(v, part[t][tid + kWarpSize * ww]);
    v = warp_butterfly(v);
    if (tid == 0) y[(t0 + t) * rows + row] = v;
  }
}

// The staged schedule as a GEMM for T > kMaxGroupRows tokens (docs/numerics.md "router_gemv",
// "The staged variant's GEMM form"): a block of kRouterStagedThreads threads owns
// kRouterGemmRows rows x kRouterGemmTokens tokens, and its thread t runs chain t (chunks t,
// t + 256, ... in increasing order, each chunk's 8 values in order, from +0) of all 64 outputs,
// so every chain is still one thread's fma sequence in the contract's order; only the outputs
// are interleaved. Each weight chunk a thread loads serves 8 tokens and each x chunk 8 rows,
// where the staged kernel reads a token's x once per row (384 times at ds41).
// A thread's chunks are copied into shared memory by 16-byte cp.async, kGemmStages chunks (8
// weight rows and 8 tokens each) asked for at once, each chunk its own group, and computed as
// their groups land: one round trip a round of kGemmStages x 256 chunks (one at K <= 6144),
// where loads into registers cost one round trip a chunk (the former form: 24.9 us at T = 64 and
// 162 us at T = 512 on the H200, docs/performance.md). No other thread reads a thread's slots,
// so no barrier orders them. The partials then go through shared memory (the same bytes, after
// a barrier), 32 outputs a round, and each output is folded as the staged kernel folds it
// (p = part[l], then part[l + 32 w] for w = 1..7 in order, then the butterfly), by one warp.
// Rows past `rows` and tokens past T load the last row / token (valid memory) and are never
// stored. Then every warp of the grid writes q8_1 blocks of x (grid-stride), as the staged
// launch's spare warps do.
constexpr int kRouterGemmRows = 8;
constexpr int kRouterGemmTokens = 8;
constexpr int kRouterGemmRound = 32;  // outputs folded per round (4 rows x 8 tokens)
constexpr int kGemmStages = 3;        // chunks a thread has in flight
// Slot (u, i, thread) of the weight (i < 8) or token (i >= 8) operand: consecutive threads'
// 16-byte slots are consecutive (no bank conflict on the 16-byte shared loads).
constexpr int kGemmSlots =
    kGemmStages * (kRouterGemmRows + kRouterGemmTokens) * kRouterStagedThreads;
constexpr size_t kRouterGemmSmem = sizeof(uint4) * kGemmSlots;  // 192 KB
static_assert(sizeof(float) * kRouterGemmRound * kRouterStagedThreads <= kRouterGemmSmem);

// One chunk of a thread's chain for the 64 outputs, in the staged contract's order: ws[r * 256]
// is row r's chunk, xs[n * 256] token n's (the thread's slots, consecutive threads' 16-byte
// slots consecutive: no bank conflict).
template <bool kF16W>
__device__ __forceinline__ void gemm_chunk(const uint4* ws, const uint4* xs, int tid,
                                           float (&acc)[kRouterGemmRows][kRouterGemmTokens]) {
  uint4 wv[kRouterGemmRows], xv[kRouterGemmTokens];
#pragma unroll
  for (int r = 0; r < kRouterGemmRows; ++r) wv[r] = ws[r * kRouterStagedThreads + tid];
#pragma unroll
  for (int n = 0; n < kRouterGemmTokens; ++n) xv[n] = xs[n * kRouterStagedThreads + tid];
  float xf[kRouterGemmTokens][kGemvChunk];
#pragma unroll
  for (int n = 0; n < kRouterGemmTokens; ++n) bf16_chunk_unpack(xv[n], xf[n]);
#pragma unroll
  for (int r = 0; r < kRouterGemmRows; ++r) bf16_chunk_fma_tokens<kF16W>(wv[r], xf, acc[r]);
}

// The tile's 64 outputs from every thread's chains, in two rounds of 32 (rows 4 g .. 4 g + 3 of
// the tile): every thread stores its chains in part, then warp v folds outputs 4 v .. 4 v + 3 of
// the round (row 4 g + v / 2, tokens 4 (v % 2) ..) as the staged kernel folds a row (p = part[l],
// then part[l + 32 w] for w = 1..7 in order, then the butterfly) and lane 0 stores the outputs
// inside rows x T. Starts with a barrier: part may be read by the previous tile's folds or alias
// slots other threads still read.
__device__ __forceinline__ void gemm_fold_store(
    const float (&acc)[kRouterGemmRows][kRouterGemmTokens], float (*part)[kRouterStagedThreads],
    int tid, int64_t r0, int64_t t0, int64_t rows, int64_t T, float* y) {
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  constexpr int kRoundRows = kRouterGemmRound / kRouterGemmTokens;
  static_assert(kRouterGemmRows % kRoundRows == 0 && kRouterGemmRound % kRouterStagedWarps == 0);
  constexpr int kPerWarp = kRouterGemmRound / kRouterStagedWarps;
#pragma unroll
  for (int g = 0; g < kRouterGemmRows / kRoundRows; ++g) {
    __syncthreads();  // every thread is past the reads of part (or of the slots it aliases)
#pragma unroll
    for (int i = 0; i < kRouterGemmRound; ++i)
      part[i][tid] = acc[g * kRoundRows + i / kRouterGemmTokens][i % kRouterGemmTokens];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPerWarp; ++k) {
      const int i = warp * kPerWarp + k;
      float v = part[i][lane];
#pragma unroll
      for (int ww = 1; ww < kRouterStagedWarps; ++ww) v = add_rn(v, part[i][lane + kWarpSize * ww]);
      v = warp_butterfly(v);
      const int64_t row = r0 + g * kRoundRows + i / kRouterGemmTokens;
      const int64_t tok = t0 + i % kRouterGemmTokens;
      if (lane == 0 && row < rows && tok < T) y[tok * rows + row] = v;
    }
  }
}

// q8_1 block j of x (row-major [T, K / 32]) on warp j % 8 of flat block j / 8 of n_blocks, and
// every such block again a grid's width on.
__device__ __forceinline__ void gemm_write_q8(const uint16_t* x, BlockQ8_1* xq, int64_t T,
                                              int64_t K, int64_t flat_block, int64_t n_blocks,
                                              int tid) {
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int64_t n_q8 = T * (K / kQK8_1);
  const int64_t step = n_blocks * kRouterStagedWarps;
  for (int64_t j = flat_block * kRouterStagedWarps + warp; j < n_q8; j += step)
    detail::quantize_block_warp(bf16_to_f32(__ldg(x + j * kQK8_1 + lane)), lane, xq + j);
}

template <bool kF16W>
__global__ void __launch_bounds__(kRouterStagedThreads, 1)
    router_gemm_kernel(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x,
                       float* __restrict__ y, int64_t rows, int64_t K, int64_t T, BlockQ8_1* xq) {
  extern __shared__ uint4 gemm_slots[];
  constexpr int kOps = kRouterGemmRows + kRouterGemmTokens;
  const int tid = threadIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRouterGemmTokens;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRouterGemmRows;
  const int64_t nchunks = K / kGemvChunk;
  pdl::wait();  // a no-op unless launched programmatically (cuda/pdl.cuh)
  pdl::launch_dependents();

  // Row and token bases, clamped to the last row / token (their outputs are never stored).
  const uint16_t* wrow[kRouterGemmRows];
  const uint16_t* xrow[kRouterGemmTokens];
#pragma unroll
  for (int r = 0; r < kRouterGemmRows; ++r) wrow[r] = w + (r0 + r < rows ? r0 + r : rows - 1) * K;
#pragma unroll
  for (int n = 0; n < kRouterGemmTokens; ++n) xrow[n] = x + (t0 + n < T ? t0 + n : T - 1) * K;

  float acc[kRouterGemmRows][kRouterGemmTokens];
#pragma unroll
  for (int r = 0; r < kRouterGemmRows; ++r)
#pragma unroll
    for (int n = 0; n < kRouterGemmTokens; ++n) acc[r][n] = 0.0f;

  constexpr int64_t kRoundChunks = static_cast<int64_t>(kGemmStages) * kRouterStagedThreads;
  for (int64_t c0 = tid; c0 < nchunks; c0 += kRoundChunks) {
    // Every chunk of the round asked for, one commit group each (empty past K: the counts of
    // the waits below stay the same).
#pragma unroll
    for (int u = 0; u < kGemmStages; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kRouterStagedThreads;
      if (c < nchunks) {
#pragma unroll
        for (int r = 0; r < kRouterGemmRows; ++r)
          bulk::async16(gemm_slots + (u * kOps + r) * kRouterStagedThreads + tid,
                        wrow[r] + c * kGemvChunk);
#pragma unroll
        for (int n = 0; n < kRouterGemmTokens; ++n)
          bulk::async16(gemm_slots + (u * kOps + kRouterGemmRows + n) * kRouterStagedThreads + tid,
                        xrow[n] + c * kGemvChunk);
      }
      bulk::async_commit();
    }
    static_assert(kGemmStages == 3, "the waits below name the pending groups of 3 stages");
    bulk::async_wait<2>();
    gemm_chunk<kF16W>(gemm_slots + 0 * kOps * kRouterStagedThreads,
                      gemm_slots + (0 * kOps + kRouterGemmRows) * kRouterStagedThreads, tid, acc);
    if (c0 + kRouterStagedThreads >= nchunks) break;
    bulk::async_wait<1>();
    gemm_chunk<kF16W>(gemm_slots + 1 * kOps * kRouterStagedThreads,
                      gemm_slots + (1 * kOps + kRouterGemmRows) * kRouterStagedThreads, tid, acc);
    if (c0 + 2 * kRouterStagedThreads >= nchunks) break;
    bulk::async_wait<0>();
    gemm_chunk<kF16W>(gemm_slots + 2 * kOps * kRouterStagedThreads,
                      gemm_slots + (2 * kOps + kRouterGemmRows) * kRouterStagedThreads, tid, acc);
  }
  bulk::async_wait<0>();  // a thread that left early still owns copies in flight

  // The partials reuse the slots once every thread is past its chunks (the fold's first barrier).
  gemm_fold_store(acc, reinterpret_cast<float(*)[kRouterStagedThreads]>(gemm_slots), tid, r0, t0,
                  rows, T, y);
  if (xq == nullptr) return;
  gemm_write_q8(x, xq, T, K, static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x,
                static_cast<int64_t>(gridDim.x) * gridDim.y, tid);
}

// The persistent form of the GEMM (K <= kResRounds x 256 chunks, 6144 values; the same chains,
// folds and bits). A grid of at most one block a multiprocessor walks the tiles, so no tile
// waits for a wave to drain: block b takes token tiles g0, g0 + groups, ... (g0 = b / bpt,
// groups = gridDim.x / bpt) and, within each, row tiles j, j + bpt, ... (j = b % bpt). A token
// tile's x stays in shared memory for all of the block's row tiles there (each thread's own
// chunks, copied once), and only the weights stream: a thread's steps (tile, chunk u) run
// through a ring of kPStages weight steps, kPStages of them in flight, each step its own
// cp.async group, so the next tile's weights land while this tile computes and folds. At T = 64
// on 132 multiprocessors: 8 token tiles x 16 blocks, 3 row tiles a block, 80 KB of x and 240 KB
// of weights into each multiprocessor, against 3 waves of 160 KB a tile in the form above.
// A thread reads only its own slots (weights and x), so only the folds need barriers; a new
// token tile's x is copied after the thread's last use of the previous one and waited for
// before its first (the thread's copies drained there: at most once a token tile).
constexpr int kResRounds = 3;  // a thread's chunks of a tile held in shared memory
constexpr int kPStages = 3;    // weight steps a thread has in flight
constexpr int kPWSlots = kPStages * kRouterGemmRows * kRouterStagedThreads;
constexpr int kPXSlots = kResRounds * kRouterGemmTokens * kRouterStagedThreads;
constexpr size_t kResidentSmem = sizeof(uint4) * (kPWSlots + kPXSlots) +
                                 sizeof(float) * kRouterGemmRound * kRouterStagedThreads;  // 224 KB
static_assert(kResidentSmem <= 227 * 1024, "one block a multiprocessor (sm_90's opt-in limit)");

template <bool kF16W>
__global__ void __launch_bounds__(kRouterStagedThreads, 1)
    router_gemm_resident_kernel(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x,
                                float* __restrict__ y, int64_t rows, int64_t K, int64_t T,
                                BlockQ8_1* xq, int bpt) {
  extern __shared__ uint4 gemm_slots[];
  uint4* const ring = gemm_slots;             // [kPStages][8 rows][256 threads]
  uint4* const xres = gemm_slots + kPWSlots;  // [kResRounds][8 tokens][256 threads]
  float(*part)[kRouterStagedThreads] =
      reinterpret_cast<float(*)[kRouterStagedThreads]>(gemm_slots + kPWSlots + kPXSlots);
  const int tid = threadIdx.x;
  const int64_t nchunks = K / kGemvChunk;
  // This thread's chunks of a tile (chunks tid, tid + 256, ...): at most kResRounds.
  const int nu =
      tid < nchunks ? static_cast<int>((nchunks - 1 - tid) / kRouterStagedThreads) + 1 : 0;
  const int64_t n_tt = (T + kRouterGemmTokens - 1) / kRouterGemmTokens;
  const int64_t n_rt = (rows + kRouterGemmRows - 1) / kRouterGemmRows;
  const int64_t groups = gridDim.x / bpt;
  const int64_t j = blockIdx.x % bpt, g0 = blockIdx.x / bpt;
  const int64_t rt_per = j < n_rt ? (n_rt - 1 - j) / bpt + 1 : 0;         // row tiles a token tile
  const int64_t tt_count = g0 < n_tt ? (n_tt - 1 - g0) / groups + 1 : 0;  // token tiles
  const int64_t n_steps = tt_count * rt_per * nu;
  pdl::wait();  // a no-op unless launched programmatically (cuda/pdl.cuh)
  pdl::launch_dependents();

  // The copy cursor: step `issued` is chunk c_u of the block's row tile c_rt (the token tile
  // does not matter to the weights), into ring stage c_st. Every call commits one group.
  int64_t issued = 0, c_rt = 0;
  int c_u = 0, c_st = 0;
  auto issue_next = [&]() {
    if (issued < n_steps) {
      const int64_t r0 = (j + c_rt * bpt) * kRouterGemmRows;
      const int64_t c = tid + static_cast<int64_t>(c_u) * kRouterStagedThreads;
      uint4* dst = ring + c_st * kRouterGemmRows * kRouterStagedThreads + tid;
#pragma unroll
      for (int r = 0; r < kRouterGemmRows; ++r) {
        const int64_t row = r0 + r < rows ? r0 + r : rows - 1;
        bulk::async16(dst + r * kRouterStagedThreads, w + row * K + c * kGemvChunk);
      }
      ++issued;
      if (++c_st == kPStages) c_st = 0;
      if (++c_u == nu) {
        c_u = 0;
        if (++c_rt == rt_per) c_rt = 0;
      }
    }
    bulk::async_commit();
  };
  // This thread's chunks of token tile tt's 8 tokens (the last token past T), one group.
  auto load_x = [&](int64_t tt) {
    for (int u = 0; u < nu; ++u) {
      const int64_t c = tid + static_cast<int64_t>(u) * kRouterStagedThreads;
#pragma unroll
      for (int n = 0; n < kRouterGemmTokens; ++n) {
        const int64_t tok = tt * kRouterGemmTokens + n < T ? tt * kRouterGemmTokens + n : T - 1;
        bulk::async16(xres + (u * kRouterGemmTokens + n) * kRouterStagedThreads + tid,
                      x + tok * K + c * kGemvChunk);
      }
    }
    bulk::async_commit();
  };

  if (tt_count > 0) load_x(g0);
  for (int s = 0; s < kPStages; ++s) issue_next();
  int st = 0;  // the ring stage of the next step computed
  for (int64_t a = 0; a < tt_count; ++a) {
    const int64_t tt = g0 + a * groups;
    if (a > 0) {  // past this thread's last read of the previous token tile's x
      load_x(tt);
      bulk::async_wait<0>();
    }
    for (int64_t b = 0; b < rt_per; ++b) {
      float acc[kRouterGemmRows][kRouterGemmTokens];
#pragma unroll
      for (int r = 0; r < kRouterGemmRows; ++r)
#pragma unroll
        for (int n = 0; n < kRouterGemmTokens; ++n) acc[r][n] = 0.0f;
      for (int u = 0; u < nu; ++u) {
        // The step's group: every group but the kPStages - 1 after it (steps not yet computed)
        // has landed, x's included.
        bulk::async_wait<kPStages - 1>();
        gemm_chunk<kF16W>(ring + st * kRouterGemmRows * kRouterStagedThreads,
                          xres + u * kRouterGemmTokens * kRouterStagedThreads, tid, acc);
        issue_next();  // into the stage just read (this thread's own slots)
        if (++st == kPStages) st = 0;
      }
      gemm_fold_store(acc, part, tid, (j + b * bpt) * kRouterGemmRows, tt * kRouterGemmTokens, rows,
                      T, y);
    }
  }
  bulk::async_wait<0>();
  if (xq == nullptr) return;
  gemm_write_q8(x, xq, T, K, blockIdx.x, gridDim.x, tid);
}

template <bool kF16W>
void launch_router_gemm(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K,
                        int64_t T, BlockQ8_1* xq, void* stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(router_gemm_kernel<kF16W>),
                     static_cast<int>(kRouterGemmSmem));
  const dim3 grid(static_cast<unsigned>((T + kRouterGemmTokens - 1) / kRouterGemmTokens),
                  static_cast<unsigned>((rows + kRouterGemmRows - 1) / kRouterGemmRows));
  pdl::launch(router_gemm_kernel<kF16W>, grid, dim3(kRouterStagedThreads), kRouterGemmSmem,
              as_stream(stream), w, x, y, rows, K, T, xq);
}

// The persistent form over at most one block a multiprocessor: with n_tt token tiles, bpt blocks
// a token tile (as many as the multiprocessors allow, at most the row tiles) and groups = n_tt;
// above one token tile a multiprocessor, one block a multiprocessor and groups of one block.
template <bool kF16W>
void launch_router_gemm_resident(const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                                 int64_t K, int64_t T, BlockQ8_1* xq, void* stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(router_gemm_resident_kernel<kF16W>),
                     static_cast<int>(kResidentSmem));
  const int64_t n_tt = (T + kRouterGemmTokens - 1) / kRouterGemmTokens;
  const int64_t n_rt = (rows + kRouterGemmRows - 1) / kRouterGemmRows;
  const int64_t sms = current_sm_count();
  int64_t bpt = 1, groups = sms;
  if (n_tt <= sms) {
    bpt = std::min(sms / n_tt, n_rt);
    groups = n_tt;
  }
  pdl::launch(router_gemm_resident_kernel<kF16W>, dim3(static_cast<unsigned>(groups * bpt)),
              dim3(kRouterStagedThreads), kResidentSmem, as_stream(stream), w, x, y, rows, K, T, xq,
              static_cast<int>(bpt));
}

// One launch of router_staged_kernel<kF16W, kN> over `groups` groups of kN tokens from t_first.
template <bool kF16W, int kN>
void launch_staged_n(int64_t groups, int64_t t_first, const uint16_t* w, const uint16_t* x,
                     float* y, int64_t rows, int64_t K, int64_t T, BlockQ8_1* xq, void* stream) {
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(groups));
  // Through pdl::launch (the carveout preference, and a pending pdl::StartEvent: the device
  // route's side stream may fork once the router's blocks have started).
  pdl::launch(router_staged_kernel<kF16W, kN>, grid, dim3(kRouterStagedThreads), 0,
              as_stream(stream), w, x, y, rows, K, T, t_first, xq);
}

// The staged router over T tokens: the full groups of 8 in one launch (which also writes q8_1 of
// x), the remaining T % 8 tokens in one more (kN = T % 8).
template <bool kF16W>
void launch_staged(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K,
                   int64_t T, BlockQ8_1* xq, void* stream) {
  const int64_t full = T / kMaxGroupRows, rem = T % kMaxGroupRows;
  if (full > 0) launch_staged_n<kF16W, 8>(full, 0, w, x, y, rows, K, T, xq, stream);
  BlockQ8_1* xq_rem = full > 0 ? nullptr : xq;
  const int64_t tf = full * kMaxGroupRows;
  switch (rem) {
    case 1: launch_staged_n<kF16W, 1>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 2: launch_staged_n<kF16W, 2>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 3: launch_staged_n<kF16W, 3>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 4: launch_staged_n<kF16W, 4>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 5: launch_staged_n<kF16W, 5>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 6: launch_staged_n<kF16W, 6>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    case 7: launch_staged_n<kF16W, 7>(1, tf, w, x, y, rows, K, T, xq_rem, stream); break;
    default: break;
  }
}

bool g_router_gemm = true;           // cuda::set_router_gemm
bool g_router_gemm_resident = true;  // cuda::set_router_gemm_resident

}  // namespace

void set_router_gemm(bool on) { g_router_gemm = on; }
void set_router_gemm_resident(bool on) { g_router_gemm_resident = on; }

void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T, void* stream, GgmlType w_type, BlockQ8_1* x_q8) {
  if (w_type != GgmlType::kBF16 && w_type != GgmlType::kF16)
    throw InputError("cuda::router_gemv: weight type " +
                     std::to_string(static_cast<uint32_t>(w_type)) + " is neither BF16 nor F16");
  const bool f16 = w_type == GgmlType::kF16;
  if (v == RouterVariant::kPlain) {
    const detail::GemvArgs a{{w, w}, {y, y}, x, rows, K, T};
    detail::launch_gemv_plain(a, 1, "router_gemv", stream, f16);
    if (x_q8 != nullptr) quantize_q8_1_bf16(x, x_q8, T, K, stream);
    return;
  }
  const std::string where = "cuda::router_gemv(staged): ";
  if (rows < 0 || T < 0 || K <= 0 || K % kGemvChunk != 0)
    throw InputError(where + "need rows >= 0, T >= 0 and K a positive multiple of 8, found rows=" +
                     std::to_string(rows) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
  if ((T + kMaxGroupRows - 1) / kMaxGroupRows > 65535 || rows > 0x7FFFFFFF)
    throw InputError(where + "launch too large: rows=" + std::to_string(rows) +
                     " T=" + std::to_string(T));
  if (x_q8 != nullptr && K % kQK8_1 != 0)
    throw InputError(where + "q8_1 of x needs K a multiple of 32, found K=" + std::to_string(K));
  if (T == 0) return;
  if (rows == 0) {  // no row to launch over: q8_1 of x alone
    if (x_q8 != nullptr) quantize_q8_1_bf16(x, x_q8, T, K, stream);
    return;
  }
  if (x_q8 != nullptr) require_aligned(x_q8, 4, "router_gemv", "x_q8");
  require_aligned(w, 16, "router_gemv", "w");
  require_aligned(x, 16, "router_gemv", "x");
  require_aligned(y, 4, "router_gemv", "y");
  // The GEMM's grid holds the row tiles in y (at most 65535); more rows take the staged kernel.
  if (T > kMaxGroupRows && g_router_gemm &&
      (rows + kRouterGemmRows - 1) / kRouterGemmRows <= 65535) {
    if (g_router_gemm_resident && K / kGemvChunk <= kResRounds * kRouterStagedThreads) {
      if (f16) launch_router_gemm_resident<true>(w, x, y, rows, K, T, x_q8, stream);
      else launch_router_gemm_resident<false>(w, x, y, rows, K, T, x_q8, stream);
      return;
    }
    if (f16) launch_router_gemm<true>(w, x, y, rows, K, T, x_q8, stream);
    else launch_router_gemm<false>(w, x, y, rows, K, T, x_q8, stream);
    return;
  }
  if (f16) launch_staged<true>(w, x, y, rows, K, T, x_q8, stream);
  else launch_staged<false>(w, x, y, rows, K, T, x_q8, stream);
}

}  // namespace moecheck::cuda
