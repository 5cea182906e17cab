// build_layer_plan, plan_slots and fold_routed_taps (core/layer_plan.h): the one host plan both
// drivers compute from. CPU tests: tests/layer_plan_test.cpp.
#include "core/layer_plan.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace moecheck {
namespace {

// Pair rows of every used expert: tokens ascending (picks are walked in token order).
void number_pairs(const Routing& r, int64_t n_routed, LayerPlan& p,
                  std::vector<std::vector<int32_t>>& tok_of) {
  const int64_t K = r.topk;
  tok_of.assign(static_cast<size_t>(n_routed), {});
  for (int64_t i = 0; i < r.tokens * K; ++i) {
    const int32_t e = r.ids[static_cast<size_t>(i)];
    const int64_t t = i / K;
    if (e < 0 || e >= n_routed)
      throw InputError("layer plan: token " + std::to_string(t) + " picks expert " +
                       std::to_string(e) + ", outside [0, " + std::to_string(n_routed) + ")");
    std::vector<int32_t>& toks = tok_of[static_cast<size_t>(e)];
    if (!toks.empty() && toks.back() == t)
      throw InputError("layer plan: token " + std::to_string(t) + " picks expert " +
                       std::to_string(e) + " twice");
    toks.push_back(static_cast<int32_t>(t));
  }
  int64_t next = 0;
  for (int64_t e = 0; e < n_routed; ++e) {
    const std::vector<int32_t>& toks = tok_of[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    p.experts.push_back(static_cast<int32_t>(e));
    p.first_pair.push_back(next);
    p.pair_token.insert(p.pair_token.end(), toks.begin(), toks.end());
    next += static_cast<int64_t>(toks.size());
  }
}

// The part of the groups list an expert with cnt pairs goes to: 0 its one MMVQ group
// (cnt <= mmvq_max_rows), 1 its MMQ groups when they are an even number, 2 when odd.
int group_part(int64_t cnt, int mmvq_max_rows) {
  if (cnt <= mmvq_max_rows) return 0;
  return ((cnt + kMaxGroupRows - 1) / kMaxGroupRows) % 2 == 0 ? 1 : 2;
}

// Groups of at most kMaxGroupRows consecutive pair rows of one expert, per projection: first
// the MMVQ groups (experts with at most mmvq_max_rows pairs, one group each), then the MMQ groups
// of the experts with an even number of them, then those of the experts with an odd number, each
// part in ascending expert id. So every even run starts at an even position of the MMQ range
// and pairs whole (positions 2 j, 2 j + 1: MMQ's pair items), and each odd run leaves one group
// unpaired, the least any order can (core/layer_plan.h).
void make_groups(LayerPlan& p, int mmvq_max_rows) {
  const int64_t U = p.n_experts(), P = p.pairs();
  std::vector<MmvqGroup> gate, up, down;
  for (int pass = 0; pass < 3; ++pass) {
    for (int64_t u = 0; u < U; ++u) {
      const int64_t first = p.first_pair[static_cast<size_t>(u)];
      const int64_t end = u + 1 < U ? p.first_pair[static_cast<size_t>(u + 1)] : P;
      if (group_part(end - first, mmvq_max_rows) != pass) continue;
      for (int64_t s0 = first; s0 < end; s0 += kMaxGroupRows) {
        MmvqGroup g, q, d;
        g.slot = static_cast<int32_t>(u);
        q.slot = static_cast<int32_t>(U + u);
        d.slot = static_cast<int32_t>(2 * U + u);
        g.n = q.n = d.n = static_cast<int32_t>(std::min<int64_t>(kMaxGroupRows, end - s0));
        for (int32_t i = 0; i < g.n; ++i) {
          const int32_t pp = static_cast<int32_t>(s0 + i);
          g.a_row[i] = q.a_row[i] = p.pair_token[static_cast<size_t>(pp)];
          g.y_row[i] = pp;
          q.y_row[i] = static_cast<int32_t>(P) + pp;
          d.a_row[i] = d.y_row[i] = pp;
        }
        if (pass == 0) p.max_group_rows = std::max(p.max_group_rows, static_cast<int>(g.n));
        gate.push_back(g);
        up.push_back(q);
        down.push_back(d);
      }
    }
    if (pass == 0) p.n_mmvq_groups = static_cast<int64_t>(gate.size());
  }
  p.n_proj_groups = static_cast<int64_t>(gate.size());
  p.groups = std::move(gate);
  p.groups.insert(p.groups.end(), up.begin(), up.end());
  p.groups.insert(p.groups.end(), down.begin(), down.end());
}

// Each pair's routing weight, and each token's pair rows and weights in ascending expert id.
void make_accumulation(const Routing& r, const std::vector<std::vector<int32_t>>& tok_of,
                       LayerPlan& p) {
  const int64_t T = r.tokens, K = r.topk;
  p.pair_weight.assign(static_cast<size_t>(p.pairs()), 0.0f);
  p.acc_rows.assign(static_cast<size_t>(T * K), 0);
  p.acc_weights.assign(static_cast<size_t>(T * K), 0.0f);
  std::vector<int64_t> pos(static_cast<size_t>(T), 0);  // next acc slot of each token
  for (int64_t u = 0; u < p.n_experts(); ++u) {         // ascending expert id
    const int32_t e = p.experts[static_cast<size_t>(u)];
    const std::vector<int32_t>& toks = tok_of[static_cast<size_t>(e)];
    for (size_t j = 0; j < toks.size(); ++j) {
      const int32_t t = toks[j];
      int64_t k = 0;
      while (r.ids[static_cast<size_t>(t * K + k)] != e) ++k;
      const float w = r.weights[static_cast<size_t>(t * K + k)];
      const int64_t pair = p.first_pair[static_cast<size_t>(u)] + static_cast<int64_t>(j);
      p.pair_weight[static_cast<size_t>(pair)] = w;
      const int64_t slot = t * K + pos[static_cast<size_t>(t)]++;
      p.acc_rows[static_cast<size_t>(slot)] = static_cast<int32_t>(pair);
      p.acc_weights[static_cast<size_t>(slot)] = w;
    }
  }
}

}  // namespace

LayerPlan build_layer_plan(const Routing& r, int64_t n_routed, int mmvq_max_rows) {
  if (mmvq_max_rows < 0 || mmvq_max_rows > kMaxGroupRows)
    throw InputError("build_layer_plan: mmvq_max_rows must be in [0, " +
                     std::to_string(kMaxGroupRows) + "], found " + std::to_string(mmvq_max_rows));
  LayerPlan p;
  p.tokens = r.tokens;
  p.topk = r.topk;
  std::vector<std::vector<int32_t>> tok_of;
  number_pairs(r, n_routed, p, tok_of);
  make_groups(p, mmvq_max_rows);
  make_accumulation(r, tok_of, p);
  return p;
}

std::vector<const uint8_t*> plan_slots(const LayerPlan& p, const uint8_t* gate, int64_t gate_stride,
                                       const uint8_t* up, int64_t up_stride, const uint8_t* down,
                                       int64_t down_stride) {
  const int64_t U = p.n_experts();
  std::vector<const uint8_t*> slots(static_cast<size_t>(3 * U));
  for (int64_t u = 0; u < U; ++u) {
    const int64_t e = p.experts[static_cast<size_t>(u)];
    slots[static_cast<size_t>(u)] = gate + e * gate_stride;
    slots[static_cast<size_t>(U + u)] = up + e * up_stride;
    slots[static_cast<size_t>(2 * U + u)] = down + e * down_stride;
  }
  return slots;
}

void fold_routed_taps(const LayerPlan& p, const float* gu, const float* h, const BlockQ8_1* hq,
                      const float* down, int64_t inter, int64_t dim, std::vector<ExpertTaps>& out) {
  const int64_t U = p.n_experts(), P = p.pairs(), nb = inter / kQK8_1;
  out.clear();
  for (int64_t u = 0; u < U; ++u) {
    const int64_t p0 = p.first_pair[static_cast<size_t>(u)];
    const int64_t p1 = u + 1 < U ? p.first_pair[static_cast<size_t>(u + 1)] : P;
    ExpertTaps& et = out.emplace_back();
    et.expert = p.experts[static_cast<size_t>(u)];
    et.tokens.assign(p.pair_token.begin() + p0, p.pair_token.begin() + p1);
    et.weights.assign(p.pair_weight.begin() + p0, p.pair_weight.begin() + p1);
    et.gate.assign(gu + p0 * inter, gu + p1 * inter);
    et.up.assign(gu + (P + p0) * inter, gu + (P + p1) * inter);
    et.h.assign(h + p0 * inter, h + p1 * inter);
    et.h_q8.assign(hq + p0 * nb, hq + p1 * nb);
    et.down.assign(down + p0 * dim, down + p1 * dim);
  }
}

}  // namespace moecheck
