// The streamed one-token bf16 GEMV's block layout (cuda/gemv_stream.cu), in a header so that the
// host tests can size what the GEMV takes of a multiprocessor beside other launches
// (tests/gpu/mmvq_sb_host_test.cu).
#pragma once

#include <cstdint>

namespace moecheck::cuda::gemv_stream {

constexpr int kMaxStages = 8;
constexpr int kSmemMax = 227 * 1024;  // the most one block may have on sm_90
// The default shape: 4 warps with 2 row stages each (measured best inside the one-token layer,
// docs/performance.md), for K up to kDefaultMaxK (the register-staged and general kernels keep K
// above it).
constexpr int kDefaultWarps = 4, kDefaultStages = 2;
constexpr int64_t kDefaultMaxK = 6016;

// The block's shared memory: the warps' rings (warp w's stages at w * S * row_bytes), x, then
// the stage barriers.
struct StreamLayout {
  int stages, row_bytes, x_off, bar_off, bytes;
};

// W warps per block with S row stages each, or as many stages as `budget` allows (S = 0, at
// most kMaxStages).
__host__ __device__ inline StreamLayout stream_layout(int64_t K, int warps, int budget,
                                                      int stages = 0) {
  StreamLayout L{};
  L.row_bytes = static_cast<int>(2 * K);
  const int s = (budget - L.row_bytes) / (warps * L.row_bytes);
  L.stages = stages != 0 ? stages : s > kMaxStages ? kMaxStages : s;
  L.x_off = warps * L.stages * L.row_bytes;
  L.bar_off = L.x_off + L.row_bytes;  // row_bytes is a multiple of 16
  L.bytes = L.bar_off + warps * L.stages * 8;
  return L;
}

}  // namespace moecheck::cuda::gemv_stream
