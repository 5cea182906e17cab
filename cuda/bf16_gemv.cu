// bf16_gemv: the shared expert's bf16 projections (and the router's plain variant) on the plain
// schedule of cuda/gemv_plain.cuh. Contract: docs/numerics.md "bf16_gemv"; twin:
// emu::bf16_gemv (emulate/bf16_gemv.h). Loads: one 16-byte load per chunk per lane (a warp
// reads 512 contiguous bytes of a row), four chunks in flight before the first use (one token:
// the lane's whole row); the loads never change the arithmetic order. bf16_gemv and
// bf16_gemv_pair with more than kMaxGroupRows tokens run the GEMM of cuda/bf16_gemm.cu instead,
// and at one token the streaming kernel of cuda/gemv_stream.cu where it applies (same bits; the
// plain router keeps this file's kernels at every T).
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/bf16_gemm.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/gemv_plain.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda {
namespace detail {

template <bool kF16W>
__global__ void __launch_bounds__(kGemvPlainWarps* kWarpSize) gemv_plain_kernel(GemvArgs p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvPlainWarps + threadIdx.x / kWarpSize;
  if (row >= p.rows) return;  // whole warps leave together: the butterfly stays full
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMaxGroupRows;
  const int n = static_cast<int>(p.T - t0 < kMaxGroupRows ? p.T - t0 : kMaxGroupRows);
  // A ternary, not p.w[blockIdx.z]: a run-time index would copy the parameter array to local
  // memory.
  const uint16_t* wrow = (blockIdx.z == 0 ? p.w[0] : p.w[1]) + row * p.K;
  const int64_t nchunks = p.K / kGemvChunk;

  float acc[kMaxGroupRows];
#pragma unroll
  for (int t = 0; t < kMaxGroupRows; ++t) acc[t] = 0.0f;

  for (int64_t c0 = lane; c0 < nchunks; c0 += kGemvUnroll * kWarpSize) {
    uint4 wv[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = c0 + u * kWarpSize;
      if (c < nchunks) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + c * kGemvChunk));
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = c0 + u * kWarpSize;
      if (c >= nchunks) break;
#pragma unroll
      for (int t = 0; t < kMaxGroupRows; ++t) {
        if (t < n) {
          const uint4 xv =
              __ldg(reinterpret_cast<const uint4*>(p.x + (t0 + t) * p.K + c * kGemvChunk));
          acc[t] = bf16_chunk_fma<kF16W>(wv[u], xv, acc[t]);
        }
      }
    }
  }
  float* y = blockIdx.z == 0 ? p.y[0] : p.y[1];
#pragma unroll
  for (int t = 0; t < kMaxGroupRows; ++t) {
    if (t < n) {
      const float v = warp_butterfly(acc[t]);
      if (lane == 0) y[(t0 + t) * p.rows + row] = v;
    }
  }
}

// Two to eight tokens: the block's token rows staged in shared memory once (n x K bf16), so that
// a row's x chunks come from shared memory instead of L2. gemv_plain_kernel reads every token's
// whole x from L2 again for each weight row (ds41's pair at T = 8: 4608 rows x 80 KB, 377 MB,
// about what L2 delivers in the 68 us the layer trace showed). A block has kTokWarps warps and
// strides over the rows (grid.x blocks per matrix, blockIdx.z the matrix); each warp takes rows
// warp, warp + kTokWarps gridDim.x, ... with gemv_plain_kernel's loads and arithmetic, so the
// same bits. One instantiation per token count kN (2 - 8), with no per-token guard, so that the
// kN tokens' shared loads issue together and their chains interleave: with the count known only
// at run time, each token's step was a branch around one shared load and its eight dependent
// fma, the tokens' chains one after the other (the n-token MMVQ had the same form, and gained
// from the same change: docs/performance.md).
constexpr int kTokWarps = 8;

template <bool kF16W, int kN>
__global__ void __launch_bounds__(kTokWarps* kWarpSize) gemv_tokens_kernel(GemvArgs p) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* xs = reinterpret_cast<uint4*>(smem);  // [kN][K / 8] chunks
  const int64_t nchunks = p.K / kGemvChunk;
  const int64_t nvec = kN * nchunks;
  const uint4* xg = reinterpret_cast<const uint4*>(p.x);
  for (int64_t i = threadIdx.x; i < nvec; i += kTokWarps * kWarpSize) xs[i] = __ldg(xg + i);
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  const uint16_t* wmat = blockIdx.z == 0 ? p.w[0] : p.w[1];
  float* y = blockIdx.z == 0 ? p.y[0] : p.y[1];
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kTokWarps + threadIdx.x / kWarpSize;
       row < p.rows; row += static_cast<int64_t>(gridDim.x) * kTokWarps) {
    const uint16_t* wrow = wmat + row * p.K;
    float acc[kN];
#pragma unroll
    for (int t = 0; t < kN; ++t) acc[t] = 0.0f;
    for (int64_t c0 = lane; c0 < nchunks; c0 += kGemvUnroll * kWarpSize) {
      uint4 wv[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + u * kWarpSize;
        if (c < nchunks) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + c * kGemvChunk));
      }
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + u * kWarpSize;
        if (c >= nchunks) break;
        uint4 xv[kN];
#pragma unroll
        for (int t = 0; t < kN; ++t) xv[t] = xs[t * nchunks + c];
#pragma unroll
        for (int t = 0; t < kN; ++t) acc[t] = bf16_chunk_fma<kF16W>(wv[u], xv[t], acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < kN; ++t) {
      const float v = warp_butterfly(acc[t]);
      if (lane == 0) y[t * p.rows + row] = v;
    }
  }
}

// One token (the plain router at T = 1; the shared expert where the streaming kernel does not
// apply or cuda::set_bf16_gemv_stream(false)): every chunk of the lane's row is
// loaded before the first fma (kNC chunks per lane: the whole row in flight, up to 8192 values),
// then the same chain and butterfly. Same bits as gemv_plain_kernel.
template <int kNC, bool kF16W>
__global__ void __launch_bounds__(kGemvPlainWarps* kWarpSize) gemv_one_kernel(GemvArgs p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvPlainWarps + threadIdx.x / kWarpSize;
  if (row >= p.rows) return;
  const uint16_t* wrow = (blockIdx.z == 0 ? p.w[0] : p.w[1]) + row * p.K;
  const int nchunks = static_cast<int>(p.K / kGemvChunk);
  uint4 wv[kNC];
#pragma unroll
  for (int u = 0; u < kNC; ++u) {
    const int c = lane + u * kWarpSize;
    if (c < nchunks) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + c * kGemvChunk));
  }
  float acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kNC; ++u) {
    const int c = lane + u * kWarpSize;
    if (c < nchunks)
      acc = bf16_chunk_fma<kF16W>(wv[u],
                                  __ldg(reinterpret_cast<const uint4*>(p.x + c * kGemvChunk)), acc);
  }
  const float v = warp_butterfly(acc);
  if (lane == 0) (blockIdx.z == 0 ? p.y[0] : p.y[1])[row] = v;
}

// The one-token kernel for chunks per lane nc (<= 32), rounded up to an instantiated kNC.
template <bool kF16W>
bool launch_gemv_one(const GemvArgs& a, int n_mat, dim3 grid, void* stream) {
  const int64_t nc = (a.K / kGemvChunk + kWarpSize - 1) / kWarpSize;
  const dim3 block(kGemvPlainWarps * kWarpSize);
  cudaStream_t s = as_stream(stream);
  grid.z = static_cast<unsigned>(n_mat);
  if (a.T != 1 || nc > 32) return false;
  if (nc <= 4) gemv_one_kernel<4, kF16W><<<grid, block, 0, s>>>(a);
  else if (nc <= 8) gemv_one_kernel<8, kF16W><<<grid, block, 0, s>>>(a);
  else if (nc <= 12) gemv_one_kernel<12, kF16W><<<grid, block, 0, s>>>(a);
  else if (nc <= 16) gemv_one_kernel<16, kF16W><<<grid, block, 0, s>>>(a);
  else if (nc <= 20) gemv_one_kernel<20, kF16W><<<grid, block, 0, s>>>(a);
  else if (nc <= 24) gemv_one_kernel<24, kF16W><<<grid, block, 0, s>>>(a);
  else gemv_one_kernel<32, kF16W><<<grid, block, 0, s>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  return true;
}

// gemv_tokens_kernel for 2 - 8 tokens where n x K bf16 fit a block's shared memory; false
// otherwise (or cuda::set_bf16_gemv_x_staged(false)). The grid: as many blocks per matrix as fit
// the multiprocessors at once while one block of the device route's selection still fits beside
// them (kSelectionRegs; at least one block), each striding over its matrix's rows; with every
// multiprocessor full the selection waited for the GEMV's persistent blocks to leave (10 us at
// T = 4, docs/performance.md). cuda::set_bf16_gemv_tokens_blocks overrides the count. The
// kernel's dynamic shared memory limit is raised to the largest (allow_dynamic_smem), and its
// blocks per multiprocessor asked once per (kernel, device, bytes) (resident_blocks_per_sm).
std::atomic<bool> g_x_staged{true};
std::atomic<int> g_tok_blocks{0};  // cuda::set_bf16_gemv_tokens_blocks (0: the rule above)
// The registers one route_select block of several tokens takes: 256 threads (launch_select) of
// at most 64 registers (its __launch_bounds__(1024)).
constexpr int kSelectionRegs = 256 * 64;

namespace {

// The current device's registers per multiprocessor, and a kernel's registers per thread
// (cached per device and kernel).
int regs_per_sm() {
  static std::mutex mu;
  static std::map<int, int> cache;
  int dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(dev, 0);
  if (fresh)
    MOECHECK_CUDA_CHECK(
        cudaDeviceGetAttribute(&it->second, cudaDevAttrMaxRegistersPerMultiprocessor, dev));
  return it->second;
}

int func_regs(const void* f) {
  static std::mutex mu;
  static std::map<const void*, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(f, 0);
  if (fresh) {
    cudaFuncAttributes fa{};
    MOECHECK_CUDA_CHECK(cudaFuncGetAttributes(&fa, f));
    it->second = fa.numRegs;
  }
  return it->second;
}

}  // namespace

template <bool kF16W, int kN>
bool launch_gemv_tokens_n(const GemvArgs& a, int n_mat, void* stream) {
  constexpr size_t kMaxSmem = 227 * 1024;
  const size_t smem = static_cast<size_t>(kN) * static_cast<size_t>(a.K) * 2;
  if (smem > kMaxSmem) return false;
  const void* f = reinterpret_cast<const void*>(gemv_tokens_kernel<kF16W, kN>);
  prefer_shared_carveout(f);
  allow_dynamic_smem(f, static_cast<int>(kMaxSmem));
  int per_sm = resident_blocks_per_sm(f, kTokWarps * kWarpSize, static_cast<int>(smem));
  if (per_sm < 1) return false;
  if (const int cap = g_tok_blocks; cap > 0) {
    per_sm = per_sm < cap ? per_sm : cap;
  } else {  // leave one selection block's registers (allocated 8 a thread at a time)
    const int room =
        (regs_per_sm() - kSelectionRegs) / ((func_regs(f) + 7) / 8 * 8 * kTokWarps * kWarpSize);
    per_sm = per_sm < room ? per_sm : (room > 1 ? room : 1);
  }
  const int64_t want = (a.rows + kTokWarps - 1) / kTokWarps;
  const int64_t fit = (static_cast<int64_t>(per_sm) * current_sm_count() + n_mat - 1) / n_mat;
  const dim3 grid(static_cast<unsigned>(want < fit ? want : fit), 1, static_cast<unsigned>(n_mat));
  gemv_tokens_kernel<kF16W, kN><<<grid, kTokWarps * kWarpSize, smem, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  return true;
}

template <bool kF16W>
bool launch_gemv_tokens(const GemvArgs& a, int n_mat, void* stream) {
  if (!g_x_staged) return false;
  switch (a.T) {
    case 2: return launch_gemv_tokens_n<kF16W, 2>(a, n_mat, stream);
    case 3: return launch_gemv_tokens_n<kF16W, 3>(a, n_mat, stream);
    case 4: return launch_gemv_tokens_n<kF16W, 4>(a, n_mat, stream);
    case 5: return launch_gemv_tokens_n<kF16W, 5>(a, n_mat, stream);
    case 6: return launch_gemv_tokens_n<kF16W, 6>(a, n_mat, stream);
    case 7: return launch_gemv_tokens_n<kF16W, 7>(a, n_mat, stream);
    case 8: return launch_gemv_tokens_n<kF16W, 8>(a, n_mat, stream);
    default: return false;
  }
}

template <bool kF16W>
void launch_gemv_typed(const GemvArgs& a, int n_mat, dim3 grid, void* stream) {
  if (launch_gemv_one<kF16W>(a, n_mat, grid, stream)) return;
  if (launch_gemv_tokens<kF16W>(a, n_mat, stream)) return;
  gemv_plain_kernel<kF16W><<<grid, kGemvPlainWarps * kWarpSize, 0, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

// The shape and alignment checks of both launches; false when there is nothing to compute.
bool check_gemv_args(const GemvArgs& a, int n_mat, const char* op, bool gemm) {
  const std::string where = std::string("cuda::") + op + ": ";
  if (a.rows < 0 || a.T < 0 || a.K <= 0 || a.K % kGemvChunk != 0)
    throw InputError(where + "need rows >= 0, T >= 0 and K a positive multiple of 8, found rows=" +
                     std::to_string(a.rows) + " K=" + std::to_string(a.K) +
                     " T=" + std::to_string(a.T));
  if (!gemm && (a.T + kMaxGroupRows - 1) / kMaxGroupRows > 65535)
    throw InputError(where + "T=" + std::to_string(a.T) + " exceeds 65535 groups of 8 tokens");
  if (a.rows == 0 || a.T == 0) return false;
  for (int m = 0; m < n_mat; ++m) {
    require_aligned(a.w[m], 16, op, "w");
    require_aligned(a.y[m], 4, op, "y");
  }
  require_aligned(a.x, 16, op, "x");
  return true;
}

namespace {

// The plain GEMV's launch after check_gemv_args passed.
void launch_gemv_checked(const GemvArgs& a, int n_mat, void* stream, bool f16_w) {
  const dim3 grid(static_cast<unsigned>((a.rows + kGemvPlainWarps - 1) / kGemvPlainWarps),
                  static_cast<unsigned>((a.T + kMaxGroupRows - 1) / kMaxGroupRows),
                  static_cast<unsigned>(n_mat));
  if (f16_w) launch_gemv_typed<true>(a, n_mat, grid, stream);
  else launch_gemv_typed<false>(a, n_mat, grid, stream);
}

}  // namespace

void launch_gemv_plain(const GemvArgs& a, int n_mat, const char* op, void* stream, bool f16_w) {
  if (check_gemv_args(a, n_mat, op, false)) launch_gemv_checked(a, n_mat, stream, f16_w);
}

// bf16_gemv / bf16_gemv_pair: the GEMM above kMaxGroupRows tokens, the GEMV otherwise (at one
// token the streaming kernel where it applies); the shapes checked once.
void launch_bf16(const GemvArgs& a, int n_mat, const char* op, void* stream) {
  if (!use_bf16_gemm(a.T)) {
    if (!check_gemv_args(a, n_mat, op, false)) return;
    if (a.T == 1 && launch_gemv_stream(a, n_mat, stream)) return;
    launch_gemv_checked(a, n_mat, stream, false);
    return;
  }
  if (check_gemv_args(a, n_mat, op, true)) launch_bf16_gemm(a, n_mat, op, stream);
}

}  // namespace detail

void set_bf16_gemv_x_staged(bool on) { detail::g_x_staged = on; }

void set_bf16_gemv_tokens_blocks(int per_sm) {
  if (per_sm < 0 || per_sm > 32)
    throw InputError("cuda::set_bf16_gemv_tokens_blocks: need 0 <= per_sm <= 32, found " +
                     std::to_string(per_sm));
  detail::g_tok_blocks = per_sm;
}

void bf16_gemv(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T,
               void* stream) {
  const detail::GemvArgs a{{w, w}, {y, y}, x, rows, K, T};
  detail::launch_bf16(a, 1, "bf16_gemv", stream);
}

void bf16_gemv_pair(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, float* y0, float* y1,
                    int64_t rows, int64_t K, int64_t T, void* stream) {
  const detail::GemvArgs a{{w0, w1}, {y0, y1}, x, rows, K, T};
  detail::launch_bf16(a, 2, "bf16_gemv_pair", stream);
}

}  // namespace moecheck::cuda
