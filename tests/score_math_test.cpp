// The routing score functions (core/score_math.h) on the CPU: a strided accuracy sweep against
// long double (the full sweep is tests/slow/score_math_full_test.cpp), the limits and special
// values, and the f64 building blocks against long double. Contract: docs/numerics.md "Score
// functions". Host and device bits: tests/gpu/route_select_test.cu.
#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"
#include "core/routing.h"
#include "core/score_math.h"
#include "tests/score_math_sweep.h"

namespace moecheck {
namespace {

TEST(ScoreMath, SoftplusStridedSweepWithinHalfUlpPlus2e9) {
  const scoretest::Sweep r = scoretest::sweep<0>(4099);
  scoretest::print("psoftplus (stride 4099)", r);
  EXPECT_GT(r.n, 500000u);
  EXPECT_LE(r.worst, 0.5 + 2e-9) << "at z = " << r.at;
  EXPECT_LE(r.misrounded, 1u);
}

TEST(ScoreMath, SigmoidStridedSweepWithinHalfUlpPlus2e9) {
  const scoretest::Sweep r = scoretest::sweep<1>(4099);
  scoretest::print("psigmoid (stride 4099)", r);
  EXPECT_GT(r.n, 500000u);
  EXPECT_LE(r.worst, 0.5 + 2e-9) << "at z = " << r.at;
  EXPECT_LE(r.misrounded, 1u);
}

TEST(ScoreMath, LimitsAndSpecialValues) {
  const float nan = std::nanf("");
  EXPECT_EQ(f32_bits(psoftplus(nan)), 0x7FFFFFFFu);  // the canonical NaN, as the device's
  EXPECT_EQ(f32_bits(psigmoid(-nan)), 0x7FFFFFFFu);
  EXPECT_EQ(psoftplus(INFINITY), INFINITY);
  EXPECT_EQ(f32_bits(psoftplus(-INFINITY)), 0u);
  EXPECT_EQ(psigmoid(INFINITY), 1.0f);
  EXPECT_EQ(f32_bits(psigmoid(-INFINITY)), 0u);
  // torch's threshold: z itself above 20, the formula at 20.
  EXPECT_EQ(psoftplus(20.000002f), 20.000002f);
  EXPECT_EQ(psoftplus(20.0f), static_cast<float>(log1pl(expl(20.0L))));
  EXPECT_EQ(psoftplus(0.0f), static_cast<float>(logl(2.0L)));
  EXPECT_EQ(psigmoid(0.0f), 0.5f);
  // Below -104 the exact values are under 2^-150 (round to +0); just above, a subnormal.
  EXPECT_EQ(f32_bits(psoftplus(-104.5f)), 0u);
  EXPECT_EQ(psoftplus(-100.0f), static_cast<float>(expl(-100.0L)));
  EXPECT_EQ(psigmoid(-100.0f), static_cast<float>(expl(-100.0L)));
  EXPECT_EQ(psigmoid(17.0f), static_cast<float>(1.0L / (1.0L + expl(-17.0L))));
  EXPECT_EQ(psigmoid(18.0f), 1.0f);
  EXPECT_EQ(psqrt_softplus(3.0f), sqrt_rn(psoftplus(3.0f)));
}

// pexp_f64 and plog1p_f64 within 4 f64 ulp (2^-50 relative) of long double over their ranges.
TEST(ScoreMath, F64BuildingBlocksWithin4Ulp) {
  double worst_exp = 0, worst_log = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double z = -110.0 + 220.0 * i / 200000.0;
    const long double e = expl(static_cast<long double>(z));
    worst_exp = std::max(worst_exp, static_cast<double>(fabsl((pexp_f64(z) - e) / e)));
    const double y = std::ldexp(1.0 + i / 200000.0, i % 160 - 80);
    const long double l = log1pl(static_cast<long double>(y));
    worst_log = std::max(worst_log, static_cast<double>(fabsl((plog1p_f64(y) - l) / l)));
  }
  std::printf("pexp_f64 max rel error %.3g, plog1p_f64 %.3g\n", worst_exp, worst_log);
  EXPECT_LE(worst_exp, 0x1p-50);
  EXPECT_LE(worst_log, 0x1p-50);
}

// Routing's scores are these functions: score_one and route_from_logits agree with them.
TEST(ScoreMath, RoutingScoresAreTheProjectFunctions) {
  MoeConfig c;
  c.n_routed = 4;
  c.topk = 2;
  c.gate_temp = 0.75f;
  for (float z : {-30.0f, -1.5f, 0.0f, 0.3f, 7.0f, 19.0f, 25.0f}) {
    c.score_func = ScoreFunc::kSqrtSoftplus;
    EXPECT_EQ(f32_bits(score_one(z, c)), f32_bits(psqrt_softplus(div_rn(z, 0.75f)))) << z;
    c.score_func = ScoreFunc::kSigmoid;
    EXPECT_EQ(f32_bits(score_one(z, c)), f32_bits(psigmoid(div_rn(z, 0.75f)))) << z;
  }
}

}  // namespace
}  // namespace moecheck
