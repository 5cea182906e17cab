// emu::quantize_q8_1 (docs/numerics.md "quantize_q8_1"): zero, NaN / Inf and underflowing blocks,
// ties to even on exact .5 quotients, the subnormal clamp, and the derived step bound
// |x_i - q_i d16| <= d/2 + 128 u d + 127 |d - d16| + max(0, amax - 127 d) as a property.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

using emu::quantize_block_q8_1;

void expect_zero_block(const BlockQ8_1& b, uint16_t ds) {
  EXPECT_EQ(b.d, ds);
  EXPECT_EQ(b.s, ds);
  for (int i = 0; i < kQK8_1; ++i) EXPECT_EQ(b.qs[i], 0) << "i = " << i;
}

TEST(EmuQuantizeQ8_1, AllZeroAndSignedZero) {
  std::vector<float> x(32, 0.0f);
  for (int i = 0; i < 32; i += 3) x[i] = -0.0f;
  expect_zero_block(quantize_block_q8_1(x.data()), 0);
}

TEST(EmuQuantizeQ8_1, NaNOrInfPoisonsTheBlock) {
  const float bad[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float v : bad) {
    for (int pos : {0, 17, 31}) {
      emutest::Gen g(static_cast<uint64_t>(pos));
      std::vector<float> x = g.f32(32, 1.0);
      x[pos] = v;
      SCOPED_TRACE("value " + std::to_string(v) + " at " + std::to_string(pos));
      expect_zero_block(quantize_block_q8_1(x.data()), 0x7E00);
    }
  }
}

TEST(EmuQuantizeQ8_1, TiesRoundToEven) {
  // amax = 127 makes d = 1 exactly, so x / d is x itself: every .5 is an exact tie.
  std::vector<float> x(32, 0.0f);
  const float in[] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f, -1.5f, 126.5f, -126.5f};
  const int want[] = {127, 2, 4, -2, -4, 0, 2, 0, -2, 126, -126};
  for (int i = 0; i < 11; ++i) x[i] = in[i];
  BlockQ8_1 b = quantize_block_q8_1(x.data());
  EXPECT_EQ(f16_to_f32(b.d), 1.0f);
  int sum = 0;
  for (int i = 0; i < 11; ++i) {
    EXPECT_EQ(b.qs[i], want[i]) << "x = " << in[i];
    sum += want[i];
  }
  EXPECT_EQ(f16_to_f32(b.s), static_cast<float>(sum));
  // amax = 63.5: d = 0.5, x = 1.25 -> 2.5 -> 2, x = 1.75 -> 3.5 -> 4.
  std::vector<float> y(32, 0.0f);
  y[0] = 63.5f;
  y[1] = 1.25f;
  y[2] = 1.75f;
  y[3] = -1.25f;
  b = quantize_block_q8_1(y.data());
  EXPECT_EQ(f16_to_f32(b.d), 0.5f);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 4);
  EXPECT_EQ(b.qs[3], -2);
}

TEST(EmuQuantizeQ8_1, SubnormalInputs) {
  const float t = std::numeric_limits<float>::denorm_min();  // 2^-149
  std::vector<float> x(32, 0.0f);
  x[0] = 10 * t;  // amax / 127 underflows to 0: the all-zero block (Changes, 1)
  x[1] = -3 * t;
  expect_zero_block(quantize_block_q8_1(x.data()), 0);
  x[0] = 200 * t;  // d = rn(1.57) 2^-149 = 2 * 2^-149: quotient 100, no clamp
  BlockQ8_1 b = quantize_block_q8_1(x.data());
  EXPECT_EQ(b.qs[0], 100);
  EXPECT_EQ(b.qs[1], -2);  // -3 / 2 = -1.5 -> -2 (tie to even)
  EXPECT_EQ(b.d, 0);       // d = 2^-148 is far below f16's 2^-24: d16 = 0
  x[0] = 190 * t;          // d = rn(1.496) 2^-149 = 2^-149: quotient 190 clamps to 127
  b = quantize_block_q8_1(x.data());
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], -3);
  const double bound = emutest::q8_block_bound(x.data());
  EXPECT_LE(std::fabs(190.0 * t - 0.0), bound);  // d16 = 0: the whole value is the error
}

TEST(EmuQuantizeQ8_1, RowsAreBlockwise) {
  emutest::Gen g(7);
  const int64_t R = 3, K = 256;
  const std::vector<float> x = g.f32(R * K, 2.0);
  std::vector<BlockQ8_1> y(static_cast<size_t>(R * K / 32));
  emu::quantize_q8_1(x.data(), y.data(), R, K);
  for (int64_t i = 0; i < R * K / 32; ++i) {
    const BlockQ8_1 b = quantize_block_q8_1(x.data() + i * 32);
    EXPECT_EQ(std::memcmp(&b, &y[i], sizeof b), 0) << "block " << i;
  }
  EXPECT_THROW(emu::quantize_q8_1(x.data(), y.data(), 1, 48), InputError);
}

// For every scale from 1e-30 to 1e4 the stored block reproduces x within the step bound, quants
// stay in [-127, 127], and s = f16(d * sum q).
// The bf16 form widens exactly, then quantises: the same bytes as the f32 form on the widened
// values.
TEST(EmuQuantizeQ8_1, Bf16FormEqualsF32FormOnWidenedValues) {
  emutest::Gen g(53);
  const int64_t R = 3, K = 256;
  std::vector<uint16_t> xb = g.bf16(R * K, 2.0);
  xb[5] = 0x7FC0;   // NaN poisons its block in both forms
  xb[40] = 0x0001;  // subnormal bf16
  std::vector<float> xf(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_f32(xb[i]);
  std::vector<BlockQ8_1> a(static_cast<size_t>(R * K / 32)), b(a.size());
  emu::quantize_q8_1_bf16(xb.data(), a.data(), R, K);
  emu::quantize_q8_1(xf.data(), b.data(), R, K);
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_1)), 0);
  EXPECT_THROW(emu::quantize_q8_1_bf16(xb.data(), a.data(), 1, 48), InputError);
}

RC_GTEST_PROP(EmuQuantizeQ8_1, StepBoundHolds, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const int e10 = *rc::gen::inRange(-30, 5);
  emutest::Gen g(seed);
  std::vector<float> x = g.f32(32, std::pow(10.0, e10));
  if (*rc::gen::inRange(0, 4) == 0) x[g.u32() % 32] = 0.0f;
  const BlockQ8_1 b = quantize_block_q8_1(x.data());
  const double d16 = f16_to_f32(b.d), bound = emutest::q8_block_bound(x.data());
  int sum = 0;
  for (int i = 0; i < 32; ++i) {
    RC_ASSERT(b.qs[i] >= -127);
    RC_ASSERT(b.qs[i] <= 127);
    sum += b.qs[i];
    const double err = std::fabs(static_cast<double>(x[i]) - b.qs[i] * d16);
    if (!(err <= bound))
      RC_FAIL("seed " + std::to_string(seed) + " scale 1e" + std::to_string(e10) + " i " +
              std::to_string(i) + ": err " + std::to_string(err) + " > bound " +
              std::to_string(bound));
  }
  double amax = 0;
  for (float v : x) amax = std::fmax(amax, std::fabs(static_cast<double>(v)));
  const float d = div_rn(static_cast<float>(amax), 127.0f);
  if (d != 0.0f) RC_ASSERT(b.s == f32_to_f16(mul_rn(d, static_cast<float>(sum))));
}

}  // namespace
}  // namespace moecheck
