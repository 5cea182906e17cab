// bf16_gemm: bf16_gemv / bf16_gemv_pair for T > kMaxGroupRows tokens, on CUDA cores, with
// exactly the bits of the plain GEMV schedule (docs/numerics.md "bf16_gemv"; twin
// emu::bf16_gemv). The contract per output (row r, token t): 32 chains, chain l over the
// 8-value chunks c = l, l + 32, ... in increasing c, acc = fma_rn(float(w), float(x), acc) over
// each chunk's values in order from +0; then butterfly(v) over the 32 chain values.
//
// Tiles. A warp owns kGemmWarpRows x kGemmWarpTokens = 8 x 8 outputs; lane l of the warp runs
// chain l (chunk class l) of all 64 of them, so every chain is one lane's fma sequence in the
// contract's order (outputs are interleaved, each output's chain is not). A block of 4 x 2 warps
// covers 32 rows x 16 tokens: the weights are read T / 16 times and the activations rows / 32
// times (at T = 512 on the shared gate: 32 weight passes instead of the GEMV's 64, and 5 MB of
// activations 72 times from L2). K is walked in slabs of 32 chunks (256 values): slab s holds
// chunks 32 s .. 32 s + 31, so lane l takes chunk 32 s + l of every slab, i.e. its chunks
// l, l + 32, ... in increasing order. The block copies each slab's 32 weight rows and 16 token
// rows (512 bytes each, bf16 as stored) into shared memory with 16-byte cp.async, a ring of
// kGemmStages slabs; rows past `rows`, tokens past T and chunks past K / 8 are zero-filled and
// never stored or chained (a lane whose chunk is past the end does no fma: the contract's
// "lanes with no chunk hold +0"). Shared memory is read as one 16-byte chunk per lane at
// consecutive addresses: no bank conflicts. Per chunk a lane widens its 8 tokens' chunks to f32
// once (64 values) and each row's chunk once, then 512 fma_rn.
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
#include <cuda_pipeline.h>

#include <string>

#include "core/error.h"
#include "cuda/bf16_gemm.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda::detail {
namespace {

constexpr int kSlabChunks = kWarpSize;                        // chunks per slab: one per lane
constexpr int kSlabRows = kGemmBlockRows + kGemmBlockTokens;  // staged rows per slab
constexpr int kSlabPieces = kSlabRows * kSlabChunks;          // 16-byte pieces per slab
constexpr int kStageBytes = kSlabPieces * 16;                 // 24 KB
constexpr int kSmemBytes = kStageBytes * kGemmStages;         // 96 KB
static_assert(kSlabPieces % kGemmThreads == 0, "every thread copies the same number of pieces");
static_assert(kGemmWarpRows * kGemmWarpTokens == 2 * kWarpSize, "two reduce-scatter rounds");

// Copies slab s (chunks 32 s .. 32 s + 31) of the block's weight rows r0 .. r0 + 31 and token
// rows t0 .. t0 + 15 into stage buffer buf ([kSlabRows][kSlabChunks] 16-byte chunks, weight rows
// first); absent rows, tokens and chunks are zero-filled (no bytes read).
__device__ __forceinline__ void stage_slab(uint4* buf, const uint16_t* w, const GemvArgs& p,
                                           int64_t r0, int64_t t0, int64_t s, int64_t nchunks) {
#pragma unroll
  for (int k = 0; k < kSlabPieces / kGemmThreads; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kGemmThreads;
    const int srow = i / kSlabChunks;
    const int64_t c = s * kSlabChunks + i % kSlabChunks;
    const bool is_w = srow < kGemmBlockRows;
    const int64_t row = is_w ? r0 + srow : t0 + (srow - kGemmBlockRows);
    const bool valid = c < nchunks && row < (is_w ? p.rows : p.T);
    const uint16_t* base = is_w ? w : p.x;
    const uint16_t* src = valid ? base + row * p.K + c * kGemvChunk : base;
    __pipeline_memcpy_async(buf + i, src, 16, valid ? 0 : 16);
  }
}

// One chunk of lane's chain for the warp's 8 x 8 outputs: ws[r * kSlabChunks] is row r's chunk,
// xs[n * kSlabChunks] token n's. For each output the values j = 0..7 in order (the low half of
// each little-endian word first), as bf16_chunk_fma.
__device__ __forceinline__ void chunk_fma(const uint4* ws, const uint4* xs,
                                          float (&acc)[kGemmWarpRows][kGemmWarpTokens]) {
  float xf[kGemmWarpTokens][kGemvChunk];
#pragma unroll
  for (int n = 0; n < kGemmWarpTokens; ++n) {
    const uint4 v = xs[n * kSlabChunks];
    const uint32_t xw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xf[n][2 * i] = bf16_lo(xw[i]);
      xf[n][2 * i + 1] = bf16_hi(xw[i]);
    }
  }
#pragma unroll
  for (int r = 0; r < kGemmWarpRows; ++r) {
    const uint4 v = ws[r * kSlabChunks];
    const uint32_t ww[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = bf16_lo(ww[i]), hi = bf16_hi(ww[i]);
#pragma unroll
      for (int n = 0; n < kGemmWarpTokens; ++n) acc[r][n] = fma_rn(lo, xf[n][2 * i], acc[r][n]);
#pragma unroll
      for (int n = 0; n < kGemmWarpTokens; ++n) acc[r][n] = fma_rn(hi, xf[n][2 * i + 1], acc[r][n]);
    }
  }
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

__global__ void __launch_bounds__(kGemmThreads, 1) bf16_gemm_kernel(GemvArgs p) {
  extern __shared__ uint4 smem[];  // [kGemmStages][kSlabRows][kSlabChunks]
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp % kGemmWarpsR, wt = warp / kGemmWarpsR;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmBlockTokens;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kGemmBlockRows;
  // Ternaries, not p.w[blockIdx.z]: a run-time index would copy the parameter array to local
  // memory.
  const uint16_t* w = blockIdx.z == 0 ? p.w[0] : p.w[1];
  float* y = blockIdx.z == 0 ? p.y[0] : p.y[1];
  const int64_t nchunks = p.K / kGemvChunk;
  const int64_t nslabs = (nchunks + kSlabChunks - 1) / kSlabChunks;
  const int64_t wr0 = r0 + wr * kGemmWarpRows, wt0 = t0 + wt * kGemmWarpTokens;
  const bool busy = wr0 < p.rows && wt0 < p.T;  // a warp with no output only copies

  float acc[kGemmWarpRows][kGemmWarpTokens];
#pragma unroll
  for (int r = 0; r < kGemmWarpRows; ++r)
#pragma unroll
    for (int n = 0; n < kGemmWarpTokens; ++n) acc[r][n] = 0.0f;

  // The ring: slabs 0 .. kGemmStages - 2 in flight before the loop, one more per iteration
  // (a group is committed every time, empty past the end, so the wait count is uniform).
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < nslabs) stage_slab(smem + s * kSlabPieces, w, p, r0, t0, s, nchunks);
    __pipeline_commit();
  }
  for (int64_t s = 0; s < nslabs; ++s) {
    __pipeline_wait_prior(kGemmStages - 2);  // slab s has landed (this thread's copies)
    __syncthreads();                         // everyone's copies; slab s - 1 fully consumed
    const int64_t next = s + kGemmStages - 1;
    if (next < nslabs)
      stage_slab(smem + (next % kGemmStages) * kSlabPieces, w, p, r0, t0, next, nchunks);
    __pipeline_commit();
    const uint4* buf = smem + (s % kGemmStages) * kSlabPieces;
    if (busy && s * kSlabChunks + lane < nchunks)
      chunk_fma(buf + (wr * kGemmWarpRows) * kSlabChunks + lane,
                buf + (kGemmBlockRows + wt * kGemmWarpTokens) * kSlabChunks + lane, acc);
  }
  if (busy) reduce_store(acc, y, p, wr0, wt0, lane);
}

}  // namespace

void launch_bf16_gemm(const GemvArgs& a, int n_mat, const char* op, void* stream) {
  const int64_t row_tiles = (a.rows + kGemmBlockRows - 1) / kGemmBlockRows;
  const int64_t tok_tiles = (a.T + kGemmBlockTokens - 1) / kGemmBlockTokens;
  if (row_tiles > 65535 || tok_tiles > 0x7FFFFFFF)
    throw InputError(std::string("cuda::") + op + ": launch too large for the GEMM: rows=" +
                     std::to_string(a.rows) + " T=" + std::to_string(a.T));
  static bool smem_set = false;  // process-wide, like the MMVQ launch's limit
  if (!smem_set) {
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(
        bf16_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    smem_set = true;
  }
  // Token tiles vary fastest: the blocks resident at once share weight rows (read from L2).
  const dim3 grid(static_cast<unsigned>(tok_tiles), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(n_mat));
  bf16_gemm_kernel<<<grid, kGemmThreads, kSmemBytes, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda::detail
