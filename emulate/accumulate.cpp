// Emulation twins of accumulate (weighted expert outputs in the plan's ascending expert id, then
// the shared expert) and finish (f32 to bf16, round to nearest even).
// Contract: docs/numerics.md "accumulate, finish".
#include "emulate/accumulate.h"

#include <string>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck::emu {

void accumulate(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim) {
  if (T < 0 || dim <= 0 || topk < 0)
    throw InputError(
        "emu::accumulate: need T >= 0, dim > 0, topk >= 0, found T=" + std::to_string(T) +
        " dim=" + std::to_string(dim) + " topk=" + std::to_string(topk));
  for (int64_t t = 0; t < T; ++t) {
    float* a = acc + t * dim;
    for (int64_t i = 0; i < dim; ++i) a[i] = 0.0f;
    for (int64_t k = 0; k < topk; ++k) {
      const float wk = weights[t * topk + k];
      const float* dk = down + static_cast<int64_t>(rows[t * topk + k]) * dim;
      for (int64_t i = 0; i < dim; ++i) a[i] = fma_rn(wk, dk[i], a[i]);
    }
    if (shared != nullptr)
      for (int64_t i = 0; i < dim; ++i) a[i] = add_rn(a[i], shared[t * dim + i]);
    if (y != nullptr) finish(a, y + t * dim, dim);
  }
}

void finish(const float* acc, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(acc[i]);
}

}  // namespace moecheck::emu
