// Number formats (emulate/numfmt.h) against independent formulations: every one of the 65,536
// bf16 and f16 bit patterns to f32 and back, and a dense sweep of f32 inputs that covers every
// rounding tie class. The independent side rounds by comparing distances in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/numfmt.h"

namespace moecheck {
namespace {

// Value of a bf16 / f16 bit pattern, computed from the definition in double.
double bf16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
  double v = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}
double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// Nearest-even rounding of a finite double x to a format given its finite-value function,
// largest finite pattern and Inf pattern: scan by bisection over the monotone positive codes.
template <typename ValueFn>
uint16_t round_by_distance(double x, ValueFn value, uint16_t max_finite, uint16_t inf) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  // Overflow: past the midpoint between max finite and the next (virtual) step, ties to Inf.
  const double top = value(max_finite);
  const double step = top - value(static_cast<uint16_t>(max_finite - 1));
  if (a >= top + step / 2) return sign | inf;
  uint16_t lo = 0, hi = max_finite;  // largest code with value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (value(mid) <= a) lo = mid;
    else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == max_finite) return sign | lo;
  const double dlo = a - value(lo), dhi = value(static_cast<uint16_t>(lo + 1)) - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | static_cast<uint16_t>(lo + 1);
  return sign | ((lo & 1) ? static_cast<uint16_t>(lo + 1) : lo);
}

uint16_t bf16_independent(float f) { return round_by_distance(f, bf16_value, 0x7F7F, 0x7F80); }
uint16_t f16_independent(float f) { return round_by_distance(f, f16_value, 0x7BFF, 0x7C00); }

TEST(Numfmt, Bf16AllPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = bf16_to_f32(b);
    const bool nan = ((b & 0x7F80) == 0x7F80) && (b & 0x7F);
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << "bf16 0x" << std::hex << h;
      const uint16_t back = f32_to_bf16(f);
      EXPECT_EQ(back, b | 0x0040) << "NaN quieted, sign and payload kept: 0x" << std::hex << h;
      continue;
    }
    if ((b & 0x7FFF) != 0x7F80) {
      EXPECT_EQ(static_cast<double>(f), bf16_value(b)) << std::hex << h;
    }
    EXPECT_EQ(f32_to_bf16(f), b) << "round trip of bf16 0x" << std::hex << h;
  }
}

TEST(Numfmt, F16AllPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = f16_to_f32(b);
    const bool nan = ((b & 0x7C00) == 0x7C00) && (b & 0x3FF);
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << "f16 0x" << std::hex << h;
      EXPECT_EQ(f32_to_f16(f), b | 0x0200)
          << "NaN quieted, sign and payload kept: 0x" << std::hex << h;
      continue;
    }
    if ((b & 0x7FFF) != 0x7C00) {
      EXPECT_EQ(static_cast<double>(f), f16_value(b)) << std::hex << h;
    }
    EXPECT_EQ(f32_to_f16(f), b) << "round trip of f16 0x" << std::hex << h;
  }
}

// Dense f32 sweep: a stride through all 2^32 patterns, plus for every bf16 / f16 code the exact
// midpoint to its successor (the tie class), and one f32 ulp either side of it.
TEST(Numfmt, F32SweepAgainstIndependentRounding) {
  uint64_t checked = 0;
  auto check = [&](float f) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      EXPECT_EQ(f32_to_bf16(f) >> 15, f32_bits(f) >> 31) << "NaN sign kept";
      return;
    }
    if (std::isinf(f)) {
      EXPECT_EQ(f32_to_bf16(f), (f32_bits(f) >> 16));
      EXPECT_EQ(f32_to_f16(f), f > 0 ? 0x7C00 : 0xFC00);
      return;
    }
    ASSERT_EQ(f32_to_bf16(f), bf16_independent(f)) << "f32 " << std::hexfloat << f;
    ASSERT_EQ(f32_to_f16(f), f16_independent(f)) << "f32 " << std::hexfloat << f;
    ++checked;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 65521) check(bits_f32(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x7F7F; ++h) {  // bf16 ties: exact midpoints are representable in f32
    const float mid = static_cast<float>(
        (bf16_value(static_cast<uint16_t>(h)) + bf16_value(static_cast<uint16_t>(h + 1))) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) check(f);
  }
  for (uint32_t h = 0; h < 0x7BFF; ++h) {  // f16 ties, subnormal ones included
    const float mid = static_cast<float>(
        (f16_value(static_cast<uint16_t>(h)) + f16_value(static_cast<uint16_t>(h + 1))) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) check(f);
  }
  // Overflow boundaries: 65520 is the f16 tie between 65504 and Inf.
  for (float f : {65504.0f, 65519.996f, 65520.0f, 3.3961776e38f, std::numeric_limits<float>::max()})
    check(f);
  std::printf("checked %llu finite f32 inputs\n", static_cast<unsigned long long>(checked));
  EXPECT_GT(checked, 300000u);
}

}  // namespace
}  // namespace moecheck
