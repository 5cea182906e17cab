// The plain bf16 GEMV schedule shared by router_gemv (RouterVariant::kPlain) and bf16_gemv:
// one warp per output row; lane l takes the 8-value chunks c = l, l + 32, ... in increasing
// order and per token runs acc = fma_rn(w, x, acc) over the chunk's 8 values; then the
// butterfly. Contract: docs/numerics.md "router_gemv" (plain) and "bf16_gemv".
// The kernel lives in cuda/bf16_gemv.cu; this header is its launch interface.
#pragma once

#include <cstdint>

#include "core/schedule.h"

namespace moecheck::cuda::detail {

inline constexpr int kGemvPlainWarps = 4;  // rows per block; no bit depends on it
inline constexpr int kGemvUnroll = 4;      // chunks loaded before the first use

struct GemvArgs {
  const uint16_t* w[2];  // blockIdx.z selects the matrix (bf16_gemv_pair)
  float* y[2];
  const uint16_t* x;  // [T, K]
  int64_t rows;
  int64_t K;
  int64_t T;
};

// Launches gemv_plain_kernel over n_mat matrices (1 or 2) after the shape checks of `op`; f16_w:
// the weights are f16 (an F16 router), widened exactly (device_util.cuh bf16_chunk_fma).
void launch_gemv_plain(const GemvArgs& a, int n_mat, const char* op, void* stream, bool f16_w);

// The one-token bf16 GEMV with bulk-copied row stages (cuda/gemv_stream.cu), after the checks of
// launch_gemv_plain; false (nothing launched) when it does not apply: T != 1, K above the
// default shape's 6016 (or too large for two stages per warp of a shape set by
// cuda::set_bf16_gemv_stream_shape), or cuda::set_bf16_gemv_stream(false).
bool launch_gemv_stream(const GemvArgs& a, int n_mat, void* stream);

}  // namespace moecheck::cuda::detail
