// Host routing (core/routing.cpp, the seeds' route_from_logits) against independent oracles:
// picks against a stable sort of the keys, exact ties (made on purpose, across the top-k
// boundary too) to the lower id, relabelling, the renormalised weight sum within a derived bound,
// NaN keys as InputErrors naming layer / token / expert, the three score functions against f64
// formulas within stated ulps, gate_temp, norm_topk_prob off and topk == 1.
// Repro: RC_PARAMS="seed=..." build/tests/routing_test --gtest_filter='Routing*'.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"

namespace moecheck {
namespace {

constexpr double kU = 0x1p-24;  // f32 unit roundoff

struct Case {
  MoeConfig c;
  int layer = 0;
  int64_t tokens = 0;
  std::vector<float> logits;  // [tokens, n_routed]
  std::vector<float> bias;    // [n_routed]
};

std::ostream& operator<<(std::ostream& os, const Case& k) {
  os << "T" << k.tokens << "_E" << k.c.n_routed << "_K" << k.c.topk << "_"
     << to_string(k.c.score_func) << "_temp" << k.c.gate_temp << "_scale" << k.c.route_scale
     << (k.c.norm_topk_prob ? "_norm" : "_nonorm") << "_layer" << k.layer;
  return os;
}

// Values from a small pool make exact key ties (equal logits and equal biases give equal keys);
// continuous values in [-lim, lim] on a 1/64 grid make near-ties; both can mix in one token.
float gen_value(int mode, const std::vector<float>& pool, int lim) {
  if (mode == 0 || (mode == 2 && *rc::gen::arbitrary<bool>()))
    return pool[*rc::gen::inRange<size_t>(0, pool.size())];
  return static_cast<float>(*rc::gen::inRange(-lim * 64, lim * 64 + 1)) / 64.0f;
}

rc::Gen<Case> gen_case(bool allow_softmax = true) {
  return rc::gen::exec([allow_softmax] {
    Case k;
    k.c.n_routed = *rc::gen::weightedOneOf<int64_t>(
        {{6, rc::gen::inRange<int64_t>(1, 41)}, {1, rc::gen::element<int64_t>(256, 384)}});
    k.c.topk = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(k.c.n_routed, 9) + 1);
    k.c.score_func =
        allow_softmax
            ? *rc::gen::element(ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax)
            : *rc::gen::element(ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid);
    k.c.gate_temp = *rc::gen::element(1.0f, 0.5f, 1.7f, 3.0f);
    k.c.route_scale = *rc::gen::element(1.0f, 1.5f, 2.5f, 0.75f);
    k.c.norm_topk_prob = *rc::gen::arbitrary<bool>();
    k.layer = *rc::gen::inRange(0, 40);
    k.tokens = *rc::gen::inRange<int64_t>(1, 5);
    const int mode = *rc::gen::inRange(0, 3);
    const std::vector<float> lpool = {-2.0f, 0.0f, 0.5f, 1.25f, 3.0f};
    const std::vector<float> bpool = {0.0f, 0.25f, -0.125f};
    const int bias_mode = *rc::gen::inRange(0, 3);
    k.bias.resize(static_cast<size_t>(k.c.n_routed));
    for (float& b : k.bias) b = bias_mode == 0 ? 0.0f : gen_value(bias_mode == 1 ? 0 : 1, bpool, 1);
    k.logits.resize(static_cast<size_t>(k.tokens * k.c.n_routed));
    for (float& z : k.logits) z = gen_value(mode, lpool, 30);
    return k;
  });
}

Routing route(const Case& k) {
  return route_from_logits(k.logits.data(), k.tokens, k.bias.data(), k.c, k.layer);
}

// The oracle: a stable sort of all ids by descending key (the seeds' sort_by on 0..n).
std::vector<int32_t> oracle_picks(const float* scores, const std::vector<float>& bias, int64_t k) {
  const size_t n = bias.size();
  std::vector<float> key(n);
  for (size_t e = 0; e < n; ++e) key[e] = scores[e] + bias[e];
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key[a] > key[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

RC_GTEST_PROP(Routing, PicksAreTheStableSortsTopK, ()) {
  const Case k = *gen_case();
  RC_LOG() << k << "\n";
  const Routing r = route(k);
  RC_ASSERT(r.ids.size() == static_cast<size_t>(k.tokens * k.c.topk));
  for (int64_t t = 0; t < k.tokens; ++t) {
    const int32_t* ids = r.ids.data() + t * k.c.topk;
    std::vector<int32_t> got(ids, ids + k.c.topk);
    for (int32_t e : got) RC_ASSERT(e >= 0 && e < k.c.n_routed);
    std::vector<int32_t> sorted = got;
    std::sort(sorted.begin(), sorted.end());
    RC_ASSERT(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    RC_ASSERT(got == oracle_picks(r.scores.data() + t * k.c.n_routed, k.bias, k.c.topk));
  }
}

TEST(Routing, ExactTiesGoToTheLowerIdAcrossTheBoundary_E8_K3) {
  // Keys: experts 6, 2, 4 tie at the top (logit 1, bias 0), expert 1 ties them through its
  // bias; picks take the three lowest ids among the four equal keys, in id order.
  MoeConfig c;
  c.n_routed = 8;
  c.topk = 3;
  c.score_func = ScoreFunc::kSigmoid;
  std::vector<float> z = {0, 0.5f, 1, 0, 1, -1, 1, 0};
  std::vector<float> b(8, 0.0f);
  // sigmoid(0.5) + bias == sigmoid(1) exactly in f32: pick the bias as the f32 difference and
  // check.
  const float s1 = 1.0f / (1.0f + std::exp(-1.0f)), s05 = 1.0f / (1.0f + std::exp(-0.5f));
  b[1] = s1 - s05;
  ASSERT_EQ(s05 + b[1], s1) << "constructed tie is not exact; choose another bias";
  const Routing r = route_from_logits(z.data(), 1, b.data(), c, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4}));
  // All keys equal: the first k ids.
  std::vector<float> zeq(8, 0.25f);
  EXPECT_EQ(route_from_logits(zeq.data(), 1, std::vector<float>(8, 0.0f).data(), c, 0).ids,
            (std::vector<int32_t>{0, 1, 2}));
}

// Relabelling experts with their logits and biases relabels the picks. Softmax is left out: its
// sum runs in id order, so relabelling changes the sum's rounding and may create or break
// near-ties. Exact ties at the boundary are mapped: within a tie group the picks are the lowest
// new ids.
RC_GTEST_PROP(Routing, RelabellingExpertsRelabelsThePicks, ()) {
  const Case k = *gen_case(false);
  const int64_t n = k.c.n_routed, K = k.c.topk;
  std::vector<int32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[i], perm[*rc::gen::inRange<int64_t>(0, i + 1)]);
  RC_LOG() << k << "\n";
  Case p = k;
  for (int64_t e = 0; e < n; ++e) {
    p.bias[perm[e]] = k.bias[e];
    for (int64_t t = 0; t < k.tokens; ++t) p.logits[t * n + perm[e]] = k.logits[t * n + e];
  }
  const Routing a = route(k), b = route(p);
  for (int64_t t = 0; t < k.tokens; ++t) {
    const float* sa = a.scores.data() + t * n;
    const float* sb = b.scores.data() + t * n;
    for (int64_t e = 0; e < n; ++e)
      RC_ASSERT(sb[perm[e]] == sa[e]);  // element-wise score functions
    std::vector<float> ka, kb;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t ea = a.ids[t * K + j], eb = b.ids[t * K + j];
      ka.push_back(sa[ea] + k.bias[ea]);
      kb.push_back(sb[eb] + p.bias[eb]);
    }
    RC_ASSERT(ka == kb);  // the same key sequence
    // Per distinct key value among the picks: the picked new ids are the lowest new ids of that
    // tie group (the whole group when it does not straddle the boundary).
    for (int64_t j = 0; j < K; ++j) {
      std::vector<int32_t> group_new, picked_new;
      for (int64_t e = 0; e < n; ++e)
        if (sa[e] + k.bias[e] == ka[j]) group_new.push_back(perm[e]);
      for (int64_t i = 0; i < K; ++i)
        if (kb[i] == ka[j]) picked_new.push_back(b.ids[t * K + i]);
      std::sort(group_new.begin(), group_new.end());
      group_new.resize(picked_new.size());
      RC_ASSERT(picked_new == group_new);
    }
  }
}

// Weight sum with renormalisation. With s_j the picked f32 scores, c = 1e-20f, R = route_scale:
// the f32 sum S~ = sum s_j (1 + th), |th| <= g(k-1) (k nonnegative terms in sequence,
// g(n) = n u / (1 - n u)); (S~ + c) = (S + c)(1 + th') with |th'| <= |th| since c >= 0; one more
// rounding adds it, one divides, one scales: w_j = R s_j (1+d1)(1+d2) / ((S + c)(1+th')(1+d3)).
// So |sum w - R S/(S+c)| <= R S/(S+c) * ((1+u)^2 / ((1-g(k-1))(1-u)) - 1), first order (k+2) u.
// Add k * 2^-149 R for weights that fall into subnormals, and 2^-40 relative for the f64 sums.
RC_GTEST_PROP(Routing, RenormalisedWeightsSumToRouteScale, ()) {
  Case k = *gen_case();
  k.c.norm_topk_prob = true;
  if (k.c.topk == 1) k.c.topk = std::min<int64_t>(2, k.c.n_routed);
  RC_PRE(k.c.topk > 1);
  RC_LOG() << k << "\n";
  const Routing r = route(k);
  const int64_t K = k.c.topk;
  const double g = (K - 1) * kU / (1 - (K - 1) * kU);
  const double rel = (1 + kU) * (1 + kU) / ((1 - g) * (1 - kU)) - 1 + 0x1p-40;
  const double c = static_cast<double>(1e-20f);
  for (int64_t t = 0; t < k.tokens; ++t) {
    double S = 0, W = 0;
    for (int64_t j = 0; j < K; ++j) {
      S += r.scores[t * k.c.n_routed + r.ids[t * K + j]];
      W += r.weights[t * K + j];
    }
    const double ideal = k.c.route_scale * S / (S + c);
    const double bound = ideal * rel + K * 0x1p-149 * k.c.route_scale;
    RC_ASSERT(std::fabs(W - ideal) <= bound);
  }
}

// Each renormalised weight is route_scale times its own *unbiased* score over the f32 sum of the
// picked scores plus 1e-20: w_j = R s_j (1+d1)(1+d2) / ((S~ + c)(1+d3)), so |w_j - R s_j / (S~ +
// c)| <= R s_j / (S~ + c) ((1+u)^2 / (1-u) - 1) with S~ the f32 sum itself (computed here the same
// way), plus 2^-149 R for a subnormal weight. The generator's biases (0.25, -0.125, 1/64 grid)
// are far above that: a weight formed from the key (score + bias) fails.
RC_GTEST_PROP(Routing, RenormalisedWeightsAreEachUnbiasedScoreOverTheSum, ()) {
  Case k = *gen_case();
  k.c.norm_topk_prob = true;
  if (k.c.topk == 1) k.c.topk = std::min<int64_t>(2, k.c.n_routed);
  RC_PRE(k.c.topk > 1);
  RC_LOG() << k << "\n";
  const Routing r = route(k);
  const int64_t K = k.c.topk, n = k.c.n_routed;
  const double rel = (1 + kU) * (1 + kU) / (1 - kU) - 1;
  for (int64_t t = 0; t < k.tokens; ++t) {
    float S = 0.0f;  // in pick order, as the rule sums
    for (int64_t j = 0; j < K; ++j) S += r.scores[t * n + r.ids[t * K + j]];
    const double den = static_cast<double>(S + 1e-20f);
    for (int64_t j = 0; j < K; ++j) {
      const double want =
          k.c.route_scale * static_cast<double>(r.scores[t * n + r.ids[t * K + j]]) / den;
      RC_LOG() << "token " << t << " pick " << j << ": got " << r.weights[t * K + j] << " want "
               << want << "\n";
      RC_ASSERT(std::fabs(r.weights[t * K + j] - want) <= want * rel + 0x1p-149 * k.c.route_scale);
    }
  }
}

// The +1e-20 where it matters: logits near -86 under sqrt-softplus give scores near e^-43 = 2e-19
// (exp stays normal in f32), so the picked scores sum to about 4e-19 and the 1e-20 moves every
// weight by about 2.5%, ten thousand times the rounding bound. Dropping it or adding it twice is
// caught; the expected weight uses the rule's own f32 scores and sum.
TEST(Routing, RenormalisationEpsilonIsAddedOnce_T1_E4_K2_logitsNearMinus86) {
  MoeConfig c;
  c.n_routed = 4;
  c.topk = 2;
  c.route_scale = 1.5f;
  std::vector<float> z = {-86.0f, -86.5f, -100.0f, -87.0f}, b = {0, 0, 0, 0};
  const Routing r = route_from_logits(z.data(), 1, b.data(), c, 0);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  const float S = r.scores[0] + r.scores[1];
  ASSERT_GT(S, 1e-19f);
  ASSERT_LT(S, 1e-18f);
  const double rel = (1 + kU) * (1 + kU) / (1 - kU) - 1;
  for (int j = 0; j < 2; ++j) {
    const double s = r.scores[r.ids[j]];
    const double once = 1.5 * s / static_cast<double>(S + 1e-20f);
    const double none = 1.5 * s / static_cast<double>(S),
                 twice = 1.5 * s / (static_cast<double>(S) + 2e-20);
    EXPECT_NEAR(r.weights[j], once, once * rel) << "pick " << j;
    // The test can tell the three apart: the alternatives sit far outside the bound.
    EXPECT_GT(std::fabs(none - once), 1000 * once * rel);
    EXPECT_GT(std::fabs(twice - once), 1000 * once * rel);
  }
}

TEST(Routing, WeightSumBoundIsTightEnoughToMeanSomething_K6) {
  // The bound above for k = 6: about 8 u, i.e. 4.8e-7 relative. A routing that forgot the
  // renormalisation (weights summing to R * S, S ~ 0.5..6 here) would be off by far more.
  const double g = 5 * kU / (1 - 5 * kU);
  const double rel = (1 + kU) * (1 + kU) / ((1 - g) * (1 - kU)) - 1;
  EXPECT_LT(rel, 8.01 * kU);
  EXPECT_GT(rel, 7.99 * kU);
}

// NaN in any logit or any bias (picked or not, any payload and sign) is an InputError naming the
// layer, token and expert.
RC_GTEST_PROP(Routing, NanKeyAnywhereIsAnInputErrorNamingLayerTokenExpert, ()) {
  Case k = *gen_case();
  const int64_t t = *rc::gen::inRange<int64_t>(0, k.tokens);
  const int64_t e = *rc::gen::inRange<int64_t>(0, k.c.n_routed);
  const bool in_bias = *rc::gen::arbitrary<bool>();
  const uint32_t payload = *rc::gen::inRange<uint32_t>(1, 0x800000);
  const uint32_t sign = *rc::gen::arbitrary<bool>() ? 0x80000000u : 0u;
  const float nan = bits_f32(sign | 0x7F800000u | payload);
  RC_ASSERT(std::isnan(nan));
  if (in_bias) k.bias[e] = nan;
  else k.logits[t * k.c.n_routed + e] = nan;
  RC_LOG() << k << " nan in " << (in_bias ? "bias" : "logit") << " t=" << t << " e=" << e << "\n";
  try {
    route(k);
    RC_FAIL("no InputError for a NaN routing key");
  } catch (const InputError& err) {
    const std::string m = err.what();
    const int64_t tok = in_bias ? 0 : t;  // a NaN bias already fails at the first token
    const std::string want = "layer " + std::to_string(k.layer) + " token " + std::to_string(tok) +
                             " expert " + std::to_string(e) + ": routing key is NaN";
    RC_LOG() << m << "\n";
    RC_ASSERT(m.find(want) != std::string::npos);
  }
}

TEST(Routing, NanMessageFormat_Layer3Token5Expert17) {
  MoeConfig c;
  c.n_routed = 32;
  c.topk = 4;
  std::vector<float> z(6 * 32, 0.5f), b(32, 0.1f);
  z[5 * 32 + 17] = std::numeric_limits<float>::quiet_NaN();
  try {
    route_from_logits(z.data(), 6, b.data(), c, 3);
    FAIL() << "no InputError";
  } catch (const InputError& err) {
    EXPECT_EQ(
        std::string(err.what()),
        "layer 3 token 5 expert 17: routing key is NaN (logit nan, score nan, bias 0.100000001)");
  }
}

TEST(Routing, TopkOutOfRangeIsAnInputError) {
  MoeConfig c;
  c.n_routed = 4;
  std::vector<float> z(4, 0.0f), b(4, 0.0f);
  for (int64_t k : {0, 5}) {
    c.topk = k;
    EXPECT_THROW(route_from_logits(z.data(), 1, b.data(), c, 7), InputError) << "topk " << k;
  }
}

// Score functions against f64 formulas evaluated on the same f32 z = logit / gate_temp (which
// also pins the division by gate_temp: the f32 quotient, rounded once). Tolerances, with glibc's
// expf and log1pf taken as within 2 ulp (relative 4u) each:
//  sqrtsoftplus: (4u + 4u) / 2 through the sqrt + u for the sqrt = 5u relative (the log1p of a
//    perturbed argument a(1+e) moves by <= e a/(1+a) <= e log1p(a)); torch's threshold above 20
//    adds < 1e-10 relative; exp underflow below z = -87 adds <= sqrt(2^-149) = 2^-74.5 absolute.
//  sigmoid: 4u through 1 + E, u for the add, u for the divide = 6u; exp(-z) overflow below
//    z = -88.7 leaves 0 where the truth is < 2^-127.
//  softmax: per term u |z - m| (the rounded subtraction) + 4u (exp); the sum adds the largest of
//    those plus g(n - 1); the division u. Terms below 2^-126 add 2^-148 absolute.
double score_f64(ScoreFunc f, double z) {
  if (f == ScoreFunc::kSqrtSoftplus)
    return std::sqrt(z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)));
  return 1.0 / (1.0 + std::exp(-z));
}

RC_GTEST_PROP(Routing, ScoresMatchF64FormulasWithinStatedBounds, ()) {
  Case k = *gen_case();
  // Add values around the softplus threshold, large magnitudes and tiny ones.
  for (float& z : k.logits)
    if (*rc::gen::inRange(0, 4) == 0)
      z = *rc::gen::element(20.0f, 19.99f, 20.01f, 40.0f, -90.0f, -120.0f, 89.0f, 1e-6f, -1e-30f,
                            0.0f);
  RC_LOG() << k << "\n";
  const Routing r = route(k);
  const int64_t n = k.c.n_routed;
  for (int64_t t = 0; t < k.tokens; ++t) {
    std::vector<float> zf(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) zf[e] = k.logits[t * n + e] / k.c.gate_temp;
    const float* s = r.scores.data() + t * n;
    if (k.c.score_func == ScoreFunc::kSoftmax) {
      double m = zf[0];
      for (float z : zf) m = std::max<double>(m, z);
      double sum = 0, worst = 0;
      for (float z : zf) {
        sum += std::exp(z - m);
        worst = std::max(worst, kU * std::fabs(z - m) + 4 * kU);
      }
      const double g = (n - 1) * kU / (1 - (n - 1) * kU);
      for (int64_t e = 0; e < n; ++e) {
        const double ref = std::exp(zf[e] - m) / sum;
        const double rel =
            (1 + kU * std::fabs(zf[e] - m) + 4 * kU) * (1 + kU) / ((1 - worst) * (1 - g)) - 1;
        RC_LOG() << "e=" << e << " z=" << zf[e] << " got " << s[e] << " ref " << ref << "\n";
        RC_ASSERT(std::fabs(s[e] - ref) <= rel * ref + 0x1p-148);
      }
    } else {
      const bool ssp = k.c.score_func == ScoreFunc::kSqrtSoftplus;
      for (int64_t e = 0; e < n; ++e) {
        const double ref = score_f64(k.c.score_func, zf[e]);
        const double tol = ssp ? (5 + 0.01) * kU * ref + 0x1p-74 : 6 * kU * ref + 0x1p-127;
        RC_LOG() << "e=" << e << " z=" << zf[e] << " got " << s[e] << " ref " << ref << "\n";
        RC_ASSERT(std::fabs(s[e] - ref) <= tol);
      }
    }
  }
}

TEST(Routing, SoftplusThresholdIsTorchs) {
  MoeConfig c;
  c.n_routed = 3;
  c.topk = 1;
  const float above = std::nextafter(20.0f, 30.0f);
  std::vector<float> z = {20.0f, above, 40.0f}, b(3, 0.0f);
  const Routing r = route_from_logits(z.data(), 1, b.data(), c, 0);
  EXPECT_EQ(r.scores[0], std::sqrt(std::log1p(std::exp(20.0f))));  // at 20: the log1p branch
  EXPECT_EQ(r.scores[1], std::sqrt(above));                        // above: z itself
  EXPECT_EQ(r.scores[2], std::sqrt(40.0f));
}

// gate_temp: routing logits / T equals routing the f32 quotients with T = 1, bit for bit.
RC_GTEST_PROP(Routing, GateTempDividesTheLogits, ()) {
  const Case k = *gen_case();
  RC_LOG() << k << "\n";
  Case q = k;
  q.c.gate_temp = 1.0f;
  for (float& z : q.logits) z /= k.c.gate_temp;
  const Routing a = route(k), b = route(q);
  RC_ASSERT(a.scores == b.scores);
  RC_ASSERT(a.ids == b.ids);
  RC_ASSERT(a.weights == b.weights);
}

// norm_topk_prob off, or topk == 1: the weights are the picked scores times route_scale, exactly.
RC_GTEST_PROP(Routing, UnnormalisedWeightsAreScaledScores, ()) {
  Case k = *gen_case();
  if (*rc::gen::arbitrary<bool>()) k.c.norm_topk_prob = false;
  else k.c.topk = 1;
  RC_LOG() << k << "\n";
  const Routing r = route(k);
  for (int64_t t = 0; t < k.tokens; ++t)
    for (int64_t j = 0; j < k.c.topk; ++j) {
      const int32_t e = r.ids[t * k.c.topk + j];
      RC_ASSERT(r.weights[t * k.c.topk + j] == r.scores[t * k.c.n_routed + e] * k.c.route_scale);
    }
}

TEST(Routing, HandComputedSqrtSoftplus_T1_E4_K2_scale1p5) {
  // z = (0, 1, -1, 2), bias (0, 0, 0, -1): keys s0, s1, s2, s3 - 1 -> picks 1, 0.
  MoeConfig c;
  c.n_routed = 4;
  c.topk = 2;
  c.route_scale = 1.5f;
  std::vector<float> z = {0, 1, -1, 2}, b = {0, 0, 0, -1};
  const Routing r = route_from_logits(z.data(), 1, b.data(), c, 0);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{1, 0}));
  const double s0 = std::sqrt(std::log(2.0)), s1 = std::sqrt(std::log1p(std::exp(1.0)));
  // Each score within 5u (ScoresMatch... above); the ratio s_i / (s0 + s1) then within
  // 5u + 5u + (k+2)u = 14u of the truth, first order; 16u leaves room for second-order terms.
  const double w0 = 1.5 * s1 / (s0 + s1), w1 = 1.5 * s0 / (s0 + s1);
  EXPECT_NEAR(r.weights[0], w0, 16 * kU * w0);
  EXPECT_NEAR(r.weights[1], w1, 16 * kU * w1);
}

}  // namespace
}  // namespace moecheck
