// The shared expert's bf16 projections as a GEMM for more than kMaxGroupRows tokens: the same
// bits as the plain GEMV schedule (docs/numerics.md "bf16_gemv"), with each weight slab read
// once per block of tokens instead of once per group of 8. The kernel lives in
// cuda/bf16_gemm.cu (its header comment holds the design and the proof that its reduction is
// the butterfly); cuda/bf16_gemv.cu dispatches to it. Internal to cuda/.
#pragma once

#include "cuda/gemv_plain.cuh"

namespace moecheck::cuda::detail {

// The tile of one warp: kGemmWarpRows rows x kGemmWarpTokens tokens (64 outputs, two rounds of
// 32 in the final reduce-scatter). A block is kGemmWarpsR x kGemmWarpsT warps, so it covers
// kGemmBlockRows x kGemmBlockTokens outputs. No bit depends on any of these.
inline constexpr int kGemmWarpRows = 8;
inline constexpr int kGemmWarpTokens = 8;
inline constexpr int kGemmWarpsR = 6;
inline constexpr int kGemmWarpsT = 2;
inline constexpr int kGemmBlockRows = kGemmWarpRows * kGemmWarpsR;      // 48
inline constexpr int kGemmBlockTokens = kGemmWarpTokens * kGemmWarpsT;  // 16
inline constexpr int kGemmThreads = kGemmWarpsR * kGemmWarpsT * 32;     // 384
inline constexpr int kGemmStages = 4;  // K slabs in flight (the ring of tile copies)

// True when bf16_gemv / bf16_gemv_pair take the GEMM for T tokens (the GEMV otherwise).
inline constexpr bool use_bf16_gemm(int64_t T) { return T > kMaxGroupRows; }

// Launches the GEMM over n_mat matrices (1 or 2: blockIdx.z selects w / y); the caller has
// checked the shapes and alignment (launch_gemv_plain's checks) and that rows, T > 0.
void launch_bf16_gemm(const GemvArgs& a, int n_mat, const char* op, void* stream);

}  // namespace moecheck::cuda::detail
