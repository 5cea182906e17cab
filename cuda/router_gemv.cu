// router_gemv: bf16 or f16 router weights [rows, K] times bf16 tokens [T, K], f32 logits [T, rows].
// Contract: docs/numerics.md "router_gemv"; twin: emu::router_gemv (emulate/router_gemv.h).
// kPlain runs the plain schedule of cuda/gemv_plain.cuh (kernel in cuda/bf16_gemv.cu); kStaged
// is here: one block of kRouterStagedThreads per row, thread t taking chunks t, t + 256, ...,
// partials staged in shared memory, folded by warp 0 (p = part[l], then part[l + 32 w] for
// w = 1..7 in order) and finished by the butterfly.
#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/gemv_plain.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda {
namespace {

// Chunks per thread loaded before the first use (K = 5120 has 640 chunks: 2 or 3 per thread).
constexpr int kStagedUnroll = 4;

template <bool kF16W>
__global__ void __launch_bounds__(kRouterStagedThreads)
    router_staged_kernel(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K,
                         int64_t T) {
  __shared__ float part[kMaxGroupRows][kRouterStagedThreads];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMaxGroupRows;
  const int n = static_cast<int>(T - t0 < kMaxGroupRows ? T - t0 : kMaxGroupRows);
  const uint16_t* wrow = w + row * K;
  const int64_t nchunks = K / kGemvChunk;

  float acc[kMaxGroupRows];
#pragma unroll
  for (int t = 0; t < kMaxGroupRows; ++t) acc[t] = 0.0f;
  for (int64_t c0 = tid; c0 < nchunks; c0 += kStagedUnroll * kRouterStagedThreads) {
    uint4 wv[kStagedUnroll];
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const int64_t c = c0 + u * kRouterStagedThreads;
      if (c < nchunks) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + c * kGemvChunk));
    }
#pragma unroll
    for (int u = 0; u < kStagedUnroll; ++u) {
      const int64_t c = c0 + u * kRouterStagedThreads;
      if (c >= nchunks) break;
#pragma unroll
      for (int t = 0; t < kMaxGroupRows; ++t) {
        if (t < n) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (t0 + t) * K + c * kGemvChunk));
          acc[t] = bf16_chunk_fma<kF16W>(wv[u], xv, acc[t]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxGroupRows; ++t) part[t][tid] = acc[t];
  __syncthreads();
  if (tid >= kWarpSize) return;
#pragma unroll
  for (int t = 0; t < kMaxGroupRows; ++t) {
    if (t < n) {
      float v = part[t][tid];
#pragma unroll
      for (int ww = 1; ww < kRouterStagedWarps; ++ww) v = add_rn(v, part[t][tid + kWarpSize * ww]);
      v = warp_butterfly(v);
      if (tid == 0) y[(t0 + t) * rows + row] = v;
    }
  }
}

}  // namespace

void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T, void* stream, GgmlType w_type) {
  if (w_type != GgmlType::kBF16 && w_type != GgmlType::kF16)
    throw InputError("cuda::router_gemv: weight type " +
                     std::to_string(static_cast<uint32_t>(w_type)) + " is neither BF16 nor F16");
  const bool f16 = w_type == GgmlType::kF16;
  if (v == RouterVariant::kPlain) {
    const detail::GemvArgs a{{w, w}, {y, y}, x, rows, K, T};
    detail::launch_gemv_plain(a, 1, "router_gemv", stream, f16);
    return;
  }
  const std::string where = "cuda::router_gemv(staged): ";
  if (rows < 0 || T < 0 || K <= 0 || K % kGemvChunk != 0)
    throw InputError(where + "need rows >= 0, T >= 0 and K a positive multiple of 8, found rows=" +
                     std::to_string(rows) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
  if ((T + kMaxGroupRows - 1) / kMaxGroupRows > 65535 || rows > 0x7FFFFFFF)
    throw InputError(where + "launch too large: rows=" + std::to_string(rows) +
                     " T=" + std::to_string(T));
  if (rows == 0 || T == 0) return;
  require_aligned(w, 16, "router_gemv", "w");
  require_aligned(x, 16, "router_gemv", "x");
  require_aligned(y, 4, "router_gemv", "y");
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((T + kMaxGroupRows - 1) / kMaxGroupRows));
  if (f16)
    router_staged_kernel<true>
        <<<grid, kRouterStagedThreads, 0, as_stream(stream)>>>(w, x, y, rows, K, T);
  else
    router_staged_kernel<false>
        <<<grid, kRouterStagedThreads, 0, as_stream(stream)>>>(w, x, y, rows, K, T);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda
