// Trace recording and the residual stream of `run` (tools/trace_record.h).
#include "tools/trace_record.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "emulate/router_gemv.h"

namespace moecheck::cli {

std::vector<int32_t> predicted_picks(RouterVariant v, const LayerWeights& w,
                                     const std::vector<uint16_t>& prev_x, int64_t T,
                                     const std::vector<uint8_t>& mask) {
  const MoeConfig& c = w.config;
  std::vector<float> logits(static_cast<size_t>(T * c.n_routed));
  emu::router_gemv(v, w.router, prev_x.data(), logits.data(), c.n_routed, c.dim, T, w.router_type);
  const RouteBias bias{w.bias, w.bias_vl, mask.empty() ? nullptr : mask.data()};
  return route_from_logits(logits.data(), T, bias, c, w.layer).ids;
}

int64_t routed_expert_bytes(const LayerWeights& w) {
  return w.gate_exps.expert_stride() + w.up_exps.expert_stride() + w.down_exps.expert_stride();
}

std::vector<uint16_t> residual_input(const std::vector<uint16_t>& x, const std::vector<uint16_t>& y,
                                     int64_t dim, int layer) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = bf16_to_f32(x[i]) + bf16_to_f32(y[i]);
    out[i] = f32_to_bf16(s);
    if (!std::isfinite(bf16_to_f32(out[i])))
      throw InputError("--residual: layer " + std::to_string(layer) + " token " +
                       std::to_string(static_cast<int64_t>(i) / dim) + " column " +
                       std::to_string(static_cast<int64_t>(i) % dim) +
                       ": input + output is not a finite bf16 (" + std::to_string(s) + ")");
  }
  return out;
}

}  // namespace moecheck::cli
