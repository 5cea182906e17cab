// What `run --trace` records and `run --residual` feeds forward (docs/cli.md "run",
// docs/streaming.md "Traces"): a layer's predicted picks from the previous run layer's input, the
// bytes of one routed expert, and the residual stream's next input.
#pragma once

#include <cstdint>
#include <vector>

#include "core/layer_weights.h"
#include "core/schedule.h"

namespace moecheck::cli {

// The picks layer w's router and bias (bias_vl for the tokens `mask` sets; mask empty: none)
// make on `prev_x` [T, dim] bf16, the input of the layer run before it: emu::router_gemv (the
// emulation's router, the CUDA router's bits) with variant v, then route_from_logits. [T, topk]
// in descending key order. A prefetch hint only: the layer's real input differs.
std::vector<int32_t> predicted_picks(RouterVariant v, const LayerWeights& w,
                                     const std::vector<uint16_t>& prev_x, int64_t T,
                                     const std::vector<uint8_t>& mask);

// Bytes of one routed expert of w: gate, up and down (llama.cpp's per-expert strides).
int64_t routed_expert_bytes(const LayerWeights& w);

// The residual stream: bf16(f32(x) + f32(y)) per element (the f32 sum of the two bf16 values,
// rounded to bf16 nearest-even, core/numfmt.h). InputError naming `layer`, the token and the
// column where the sum is not finite.
std::vector<uint16_t> residual_input(const std::vector<uint16_t>& x, const std::vector<uint16_t>& y,
                                     int64_t dim, int layer);

}  // namespace moecheck::cli
