// quantize_q8_1: f32 (or bf16) activation rows [R, K] to q8_1 blocks [R, K / 32], one warp per
// block (cuda/q8_1_block.cuh). Contract: docs/numerics.md "quantize_q8_1"; twin:
// emu::quantize_q8_1 (emulate/quantize_q8_1.h). The bf16 form widens exactly first, so it
// equals the f32 form on the widened values.
#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/q8_1_block.cuh"

namespace moecheck::cuda {
namespace {

constexpr int kQuantWarps = 8;  // blocks per CUDA block; no bit depends on it

__device__ __forceinline__ float load_value(const float* x, int64_t i) { return __ldg(x + i); }
__device__ __forceinline__ float load_value(const uint16_t* x, int64_t i) {
  return bf16_to_f32(__ldg(x + i));
}

template <typename In>
__global__ void __launch_bounds__(kQuantWarps* kWarpSize)
    quantize_q8_1_kernel(const In* x, BlockQ8_1* y, int64_t n_blocks) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / kWarpSize;
  if (blk >= n_blocks) return;  // whole warps leave together
  detail::quantize_block_warp(load_value(x, blk * kQK8_1 + lane), lane, y + blk);
}

template <typename In>
void launch(const In* x, BlockQ8_1* y, int64_t R, int64_t K, void* stream, const char* op) {
  if (R < 0 || K <= 0 || K % kQK8_1 != 0)
    throw InputError(std::string("cuda::") + op +
                     ": need R >= 0 and K a positive multiple of 32, found R=" + std::to_string(R) +
                     " K=" + std::to_string(K));
  const int64_t n_blocks = R * (K / kQK8_1);
  if (n_blocks == 0) return;
  require_aligned(x, static_cast<int>(sizeof(In)), op, "x");
  require_aligned(y, 4, op, "y");
  const int64_t grid = (n_blocks + kQuantWarps - 1) / kQuantWarps;
  if (grid > 0x7FFFFFFF) throw InputError(std::string("cuda::") + op + ": too many blocks");
  quantize_q8_1_kernel<In>
      <<<static_cast<unsigned>(grid), kQuantWarps * kWarpSize, 0, as_stream(stream)>>>(x, y,
                                                                                       n_blocks);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t R, int64_t K, void* stream) {
  launch(x, y, R, K, stream, "quantize_q8_1");
}

void quantize_q8_1_bf16(const uint16_t* x, BlockQ8_1* y, int64_t R, int64_t K, void* stream) {
  launch(x, y, R, K, stream, "quantize_q8_1_bf16");
}

}  // namespace moecheck::cuda
