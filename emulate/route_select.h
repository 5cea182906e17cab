// Emulation twin of the device route (cuda/route_select.cu): route_select writes one layer's
// route header (core/route_header.h) from the router logits, the per-token bias and the layer's
// row of the slot table, as the kernel does; the device plan it feeds is build_layer_plan's
// (core/layer_plan.h). Contract: docs/numerics.md "route_select".
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/routing.h"

namespace moecheck::emu {

// logits [T, n_routed] f32; slots [n_routed] (this layer's slot table row, -1 = not resident);
// hdr: RouteHeaderLayout{T, topk}.words() i32. Per token the rule of route_token: picks, weight
// bits and each pick's slot; a token whose key is NaN gets picks -1, weight bits 0 and slots -1,
// sets kRouteNaN and competes for the NaN location (lowest token, then its route_token expert); a
// pick whose slot is -1 sets kRouteMiss and competes for the miss location (lowest token, then
// lowest expert id). Never throws on the data (the host reads the status after the forward).
void route_select(const float* logits, int64_t T, const RouteBias& bias, const MoeConfig& c,
                  const int32_t* slots, int32_t* hdr);

}  // namespace moecheck::emu
