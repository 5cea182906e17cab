// swiglu_q8: h = swiglu(g, u, limit) (the shared scalar of core/portable_math.h, with the
// project-owned pexp) and, fused, the q8_1 blocks of h (one warp per 32-value block,
// cuda/q8_1_block.cuh). swiglu_bf16 is the bf16 shared expert's form: h rounded to bf16 for
// the bf16 down projection. Contract: docs/numerics.md "swiglu_q8"; twin: emu::swiglu_q8.
#include <string>

#include "core/error.h"
#include "core/portable_math.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_1_block.cuh"

namespace moecheck::cuda {
namespace {

constexpr int kSwigluWarps = 8;  // q8_1 blocks per CUDA block; no bit depends on it

__global__ void __launch_bounds__(kSwigluWarps* kWarpSize)
    swiglu_q8_kernel(const float* g, const float* u, float* h, BlockQ8_1* hq, int64_t n_blocks,
                     float limit) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kSwigluWarps + threadIdx.x / kWarpSize;
  pdl::wait();  // g and u (cuda/pdl.cuh)
  pdl::launch_dependents();
  if (blk >= n_blocks) return;  // whole warps leave together
  const int64_t i = blk * kQK8_1 + lane;
  const float v = swiglu(__ldg(g + i), __ldg(u + i), limit);
  h[i] = v;
  if (hq != nullptr) detail::quantize_block_warp(v, lane, hq + blk);
}

__global__ void swiglu_bf16_kernel(const float* g, const float* u, float* h, uint16_t* hb,
                                   int64_t n, float limit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  pdl::wait();  // g and u (cuda/pdl.cuh)
  pdl::launch_dependents();
  if (i >= n) return;
  const float v = swiglu(__ldg(g + i), __ldg(u + i), limit);
  if (h != nullptr) h[i] = v;
  hb[i] = f32_to_bf16(v);
}

void check_shape(int64_t R, int64_t inter, const char* op) {
  if (R < 0 || inter <= 0 || inter % kQK8_1 != 0)
    throw InputError(std::string("cuda::") + op +
                     ": need R >= 0 and inter a positive multiple of 32, found R=" +
                     std::to_string(R) + " inter=" + std::to_string(inter));
}

}  // namespace

void swiglu_q8(const float* g, const float* u, float* h, BlockQ8_1* hq, int64_t R, int64_t inter,
               float limit, void* stream) {
  check_shape(R, inter, "swiglu_q8");
  const int64_t n_blocks = R * (inter / kQK8_1);
  if (n_blocks == 0) return;
  require_aligned(g, 4, "swiglu_q8", "g");
  require_aligned(u, 4, "swiglu_q8", "u");
  require_aligned(h, 4, "swiglu_q8", "h");
  if (hq != nullptr) require_aligned(hq, 4, "swiglu_q8", "hq");
  const int64_t grid = (n_blocks + kSwigluWarps - 1) / kSwigluWarps;
  pdl::launch(swiglu_q8_kernel, dim3(static_cast<unsigned>(grid)), dim3(kSwigluWarps * kWarpSize),
              0, as_stream(stream), g, u, h, hq, n_blocks, limit);
}

void swiglu_bf16(const float* g, const float* u, float* h, uint16_t* hb, int64_t R, int64_t inter,
                 float limit, void* stream) {
  check_shape(R, inter, "swiglu_bf16");
  const int64_t n = R * inter;
  if (n == 0) return;
  require_aligned(g, 4, "swiglu_bf16", "g");
  require_aligned(u, 4, "swiglu_bf16", "u");
  require_aligned(hb, 2, "swiglu_bf16", "hb");
  if (h != nullptr) require_aligned(h, 4, "swiglu_bf16", "h");
  constexpr int kThreads = 256;
  pdl::launch(swiglu_bf16_kernel, dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)),
              dim3(kThreads), 0, as_stream(stream), g, u, h, hb, n, limit);
}

}  // namespace moecheck::cuda
