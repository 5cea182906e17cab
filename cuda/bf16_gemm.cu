// bf16_gemm: bf16_gemv / bf16_gemv_pair for T > kMaxGroupRows tokens, on CUDA cores, with
// exactly the bits of the plain GEMV schedule (docs/numerics.md "bf16_gemv"; twin
// emu::bf16_gemv). The contract per output (row r, token t): 32 chains, chain l over the
// 8-value chunks c = l, l + 32, ... in increasing c, acc = fma_rn(float(w), float(x), acc) over
// each chunk's values in order from +0; then butterfly(v) over the 32 chain values.
//
// Tiles. A warp owns kGemmWarpRows x kGemmWarpTokens = 8 x 8 outputs; lane l of the warp runs
// chain l (chunk class l) of all 64 of them, so every chain is one lane's fma sequence in the
// contract's order (outputs are interleaved, each output's chain is not). A block of 6 x 2 warps
// covers 48 rows x 16 tokens: the weights are read T / 16 times and the activations rows / 48
// times. Twelve warps of at most 168 registers (three a scheduler) hide more of the chains'
// latencies than eight of 223 did (docs/performance.md, "The shared expert's GEMM fed by the
// tensor-memory accelerator"). K is walked in slabs of 32 chunks (256 values): slab s holds
// chunks 32 s .. 32 s + 31, so lane l takes chunk 32 s + l of every slab, i.e. its chunks
// l, l + 32, ... in increasing order.
//
// Staging. Thread 0 fills a ring of kGemmStages slab buffers with the tensor-memory accelerator:
// per slab two 2-D tile copies (the block's 48 weight rows and its 16 token rows, 512 bytes of
// bf16 as stored per row), completing on the stage's mbarrier; the other threads only wait on
// it, so no warp spends instructions on addresses. Elements past `rows`, T or K are written as
// zeros by the copy (the tensor maps' bounds) and are never chained into a stored output (a lane
// whose chunk is past the end does no fma: the contract's "lanes with no chunk hold +0"; absent
// rows and tokens are never stored). A barrier after each slab's products releases its buffer
// to the next copy. Shared memory is read as one 16-byte chunk per lane at consecutive
// addresses: no bank conflicts. Per chunk a lane widens its 8 tokens' chunks to f32 once (64
// values) and each row's chunk once, then 512 fma_rn.
//
// Reduction: a reduce-scatter transpose over the warp, per round of 32 outputs (outputs i =
// 0..31 of the round: rows 4 g + i / 8, tokens i % 8, round g = 0, 1). Before step k (k = 0..4,
// offset o = 16 >> k) lane l holds m = 32 >> k outputs; it keeps the half selected by bit o of
// l, sends the other half to lane l ^ o and adds the partner's value of each kept output:
// keep = add_rn(own, partner's). 16 + 8 + 4 + 2 + 1 = 31 shuffles; at the end lane l holds
// output l.
//
// Why these are the butterfly's bits. Write v_k[l] for the butterfly's value of lane l after k
// steps for one output: v_0[l] = chain l, v_{k+1}[l] = add_rn(v_k[l], v_k[l ^ o_k]), o_k = 16 >> k.
// (1) By induction v_k[l] = v_k[l ^ h] for every h in H_k, the lane offsets spanned by
// o_0 .. o_{k-1}: true for k = 0; v_{k+1}[l ^ o_k] = add_rn(v_k[l ^ o_k], v_k[l]) equals
// v_{k+1}[l] because add_rn is commutative bit for bit (IEEE addition is; a NaN result is the
// canonical NaN either way, docs/numerics.md "Conventions"), and for h in H_k
// v_{k+1}[l ^ h] = add_rn(v_k[l ^ h], v_k[l ^ h ^ o_k]) = add_rn(v_k[l], v_k[l ^ o_k]) by (1).
// So v_5 is the same on all lanes, equal to the contract's lane 0.
// (2) Claim: before step k, for each output that lane l holds, lane l's value is v_k[l] of that
// output. Step 0: lane l's own chains, v_0[l]. Step k: the outputs a lane holds are selected
// by its bits 4 .. 5 - k (o_0 .. o_{k-1}), which lane l ^ o_k shares, so the partner holds the
// same outputs and sends its v_k[l ^ o_k] of the output lane l keeps; lane l computes
// add_rn(v_k[l], v_k[l ^ o_k]) (or the operands swapped: same bits) = v_{k+1}[l]. After step 4
// lane l holds one output with v_5[l] = the contract's result by (1). Each addition adds the
// partial sums over the same lane subsets as the butterfly: the same tree, not a re-association.
// No float atomics, no tensor cores; every float op is an fp_ops.h helper (--fmad=false).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

#include "core/error.h"
#include "cuda/bf16_gemm.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda::detail {
namespace {

constexpr int kSlabChunks = kWarpSize;                        // chunks per slab: one per lane
constexpr int kSlabRows = kGemmBlockRows + kGemmBlockTokens;  // staged rows per slab
constexpr int kSlabPieces = kSlabRows * kSlabChunks;          // 16-byte pieces per slab
constexpr int kStageBytes = kSlabPieces * 16;                 // 32 KB
constexpr int kSmemBytes = kStageBytes * kGemmStages;         // 128 KB
static_assert(kGemmWarpRows * kGemmWarpTokens == 2 * kWarpSize, "two reduce-scatter rounds");

// The ring is filled by the tensor-memory accelerator: per slab one thread issues two 2-D tile
// copies, the block's weight rows [r0, r0 + 48) x values [256 s, 256 s + 256) and its token rows
// [t0, t0 + 16) x the same values, each landing row-major (512 bytes a row) in the stage buffer,
// completing on the stage's mbarrier. Tile elements past `rows`, T or K are written as zeros by
// the copy itself (the tensor maps' bounds), so absent rows and the chunks past the end of a
// partial last slab are zero, never chained and never stored. The copies carry 16-bit elements
// untouched (the maps' type is UINT16: no float interpretation of the bf16 bits).
struct GemmMaps {
  CUtensorMap w[2];  // [rows, K] of p.w[0], p.w[1]; box kGemmBlockRows x kSlabChunks chunks
  CUtensorMap x;     // [T, K] of p.x; box kGemmBlockTokens x kSlabChunks chunks
};
constexpr uint32_t kWBoxBytes = kGemmBlockRows * kSlabChunks * 16;
constexpr uint32_t kXBoxBytes = kGemmBlockTokens * kSlabChunks * 16;
static_assert(kWBoxBytes + kXBoxBytes == kStageBytes, "a stage is the two boxes");
static_assert(kWBoxBytes % 128 == 0 && kStageBytes % 128 == 0, "tile copies land 128-aligned");

// Thread 0 only: slab s of the block's rows into stage buffer buf, completing on bar.
__device__ __forceinline__ void stage_slab(uint4* buf, uint64_t* bar, const CUtensorMap* wmap,
                                           const CUtensorMap* xmap, int s, int64_t r0, int64_t t0) {
  bulk::bar_expect_tx(bar, kStageBytes);
  const int c0 = s * kSlabChunks * kGemvChunk;  // first value of the slab along K
  bulk::tile_copy_2d(buf, wmap, c0, static_cast<int>(r0), bar);
  bulk::tile_copy_2d(buf + kGemmBlockRows * kSlabChunks, xmap, c0, static_cast<int>(t0), bar);
}

// One chunk of lane's chain for the warp's 8 x 8 outputs: ws[r * kSlabChunks] is row r's chunk,
// xs[n * kSlabChunks] token n's. For each output the values j = 0..7 in order (the low half of
// each little-endian word first), as bf16_chunk_fma.
__device__ __forceinline__ void chunk_fma(const uint4* ws, const uint4* xs,
                                          float (&acc)[kGemmWarpRows][kGemmWarpTokens]) {
  float xf[kGemmWarpTokens][kGemvChunk];
#pragma unroll
  for (int n = 0; n < kGemmWarpTokens; ++n) bf16_chunk_unpack(xs[n * kSlabChunks], xf[n]);
#pragma unroll
  for (int r = 0; r < kGemmWarpRows; ++r)
    bf16_chunk_fma_tokens<false>(ws[r * kSlabChunks], xf, acc[r]);
}

// One step of the reduce-scatter transpose of the header comment, offset O: lane keeps the half
// of v[0 .. 2 O - 1] selected by its bit O in v[0 .. O - 1], adding the partner's values of it.
// Then the steps O / 2 .. 1; at the end v[0] is the butterfly's result of output `lane`.
template <int O>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[kWarpSize], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float lo = v[i], hi = v[i + O];
    const float send = upper ? lo : hi;
    const float keep = upper ? hi : lo;
    v[i] = add_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, O));
  }
  if constexpr (O > 1) reduce_scatter_step<O / 2>(v, lane);
}

// Round g's 32 outputs (rows 4 g + i / 8, tokens i % 8 of the warp tile), reduced and stored
// by the lane that ends with each.
__device__ __forceinline__ void reduce_store(float (&acc)[kGemmWarpRows][kGemmWarpTokens], float* y,
                                             const GemvArgs& p, int64_t wr0, int64_t wt0,
                                             int lane) {
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    float v[kWarpSize];
#pragma unroll
    for (int i = 0; i < kWarpSize; ++i)
      v[i] = acc[4 * g + i / kGemmWarpTokens][i % kGemmWarpTokens];
    reduce_scatter_step<kWarpSize / 2>(v, lane);
    const int64_t row = wr0 + 4 * g + lane / kGemmWarpTokens;
    const int64_t tok = wt0 + lane % kGemmWarpTokens;
    if (row < p.rows && tok < p.T) y[tok * p.rows + row] = v[0];
  }
}

__global__ void __launch_bounds__(kGemmThreads, 1)
    bf16_gemm_kernel(const __grid_constant__ GemmMaps maps, GemvArgs p) {
  extern __shared__ __align__(128) uint4 smem[];  // [kGemmStages][kSlabRows][kSlabChunks]
  __shared__ uint64_t full[kGemmStages];  // stage st holds its slab (phase k: slab st + S k)
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp % kGemmWarpsR, wt = warp / kGemmWarpsR;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmBlockTokens;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kGemmBlockRows;
  // Ternaries, not p.y[blockIdx.z]: a run-time index would copy the parameter array to local
  // memory.
  const CUtensorMap* wmap = blockIdx.z == 0 ? &maps.w[0] : &maps.w[1];
  float* y = blockIdx.z == 0 ? p.y[0] : p.y[1];
  // K / 8 fits an int (launch_bf16_gemm checks), so the slab loop runs on 32-bit counters.
  const int nchunks = static_cast<int>(p.K / kGemvChunk);
  const int nslabs = (nchunks + kSlabChunks - 1) / kSlabChunks;
  const int64_t wr0 = r0 + wr * kGemmWarpRows, wt0 = t0 + wt * kGemmWarpTokens;
  const bool busy = wr0 < p.rows && wt0 < p.T;  // a warp with no output only waits

  // The ring: slabs 0 .. S - 1 in flight before the loop.
  if (threadIdx.x == 0) {
    for (int st = 0; st < kGemmStages; ++st) bulk::bar_init(full + st, 1);
    bulk::fence_bar_init();
    for (int st = 0; st < kGemmStages && st < nslabs; ++st)
      stage_slab(smem + st * kSlabPieces, full + st, wmap, &maps.x, st, r0, t0);
  }
  __syncthreads();  // the barriers' inits, before anyone waits on them

  float acc[kGemmWarpRows][kGemmWarpTokens];
#pragma unroll
  for (int r = 0; r < kGemmWarpRows; ++r)
#pragma unroll
    for (int n = 0; n < kGemmWarpTokens; ++n) acc[r][n] = 0.0f;

  int st = 0;
  uint32_t parity = 0;
  for (int s = 0; s < nslabs; ++s) {
    const uint4* buf = smem + st * kSlabPieces;
    bulk::bar_wait(full + st, parity);
    if (busy && s * kSlabChunks + lane < nchunks)
      chunk_fma(buf + (wr * kGemmWarpRows) * kSlabChunks + lane,
                buf + (kGemmBlockRows + wt * kGemmWarpTokens) * kSlabChunks + lane, acc);
    __syncthreads();  // every warp is done reading stage st
    if (threadIdx.x == 0 && s + kGemmStages < nslabs) {
      bulk::fence_proxy_async();
      stage_slab(smem + st * kSlabPieces, full + st, wmap, &maps.x, s + kGemmStages, r0, t0);
    }
    if (++st == kGemmStages) {
      st = 0;
      parity ^= 1u;
    }
  }
  if (busy) reduce_store(acc, y, p, wr0, wt0, lane);
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOECHECK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                         cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || f == nullptr)
      throw InputError("cuda::bf16_gemm: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The map of a row-major [n_rows, K] matrix of 16-bit values with a box of box_rows rows x one
// slab (kSlabChunks chunks of 8 values).
void encode_map(CUtensorMap* map, const uint16_t* base, int64_t n_rows, int64_t K, int box_rows,
                const char* op) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(n_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * sizeof(uint16_t)};
  const cuuint32_t box[2] = {kSlabChunks * kGemvChunk, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estrides[2] = {1, 1};
  const CUresult r =
      encode_fn()(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<uint16_t*>(base), dims,
                  strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw InputError(std::string("cuda::") + op + ": cuTensorMapEncodeTiled failed (" +
                     std::to_string(static_cast<int>(r)) + ") for rows=" + std::to_string(n_rows) +
                     " K=" + std::to_string(K));
}

}  // namespace

void launch_bf16_gemm(const GemvArgs& a, int n_mat, const char* op, void* stream) {
  const int64_t row_tiles = (a.rows + kGemmBlockRows - 1) / kGemmBlockRows;
  const int64_t tok_tiles = (a.T + kGemmBlockTokens - 1) / kGemmBlockTokens;
  if (row_tiles > 65535 || tok_tiles > 0x7FFFFFFF || a.K > 0x3FFFFFFF)
    throw InputError(std::string("cuda::") + op +
                     ": launch too large for the GEMM: rows=" + std::to_string(a.rows) +
                     " T=" + std::to_string(a.T) + " K=" + std::to_string(a.K));
  allow_dynamic_smem(reinterpret_cast<const void*>(bf16_gemm_kernel), static_cast<int>(kSmemBytes));
  GemmMaps maps;
  for (int m = 0; m < 2; ++m)
    encode_map(&maps.w[m], a.w[m < n_mat ? m : 0], a.rows, a.K, kGemmBlockRows, op);
  encode_map(&maps.x, a.x, a.T, a.K, kGemmBlockTokens, op);
  // Token tiles vary fastest: the blocks resident at once share weight rows (read from L2).
  const dim3 grid(static_cast<unsigned>(tok_tiles), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(n_mat));
  bf16_gemm_kernel<<<grid, kGemmThreads, kSmemBytes, as_stream(stream)>>>(maps, a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda::detail
