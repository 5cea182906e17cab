// emu::accumulate and emu::finish (docs/numerics.md "accumulate, finish"): the fma chain over a
// token's picks in the plan's ascending expert id (replayed literally here), then the shared
// term; the same bits whatever order routing listed the picks in (the plan sorts them); within
// gamma_{topk+1} of the f64 sum; finish = f32_to_bf16. Repro: --gtest_filter=EmuAccumulate*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/layer_plan.h"
#include "emulate/accumulate.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

// A routing of T tokens over `ids` (picks in the given order) with random weights.
Routing routing_of(const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t T,
                   int64_t K) {
  Routing r;
  r.tokens = T;
  r.topk = K;
  r.ids = ids;
  r.weights = w;
  return r;
}

// The pair row of (expert e, token t) in the plan, or -1.
int64_t pair_row(const LayerPlan& p, int32_t e, int64_t t) {
  for (int64_t u = 0; u < p.n_experts(); ++u) {
    if (p.experts[u] != e) continue;
    const int64_t end = u + 1 < p.n_experts() ? p.first_pair[u + 1] : p.pairs();
    for (int64_t q = p.first_pair[u]; q < end; ++q)
      if (p.pair_token[q] == t) return q;
  }
  return -1;
}

TEST(EmuAccumulate, AscendingExpertChainOrderFreeBoundAndFinish_T3_topk4_dim64) {
  emutest::Gen gen(41);
  const int64_t T = 3, K = 4, dim = 64, E = 16;
  const std::vector<int32_t> ids = {7, 2, 9, 0, 1, 3, 5, 4, 15, 14, 13, 12};
  const std::vector<float> w = gen.f32(T * K, 0.5), sh = gen.f32(T * dim, 1.0);
  const LayerPlan p = build_layer_plan(routing_of(ids, w, T, K), E);
  const std::vector<float> down = gen.f32(p.pairs() * dim, 3.0);  // by pair row
  std::vector<float> acc(static_cast<size_t>(T * dim));
  std::vector<uint16_t> y(acc.size());
  emu::accumulate(p.acc_rows.data(), p.acc_weights.data(), K, down.data(), sh.data(), acc.data(),
                  y.data(), T, dim);
  for (int64_t t = 0; t < T; ++t) {
    // The chain replayed: picks of token t sorted by expert id, fma from +0, then the shared term.
    std::vector<int64_t> order = {0, 1, 2, 3};
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return ids[t * K + a] < ids[t * K + b]; });
    for (int64_t i = 0; i < dim; ++i) {
      float a = 0.0f;
      double exact = sh[t * dim + i], mag = std::fabs(sh[t * dim + i]);
      for (int64_t k : order) {
        const int32_t e = ids[t * K + k];
        const int64_t pair = pair_row(p, e, t);
        ASSERT_GE(pair, 0);
        a = std::fma(w[t * K + k], down[pair * dim + i], a);
        exact += static_cast<double>(w[t * K + k]) * down[pair * dim + i];
        mag += std::fabs(static_cast<double>(w[t * K + k]) * down[pair * dim + i]);
      }
      a = a + sh[t * dim + i];
      ASSERT_EQ(f32_bits(acc[t * dim + i]), f32_bits(a)) << "t " << t << " i " << i;
      ASSERT_LE(std::fabs(acc[t * dim + i] - exact), emutest::gamma(K + 1) * mag)
          << "t " << t << " i " << i;
      ASSERT_EQ(y[t * dim + i], f32_to_bf16(acc[t * dim + i]));
    }
  }
  // Reverse every token's picks in the routing: the plan orders them again, the same bits.
  std::vector<int32_t> ids2(ids.size());
  std::vector<float> w2(w.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      ids2[t * K + (K - 1 - k)] = ids[t * K + k];
      w2[t * K + (K - 1 - k)] = w[t * K + k];
    }
  const LayerPlan p2 = build_layer_plan(routing_of(ids2, w2, T, K), E);
  std::vector<float> acc2(acc.size());
  emu::accumulate(p2.acc_rows.data(), p2.acc_weights.data(), K, down.data(), sh.data(), acc2.data(),
                  nullptr, T, dim);
  ASSERT_EQ(std::memcmp(acc.data(), acc2.data(), acc.size() * 4), 0);
  // finish on its own equals the fused rounding.
  std::vector<uint16_t> y2(acc.size());
  emu::finish(acc.data(), y2.data(), T * dim);
  ASSERT_EQ(y, y2);
}

TEST(EmuAccumulate, NoSharedTermAndBadShapes) {
  emutest::Gen gen(43);
  const int64_t T = 2, K = 1, dim = 32;
  const std::vector<int32_t> rows = {1, 0};
  const std::vector<float> w = {0.5f, -2.0f}, down = gen.f32(2 * dim, 1.0);
  std::vector<float> acc(static_cast<size_t>(T * dim));
  emu::accumulate(rows.data(), w.data(), K, down.data(), nullptr, acc.data(), nullptr, T, dim);
  for (int64_t i = 0; i < dim; ++i) {
    ASSERT_EQ(f32_bits(acc[i]), f32_bits(std::fma(0.5f, down[dim + i], 0.0f)));
    ASSERT_EQ(f32_bits(acc[dim + i]), f32_bits(std::fma(-2.0f, down[i], 0.0f)));
  }
  EXPECT_THROW(
      emu::accumulate(rows.data(), w.data(), K, down.data(), nullptr, acc.data(), nullptr, -1, dim),
      InputError);
  EXPECT_THROW(
      emu::accumulate(rows.data(), w.data(), K, down.data(), nullptr, acc.data(), nullptr, T, 0),
      InputError);
}

}  // namespace
}  // namespace moecheck
