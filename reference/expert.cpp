// model.py Expert (lines 830-851) in the reference: SwiGLU with the training clamps, the routing
// weight applied to the hidden features before w2, in Model mode (model.py's bf16 rounding
// points) and Exact mode (f64, unrounded). Contract: docs/reference.md "Rounding points".
#include <cmath>

#include "core/numfmt.h"
#include "reference/linear.h"
#include "reference/moe.h"

namespace moecheck::ref {
namespace {

// torch.clamp keeps a NaN, so both clamps are written with comparisons a NaN fails.
template <typename T>
T clamp_up(T u, T lim) {  // torch.clamp(up, min=-L, max=L)
  return u > lim ? lim : (u < -lim ? -lim : u);
}
template <typename T>
T clamp_gate(T g, T lim) {  // torch.clamp(gate, max=L)
  return g > lim ? lim : g;
}

}  // namespace

std::vector<float> Expert::forward(const float* x, int64_t n, const float* weights,
                                   ExpertTaps* taps) const {
  const int64_t inter = w1_.rows;
  const int64_t dim = w2_.rows;
  const size_t ni = static_cast<size_t>(n * inter);
  std::vector<float> gate(ni), up(ni), h(ni), out(static_cast<size_t>(n * dim));
  // gate = self.w1(x).float(); up = self.w3(x).float(): Linear on bf16 input returns bf16, so the
  // f32 sums are rounded to bf16 (nearest even) and widened back.
  linear_f32(w1_, x, n, gate.data());
  linear_f32(w3_, x, n, up.data());
  for (size_t i = 0; i < ni; ++i) {
    gate[i] = round_bf16(gate[i]);
    up[i] = round_bf16(up[i]);
  }
  if (taps) {
    taps->gate = gate;
    taps->up = up;
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < inter; ++j) {
      const size_t i = static_cast<size_t>(t * inter + j);
      float g = gate[i];
      float u = up[i];
      if (limit_ > 0.0f) {  // if self.swiglu_limit > 0: clamp up both sides, gate from above
        u = clamp_up(u, limit_);
        g = clamp_gate(g, limit_);
      }
      float v = (g / (1.0f + std::exp(-g))) * u;  // F.silu(gate) * up, f32
      if (weights) v = weights[t] * v;            // x = weights * x, f32
      h[i] = v;
    }
  }
  if (taps) taps->h = h;
  for (float& v : h) v = round_bf16(v);  // x.to(dtype)
  // self.w2(...): bf16 output.
  linear_f32(w2_, h.data(), n, out.data());
  for (float& v : out) v = round_bf16(v);
  if (taps) taps->down = out;
  return out;
}

std::vector<double> Expert::forward_exact(const double* x, int64_t n, const double* weights,
                                          ExpertTaps* taps) const {
  const int64_t inter = w1_.rows;
  const int64_t dim = w2_.rows;
  const size_t ni = static_cast<size_t>(n * inter);
  std::vector<double> gate(ni), up(ni), h(ni), out(static_cast<size_t>(n * dim));
  linear_f64(w1_, x, n, gate.data());  // self.w1(x), unrounded
  linear_f64(w3_, x, n, up.data());    // self.w3(x), unrounded
  if (taps) {
    taps->gate.assign(gate.begin(), gate.end());
    taps->up.assign(up.begin(), up.end());
  }
  const double lim = limit_;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < inter; ++j) {
      const size_t i = static_cast<size_t>(t * inter + j);
      double g = gate[i];
      double u = up[i];
      if (lim > 0.0) {
        u = clamp_up(u, lim);
        g = clamp_gate(g, lim);
      }
      double v = (g / (1.0 + std::exp(-g))) * u;  // silu(gate) * up
      if (weights) v = weights[t] * v;            // weights * x, not rounded to bf16
      h[i] = v;
    }
  }
  if (taps) taps->h.assign(h.begin(), h.end());
  linear_f64(w2_, h.data(), n, out.data());  // self.w2(x), unrounded
  if (taps) taps->down.assign(out.begin(), out.end());
  return out;
}

}  // namespace moecheck::ref
