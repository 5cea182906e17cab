// The host plan of one layer forward: which (expert, token) pairs the routed experts compute and
// in what order, the MMVQ launch groups that compute them through a slot table, and how the
// accumulation reads them back in ascending expert id. Pure C++ with no GPU: both drivers
// (emu::MoeLayer and cuda::MoeLayer) build their plan with build_layer_plan and fold their taps
// with fold_routed_taps, so their stages agree by construction. Contract: docs/numerics.md
// "mmvq_q2k, mmvq_q3k" (groups) and "accumulate, finish" (order); docs/emulation.md.
#pragma once

#include <cstdint>
#include <vector>

#include "core/blocks.h"
#include "core/routing.h"
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck {

// One MMVQ launch group: the weight matrix slots[slot] ([rows, K]) against n <= kMaxGroupRows
// activation rows a[a_row[i]], written to y[y_row[i] * rows + r]. The layout is the kernels'.
struct MmvqGroup {
  int32_t slot = 0;
  int32_t n = 0;
  int32_t a_row[kMaxGroupRows] = {};
  int32_t y_row[kMaxGroupRows] = {};
};

// Routed pairs (expert, token) are numbered p = 0..P-1 (P = T * topk) in ascending expert id,
// then ascending token. The slot table the groups index holds, for the U distinct experts in
// ascending id: gate slots 0..U-1, up slots U..2U-1, down slots 2U..3U-1. The gate groups write
// pair rows p of a [2P, inter] buffer, the up groups rows P + p of the same buffer, the down
// groups rows p of [P, dim], reading the SwiGLU's q8_1 row p.
struct LayerPlan {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int32_t> experts;     // [U] distinct picked experts, ascending
  std::vector<int64_t> first_pair;  // [U] first pair row of expert u
  std::vector<int32_t> pair_token;  // [P] token of pair row p
  std::vector<float> pair_weight;   // [P] routing weight of pair row p
  std::vector<MmvqGroup> groups;    // the gate groups, then the up groups, then the down groups
  int64_t n_proj_groups = 0;        // groups per projection (gate = up = down)
  int64_t n_mmvq_groups = 0;        // of which the first n_mmvq_groups run through MMVQ, the
                                    // rest (experts with more than mmvq_max_rows pairs) MMQ
  int max_group_rows = 1;           // the largest MMVQ group's n: sizes the MMVQ shared memory
  std::vector<int32_t> acc_rows;    // [T, topk] token t's pair rows in ascending expert id
  std::vector<float> acc_weights;   // [T, topk] their routing weights

  int64_t pairs() const { return tokens * topk; }
  int64_t n_experts() const { return static_cast<int64_t>(experts.size()); }
  const MmvqGroup* gate_groups() const { return groups.data(); }
  const MmvqGroup* up_groups() const { return groups.data() + n_proj_groups; }
  const MmvqGroup* down_groups() const { return groups.data() + 2 * n_proj_groups; }
};

// The plan of a routing (`r.ids` [T, topk], picks in any order). Throws InputError naming the
// token when an id is outside [0, n_routed) or a token picks an expert twice. Each projection's
// groups hold first the MMVQ groups (the experts with at most mmvq_max_rows pairs: one group
// each, ascending expert id), then the MMQ groups (the other experts, groups of 8 consecutive
// pair rows, the last ragged): first the experts with an even number of groups, then those with
// an odd number, each in ascending id. MMQ pairs the groups at positions 2 j, 2 j + 1 of its
// range that share a slot; in this order every expert's groups pair but the last of an odd
// number. No bit depends on the split or the order (numerics.md "mmvq", "Layer plan").
LayerPlan build_layer_plan(const Routing& r, int64_t n_routed, int mmvq_max_rows = kMaxGroupRows);

// The slot table of a plan: 3U matrix base pointers (gate, up, down of each used expert), expert
// e of a stack at base + e * stride (llama.cpp's stacked layout; the bases may be host views or
// device copies).
std::vector<const uint8_t*> plan_slots(const LayerPlan& p, const uint8_t* gate, int64_t gate_stride,
                                       const uint8_t* up, int64_t up_stride, const uint8_t* down,
                                       int64_t down_stride);

// The routed experts' taps from the pair-row buffers: gu [2P, inter] (gate rows, then up
// rows), h [P, inter], hq [P, inter / 32], down [P, dim]; one ExpertTaps per used expert in
// ascending id, its tokens ascending, weights = the pairs' routing weights.
void fold_routed_taps(const LayerPlan& p, const float* gu, const float* h, const BlockQ8_1* hq,
                      const float* down, int64_t inter, int64_t dim, std::vector<ExpertTaps>& out);

}  // namespace moecheck
