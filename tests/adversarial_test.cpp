// The adversarial tokens (golden/adversarial.h) do what they are made for, measured on the
// emulation's own taps (not on the generator's f64 estimate): the clamp token drives gate and up
// past +L and -L in its picked experts, the zero token meets the generator's exact bias tie at the
// top-k boundary and routing sends it to the lower expert id, the near-tie token decides the same
// pair by a few f32 ulps, and the eps token makes model.py's +1e-20 matter. Every leg of the
// check (bounds, stage-local, statistical) still passes on them: an edge case is a place where a
// bug shows, never a false alarm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "compare/local_leg.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "emulate/moe_layer.h"
#include "golden/adversarial.h"
#include "golden/generator.h"

namespace moecheck {
namespace {

struct Case {
  std::string preset;
  ScoreFunc score;
};

std::string name_of(const Case& c) { return c.preset + "/" + to_string(c.score); }

class Adversarial : public ::testing::TestWithParam<Case> {};

// Sorted (key, id) pairs of one token: key = f32 score + bias, ties in ascending id.
std::vector<std::pair<float, int32_t>> keys_of(const LayerWeights& w, const LayerTaps& t,
                                               int64_t tok) {
  const MoeConfig& c = w.config;
  const Routing r =
      route_from_logits(t.router_logits.data() + tok * c.n_routed, 1, w.bias, c, w.layer);
  std::vector<std::pair<float, int32_t>> k;
  for (int64_t e = 0; e < c.n_routed; ++e)
    k.emplace_back(r.scores[e] + w.bias[e], static_cast<int32_t>(e));
  std::stable_sort(k.begin(), k.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return k;
}

bool picked(const LayerTaps& t, int64_t tok, int64_t K, int32_t e) {
  const int32_t* ids = t.topk_ids.data() + tok * K;
  return std::find(ids, ids + K, e) != ids + K;
}

TEST_P(Adversarial, EveryEdgeCaseHappensOnTheEmulationAndEveryLegPasses) {
  GenOptions o = preset_options(GetParam().preset);
  o.config.score_func = GetParam().score;
  const std::string cfg = name_of(GetParam()) + " seed 1 layer 0";
  const LayerWeights w = generate_layer(o, 0);
  const MoeConfig& c = w.config;
  const std::vector<AdversarialToken> adv = adversarial_tokens(w, 1);
  ASSERT_EQ(adv.size(), static_cast<size_t>(kAdversarialTokens));
  // Two seeded tokens first, so the adversarial ones sit at an offset as in a check run.
  std::vector<uint16_t> x = generate_input(1, 2, c.dim);
  for (int i = 0; i < kAdversarialTokens; ++i) {
    EXPECT_EQ(adv[i].name, kAdversarialNames[i]) << cfg;
    ASSERT_EQ(adv[i].x.size(), static_cast<size_t>(c.dim)) << cfg;
    x.insert(x.end(), adv[i].x.begin(), adv[i].x.end());
  }
  const int64_t T = 2 + kAdversarialTokens, first = 2, K = c.topk;
  emu::LayerOptions lo;
  const emu::MoeLayer layer(w, lo);
  LayerTaps t;
  layer.forward(x.data(), T, &t);

  // Clamps: every side of gate and up passed, measured on the emulation's gate and up.
  EXPECT_TRUE(adv[0].made) << cfg;
  int64_t n[4] = {0, 0, 0, 0};
  const double L = c.swiglu_limit;
  for (const ExpertTaps& e : t.experts)
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      if (e.tokens[j] != first) continue;
      for (int64_t i = 0; i < c.inter; ++i) {
        const double g = e.gate[j * c.inter + i], u = e.up[j * c.inter + i];
        n[0] += g > L, n[1] += g<-L, n[2] += u> L, n[3] += u < -L;
      }
    }
  EXPECT_GT(n[0], 0) << cfg << ": gate > +L never reached";
  EXPECT_GT(n[1], 0) << cfg << ": gate < -L never reached";
  EXPECT_GT(n[2], 0) << cfg << ": up > +L never reached";
  EXPECT_GT(n[3], 0) << cfg << ": up < -L never reached";

  // Zero token: the keys at ranks K-1 and K are exactly equal, and the lower id is the one picked.
  const auto kz = keys_of(w, t, first + 1);
  ASSERT_EQ(kz[K - 1].first, kz[K].first) << cfg << ": no exact tie at the top-k boundary";
  const int32_t lo_id = std::min(kz[K - 1].second, kz[K].second),
                hi_id = std::max(kz[K - 1].second, kz[K].second);
  EXPECT_TRUE(picked(t, first + 1, K, lo_id))
      << cfg << ": tie at expert " << lo_id << " / " << hi_id;
  EXPECT_FALSE(picked(t, first + 1, K, hi_id))
      << cfg << ": tie at expert " << lo_id << " / " << hi_id;

  // Near tie: the same boundary decided by a few f32 ulps (not 0: that is the zero token's case).
  const auto kn = keys_of(w, t, first + 2);
  const int64_t ulps = static_cast<int64_t>(f32_bits(kn[K - 1].first)) - f32_bits(kn[K].first);
  EXPECT_GT(ulps, 0) << cfg;
  EXPECT_LE(ulps, 64) << cfg << ": the near tie is not near";

  // Eps: the picked scores sum to less than 2^20 * 1e-20, so the +1e-20 moves every weight by more
  // than an f32 ulp; never made under softmax (its scores sum to 1).
  if (c.score_func == ScoreFunc::kSoftmax) {
    EXPECT_FALSE(adv[3].made) << cfg;
  } else {
    ASSERT_TRUE(adv[3].made) << cfg;
    const Routing r =
        route_from_logits(t.router_logits.data() + (first + 3) * c.n_routed, 1, w.bias, c, w.layer);
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += r.scores[r.ids[j]];
    EXPECT_GT(sum, 0) << cfg;
    EXPECT_LT(sum, 0x1p20 * 1e-20) << cfg;
    // The largest picked score stays clear of f32's subnormal exp (its own rounding would hide
    // the +1e-20 there): its logit / gate_temp is above -87.
    double zmax = -INFINITY;
    for (int64_t j = 0; j < K; ++j)
      zmax =
          std::max(zmax, static_cast<double>(t.router_logits[(first + 3) * c.n_routed + r.ids[j]]) /
                             c.gate_temp);
    EXPECT_GT(zmax, -87.0) << cfg;
  }

  // Every leg passes on these tokens.
  LegReport stat;
  const LegReport bounds = check_emu_against_exact(w, t, lo.router, nullptr, &stat);
  const LegReport local = check_local(w, t, lo.router);
  for (const auto& [leg, r] : {std::pair<const char*, const LegReport*>{"bounds", &bounds},
                               {"statistical", &stat},
                               {"local", &local}}) {
    EXPECT_TRUE(r->ok()) << cfg << ": " << leg << " leg fails at " << stage_name(r->first_failing())
                         << ": "
                         << (r->stage(r->first_failing())
                                 ? r->stage(r->first_failing())->first_violation
                                 : "");
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Adversarial,
                         ::testing::Values(Case{"tiny", ScoreFunc::kSqrtSoftplus},
                                           Case{"tiny", ScoreFunc::kSigmoid},
                                           Case{"tiny", ScoreFunc::kSoftmax},
                                           Case{"small", ScoreFunc::kSqrtSoftplus}),
                         [](const auto& i) {
                           std::string s = name_of(i.param);
                           std::replace(s.begin(), s.end(), '/', '_');
                           return s;
                         });

}  // namespace
}  // namespace moecheck
