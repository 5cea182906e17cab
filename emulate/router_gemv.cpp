// Emulation twin of the router GEMV in both variants: the lanes' (or threads') chunk loops in
// the kernel's order, the staged fold of warp 0, and the butterfly over a 32-lane array.
// Contract: docs/numerics.md "router_gemv". bf16 x bf16 products are exact in f32, so each
// fma_rn rounds once, in the addition.
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
// 8 values in increasing k, starting from +0.
float thread_partial(const uint16_t* w, const float* x, int64_t chunks, int64_t first,
                     int64_t stride) {
  float acc = 0.0f;
  for (int64_t c = first; c < chunks; c += stride) {
    const uint16_t* wc = w + c * kGemvChunk;
    const float* xc = x + c * kGemvChunk;
    for (int j = 0; j < kGemvChunk; ++j) acc = fma_rn(bf16_to_f32(wc[j]), xc[j], acc);
  }
  return acc;
}

// Plain: one warp per row, lane l takes chunks l, l + 32, ...
float row_plain(const uint16_t* w, const float* x, int64_t chunks) {
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) lane[l] = thread_partial(w, x, chunks, l, kWarpSize);
  return butterfly(lane);
}

// Staged: 256 threads per row, partials in shared memory, warp 0 lane l folds
// part[l], part[l + 32], ..., part[l + 224] in that order, then the butterfly.
float row_staged(const uint16_t* w, const float* x, int64_t chunks) {
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
                 int64_t K, int64_t T) {
  if (K % kGemvChunk != 0 || rows < 0 || T < 0) {
    throw InputError("emu::router_gemv: K = " + std::to_string(K) +
                     " must be a multiple of 8 (rows " + std::to_string(rows) + ", tokens " +
                     std::to_string(T) + ")");
  }
  const int64_t chunks = K / kGemvChunk;
  std::vector<float> xf(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) xf[k] = bf16_to_f32(x[t * K + k]);  // exact widening
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* wr = w + r * K;
      y[t * rows + r] = v == RouterVariant::kPlain ? row_plain(wr, xf.data(), chunks)
                                                   : row_staged(wr, xf.data(), chunks);
    }
  }
}

}  // namespace moecheck::emu
