// Emulation twins of accumulate (weighted expert outputs in ascending expert id, then the
// shared expert) and finish (f32 to bf16, round to nearest even).
// Contract: docs/numerics.md "accumulate, finish".
#include "emulate/accumulate.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck::emu {

void accumulate(const int32_t* ids, const float* weights, const float* down, const float* shared,
                float* acc, int64_t T, int64_t topk, int64_t dim) {
  std::vector<int64_t> order(static_cast<size_t>(topk));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* id = ids + t * topk;
    std::iota(order.begin(), order.end(), int64_t{0});
    // The kernel walks a token's picks in ascending expert id, whatever order routing gave.
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
    for (int64_t k = 1; k < topk; ++k) {
      if (id[order[k]] == id[order[k - 1]]) {
        throw InputError("emu::accumulate: token " + std::to_string(t) + " picks expert " +
                         std::to_string(id[order[k]]) + " twice");
      }
    }
    float* a = acc + t * dim;
    for (int64_t i = 0; i < dim; ++i) a[i] = 0.0f;
    for (int64_t k : order) {
      const float wk = weights[t * topk + k];
      const float* dk = down + (t * topk + k) * dim;
      for (int64_t i = 0; i < dim; ++i) a[i] = fma_rn(wk, dk[i], a[i]);
    }
    const float* s = shared + t * dim;
    for (int64_t i = 0; i < dim; ++i) a[i] = add_rn(a[i], s[i]);
  }
}

void finish(const float* acc, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(acc[i]);
}

}  // namespace moecheck::emu
