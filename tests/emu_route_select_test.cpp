// emu::route_select (the device route's twin) on the CPU: its header's picks and weights equal
// route_from_logits (with and without an image mask), a NaN key sets kRouteNaN with the lowest
// token and the host rule's expert (the token's picks -1), a non-resident pick sets kRouteMiss
// with the lowest token and its lowest missing expert; the header layout. Contract:
// docs/numerics.md "route_select"; the kernel's equality: tests/gpu/route_select_test.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/route_header.h"
#include "core/routing.h"
#include "emulate/route_select.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

MoeConfig config(int64_t n, int64_t k) {
  MoeConfig c;
  c.n_routed = n;
  c.topk = k;
  c.route_scale = 2.5f;
  return c;
}

uint64_t loc(const std::vector<int32_t>& h, int64_t word) {
  uint64_t v;
  std::memcpy(&v, h.data() + word, sizeof v);
  return v;
}

TEST(EmuRouteSelect, PicksAndWeightsEqualHostRoute_WithAndWithoutMask) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    emutest::Gen g(seed);
    const int64_t n = 8 + g.u32() % 120, k = 1 + g.u32() % 8, T = 1 + g.u32() % 9;
    MoeConfig c = config(n, k);
    c.score_func = static_cast<ScoreFunc>(seed % 3);
    const auto z = g.f32(T * n, 3.0), b = g.f32(n, 0.5), bvl = g.f32(n, 0.5);
    std::vector<uint8_t> mask(static_cast<size_t>(T));
    for (auto& m : mask) m = g.u32() % 2;
    std::vector<int32_t> slots(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) slots[e] = static_cast<int32_t>(e);
    for (bool masked : {false, true}) {
      const RouteBias rb{b.data(), bvl.data(), masked ? mask.data() : nullptr};
      const Routing want = route_from_logits(z.data(), T, rb, c, 0);
      const RouteHeaderLayout L{T, k};
      std::vector<int32_t> h(static_cast<size_t>(L.words()), 77);
      emu::route_select(z.data(), T, rb, c, slots.data(), h.data());
      const std::string r = "seed " + std::to_string(seed) + (masked ? " masked" : "");
      EXPECT_EQ(h[RouteHeaderLayout::kStatus], 0) << r;
      EXPECT_EQ(h[RouteHeaderLayout::kTokens], T) << r;
      EXPECT_EQ(loc(h, RouteHeaderLayout::kNaNLoc), kRouteNoError) << r;
      EXPECT_EQ(loc(h, RouteHeaderLayout::kMissLoc), kRouteNoError) << r;
      for (int64_t i = 0; i < T * k; ++i) {
        ASSERT_EQ(h[RouteHeaderLayout::kPicks + i], want.ids[i]) << r << " pick " << i;
        ASSERT_EQ(static_cast<uint32_t>(h[L.weights() + i]), f32_bits(want.weights[i])) << r;
        ASSERT_EQ(h[L.slots() + i], want.ids[i]) << r << " slot of pick " << i;
      }
    }
  }
}

TEST(EmuRouteSelect, NaNKeySetsStatusAndTheHostRulesLocation) {
  const MoeConfig c = config(16, 4);
  emutest::Gen g(5);
  const int64_t T = 5;
  auto z = g.f32(T * 16, 2.0);
  auto b = g.f32(16, 0.5);
  z[3 * 16 + 9] = std::nanf("");  // token 3, expert 9's logit
  z[4 * 16 + 2] = INFINITY;       // token 4: Inf logit, -Inf bias at expert 2: Inf - Inf key
  b[2] = -INFINITY;
  std::vector<int32_t> slots(16, 0);
  const RouteHeaderLayout L{T, 4};
  std::vector<int32_t> h(static_cast<size_t>(L.words()));
  emu::route_select(z.data(), T, RouteBias{b.data()}, c, slots.data(), h.data());
  EXPECT_EQ(h[RouteHeaderLayout::kStatus], kRouteNaN);
  // Every token's key at expert 2 is score - Inf = -Inf (a number) except token 4's (NaN); the
  // lowest token with a NaN key is 3, whose first NaN input is expert 9.
  EXPECT_EQ(loc(h, RouteHeaderLayout::kNaNLoc), uint64_t{3} << 32 | 9u);
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(h[RouteHeaderLayout::kPicks + 3 * 4 + j], -1);
    EXPECT_EQ(h[L.slots() + 4 * 4 + j], -1);
    EXPECT_GE(h[RouteHeaderLayout::kPicks + 2 * 4 + j], 0);  // token 2 routed normally
  }
  // The host route names the same token and expert.
  try {
    route_from_logits(z.data(), T, b.data(), c, 0);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token 3 expert 9"), std::string::npos) << e.what();
  }
}

TEST(EmuRouteSelect, MissSetsStatusWithLowestTokenThenLowestExpert) {
  const MoeConfig c = config(16, 4);
  emutest::Gen g(6);
  const int64_t T = 3;
  const auto z = g.f32(T * 16, 2.0), b = g.f32(16, 0.5);
  const Routing rt = route_from_logits(z.data(), T, b.data(), c, 0);
  std::vector<int32_t> slots(16);
  for (int e = 0; e < 16; ++e) slots[e] = 15 - e;
  // Tokens 1 and 2 lose two picks each; token 0 keeps all of its own.
  std::vector<int32_t> gone;
  for (int64_t t = 1; t < T; ++t)
    for (int64_t j : {1, 3}) {
      const int32_t e = rt.ids[t * 4 + j];
      if (std::find(rt.ids.begin(), rt.ids.begin() + 4, e) == rt.ids.begin() + 4) gone.push_back(e);
    }
  ASSERT_FALSE(gone.empty());
  for (int32_t e : gone) slots[e] = -1;
  const RouteHeaderLayout L{T, 4};
  std::vector<int32_t> h(static_cast<size_t>(L.words()));
  emu::route_select(z.data(), T, RouteBias{b.data()}, c, slots.data(), h.data());
  EXPECT_EQ(h[RouteHeaderLayout::kStatus], kRouteMiss);
  int64_t t_min = -1;
  int32_t e_min = -1;
  for (int64_t t = 0; t < T && t_min < 0; ++t)
    for (int64_t j = 0; j < 4; ++j) {
      const int32_t e = rt.ids[t * 4 + j];
      if (slots[e] < 0 && (e_min < 0 || e < e_min)) {
        t_min = t;
        e_min = e;
      }
    }
  EXPECT_EQ(loc(h, RouteHeaderLayout::kMissLoc),
            static_cast<uint64_t>(t_min) << 32 | static_cast<uint32_t>(e_min));
  for (int64_t i = 0; i < T * 4; ++i) {  // picks and weights stay; slots carry the table's value
    EXPECT_EQ(h[RouteHeaderLayout::kPicks + i], rt.ids[i]);
    EXPECT_EQ(h[L.slots() + i], slots[rt.ids[i]]);
  }
}

TEST(RouteHeader, LayoutWordsAreEvenAndRegionsDisjoint) {
  for (int64_t T : {1, 2, 7, 8, 33})
    for (int64_t k : {1, 3, 6, 8}) {
      const RouteHeaderLayout L{T, k};
      EXPECT_EQ(L.words() % 2, 0);
      EXPECT_EQ(L.weights(), RouteHeaderLayout::kPicks + T * k);
      EXPECT_EQ(L.slots(), L.weights() + T * k);
      EXPECT_GE(L.words(), L.slots() + T * k);
      const DevicePlanLayout D(T, k);
      EXPECT_EQ(D.groups % 16, 0u);
      EXPECT_GE(D.groups, static_cast<size_t>(3 * T * k) * sizeof(void*));
      EXPECT_EQ(D.down_groups, D.groups + static_cast<size_t>(2 * T * k) * sizeof(MmvqGroup));
      EXPECT_GE(D.rows, D.groups + static_cast<size_t>(3 * T * k) * sizeof(MmvqGroup));
      EXPECT_GE(D.bytes, D.scratch + static_cast<size_t>(T * k) * 4);
    }
}

}  // namespace
}  // namespace moecheck
