// build_layer_plan, plan_slots and fold_routed_taps (core/layer_plan.h), the host plan both
// drivers run: pair rows in ascending expert id then token, groups of at most 8 consecutive
// pairs per projection with the documented slots and rows, accumulation rows in ascending expert
// id per token, bad routings refused with the token named. Checked against a plain restatement
// of the rules on random and skewed routings. Repro: --gtest_filter=LayerPlan*.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/layer_plan.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

// A routing of T tokens, each picking K distinct experts of E in random order.
Routing random_routing(emutest::Gen& g, int64_t T, int64_t K, int64_t E, int64_t skew_to = -1) {
  Routing r;
  r.tokens = T;
  r.topk = K;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) std::swap(e[i], e[g.u32() % (i + 1)]);
    if (skew_to >= 0) {  // every token picks skew_to first
      auto it = std::find(e.begin(), e.end(), static_cast<int32_t>(skew_to));
      std::swap(*it, e[0]);
    }
    r.ids.insert(r.ids.end(), e.begin(), e.begin() + K);
  }
  r.weights = g.f32(T * K, 1.0);
  return r;
}

// The plan's part of used expert u: 0 MMVQ, 1 an even number of MMQ groups, 2 an odd number.
int plan_part(const LayerPlan& p, int64_t u, int mmvq_max_rows) {
  const int64_t P = p.pairs(), U = p.n_experts();
  const int64_t c = (u + 1 < U ? p.first_pair[u + 1] : P) - p.first_pair[u];
  if (c <= mmvq_max_rows) return 0;
  return (c + kMaxGroupRows - 1) / kMaxGroupRows % 2 == 0 ? 1 : 2;
}

// Every property of the plan, restated plainly.
void expect_plan_rules(const Routing& r, int64_t E, const LayerPlan& p,
                       int mmvq_max_rows = kMaxGroupRows) {
  const int64_t T = r.tokens, K = r.topk, P = T * K;
  ASSERT_EQ(p.pairs(), P);
  // (expert, token) pairs in ascending expert id, then token.
  std::map<std::pair<int32_t, int32_t>, float> want;  // (e, t) -> weight
  for (int64_t i = 0; i < P; ++i) want[{r.ids[i], static_cast<int32_t>(i / K)}] = r.weights[i];
  std::set<int32_t> used;
  for (const auto& kv : want) used.insert(kv.first.first);
  ASSERT_EQ(p.experts, std::vector<int32_t>(used.begin(), used.end()));
  int64_t q = 0;
  for (const auto& [et, w] : want) {
    const int64_t u = std::find(p.experts.begin(), p.experts.end(), et.first) - p.experts.begin();
    ASSERT_GE(q, p.first_pair[u]);
    ASSERT_EQ(p.pair_token[q], et.second) << "pair " << q;
    ASSERT_EQ(f32_bits(p.pair_weight[q]), f32_bits(w)) << "pair " << q;
    ++q;
  }
  // Groups: each projection covers every pair exactly once, <= 8 consecutive pairs of one expert.
  const int64_t U = p.n_experts(), n = p.n_proj_groups;
  ASSERT_EQ(static_cast<int64_t>(p.groups.size()), 3 * n);
  std::vector<int> seen(static_cast<size_t>(P), 0);
  int max_n = 1;
  for (int64_t i = 0; i < n; ++i) {
    const MmvqGroup &g = p.gate_groups()[i], &up = p.up_groups()[i], &d = p.down_groups()[i];
    ASSERT_TRUE(g.n >= 1 && g.n <= kMaxGroupRows);
    ASSERT_EQ(up.slot, U + g.slot);
    ASSERT_EQ(d.slot, 2 * U + g.slot);
    // MMVQ groups first (experts with at most mmvq_max_rows pairs, one group each), then the
    // MMQ groups of the experts with an even number of them, then the odd; each part in
    // ascending expert id.
    const int64_t cnt = (g.slot + 1 < U ? p.first_pair[g.slot + 1] : P) - p.first_pair[g.slot];
    ASSERT_EQ(i < p.n_mmvq_groups, cnt <= mmvq_max_rows)
        << "group " << i << ", " << cnt << " pairs";
    const int part = plan_part(p, g.slot, mmvq_max_rows);
    if (i > 0) {
      const int32_t prev = p.gate_groups()[i - 1].slot;
      const int prev_part = plan_part(p, prev, mmvq_max_rows);
      ASSERT_TRUE(prev_part < part || (prev_part == part && prev <= g.slot))
          << "group " << i << " (expert slot " << g.slot << ", part " << part
          << ") after expert slot " << prev << " (part " << prev_part << ")";
    }
    if (i < p.n_mmvq_groups) max_n = std::max(max_n, g.n);
    for (int j = 0; j < g.n; ++j) {
      const int32_t pair = g.y_row[j];
      ++seen[pair];
      ASSERT_EQ(g.a_row[j], p.pair_token[pair]);
      ASSERT_EQ(up.a_row[j], p.pair_token[pair]);
      ASSERT_EQ(up.y_row[j], P + pair);
      ASSERT_EQ(d.a_row[j], pair);
      ASSERT_EQ(d.y_row[j], pair);
      if (j > 0) {
        ASSERT_EQ(pair, g.y_row[j - 1] + 1);
      }
      const int64_t end = g.slot + 1 < U ? p.first_pair[g.slot + 1] : P;
      ASSERT_TRUE(pair >= p.first_pair[g.slot] && pair < end)
          << "group " << i << " leaves its expert";
    }
  }
  for (int64_t i = 0; i < P; ++i) ASSERT_EQ(seen[i], 1) << "pair " << i;
  ASSERT_EQ(p.max_group_rows, max_n);
  // What the MMQ order is for: the positions 2 j, 2 j + 1 of the MMQ range that share a slot
  // (MMQ's pair items) are every expert's groups two by two, all but the last of an odd number.
  const MmvqGroup* mq = p.gate_groups() + p.n_mmvq_groups;
  const int64_t nq = n - p.n_mmvq_groups;
  int64_t paired = 0, best = 0;
  for (int64_t j = 0; j + 1 < nq; j += 2) paired += mq[j].slot == mq[j + 1].slot;
  for (int64_t u = 0; u < U; ++u) {
    const int64_t c = (u + 1 < U ? p.first_pair[u + 1] : P) - p.first_pair[u];
    if (c > mmvq_max_rows) best += (c + kMaxGroupRows - 1) / kMaxGroupRows / 2;
  }
  ASSERT_EQ(paired, best) << "MMQ pair items, of " << nq << " MMQ groups";
  // Accumulation: token t's pair rows in ascending expert id, with their weights.
  for (int64_t t = 0; t < T; ++t) {
    int32_t last = -1;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t pair = p.acc_rows[t * K + k];
      ASSERT_EQ(p.pair_token[pair], t);
      const int64_t u = std::upper_bound(p.first_pair.begin(), p.first_pair.end(), pair) -
                        p.first_pair.begin() - 1;
      ASSERT_GT(p.experts[u], last) << "token " << t << ": not ascending expert id";
      last = p.experts[u];
      ASSERT_EQ(f32_bits(p.acc_weights[t * K + k]),
                f32_bits(want.at({last, static_cast<int32_t>(t)})));
    }
  }
  (void)E;
}

TEST(LayerPlan, RandomRoutings_T1to70_matchTheRules) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    emutest::Gen g(seed * 7919);
    const int64_t E = 4 + g.u32() % 60, K = 1 + g.u32() % std::min<int64_t>(E, 8),
                  T = 1 + g.u32() % 70;
    const Routing r =
        random_routing(g, T, K, E, seed % 4 == 0 ? static_cast<int64_t>(g.u32() % E) : -1);
    SCOPED_TRACE("seed " + std::to_string(seed) + " T " + std::to_string(T) + " K " +
                 std::to_string(K) + " E " + std::to_string(E));
    expect_plan_rules(r, E, build_layer_plan(r, E));
    const int mr = static_cast<int>(seed % 9);  // every split, 0 (all MMQ) to 8
    expect_plan_rules(r, E, build_layer_plan(r, E, mr), mr);
  }
}

TEST(LayerPlan, OneExpertTakesEveryToken_GroupsOf8) {
  emutest::Gen g(5);
  const Routing r = random_routing(g, 20, 1, 8, 3);
  const LayerPlan p = build_layer_plan(r, 8);
  ASSERT_EQ(p.experts, std::vector<int32_t>({3}));
  ASSERT_EQ(p.n_proj_groups, 3);  // 8 + 8 + 4, all MMQ (20 pairs > 8)
  EXPECT_EQ(p.n_mmvq_groups, 0);
  EXPECT_EQ(p.gate_groups()[2].n, 4);
  EXPECT_EQ(p.max_group_rows, 1);
  expect_plan_rules(r, 8, p);
}

TEST(LayerPlan, MmvqGroupsFirstThenMmq_AndBadSplitThrows) {
  // Token t picks experts {0, 1} (t < 3) or {1, 2}: expert 0 has 3 pairs, 1 has 12, 2 has 9.
  Routing r;
  r.tokens = 12;
  r.topk = 2;
  for (int32_t t = 0; t < 12; ++t) {
    r.ids.push_back(t < 3 ? 0 : 2);
    r.ids.push_back(1);
    r.weights.push_back(0.5f);
    r.weights.push_back(0.25f);
  }
  const LayerPlan p = build_layer_plan(r, 4);
  ASSERT_EQ(p.n_proj_groups, 1 + 2 + 2);
  ASSERT_EQ(p.n_mmvq_groups, 1);
  EXPECT_EQ(p.gate_groups()[0].slot, 0);  // expert 0 (MMVQ), then 1, 1, 2, 2 (MMQ)
  EXPECT_EQ(p.gate_groups()[1].slot, 1);
  EXPECT_EQ(p.gate_groups()[3].slot, 2);
  EXPECT_EQ(p.max_group_rows, 3);
  expect_plan_rules(r, 4, p);
  const LayerPlan all_mmq = build_layer_plan(r, 4, 0);
  EXPECT_EQ(all_mmq.n_mmvq_groups, 0);
  expect_plan_rules(r, 4, all_mmq, 0);
  for (int bad : {-1, 9}) EXPECT_THROW(build_layer_plan(r, 4, bad), InputError) << bad;
}

TEST(LayerPlan, MmqExpertsWithEvenGroupCountsFirst_SoTheirGroupsPair) {
  // Tokens 0 - 2 pick {0, 1, 2}, 3 - 11 {0, 1, 3}, 12 {0, 3, 2}, 13 - 19 {0, 3, 4}: expert 0
  // has 20 pairs (3 MMQ groups), 1 has 12 (2), 2 has 4 (MMVQ), 3 has 17 (3), 4 has 7 (MMVQ). In
  // ascending id the MMQ groups would be 0 0 0 1 1 3 3 3, whose positions (2, 3) and (4, 5) mix
  // experts: 4 single groups. Even counts first gives 1 1 0 0 0 3 3 3: 2 single groups, one a
  // run of 3, the least any order leaves.
  Routing r;
  r.tokens = 20;
  r.topk = 3;
  for (int32_t t = 0; t < 20; ++t) {
    if (t < 12) r.ids.insert(r.ids.end(), {0, 1, t < 3 ? 2 : 3});
    else r.ids.insert(r.ids.end(), {0, 3, t < 13 ? 2 : 4});
  }
  r.weights.assign(r.ids.size(), 0.5f);
  const LayerPlan p = build_layer_plan(r, 5);
  ASSERT_EQ(p.experts, std::vector<int32_t>({0, 1, 2, 3, 4}));
  ASSERT_EQ(p.n_mmvq_groups, 2);  // experts 2 and 4
  std::vector<int32_t> slots;
  for (int64_t i = 0; i < p.n_proj_groups; ++i) slots.push_back(p.gate_groups()[i].slot);
  EXPECT_EQ(slots, std::vector<int32_t>({2, 4, 1, 1, 0, 0, 0, 3, 3, 3}));
  expect_plan_rules(r, 5, p);
}

TEST(LayerPlan, SlotsAndFoldedTaps) {
  emutest::Gen g(9);
  const int64_t T = 5, K = 2, E = 6, inter = 64, dim = 32;
  const Routing r = random_routing(g, T, K, E);
  const LayerPlan p = build_layer_plan(r, E);
  const int64_t U = p.n_experts(), P = p.pairs();
  uint8_t base[3] = {};
  const auto slots = plan_slots(p, base, 100, base + 1, 200, base + 2, 300);
  ASSERT_EQ(static_cast<int64_t>(slots.size()), 3 * U);
  for (int64_t u = 0; u < U; ++u) {
    EXPECT_EQ(slots[u], base + 100 * p.experts[u]);
    EXPECT_EQ(slots[U + u], base + 1 + 200 * p.experts[u]);
    EXPECT_EQ(slots[2 * U + u], base + 2 + 300 * p.experts[u]);
  }
  // Buffers whose every value names its pair row and column.
  std::vector<float> gu(static_cast<size_t>(2 * P * inter)), h(static_cast<size_t>(P * inter)),
      down(static_cast<size_t>(P * dim));
  for (size_t i = 0; i < gu.size(); ++i) gu[i] = static_cast<float>(i);
  for (size_t i = 0; i < h.size(); ++i) h[i] = -static_cast<float>(i);
  for (size_t i = 0; i < down.size(); ++i) down[i] = 0.5f * static_cast<float>(i);
  std::vector<BlockQ8_1> hq(static_cast<size_t>(P * inter / kQK8_1));
  for (size_t i = 0; i < hq.size(); ++i) hq[i].d = static_cast<uint16_t>(i);
  std::vector<ExpertTaps> taps;
  fold_routed_taps(p, gu.data(), h.data(), hq.data(), down.data(), inter, dim, taps);
  ASSERT_EQ(static_cast<int64_t>(taps.size()), U);
  for (int64_t u = 0; u < U; ++u) {
    const ExpertTaps& e = taps[u];
    EXPECT_EQ(e.expert, p.experts[u]);
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      const int64_t q = p.first_pair[u] + static_cast<int64_t>(j);
      EXPECT_EQ(e.tokens[j], p.pair_token[q]);
      EXPECT_EQ(e.weights[j], p.pair_weight[q]);
      EXPECT_EQ(e.gate[j * inter + 3], gu[q * inter + 3]);
      EXPECT_EQ(e.up[j * inter + 5], gu[(P + q) * inter + 5]);
      EXPECT_EQ(e.h[j * inter + 7], h[q * inter + 7]);
      EXPECT_EQ(e.h_q8[j * inter / kQK8_1 + 1].d, hq[q * inter / kQK8_1 + 1].d);
      EXPECT_EQ(e.down[j * dim + 11], down[q * dim + 11]);
    }
  }
}

TEST(LayerPlan, BadRoutingsNameTheToken) {
  Routing r;
  r.tokens = 2;
  r.topk = 2;
  r.weights = {1, 1, 1, 1};
  r.ids = {0, 1, 3, 3};
  try {
    (void)build_layer_plan(r, 4);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 picks expert 3 twice"), std::string::npos)
        << e.what();
  }
  r.ids = {0, 1, 2, 4};
  try {
    (void)build_layer_plan(r, 4);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 picks expert 4, outside [0, 4)"),
              std::string::npos)
        << e.what();
  }
}

RC_GTEST_PROP(LayerPlan, AnyRoutingMatchesTheRules, ()) {
  const int64_t E = *rc::gen::inRange<int64_t>(1, 40);
  const int64_t K = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(E, 8) + 1);
  const int64_t T = *rc::gen::inRange<int64_t>(0, 40);
  emutest::Gen g(*rc::gen::arbitrary<uint32_t>());
  const Routing r = random_routing(g, T, K, E);
  const LayerPlan p = build_layer_plan(r, E);
  expect_plan_rules(r, E, p);
  RC_ASSERT(!::testing::Test::HasFailure());
}

}  // namespace
}  // namespace moecheck
