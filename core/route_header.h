// The device route's data, as the seeds lay it out (moe_v41: `route_hdr`, `slot_table`): a slot
// table of kSlotTableLayers layers x n_routed i32 (the device slot holding expert e of layer L,
// -1 = not resident), and per layer a route header of i32 words (status, error locations, the
// picks, their weight bits and their plan slots), written by route_select (cuda/route_select.cu)
// and its emulation twin (emu::route_select), read by the plan builder on the device and by the
// host after the forward. Also the device plan's buffer layout (route_plan), fixed by the token
// count alone so every launch can be enqueued before routing has run. Contract: docs/numerics.md
// "route_select".
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/layer_plan.h"
#include "core/numfmt.h"

namespace moecheck {

// Layers the slot table and the route headers cover (the seeds' SLOT_TABLE_LAYERS); the device
// route refuses a layer at or past it.
inline constexpr int kSlotTableLayers = 64;

// Status bits of a route header.
inline constexpr int32_t kRouteMiss = 1;  // a picked expert's slot is -1 (not resident)
inline constexpr int32_t kRouteNaN = 2;   // a routing key is NaN (the host route's InputError)
// "no error" in a location word pair.
inline constexpr uint64_t kRouteNoError = ~uint64_t{0};

// Word offsets of one layer's header for T tokens and topk picks each:
//   [0] status (kRouteMiss | kRouteNaN), [1] T,
//   [2, 3] the NaN location, [4, 5] the miss location: u64 (token << 32 | expert), the lowest
//          such pair (token first); kRouteNoError when none,
//   [6, 6 + P) picks, then P weight bits (f32), then P plan slots (the slot table's value of each
//   pick), P = T * topk in token-major, pick order (descending key); a NaN token's picks and
//   slots are -1 and its weight bits 0; a padding word (when P is odd) is 0.
struct RouteHeaderLayout {
  int64_t tokens = 0, topk = 0;
  static constexpr int64_t kStatus = 0, kTokens = 1, kNaNLoc = 2, kMissLoc = 4, kPicks = 6;
  MOECHECK_HD int64_t pairs() const { return tokens * topk; }
  MOECHECK_HD int64_t weights() const { return kPicks + pairs(); }
  MOECHECK_HD int64_t slots() const { return kPicks + 2 * pairs(); }
  // Words per header, even so that every layer's header keeps the u64 words 8-byte aligned.
  MOECHECK_HD int64_t words() const { return (kPicks + 3 * pairs() + 1) / 2 * 2; }
};

// The device plan's buffer for T tokens (P = T * topk pairs; the groups per projection are at
// most P): byte offsets of the slot pointers (3P), the MMVQ groups (gate [0, G), up [G, 2G): one
// contiguous launch; down at [2P, 2P + G)), the accumulation rows and weights ([T, topk] each)
// and four i32 counts {2G, G, U, Gs} (Gs: the MMVQ groups, which come first in each
// projection; the MMQ groups follow), then route_plan's scratch (each
// pick's pair row, P i32). Equal to build_layer_plan's content where both are defined
// (tests/gpu/route_select_test.cu).
struct DevicePlanLayout {
  int64_t pairs = 0;
  size_t slots = 0, groups = 0, down_groups = 0, rows = 0, weights = 0, counts = 0, scratch = 0,
         bytes = 0;
  MOECHECK_HD DevicePlanLayout(int64_t tokens, int64_t topk) : pairs(tokens * topk) {
    const size_t P = static_cast<size_t>(pairs);
    groups = align(3 * P * sizeof(void*));
    down_groups = groups + 2 * P * sizeof(MmvqGroup);
    rows = align(groups + 3 * P * sizeof(MmvqGroup));
    weights = align(rows + P * 4);
    counts = align(weights + P * 4);
    scratch = counts + 4 * sizeof(int32_t);
    bytes = scratch + P * 4;
  }
  MOECHECK_HD static size_t align(size_t n) { return (n + 15) / 16 * 16; }
};

}  // namespace moecheck
