// Emulation twin of the router GEMV in both variants: the lanes' (or threads') chunk loops in
// the kernel's order, the staged fold of warp 0, and the butterfly over a 32-lane array.
// Contract: docs/numerics.md "router_gemv". bf16 x bf16 (8 x 8 significant bits) and f16 x bf16
// (11 x 8) products are exact in f32 (24), so each fma_rn rounds once, in the addition; the f16
// weights widen exactly (numfmt.h f16_to_f32, the kernel's f16_bits_to_f32).
#include "emulate/router_gemv.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/schedule.h"

namespace moecheck::emu {

namespace {

// One thread's partial: chunks c = first, first + stride, ... in increasing order, each chunk's
// 8 values in increasing k, starting from +0. w is the row already widened to f32.
float thread_partial(const float* w, const float* x, int64_t chunks, int64_t first,
                     int64_t stride) {
  float acc = 0.0f;
  for (int64_t c = first; c < chunks; c += stride) {
    const float* wc = w + c * kGemvChunk;
    const float* xc = x + c * kGemvChunk;
    for (int j = 0; j < kGemvChunk; ++j) acc = fma_rn(wc[j], xc[j], acc);
  }
  return acc;
}

// Plain: one warp per row, lane l takes chunks l, l + 32, ...
float row_plain(const float* w, const float* x, int64_t chunks) {
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) lane[l] = thread_partial(w, x, chunks, l, kWarpSize);
  return butterfly(lane);
}

// Staged: 256 threads per row, partials in shared memory, warp 0 lane l folds
// part[l], part[l + 32], ..., part[l + 224] in that order, then the butterfly.
float row_staged(const float* w, const float* x, int64_t chunks) {
  float part[kRouterStagedThreads];
  for (int t = 0; t < kRouterStagedThreads; ++t) {
    part[t] = thread_partial(w, x, chunks, t, kRouterStagedThreads);
  }
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    float v = part[l];
    for (int wp = 1; wp < kRouterStagedWarps; ++wp) v = add_rn(v, part[l + kWarpSize * wp]);
    lane[l] = v;
  }
  return butterfly(lane);
}

}  // namespace

void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T, GgmlType w_type) {
  if (K % kGemvChunk != 0 || rows < 0 || T < 0) {
    throw InputError("emu::router_gemv: K = " + std::to_string(K) +
                     " must be a multiple of 8 (rows " + std::to_string(rows) + ", tokens " +
                     std::to_string(T) + ")");
  }
  if (w_type != GgmlType::kBF16 && w_type != GgmlType::kF16)
    throw InputError("emu::router_gemv: weight type " +
                     std::to_string(static_cast<uint32_t>(w_type)) + " is neither BF16 nor F16");
  const bool f16 = w_type == GgmlType::kF16;
  const int64_t chunks = K / kGemvChunk;
  // Every weight and activation widened to f32 once, exactly.
  std::vector<float> xf(static_cast<size_t>(T * K)), wf(static_cast<size_t>(K));
  for (int64_t i = 0; i < T * K; ++i) xf[i] = bf16_to_f32(x[i]);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* wr = w + r * K;
    for (int64_t k = 0; k < K; ++k) wf[k] = f16 ? f16_to_f32(wr[k]) : bf16_to_f32(wr[k]);
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = xf.data() + t * K;
      y[t * rows + r] = v == RouterVariant::kPlain ? row_plain(wf.data(), xt, chunks)
                                                   : row_staged(wf.data(), xt, chunks);
    }
  }
}

}  // namespace moecheck::emu
