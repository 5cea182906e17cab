// The Eigen reference (reference/moe.h): hand-computed tiny layers (bf16 rounding points, the
// clamps), taps, batch invariance, shape errors, the one-rounding f64 -> bf16 and the f64 routing
// twin. Model vs Exact within the derived bound: tests/reference_bound_test.cpp.
// Repro: RC_PARAMS="seed=..." build/tests/reference_test --gtest_filter='Reference*'.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "golden/generator.h"
#include "reference/moe.h"
#include "tests/reference_layer.h"

namespace moecheck {
namespace {

using namespace reftest;
using ref::MoE;
using ref::Precision;

// ---- A hand-computed layer: dim 256, inter 256, 2 experts, both picked; x = 1. Every weight
// matrix is constant (W = a / 256), so each Linear output is a * (sum of x) / 256 with all partial
// sums exact in f32 in any order, and the whole layer is a short formula written out below in
// model.py's f32 / bf16 steps.
struct HandLayer {
  OwnedLayer L;
  float a[2] = {12.0f, 2.5f}, b[2] = {-15.0f, 3.0f}, cc[2] = {3.0f, -1.25f};  // gate, up, down
  float as = 1.0f, bs = -2.0f, cs = 0.75f;                                    // shared
  float z[2] = {1.0f, -0.5f};                                                 // router logits
};

HandLayer hand_layer(float limit, bool nan_up1 = false) {
  HandLayer H;
  MoeConfig& c = H.L.c;
  c.dim = 256;
  c.inter = 256;
  c.n_routed = 2;
  c.topk = 2;
  c.route_scale = 1.5f;
  c.swiglu_limit = limit;
  const int64_t n = 256 * 256;
  auto fill = [&](float v0, float v1) {
    std::vector<float> m(static_cast<size_t>(2 * n));
    std::fill(m.begin(), m.begin() + n, v0 / 256);
    std::fill(m.begin() + n, m.end(), v1 / 256);
    return m;
  };
  H.L.exp_gu = H.L.exp_down = GgmlType::kF32;
  H.L.gate = encode(GgmlType::kF32, fill(H.a[0], H.a[1]), 512, 256);
  auto upm = fill(H.b[0], H.b[1]);
  if (nan_up1) upm[n] = std::numeric_limits<float>::quiet_NaN();  // expert 1, row 0
  H.L.up = encode(GgmlType::kF32, upm, 512, 256);
  H.L.down = encode(GgmlType::kF32, fill(H.cc[0], H.cc[1]), 512, 256);
  H.L.sgate = encode(GgmlType::kBF16, std::vector<float>(n, H.as / 256), 256, 256);
  H.L.sup = encode(GgmlType::kBF16, std::vector<float>(n, H.bs / 256), 256, 256);
  H.L.sdown = encode(GgmlType::kBF16, std::vector<float>(n, H.cs / 256), 256, 256);
  for (int e = 0; e < 2; ++e)
    for (int k = 0; k < 256; ++k) H.L.router.push_back(f32_to_bf16(H.z[e] / 256));
  H.L.bias = {0.0f, 0.0f};
  return H;
}

float silu_f32(float g) { return g / (1.0f + std::exp(-g)); }

TEST(ReferenceHand, ModelModeFollowsModelPyStepByStep_T1_E2_K2_dim256_L10) {
  const HandLayer H = hand_layer(10.0f);
  const LayerWeights w = H.L.view();
  const std::vector<uint16_t> x(256, f32_to_bf16(1.0f));
  LayerTaps tp;
  const std::vector<uint16_t> y = MoE(w, Precision::kModel).forward(x.data(), 1, &tp);
  // Gate.forward: sqrt(softplus(z)), both picked in key order, sum in pick order + 1e-20, * 1.5.
  float s[2], wgt[2];
  for (int e = 0; e < 2; ++e) s[e] = std::sqrt(std::log1p(std::exp(H.z[e])));
  float sum = 0.0f;
  sum += s[0];
  sum += s[1];
  sum += 1e-20f;
  for (int e = 0; e < 2; ++e) wgt[e] = s[e] / sum * 1.5f;
  ASSERT_EQ(tp.topk_ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(tp.topk_weights, (std::vector<float>{wgt[0], wgt[1]}));
  // Expert.forward per expert: gate 12 clamps to 10 from above, up -15 clamps to -10; expert 1
  // (2.5, 3) is inside the limits; h = weight * silu * up in f32, then bf16; w2 sums 256 equal
  // terms exactly; the output rounds to bf16.
  float d[2];
  for (int e = 0; e < 2; ++e) {
    const float g = std::min(H.a[e], 10.0f), u = std::max(std::min(H.b[e], 10.0f), -10.0f);
    const float h = wgt[e] * (silu_f32(g) * u);
    ASSERT_EQ(tp.experts.size(), 2u);
    EXPECT_EQ(tp.experts[e].gate[7], H.a[e]) << "gate tap is w1(x), before the clamp";
    EXPECT_EQ(tp.experts[e].up[7], H.b[e]) << "up tap is w3(x), before the clamp";
    EXPECT_EQ(tp.experts[e].h[7], h) << "expert " << e;
    d[e] = round_bf16(H.cc[e] * round_bf16(h));
    EXPECT_EQ(tp.experts[e].down[3], d[e]) << "expert " << e;
  }
  const float hs = round_bf16(silu_f32(H.as) * H.bs);  // shared: no weight, no clamp needed
  const float ds = round_bf16(H.cs * hs);
  float acc = 0.0f;
  acc += d[0];
  acc += d[1];
  acc += ds;
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], f32_to_bf16(acc)) << "element " << i;
}

TEST(ReferenceHand, ExactModeIsTheFormulaInF64_T1_E2_K2_dim256_L10) {
  const HandLayer H = hand_layer(10.0f);
  const LayerWeights w = H.L.view();
  const std::vector<uint16_t> x(256, f32_to_bf16(1.0f));
  const std::vector<double> y = MoE(w, Precision::kExact).forward_exact(x.data(), 1);
  double s[2], terms[3];
  for (int e = 0; e < 2; ++e) s[e] = std::sqrt(std::log1p(std::exp(double(H.z[e]))));
  auto silu = [](double g) { return g / (1 + std::exp(-g)); };
  for (int e = 0; e < 2; ++e) {
    const double wt = 1.5 * s[e] / (s[0] + s[1] + 1e-20);
    const double g = std::min<double>(H.a[e], 10),
                 u = std::max<double>(std::min<double>(H.b[e], 10), -10);
    terms[e] = H.cc[e] * wt * silu(g) * u;
  }
  terms[2] = H.cs * silu(H.as) * H.bs;
  const double want = terms[0] + terms[1] + terms[2];
  // About 30 f64 operations per term (libm's exp / log1p within 1 ulp) and 256-term sums:
  // 2^-40 of the sum of |terms| is above all of them.
  const double bound = 0x1p-40 * (std::fabs(terms[0]) + std::fabs(terms[1]) + std::fabs(terms[2]));
  for (int i = 0; i < 256; ++i) ASSERT_NEAR(y[i], want, bound) << "element " << i;
}

TEST(ReferenceHand, ClampKeepsNanAndLimitZeroMeansNoClamp_T1_E2_K2_dim256) {
  {  // NaN in expert 1's up row 0: torch.clamp keeps it.
    const HandLayer H = hand_layer(10.0f, true);
    const LayerWeights w = H.L.view();
    const std::vector<uint16_t> x(256, f32_to_bf16(1.0f));
    LayerTaps tp;
    MoE(w, Precision::kModel).forward(x.data(), 1, &tp);
    EXPECT_TRUE(std::isnan(tp.experts[1].h[0]));
    EXPECT_FALSE(std::isnan(tp.experts[1].h[1]));
  }
  {  // swiglu_limit 0: gate 12 and up -15 pass unclamped.
    const HandLayer H = hand_layer(0.0f);
    const LayerWeights w = H.L.view();
    const std::vector<uint16_t> x(256, f32_to_bf16(1.0f));
    LayerTaps tp;
    MoE(w, Precision::kModel).forward(x.data(), 1, &tp);
    const float w0 = tp.topk_weights[0];
    EXPECT_EQ(tp.experts[0].h[0], w0 * (silu_f32(12.0f) * -15.0f));
  }
}

// ---- Rounding points, taps, batch invariance, errors.
bool is_bf16(float v) { return std::isnan(v) || round_bf16(v) == v; }

TEST(Reference, ModelModeRoundsWhereModelPyRounds_T8_E16_K4_dim512_seed7) {
  const MoeConfig c = small_config(ScoreFunc::kSqrtSoftplus);
  const OwnedLayer L = random_layer(c, 7, 3.0f, GgmlType::kBF16);
  const LayerWeights w = L.view();
  const std::vector<uint16_t> x = random_x(77, 8 * c.dim);
  LayerTaps tp;
  const std::vector<uint16_t> y = MoE(w, Precision::kModel).forward(x.data(), 8, &tp);
  EXPECT_EQ(tp.input, x);
  EXPECT_EQ(tp.output, y);
  ASSERT_EQ(tp.acc.size(), y.size());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_EQ(y[i], f32_to_bf16(tp.acc[i])) << "type_as(x) at " << i;
  int h_not_bf16 = 0;
  std::vector<const ExpertTaps*> all = {&tp.shared};
  for (const auto& e : tp.experts) all.push_back(&e);
  for (const ExpertTaps* e : all) {
    for (float v : e->gate)
      ASSERT_TRUE(is_bf16(v)) << "w1 output of expert " << e->expert << " not bf16";
    for (float v : e->up) ASSERT_TRUE(is_bf16(v)) << "w3 output of expert " << e->expert;
    for (float v : e->down) ASSERT_TRUE(is_bf16(v)) << "w2 output of expert " << e->expert;
    for (float v : e->h) h_not_bf16 += !is_bf16(v);
  }
  // h is tapped before x.to(dtype): most values carry more than 8 significant bits.
  EXPECT_GT(h_not_bf16, 1000);
  // Taps layout: experts ascending, each with its tokens ascending and one weight per token.
  for (size_t i = 1; i < tp.experts.size(); ++i)
    EXPECT_LT(tp.experts[i - 1].expert, tp.experts[i].expert);
  for (const auto& e : tp.experts) {
    EXPECT_TRUE(std::is_sorted(e.tokens.begin(), e.tokens.end()));
    EXPECT_EQ(e.weights.size(), e.tokens.size());
    EXPECT_EQ(e.gate.size(), e.tokens.size() * c.inter);
    EXPECT_EQ(e.down.size(), e.tokens.size() * c.dim);
  }
  EXPECT_EQ(tp.shared.expert, -1);
  EXPECT_EQ(tp.shared.tokens.size(), 8u);
}

// A token's result does not depend on the other tokens of the batch (one GEMV per token).
TEST(Reference, BatchInvariant_T8_E16_K4_dim512_seed8) {
  const MoeConfig c = small_config(ScoreFunc::kSigmoid);
  const OwnedLayer L = random_layer(c, 8, 3.0f, GgmlType::kQ2K);
  const LayerWeights w = L.view();
  const std::vector<uint16_t> x = random_x(88, 8 * c.dim);
  for (Precision p : {Precision::kModel, Precision::kExact}) {
    const MoE moe(w, p);
    const std::vector<double> all = moe.forward_exact(x.data(), 8);
    for (int64_t t = 0; t < 8; ++t) {
      const std::vector<double> one = moe.forward_exact(x.data() + t * c.dim, 1);
      for (int64_t i = 0; i < c.dim; ++i)
        ASSERT_EQ(one[i], all[t * c.dim + i]) << "token " << t << " element " << i << " precision "
                                              << (p == Precision::kModel ? "model" : "exact");
    }
  }
}

TEST(Reference, WrongShapeIsAnInputErrorNamingTheTensor) {
  const MoeConfig c = small_config(ScoreFunc::kSqrtSoftplus);
  const OwnedLayer L = random_layer(c, 9, 1.0f, GgmlType::kBF16);
  LayerWeights w = L.view();
  w.down_exps.rows = c.inter;
  try {
    MoE moe(w, Precision::kModel);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "layer 1: tensor blk.1.ffn_down_exps.weight: expected 16 experts of [512, 256]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reference, NanInputIsARoutingInputError) {
  const MoeConfig c = small_config(ScoreFunc::kSqrtSoftplus);
  const OwnedLayer L = random_layer(c, 10, 1.0f, GgmlType::kBF16);
  const LayerWeights w = L.view();
  std::vector<uint16_t> x = random_x(100, 3 * c.dim);
  x[2 * c.dim + 17] = 0x7FC0;  // bf16 NaN in token 2
  for (Precision p : {Precision::kModel, Precision::kExact}) {
    try {
      MoE(w, p).forward(x.data(), 3);
      FAIL() << "no InputError";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1 token 2 expert 0: routing key is NaN"),
                std::string::npos)
          << e.what();
    }
  }
}

// ---- f64 -> bf16 with one rounding, against nearest-by-distance between the two neighbours.
RC_GTEST_PROP(Reference, F64ToBf16RoundsOnce, ()) {
  // Around a random finite bf16 value: exactly on it, on the midpoint to the next one, and off
  // the midpoint by tiny amounts that an f32 detour would lose (the double-rounding trap).
  const uint16_t lo = *rc::gen::inRange<uint16_t>(0, 0x7F7F);
  const double a = bf16_to_f32(lo), b = bf16_to_f32(static_cast<uint16_t>(lo + 1));
  const double mid = a + (b - a) / 2;
  const int which = *rc::gen::inRange(0, 5);
  const double off = std::ldexp(b - a, -*rc::gen::inRange(17, 40));
  double v = which == 0   ? a
             : which == 1 ? mid
             : which == 2 ? mid + off
             : which == 3 ? mid - off
                          : a + (b - a) * 0.3;
  const bool neg = *rc::gen::arbitrary<bool>();
  uint16_t want;
  if (v - a < b - v) want = lo;
  else if (b - v < v - a) want = static_cast<uint16_t>(lo + 1);
  else want = (lo & 1) ? static_cast<uint16_t>(lo + 1) : lo;
  if (neg) {
    v = -v;
    want |= 0x8000;
  }
  RC_LOG() << "v=" << v << " lo=0x" << std::hex << lo << "\n";
  RC_ASSERT(ref::f64_to_bf16(v) == want);
}

TEST(Reference, F64ToBf16Specials) {
  EXPECT_EQ(ref::f64_to_bf16(1.0 + 0x1p-8 + 0x1p-40),
            0x3F81);                                  // f32 would round to the tie, then to 1.0
  EXPECT_EQ(ref::f64_to_bf16(1.0 + 0x1p-8), 0x3F80);  // a true tie: to even
  EXPECT_EQ(ref::f64_to_bf16(1e300), 0x7F80);
  EXPECT_EQ(ref::f64_to_bf16(-1e300), 0xFF80);
  EXPECT_EQ(ref::f64_to_bf16(3.3962e38), 0x7F80);  // above the max-to-Inf midpoint 3.39617753e38
  EXPECT_EQ(ref::f64_to_bf16(3.3961e38), 0x7F7F);  // below it: the largest finite bf16
  EXPECT_EQ(ref::f64_to_bf16(0x1p-140), 0x0000 | 0x0000);  // below half the smallest subnormal: 0
  EXPECT_EQ(ref::f64_to_bf16(0x1p-133), 0x0001);
  EXPECT_TRUE(std::isnan(bf16_to_f32(ref::f64_to_bf16(std::nan("")))));
}

// ---- The f64 routing twin picks what the f32 rule picks when keys are far apart or exactly
// tied (logits on a 1/8 grid, zero bias: distinct logits give scores at least ~1e-4 apart,
// far above the f32 rule's ~1e-6 error; equal logits tie exactly in both), and its weights agree
// within routing_test's f32 error bounds (5u / 6u per score, (k + 2) u for the renormalisation).
RC_GTEST_PROP(Reference, ExactRoutingTwinAgreesWithTheF32Rule, ()) {
  MoeConfig c;
  c.n_routed = *rc::gen::inRange<int64_t>(1, 40);
  c.topk = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(c.n_routed, 8) + 1);
  c.score_func =
      *rc::gen::element(ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax);
  c.norm_topk_prob = *rc::gen::arbitrary<bool>();
  c.route_scale = 1.5f;
  std::vector<float> z(static_cast<size_t>(c.n_routed)), bias(z.size(), 0.0f);
  for (float& v : z) v = static_cast<float>(*rc::gen::inRange(-40, 41)) / 8.0f;
  std::vector<double> zd(z.begin(), z.end());
  const Routing r = route_from_logits(z.data(), 1, bias.data(), c, 0);
  const ref::ExactRouting x = ref::route_from_logits_exact(zd.data(), 1, bias.data(), c, 0);
  RC_ASSERT(r.ids == x.ids);
  // softmax: |z - m| <= 10 and n - 1 <= 39 summands: eval <= (10 + 4 + 39 + 1) u, call it 60u.
  const double es = c.score_func == ScoreFunc::kSoftmax   ? 60 * kU
                    : c.score_func == ScoreFunc::kSigmoid ? 6 * kU
                                                          : 5.01 * kU;
  const double rw = c.norm_topk_prob && c.topk > 1
                        ? (1 + es) * (1 + kU) * (1 + kU) /
                                  (1 - ((1 + es) * (1 + gam(c.topk - 1)) * (1 + kU) - 1)) -
                              1
                        : (1 + es) * (1 + kU) - 1;
  for (int64_t j = 0; j < c.topk; ++j)
    RC_ASSERT(std::fabs(r.weights[j] - x.weights[j]) <= rw * x.weights[j] + 0x1p-126);
}

// The Exact twin's +1e-20, where it matters (logits near -86 under sqrt-softplus: the picked
// scores sum to about 4e-19): each weight is R s / (S + 1e-20) in f64 on its own f64 scores.
TEST(Reference, ExactRoutingAddsTheEpsilonOnce_T1_E4_K2_logitsNearMinus86) {
  MoeConfig c;
  c.n_routed = 4;
  c.topk = 2;
  c.route_scale = 1.5f;
  const std::vector<double> z = {-86.0, -86.5, -100.0, -87.0};
  const std::vector<float> bias(4, 0.0f);
  const ref::ExactRouting x = ref::route_from_logits_exact(z.data(), 1, bias.data(), c, 0);
  ASSERT_EQ(x.ids, (std::vector<int32_t>{0, 1}));
  const double s0 = std::sqrt(std::log1p(std::exp(-86.0))),
               s1 = std::sqrt(std::log1p(std::exp(-86.5)));
  EXPECT_NEAR(x.scores[0], s0, 1e-15 * s0);
  const double S = s0 + s1;
  for (int j = 0; j < 2; ++j) {
    const double s = j == 0 ? s0 : s1, want = 1.5 * s / (S + 1e-20);
    EXPECT_NEAR(x.weights[j], want, 1e-14 * want) << "pick " << j;
    EXPECT_GT(std::fabs(1.5 * s / S - want), 1e-3 * want) << "the epsilon is visible here";
  }
}

// model.py MoE.forward(x, image_mask): the Gate selects the image-span tokens' experts with
// bias_vl. Model mode's picks and weights are route_from_logits of its own logits with the mask,
// Exact mode's route_from_logits_exact of its f64 logits; unmasked tokens route and compute as
// with no mask, and the generator's bias_vl moves some masked token's picks (so the test can
// fail). Repro: reference_test --gtest_filter='Reference.ImageMask*'.
TEST(Reference, ImageMaskRoutesImageTokensWithBiasVl_tiny_vision_T12_seed5) {
  GenOptions o = preset_options("tiny");
  o.vision = true;
  const LayerWeights w = generate_layer(o, 0);
  const int64_t T = 12, K = w.config.topk, dim = w.config.dim;
  const std::vector<uint16_t> x = generate_input(5, T, dim);
  const std::vector<uint8_t> mask = {1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1};
  const RouteBias rb{w.bias, w.bias_vl, mask.data()};
  for (Precision p : {Precision::kModel, Precision::kExact}) {
    const std::string cfg = p == Precision::kModel ? "model" : "exact";
    LayerTaps tm, t0;
    const std::vector<uint16_t> ym = MoE(w, p).forward(x.data(), T, &tm, mask.data());
    const std::vector<uint16_t> y0 = MoE(w, p).forward(x.data(), T, &t0);
    EXPECT_EQ(tm.image_mask, mask) << cfg;
    EXPECT_TRUE(t0.image_mask.empty()) << cfg;
    if (p == Precision::kModel) {
      const Routing want = route_from_logits(tm.router_logits.data(), T, rb, w.config, 0);
      EXPECT_EQ(tm.topk_ids, want.ids) << cfg;
      for (size_t i = 0; i < want.weights.size(); ++i)
        EXPECT_EQ(f32_bits(tm.topk_weights[i]), f32_bits(want.weights[i])) << cfg << " " << i;
    } else {
      const std::vector<double> z = ref::Gate(w).logits_exact(x.data(), T);
      EXPECT_EQ(tm.topk_ids, ref::route_from_logits_exact(z.data(), T, rb, w.config, 0).ids);
    }
    int changed = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool same_picks =
          std::equal(tm.topk_ids.begin() + t * K, tm.topk_ids.begin() + (t + 1) * K,
                     t0.topk_ids.begin() + t * K);
      const bool same_out = std::memcmp(ym.data() + t * dim, y0.data() + t * dim, 2 * dim) == 0;
      if (mask[t] == 0) {
        EXPECT_TRUE(same_picks && same_out) << cfg << " token " << t << " (not masked) changed";
      } else {
        changed += !same_picks;
      }
    }
    EXPECT_GT(changed, 0) << cfg << ": bias_vl moved no masked token's picks (vacuous)";
  }
}

}  // namespace
}  // namespace moecheck
