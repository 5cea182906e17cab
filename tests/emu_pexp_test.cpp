// pexp (emulate/portable_math.h) against exp in double: special values and a strided sweep over
// f32 bit patterns in [-104, 88.7228]. Bound (docs/numerics.md "pexp"): P_exp = 1 ulp of the
// exact result (ulp of 2^-149 below the normal range). The full sweep is tests/slow/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "core/portable_math.h"
#include "tests/emu_pexp_sweep.h"

namespace moecheck {
namespace {

TEST(EmuPexp, SpecialValues) {
  EXPECT_TRUE(std::isnan(pexp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(pexp(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(f32_bits(pexp(std::numeric_limits<float>::infinity())), 0x7F800000u);
  EXPECT_EQ(f32_bits(pexp(-std::numeric_limits<float>::infinity())), 0u);
  EXPECT_EQ(pexp(0.0f), 1.0f);
  EXPECT_EQ(pexp(-0.0f), 1.0f);
  EXPECT_EQ(f32_bits(pexp(kPexpOverflow)), 0x7F800000u);
  // The last finite input stays finite (2^128 is built as 2^64 * 2^64 after the polynomial).
  const float last = bits_f32(f32_bits(kPexpOverflow) - 1);
  EXPECT_TRUE(std::isfinite(pexp(last)));
  EXPECT_EQ(pexp(-104.0f), 0.0f);
  EXPECT_EQ(pexp(-200.0f), 0.0f);
  // Smallest subnormal: e^x = 2^-149 at x = -149 ln 2 = -103.2789.
  EXPECT_EQ(f32_bits(pexp(-103.2789f)), 1u);
}

TEST(EmuPexp, StridedSweepWithinOneUlp) {
  // Stride 4099 (prime) over all patterns: ~546,000 inputs, both signs.
  const emutest::SweepResult r = emutest::sweep_pexp(4099);
  emutest::print_sweep("strided sweep", r);
  EXPECT_GT(r.n, 500000u);
  EXPECT_LE(r.worst_normal, 1.0) << "at x = " << r.x_normal;
  EXPECT_LE(r.worst_subnormal, 1.0) << "at x = " << r.x_subnormal;
}

TEST(EmuPexp, SwigluClampAndSigns) {
  // L = 10: g clamps from above only, u on both sides; silu(10) * 10.
  const float h = swiglu(50.0f, -50.0f, 10.0f);
  const double s10 = 10.0 / (1.0 + std::exp(-10.0));
  EXPECT_NEAR(h, -10.0 * s10, 4 * emutest_ulp(static_cast<float>(10.0 * s10)));
  EXPECT_EQ(swiglu(-50.0f, 3.0f, 10.0f), swiglu(-50.0f, 3.0f, 0.0f));  // no lower clamp on g
  EXPECT_NE(swiglu(2.0f, 50.0f, 10.0f), swiglu(2.0f, 50.0f, 0.0f));    // L <= 0: no clamp
  EXPECT_TRUE(std::isnan(swiglu(std::nanf(""), 1.0f, 10.0f)));
  EXPECT_TRUE(std::isnan(swiglu(1.0f, std::nanf(""), 10.0f)));
  EXPECT_EQ(f32_bits(swiglu(-200.0f, 1.0f, 10.0f)), 0x80000000u);  // exp overflows: -0
}

}  // namespace
}  // namespace moecheck
