// bf16_gemv: the shared expert's bf16 projections (and the router's plain variant) on the plain
// schedule of cuda/gemv_plain.cuh. Contract: docs/numerics.md "bf16_gemv"; twin:
// emu::bf16_gemv (emulate/bf16_gemv.h). Loads: one 16-byte load per chunk per lane (a warp
// reads 512 contiguous bytes of a row), four chunks in flight before the first use (one token:
// the lane's whole row); the loads never change the arithmetic order. bf16_gemv and
// bf16_gemv_pair with more than kMaxGroupRows tokens run the GEMM of cuda/bf16_gemm.cu instead,
// and at one token the streaming kernel of cuda/gemv_stream.cu where it applies (same bits; the
// plain router keeps this file's kernels at every T).
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

template <bool kF16W>
void launch_gemv_typed(const GemvArgs& a, int n_mat, dim3 grid, void* stream) {
  if (launch_gemv_one<kF16W>(a, n_mat, grid, stream)) return;
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
