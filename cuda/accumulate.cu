// accumulate + finish: per token, acc = +0, then fma_rn(weight, down, acc) over the token's
// picks in ascending expert id (the caller orders rows / weights so), then add_rn(acc, shared),
// and y = f32_to_bf16(acc). One thread per (token, element); no atomics, no reordering.
// Contract: docs/numerics.md "accumulate, finish"; twins: emu::accumulate, emu::finish.
#include <string>

#include "core/error.h"
#include "core/schedule.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda {
namespace {

constexpr int kThreads = 256;
// Picks per token whose loads are all issued before the chain starts (ds41: 6).
constexpr int kLoadsAhead = 8;

__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                      const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= T * dim) return;
  const int64_t t = i / dim;
  const int64_t c = i - t * dim;
  float a = 0.0f;
  if (topk <= kLoadsAhead) {
    // Every load in flight before the first fma: the rows, then the down values they index
    // (two round trips to L2 in all, where the loop below takes two per pick). Same chain.
    int32_t r[kLoadsAhead];
    float wk[kLoadsAhead], dk[kLoadsAhead];
#pragma unroll
    for (int k = 0; k < kLoadsAhead; ++k)
      if (k < topk) {
        r[k] = __ldg(rows + t * topk + k);
        wk[k] = __ldg(weights + t * topk + k);
      }
    const float sh = shared != nullptr ? __ldg(shared + i) : 0.0f;
#pragma unroll
    for (int k = 0; k < kLoadsAhead; ++k)
      if (k < topk) dk[k] = __ldg(down + static_cast<int64_t>(r[k]) * dim + c);
#pragma unroll
    for (int k = 0; k < kLoadsAhead; ++k)
      if (k < topk) a = fma_rn(wk[k], dk[k], a);
    if (shared != nullptr) a = add_rn(a, sh);
  } else {
    for (int64_t k = 0; k < topk; ++k) {
      const int64_t r = __ldg(rows + t * topk + k);
      a = fma_rn(__ldg(weights + t * topk + k), __ldg(down + r * dim + c), a);
    }
    if (shared != nullptr) a = add_rn(a, __ldg(shared + i));
  }
  acc[i] = a;
  if (y != nullptr) y[i] = f32_to_bf16(a);
}

// Four consecutive elements of one token a thread (T > 8; dim % 4 == 0; down, shared and acc
// 16-byte aligned, y 8-byte aligned; topk <= kLoadsAhead): 16-byte loads of each pick's down
// values, a quarter of the threads and load instructions of the kernel above. Each element's chain
// is the one above (+0, fma_rn over the picks in the given order, then add_rn of the shared value),
// so the bits are the same.
__global__ void __launch_bounds__(kThreads)
    accumulate4_kernel(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                       const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t i = 4 * q;
  if (i >= T * dim) return;
  const int64_t t = i / dim;
  const int64_t c = i - t * dim;
  int32_t r[kLoadsAhead];
  float wk[kLoadsAhead];
  float4 dk[kLoadsAhead];
#pragma unroll
  for (int k = 0; k < kLoadsAhead; ++k)
    if (k < topk) {
      r[k] = __ldg(rows + t * topk + k);
      wk[k] = __ldg(weights + t * topk + k);
    }
  const float4 sh = shared != nullptr ? __ldg(reinterpret_cast<const float4*>(shared + i))
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int k = 0; k < kLoadsAhead; ++k)
    if (k < topk)
      dk[k] = __ldg(reinterpret_cast<const float4*>(down + static_cast<int64_t>(r[k]) * dim + c));
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int k = 0; k < kLoadsAhead; ++k)
    if (k < topk) {
      a.x = fma_rn(wk[k], dk[k].x, a.x);
      a.y = fma_rn(wk[k], dk[k].y, a.y);
      a.z = fma_rn(wk[k], dk[k].z, a.z);
      a.w = fma_rn(wk[k], dk[k].w, a.w);
    }
  if (shared != nullptr) {
    a.x = add_rn(a.x, sh.x);
    a.y = add_rn(a.y, sh.y);
    a.z = add_rn(a.z, sh.z);
    a.w = add_rn(a.w, sh.w);
  }
  *reinterpret_cast<float4*>(acc + i) = a;
  if (y != nullptr) {
    const uint32_t lo = f32_to_bf16(a.x) | static_cast<uint32_t>(f32_to_bf16(a.y)) << 16;
    const uint32_t hi = f32_to_bf16(a.z) | static_cast<uint32_t>(f32_to_bf16(a.w)) << 16;
    *reinterpret_cast<uint2*>(y + i) = make_uint2(lo, hi);
  }
}

bool g_accumulate4 = true;  // cuda::set_accumulate_vector

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

__global__ void __launch_bounds__(kThreads)
    finish_kernel(const float* acc, uint16_t* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) y[i] = f32_to_bf16(__ldg(acc + i));
}

}  // namespace

void accumulate(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim,
                void* stream) {
  if (T < 0 || dim <= 0 || topk < 0)
    throw InputError(
        "cuda::accumulate: need T >= 0, dim > 0, topk >= 0, found T=" + std::to_string(T) +
        " dim=" + std::to_string(dim) + " topk=" + std::to_string(topk));
  if (T == 0) return;
  if (topk > 0) {
    require_aligned(rows, 4, "accumulate", "rows");
    require_aligned(weights, 4, "accumulate", "weights");
    require_aligned(down, 4, "accumulate", "down");
  }
  require_aligned(acc, 4, "accumulate", "acc");
  const int64_t n = T * dim;
  // Above 8 tokens only: at one token the one-element form was 0.4 us faster (2.3 against 2.7
  // us on the H100, docs/performance.md, thirty-fourth session), at 64 and 512 tokens the
  // four-element form 10 % and 14 % (7.0 against 6.3 us, 41.6 against 35.9).
  if (g_accumulate4 && T > kMaxGroupRows && dim % 4 == 0 && topk <= kLoadsAhead &&
      aligned_to(down, 16) && aligned_to(shared, 16) && aligned_to(acc, 16) && aligned_to(y, 8)) {
    prefer_shared_carveout(reinterpret_cast<const void*>(accumulate4_kernel));
    accumulate4_kernel<<<static_cast<unsigned>((n / 4 + kThreads - 1) / kThreads), kThreads, 0,
                         as_stream(stream)>>>(rows, weights, topk, down, shared, acc, y, T, dim);
    MOECHECK_CUDA_CHECK(cudaGetLastError());
    return;
  }
  prefer_shared_carveout(reinterpret_cast<const void*>(accumulate_kernel));
  accumulate_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                      as_stream(stream)>>>(rows, weights, topk, down, shared, acc, y, T, dim);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

void set_accumulate_vector(bool on) { g_accumulate4 = on; }

void finish(const float* acc, uint16_t* y, int64_t n, void* stream) {
  if (n < 0) throw InputError("cuda::finish: n must be >= 0, found " + std::to_string(n));
  if (n == 0) return;
  require_aligned(acc, 4, "finish", "acc");
  require_aligned(y, 2, "finish", "y");
  finish_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                  as_stream(stream)>>>(acc, y, n);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda
