// The baseline of tests/bench/batched_bench.cu: what a user would otherwise run for the same
// layer. Every routed expert dequantised to bf16 once (device kernels below, through the same
// core/blocks.h element decoders as the host dequantiser, checked against core/kquant.h on
// sampled rows; not timed), then per forward: gather each expert's tokens, one grouped bf16
// GEMM through cuBLAS for gate and up (the two matrices stacked as one [2 inter, dim] matrix
// per expert), SwiGLU to bf16, a grouped GEMM for down, the shared expert's two GEMMs and
// SwiGLU, and the weighted sum of each token's down rows plus the shared expert to bf16 (a
// gather, no atomics). bf16 in, f32 compute, bf16 out (cublasGemmGroupedBatchedEx; a loop of
// cublasGemmEx when the grouped call is refused). The router and the top-k are not part of it
// (the picks are the layer's). A benchmark baseline only: cuBLAS is linked to this benchmark
// alone, never to the product libraries.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/blocks.h"
#include "core/kquant.h"
#include "core/layer_weights.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "core/routing.h"
#include "cuda/check.h"

namespace moecheck::bench {

#define BENCH_CUBLAS_CHECK(x)                                                  \
  do {                                                                         \
    const cublasStatus_t st_ = (x);                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::fprintf(stderr, "bench: %s failed: cuBLAS status %d (%s:%d)\n", #x, \
                   static_cast<int>(st_), __FILE__, __LINE__);                 \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// Blocks of `rows` rows x bpr blocks per expert, n experts, to bf16 rows of dst: expert e's row
// r lands at dst[(e * dst_rows + row0 + r) * (bpr * 256)]. One thread per 8 values.
template <class Block>
__global__ void dequant_kernel(const Block* src, uint16_t* dst, int64_t n_blocks, int64_t rows,
                               int64_t bpr, int64_t dst_rows, int64_t row0) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n_blocks * 32) return;
  const int64_t b = i / 32, part = i % 32;
  const int64_t e = b / (rows * bpr), r = (b / bpr) % rows, kb = b % bpr;
  const Block& blk = src[b];
  uint16_t* out = dst + (e * dst_rows + row0 + r) * (bpr * kQK_K) + kb * kQK_K + part * 8;
  for (int j = 0; j < 8; ++j) {
    const int el = static_cast<int>(part) * 8 + j;
    float v;
    if constexpr (sizeof(Block) == sizeof(BlockQ2K)) v = q2k_dequant(blk, el);
    else v = q3k_dequant(blk, el);
    out[j] = f32_to_bf16(v);
  }
}

// dst[p] = x[tok[p]] for p < P, rows of dim bf16 (dim a multiple of 8).
__global__ void gather_rows_kernel(const uint16_t* x, const int32_t* tok, uint16_t* dst, int64_t P,
                                   int64_t dim) {
  const int64_t per = dim / 8;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < P * per;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / per, c = i % per;
    reinterpret_cast<uint4*>(dst + p * dim)[c] =
        reinterpret_cast<const uint4*>(x + tok[p] * dim)[c];
  }
}

// h[p][i] = bf16(swiglu(gu[p][i], gu[p][inter + i], limit)); gu bf16 [P, 2 inter].
__global__ void swiglu_rows_kernel(const uint16_t* gu, uint16_t* h, int64_t P, int64_t inter,
                                   float limit) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < P * inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / inter, c = i % inter;
    const float g = bf16_to_f32(gu[p * 2 * inter + c]),
                u = bf16_to_f32(gu[p * 2 * inter + inter + c]);
    h[i] = f32_to_bf16(swiglu(g, u, limit));
  }
}

// y[t][j] = bf16(shared[t][j] + sum_k wts[t][k] * down[pos[t][k]][j]); bf16 rows of dim.
__global__ void combine_kernel(const uint16_t* down, const uint16_t* shared, const int32_t* pos,
                               const float* wts, int64_t topk, uint16_t* y, int64_t T,
                               int64_t dim) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T * dim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dim, j = i % dim;
    float acc = bf16_to_f32(shared[i]);
    for (int64_t k = 0; k < topk; ++k)
      acc += wts[t * topk + k] * bf16_to_f32(down[pos[t * topk + k] * dim + j]);
    y[i] = f32_to_bf16(acc);
  }
}

// One GEMM of the baseline in cuBLAS's column-major terms: C [m, n] = A^T [m, k] x B [k, n],
// i.e. row-major out [n, m] = in [n, k] x W^T with W row-major [m, k] (ld k) and in (ld k).
struct GemmProblem {
  int m, n, k;
  const void* A;
  const void* B;
  void* C;
};

// A list of problems run as one grouped call (each problem its own group of one), or as a
// loop of cublasGemmEx when the grouped call is refused (`grouped` says which ran last).
class GemmList {
 public:
  GemmList() = default;
  GemmList(const GemmList&) = delete;
  GemmList& operator=(const GemmList&) = delete;
  ~GemmList() { free_dev(); }

  void set(const std::vector<GemmProblem>& ps) {
    ps_ = ps;
    const size_t n = ps.size();
    ta_.assign(n, CUBLAS_OP_T);
    tb_.assign(n, CUBLAS_OP_N);
    m_.resize(n), n_.resize(n), k_.resize(n), lda_.resize(n), ldb_.resize(n), ldc_.resize(n);
    one_.assign(n, 1.0f), zero_.assign(n, 0.0f), size_.assign(n, 1);
    std::vector<void*> a(n), b(n), c(n);
    for (size_t i = 0; i < n; ++i) {
      m_[i] = ps[i].m, n_[i] = ps[i].n, k_[i] = ps[i].k;
      lda_[i] = ps[i].k, ldb_[i] = ps[i].k, ldc_[i] = ps[i].m;
      a[i] = const_cast<void*>(ps[i].A), b[i] = const_cast<void*>(ps[i].B), c[i] = ps[i].C;
    }
    free_dev();
    MOECHECK_CUDA_CHECK(cudaMalloc(&dptr_, 3 * n * sizeof(void*) + 8));
    MOECHECK_CUDA_CHECK(cudaMemcpy(dptr_, a.data(), n * sizeof(void*), cudaMemcpyHostToDevice));
    MOECHECK_CUDA_CHECK(cudaMemcpy(dptr_ + n, b.data(), n * sizeof(void*), cudaMemcpyHostToDevice));
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(dptr_ + 2 * n, c.data(), n * sizeof(void*), cudaMemcpyHostToDevice));
  }

  void run(cublasHandle_t h) {
    const int n = static_cast<int>(ps_.size());
    if (n == 0) return;
    if (grouped) {
      const cublasStatus_t st = cublasGemmGroupedBatchedEx(
          h, ta_.data(), tb_.data(), m_.data(), n_.data(), k_.data(), one_.data(), dptr_,
          CUDA_R_16BF, lda_.data(), dptr_ + n, CUDA_R_16BF, ldb_.data(), zero_.data(),
          dptr_ + 2 * n, CUDA_R_16BF, ldc_.data(), n, size_.data(), CUBLAS_COMPUTE_32F);
      if (st == CUBLAS_STATUS_SUCCESS) return;
      std::printf("cublasGemmGroupedBatchedEx refused (status %d): a loop of cublasGemmEx\n",
                  static_cast<int>(st));
      grouped = false;
    }
    const float one = 1.0f, zero = 0.0f;
    for (const GemmProblem& p : ps_)
      BENCH_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, p.m, p.n, p.k, &one, p.A,
                                      CUDA_R_16BF, p.k, p.B, CUDA_R_16BF, p.k, &zero, p.C,
                                      CUDA_R_16BF, p.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  bool grouped = true;

 private:
  void free_dev() {
    if (dptr_ != nullptr) MOECHECK_CUDA_CHECK(cudaFree(dptr_));
    dptr_ = nullptr;
  }
  std::vector<GemmProblem> ps_;
  std::vector<cublasOperation_t> ta_, tb_;
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, size_;
  std::vector<float> one_, zero_;
  void** dptr_ = nullptr;  // device: A pointers, B pointers, C pointers
};

}  // namespace moecheck::bench
