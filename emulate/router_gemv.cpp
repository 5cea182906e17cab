// Emulation twin of the router GEMV in both variants: the lanes' (or threads') chunk loops in
// the kernel's order, the staged fold of warp 0, and the butterfly over a 32-lane array.
// Contract: docs/numerics.md "router_gemv". bf16 x bf16 (8 x 8 significant bits) and f16 x bf16
// (11 x 8) products are exact in f32 (24), so each fma_rn rounds once, in the addition; the f16
// weights widen exactly (numfmt.h f16_to_f32, the kernel's f16_bits_to_f32).
#include "emulate/router_gemv.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/schedule.h"
#include "emulate/lanes.h"

namespace moecheck::emu {

namespace {

// Rows widened per step: each token's activations are read once per block of rows.
constexpr int64_t kRowBlock = 8;

// The chunk-transposed f32 layout of one row for a schedule of `width` threads (thread i takes
// chunks i, i + width, ...): value j of chunk c = s * width + i sits at [s][j][i], so one step
// of all threads' chains reads contiguous memory. Entries past the last chunk are never read.
void transpose_chunks(const uint16_t* src, bool f16, int64_t chunks, int width, float* dst) {
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c / width, i = c % width;
    for (int j = 0; j < kGemvChunk; ++j) {
      const uint16_t h = src[c * kGemvChunk + j];
      dst[(s * kGemvChunk + j) * width + i] = f16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
}

// Every thread's partial: thread i's chain over its chunks in increasing order, each chunk's 8
// values in increasing k, from +0 (threads without a chunk keep +0). w, x transposed as above.
void partials(const float* w, const float* x, int64_t chunks, int width, float* part) {
  for (int i = 0; i < width; ++i) part[i] = 0.0f;
  for (int64_t s = 0; s * width < chunks; ++s) {
    const int64_t n = std::min<int64_t>(width, chunks - s * width);
    for (int j = 0; j < kGemvChunk; ++j) {
      const int64_t o = (s * kGemvChunk + j) * width;
      detail::fma_step(part, w + o, x + o, n);
    }
  }
}

// Plain: one warp per row, lane l takes chunks l, l + 32, ..., then the butterfly.
float row_plain(const float* w, const float* x, int64_t chunks) {
  float lane[kWarpSize];
  partials(w, x, chunks, kWarpSize, lane);
  return detail::butterfly0(lane);
}

// Staged: 256 threads per row, partials in shared memory, warp 0 lane l folds
// part[l], part[l + 32], ..., part[l + 224] in that order, then the butterfly.
float row_staged(const float* w, const float* x, int64_t chunks) {
  float part[kRouterStagedThreads];
  partials(w, x, chunks, kRouterStagedThreads, part);
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    float v = part[l];
    for (int wp = 1; wp < kRouterStagedWarps; ++wp) v = add_rn(v, part[l + kWarpSize * wp]);
    lane[l] = v;
  }
  return detail::butterfly0(lane);
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
  const int width = v == RouterVariant::kPlain ? kWarpSize : kRouterStagedThreads;
  // Every weight and activation widened to f32 once, exactly, in the transposed layout.
  const int64_t tk = (chunks + width - 1) / width * width * kGemvChunk;
  std::vector<float> xf(static_cast<size_t>(T * tk)), wf(static_cast<size_t>(kRowBlock * tk));
  for (int64_t t = 0; t < T; ++t) transpose_chunks(x + t * K, false, chunks, width, &xf[t * tk]);
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t nr = std::min(kRowBlock, rows - r0);
    for (int64_t r = 0; r < nr; ++r)
      transpose_chunks(w + (r0 + r) * K, f16, chunks, width, &wf[r * tk]);
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = xf.data() + t * tk;
      for (int64_t r = 0; r < nr; ++r)
        y[t * rows + r0 + r] = v == RouterVariant::kPlain ? row_plain(&wf[r * tk], xt, chunks)
                                                          : row_staged(&wf[r * tk], xt, chunks);
    }
  }
}

}  // namespace moecheck::emu
