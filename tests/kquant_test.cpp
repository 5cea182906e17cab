// Reference quantisers (core/kquant.cpp, ggml's src/ggml-quants.c at d99724f2): ggml's own quality
// check, a pin to the bytes ggml's quantize_row_q{2,3}_K_ref produce, and properties over
// adversarial rows: each element lands on the nearest point of its sub-block's decoded grid,
// sub-blocks that decode to zero were small, every block is structurally valid and
// deterministic, and exact Q3_K grids survive a dequantise / quantise round trip.
// Repro: RC_PARAMS="seed=<printed seed>" ./quantize_test --gtest_filter=Quantize.<name>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/blocks.h"
#include "core/kquant.h"

namespace moecheck {
namespace {

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const uint8_t*>(p)[i];
    h *= 1099511628211ull;
  }
  return h;
}

// ggml tests/test-quantize-fns.cpp: sqrt(sum (x - y)^2) / n, sum in double.
double total_error(const std::vector<float>& x, const std::vector<float>& y) {
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = static_cast<double>(x[i]) - y[i];
    sum += diff * diff;
  }
  return std::sqrt(sum) / static_cast<double>(x.size());
}

// Step 1: ggml's quantisation check, x_i = 0.1 + 2 cos(i) over 4096 values, with ggml's
// thresholds MAX_QUANTIZATION_TOTAL_ERROR_2BITS / _3BITS.
TEST(Quantize, GgmlTotalError_cos4096) {
  const int n = 4096;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(0.1 + 2 * std::cos(static_cast<float>(i)));
  std::vector<BlockQ2K> b2(n / 256);
  std::vector<BlockQ3K> b3(n / 256);
  quantize_row_q2_K_ref(x.data(), b2.data(), n);
  dequantize_row_q2_K(b2.data(), y.data(), n);
  const double e2 = total_error(x, y);
  quantize_row_q3_K_ref(x.data(), b3.data(), n);
  dequantize_row_q3_K(b3.data(), y.data(), n);
  const double e3 = total_error(x, y);
  std::printf(
      "ggml total error (sqrt(sum d^2)/n, n = 4096): Q2_K %.6f (max 0.0075), "
      "Q3_K %.6f (max 0.0040)\n",
      e2, e3);
  EXPECT_LE(e2, 0.0075);
  EXPECT_LE(e3, 0.0040);
}

// Step 2: bit-exactness with ggml. The hashes are of the blocks that ggml's own
// quantize_row_q2_K_ref / quantize_row_q3_K_ref (ggml-org/ggml d99724f, x86-64 gcc -O2, no FMA)
// wrote for this input; it avoids libm so it is the same input on every platform.
TEST(Quantize, MatchesGgmlBytes_lcg4096) {
  const int n = 4096;
  std::vector<float> x(n);
  uint32_t s = 12345;
  for (int i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const int m = static_cast<int>((s >> 9) & 0x7FFFFF) - 0x400000;
    x[i] = std::ldexp(static_cast<float>(m), (i / 256) % 12 - 6 - 22);  // 2^-7 .. 2^4 per block
  }
  std::vector<BlockQ2K> b2(n / 256);
  std::vector<BlockQ3K> b3(n / 256);
  quantize_row_q2_K_ref(x.data(), b2.data(), n);
  quantize_row_q3_K_ref(x.data(), b3.data(), n);
  EXPECT_EQ(fnv1a(b2.data(), b2.size() * sizeof(BlockQ2K)), 0x5ecbf0628162778cull);
  EXPECT_EQ(fnv1a(b3.data(), b3.size() * sizeof(BlockQ3K)), 0x5be2242bfa313fa0ull);
}

// ---- generators ----

enum class RowKind {
  kUniform,         // one exponent per block
  kSubBlockScales,  // each sub-block its own exponent: wide range, many zero-scale sub-blocks
  kConstant,
  kZero,           // +0 and -0
  kOutlier,        // small values and one element 2^10 larger
  kTiny,           // |x| < 2^-22: d and dmin land in or below the f16 subnormals
  kAlternating,    // signs alternate
  kTies,           // (k + 1/2) 2^E: quotients on rounding ties
  kSparse,         // about one value in eight nonzero
  kAllPositive,    // Q2_K's min clamps to 0
  kSmallIntegers,  // k 2^E, k in [-4, 3]: exact Q3_K grids
};
constexpr int kRowKinds = 11;

// Value m 2^(E - 23), m a random 24-bit signed mantissa: |x| < 2^E.
float mantissa_value(int m, int e) { return std::ldexp(static_cast<float>(m), e - 23); }

// One 256-value block of a random kind. Every |x| < 2^12, so d and dmin stay finite f16.
void draw_block(float* x) {
  const auto kind = static_cast<RowKind>(*rc::gen::inRange(0, kRowKinds));
  const int e = *rc::gen::inRange(-12, 13);
  const auto m =
      *rc::gen::container<std::vector<int>>(256, rc::gen::inRange(-(1 << 23), (1 << 23) + 1));
  switch (kind) {
    case RowKind::kUniform:
      for (int i = 0; i < 256; ++i) x[i] = mantissa_value(m[i], e);
      break;
    case RowKind::kSubBlockScales: {
      const auto es = *rc::gen::container<std::vector<int>>(16, rc::gen::inRange(-20, 13));
      for (int i = 0; i < 256; ++i) x[i] = mantissa_value(m[i], es[i / 16]);
      break;
    }
    case RowKind::kConstant:
      for (int i = 0; i < 256; ++i) x[i] = mantissa_value(m[0], e);
      break;
    case RowKind::kZero:
      for (int i = 0; i < 256; ++i) x[i] = (m[i] & 1) ? -0.0f : 0.0f;
      break;
    case RowKind::kOutlier: {
      const int at = *rc::gen::inRange(0, 256);
      for (int i = 0; i < 256; ++i) x[i] = mantissa_value(m[i], std::min(e, 0) - 10);
      x[at] =
          mantissa_value(m[at] >= 0 ? m[at] | (1 << 22) : m[at] & ~(1 << 22), std::min(e, 0) + 1);
      break;
    }
    case RowKind::kTiny:
      for (int i = 0; i < 256; ++i) x[i] = mantissa_value(m[i], *rc::gen::inRange(-40, -21));
      break;
    case RowKind::kAlternating:
      for (int i = 0; i < 256; ++i)
        x[i] = (i & 1 ? -1.f : 1.f) * std::fabs(mantissa_value(m[i], e));
      break;
    case RowKind::kTies:
      for (int i = 0; i < 256; ++i) x[i] = std::ldexp(static_cast<float>(m[i] % 5) + 0.5f, e - 3);
      break;
    case RowKind::kSparse:
      for (int i = 0; i < 256; ++i) x[i] = (m[i] & 7) == 0 ? mantissa_value(m[i], e) : 0.0f;
      break;
    case RowKind::kAllPositive:
      for (int i = 0; i < 256; ++i) x[i] = std::fabs(mantissa_value(m[i], e)) + std::ldexp(1.f, e);
      break;
    case RowKind::kSmallIntegers:
      for (int i = 0; i < 256; ++i)
        x[i] = std::ldexp(static_cast<float>(m[i] % 8 > 3 ? m[i] % 8 - 8 : m[i] % 8), e - 3);
      break;
  }
}

std::vector<float> draw_row(int nb) {
  std::vector<float> x(256 * nb);
  for (int b = 0; b < nb; ++b) draw_block(x.data() + 256 * b);
  return x;
}

// ---- the per-element bound (both types) ----
//
// The quantiser's last step rounds each element against the grid the decoder will use:
// Q3_K  l = clamp(rne(fl(x / dj)), -4, 3),            y = dj l               (exact),
// Q2_K  l = clamp(rne(fl(fl(x + dm) / dj)), 0, 3),    y = fl(dj l - dm),
// with dj = f16(d) * scale code (exact) and dm = f16(dmin) * min code (exact). Rounding then
// clamping picks the integer of [lo, hi] nearest to the computed quotient q~. With t the exact
// quotient and l* the integer of [lo, hi] nearest to t: |t - l| <= |q~ - l| + |t - q~| <=
// |q~ - l*| + |t - q~| <= |t - l*| + 2 |t - q~|. One rounding (Q3_K) gives |t - q~| <=
// 2^-24 |t|; two (Q2_K) give (2^-23 + 2^-48) |t|. Times |dj|, and adding Q2_K's final
// subtraction (relative 2^-24 of the exact value, <= 2^-24 (1 + 2^-23) |y|):
// Q3_K  |x - y| <= min_l |x - dj l| + 2^-23 |x|
// Q2_K  |x - y| <= min_l |x - (dj l - dm)| + 2^-21 |x + dm| + 2^-23 |y|
// i.e. y is the nearest grid point up to the last bit. Only sub-blocks with dj != 0 are
// re-quantised; the others are checked by their own properties below.

double q3_nearest_grid_error(double x, double dj) {
  double best = INFINITY;
  for (int l = -4; l <= 3; ++l) best = std::min(best, std::fabs(x - dj * l));
  return best;
}
double q2_nearest_grid_error(double x, double dj, double dm) {
  double best = INFINITY;
  for (int l = 0; l <= 3; ++l) best = std::min(best, std::fabs(x - (dj * l - dm)));
  return best;
}

// Q2_K block validity (§2.2 steps 2-3): the largest fitted scale maps to code 15 and d =
// f16(max / 15) >= 0, so the largest scale code is 0 or 15 and all codes are 0 when d is +0 by
// construction (max_scale <= 0); the same for the mins. d, dmin finite for |x| < 2^12.
void check_q2_valid(const BlockQ2K& b) {
  int max_sc = 0, max_m = 0;
  for (int s = 0; s < 16; ++s) {
    max_sc = std::max(max_sc, q2k_scale(b, s));
    max_m = std::max(max_m, q2k_min(b, s));
  }
  RC_ASSERT(max_sc == 0 || max_sc == 15);
  RC_ASSERT(max_m == 0 || max_m == 15);
  if (max_sc == 0) RC_ASSERT(b.d == 0);
  if (max_m == 0) RC_ASSERT(b.dmin == 0);
  RC_ASSERT((b.d & 0x8000) == 0);
  RC_ASSERT((b.dmin & 0x8000) == 0);
  RC_ASSERT(std::isfinite(f16_to_f32(b.d)));
  RC_ASSERT(std::isfinite(f16_to_f32(b.dmin)));
}

// Q3_K validity (§2.3 step 2): the largest |scale| maps to code 0 (scale -32), so some sub-block
// always has scale -32 (all do when the block is zero: the bytes stay zeroed); d finite.
void check_q3_valid(const BlockQ3K& b) {
  bool has_min_code = false;
  for (int s = 0; s < 16; ++s) has_min_code = has_min_code || q3k_scale(b, s) == -32;
  RC_ASSERT(has_min_code);
  RC_ASSERT(std::isfinite(f16_to_f32(b.d)));
}

// Step 3 (Q2_K): valid blocks, deterministic, rows = independent blocks, nearest grid point.
RC_GTEST_PROP(Quantize, Q2K_NearestGridPointAndValid, ()) {
  const int nb = *rc::gen::inRange(1, 4);
  const std::vector<float> x = draw_row(nb);
  const int64_t k = 256 * nb;
  std::vector<BlockQ2K> b(nb), again(nb);
  quantize_row_q2_K_ref(x.data(), b.data(), k);
  quantize_row_q2_K_ref(x.data(), again.data(), k);
  RC_ASSERT(std::memcmp(b.data(), again.data(), sizeof(BlockQ2K) * nb) == 0);
  for (int i = 0; i < nb; ++i) {
    BlockQ2K one;
    quantize_row_q2_K_ref(x.data() + 256 * i, &one, 256);
    RC_ASSERT(std::memcmp(&one, &b[i], sizeof one) == 0);
  }
  std::vector<float> y(k);
  dequantize_row_q2_K(b.data(), y.data(), k);
  for (int i = 0; i < nb; ++i) {
    check_q2_valid(b[i]);
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int s = 0; s < 16; ++s) {
      const float dj = d * static_cast<float>(q2k_scale(b[i], s));
      const float dm = dmin * static_cast<float>(q2k_min(b[i], s));
      if (dj == 0.f) continue;
      for (int e = 16 * s; e < 16 * s + 16; ++e) {
        const double xv = x[256 * i + e], yv = y[256 * i + e];
        const double bound = q2_nearest_grid_error(xv, dj, dm) +
                             std::ldexp(std::fabs(xv + dm), -21) + std::ldexp(std::fabs(yv), -23);
        RC_ASSERT(std::fabs(xv - yv) <= bound);
      }
    }
  }
}

// Q3_K sub-blocks that decode to zero. make_q3_quants' fit has |scale| >= amax / 64: the
// start l_i = rne(-4 x_i / max) gives the largest element l = -4 and makes every w x l term
// (w = x^2) the same sign, so S = (sum w x l)^2 / sum w l^2 >= (4 amax^3)^2 / (16 sum x^2);
// the passes only raise S; and |scale| = sqrt(S / sum w l^2) with sum w l^2 <= 16 sum x^2 <=
// 256 amax^2. (a) Scale code 0 means |(-32 / max_scale) scale_j| <= 1/2, so amax_j <=
// |max_scale|, and |max_scale| = 32 |1 / iscale| <= 32 (|d| + 2^-25) (f16 rounding: relative
// 2^-11 when normal, absolute 2^-25 when subnormal). (b) d = +-0 means |max_scale| <= 2^-20,
// so amax_j <= 64 |max_scale| <= 2^-14. Float sums move these by < 2^-16 relative; we allow
// 2^-10. The bounds are sure, not tight: over 3.2M sub-blocks of mixed scales the largest
// amax_j / (32 (|d| + 2^-25)) seen for code-0 sub-blocks was 0.07 (docs/blocks.md).
RC_GTEST_PROP(Quantize, Q3K_NearestGridPointAndValid, ()) {
  const int nb = *rc::gen::inRange(1, 4);
  const std::vector<float> x = draw_row(nb);
  const int64_t k = 256 * nb;
  std::vector<BlockQ3K> b(nb), again(nb);
  quantize_row_q3_K_ref(x.data(), b.data(), k);
  quantize_row_q3_K_ref(x.data(), again.data(), k);
  RC_ASSERT(std::memcmp(b.data(), again.data(), sizeof(BlockQ3K) * nb) == 0);
  for (int i = 0; i < nb; ++i) {
    BlockQ3K one;
    quantize_row_q3_K_ref(x.data() + 256 * i, &one, 256);
    RC_ASSERT(std::memcmp(&one, &b[i], sizeof one) == 0);
  }
  std::vector<float> y(k);
  dequantize_row_q3_K(b.data(), y.data(), k);
  const double slack = 1 + std::ldexp(1.0, -10);
  for (int i = 0; i < nb; ++i) {
    check_q3_valid(b[i]);
    const float d = f16_to_f32(b[i].d);
    for (int s = 0; s < 16; ++s) {
      const float dj = d * static_cast<float>(q3k_scale(b[i], s));
      double amax = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) {
        const double xv = x[256 * i + e], yv = y[256 * i + e];
        amax = std::max(amax, std::fabs(xv));
        if (dj != 0.f) {
          RC_ASSERT(std::fabs(xv - yv) <=
                    q3_nearest_grid_error(xv, dj) + std::ldexp(std::fabs(xv), -23));
        }
      }
      if (d == 0.f) RC_ASSERT(amax <= std::ldexp(1.0, -14) * slack);
      else if (dj == 0.f) RC_ASSERT(amax <= 32 * (std::fabs(d) + std::ldexp(1.0, -25)) * slack);
    }
  }
}

// Step 4 (Q3_K round trip): blocks whose sub-block scales are all -32 (code 0) and whose every
// sub-block holds a quant -4 are fixed points of quantise(dequantise(.)), for any f16 d with
// 2^-14 <= |d| <= 16. Why: x = -32 d l exactly; in each sub-block the largest |x| is the l = -4
// element, so make_q3_quants' start rne(-4 x / max) = l (off by ~2^-23 before rounding), the
// passes keep it (x sl2 / slx = l to ~2^-12), and the scale sum w x l / sum w l^2 = -32 d to
// ~2^-19 (16 same-sign terms per sum); all codes round to 0 again and f16(1 / iscale) to d
// (error far below half an f16 ulp, 2^-12 relative); x / (-32 d) = l exactly. Q2_K has no such
// statement: its grid search may pick a different but equally exact fit (e.g. a sub-block
// using only quants 1 and 3 is also fitted exactly with step 2 d sc and min d sc).
RC_GTEST_PROP(Quantize, Q3K_RoundTripOfExactGrids_scale_m32, ()) {
  const int exp = *rc::gen::inRange(1, 19);  // f16 exponent field: 2^-14 .. 2^3 (x 1.x)
  const int mant = *rc::gen::inRange(0, 1024);
  const bool neg = *rc::gen::arbitrary<bool>();
  const uint16_t d = static_cast<uint16_t>((neg ? 0x8000 : 0) | (exp << 10) | mant);
  const auto lq = *rc::gen::container<std::vector<int>>(256, rc::gen::inRange(0, 8));
  const auto at = *rc::gen::container<std::vector<int>>(16, rc::gen::inRange(0, 16));
  BlockQ3K b{};
  b.d = d;  // scales bytes stay zero: every code is 0, every scale -32
  for (int e = 0; e < 256; ++e) {
    const int v = e % 16 == at[e / 16] ? 0 : lq[e];  // stored Lq = l + 4; Lq 0 is l = -4
    b.qs[32 * (e / 128) + e % 32] =
        static_cast<uint8_t>(b.qs[32 * (e / 128) + e % 32] | ((v & 3) << (2 * ((e / 32) % 4))));
    if (v >= 4) b.hmask[e % 32] = static_cast<uint8_t>(b.hmask[e % 32] | (1u << (e / 32)));
  }
  float y[256];
  dequantize_row_q3_K(&b, y, 256);
  BlockQ3K back;
  quantize_row_q3_K_ref(y, &back, 256);
  RC_ASSERT(std::memcmp(&b, &back, sizeof b) == 0);
}

// Step 5: NaN input never crashes and is contained, as docs/blocks.md states. Q3_K: a
// sub-block holding a NaN gets scale 0 (its sums are NaN, so make_q3_quants returns 0) and
// decodes to zeros; the others are quantised as if it were absent. Q2_K: a NaN element
// rounds to quant 0 and decodes to -dm of its sub-block; a NaN in a sub-block's first position
// makes that sub-block's fit NaN, which ranks below every scale, so it decodes to zeros.
TEST(Quantize, NaNInputIsContained) {
  std::vector<float> x(256), y(256);
  for (int i = 0; i < 256; ++i) x[i] = std::ldexp(static_cast<float>((i * 37) % 101 - 50), -5);
  x[5] = std::nanf("");   // sub-block 0, not first
  x[32] = std::nanf("");  // sub-block 2, first
  BlockQ2K b2;
  quantize_row_q2_K_ref(x.data(), &b2, 256);
  dequantize_row_q2_K(&b2, y.data(), 256);
  EXPECT_TRUE(std::isfinite(f16_to_f32(b2.d)) && std::isfinite(f16_to_f32(b2.dmin)));
  EXPECT_EQ(y[5], -(f16_to_f32(b2.dmin) * static_cast<float>(q2k_min(b2, 0))));
  EXPECT_NE(q2k_scale(b2, 0), 0) << "sub-block 0 keeps its fit";
  EXPECT_EQ(b2.scales[2], 0) << "NaN-first sub-block: scale and min code 0";
  for (int e = 32; e < 48; ++e) EXPECT_EQ(y[e], 0.f) << "element " << e;
  for (int e = 0; e < 256; ++e) EXPECT_FALSE(std::isnan(y[e])) << "Q2_K element " << e;

  BlockQ3K b3;
  quantize_row_q3_K_ref(x.data(), &b3, 256);
  dequantize_row_q3_K(&b3, y.data(), 256);
  EXPECT_TRUE(std::isfinite(f16_to_f32(b3.d)) && f16_to_f32(b3.d) != 0.f);
  EXPECT_EQ(q3k_scale(b3, 0), 0);
  EXPECT_EQ(q3k_scale(b3, 2), 0);
  for (int e = 0; e < 256; ++e) {
    EXPECT_FALSE(std::isnan(y[e])) << "Q3_K element " << e;
    if (e < 16 || (e >= 32 && e < 48)) {
      EXPECT_EQ(y[e], 0.f) << "element " << e;
    }
  }
  EXPECT_NE(q3k_scale(b3, 1), 0);
}

// Step 5b: Inf, as docs/blocks.md states. Q3_K: its sub-block's sums are NaN (Inf * 0), so the
// sub-block gets scale 0 and decodes to zeros. Q2_K: the fit's step is Inf, so d = Inf and every
// element decodes to Inf or NaN (ggml does the same; no crash, no undefined behaviour).
TEST(Quantize, InfInput) {
  std::vector<float> x(256), y(256);
  for (int i = 0; i < 256; ++i) x[i] = std::ldexp(static_cast<float>((i * 37) % 101 - 50), -5);
  x[40] = INFINITY;
  BlockQ3K b3;
  quantize_row_q3_K_ref(x.data(), &b3, 256);
  dequantize_row_q3_K(&b3, y.data(), 256);
  EXPECT_TRUE(std::isfinite(f16_to_f32(b3.d)));
  EXPECT_EQ(q3k_scale(b3, 2), 0);
  for (int e = 0; e < 256; ++e) EXPECT_TRUE(std::isfinite(y[e])) << "Q3_K element " << e;
  BlockQ2K b2;
  quantize_row_q2_K_ref(x.data(), &b2, 256);
  dequantize_row_q2_K(&b2, y.data(), 256);
  EXPECT_EQ(b2.d, 0x7C00);
  for (int e = 0; e < 256; ++e) EXPECT_FALSE(std::isfinite(y[e])) << "Q2_K element " << e;
}

// Step 6: nearest_int is ggml's rounding (nearest, ties to even) inside |f| <= 4194303 and
// total outside it: saturating at +-2^22, 0 for NaN.
TEST(Quantize, NearestIntTiesToEvenAndTotal) {
  EXPECT_EQ(nearest_int(0.5f), 0);
  EXPECT_EQ(nearest_int(1.5f), 2);
  EXPECT_EQ(nearest_int(2.5f), 2);
  EXPECT_EQ(nearest_int(-0.5f), 0);
  EXPECT_EQ(nearest_int(-1.5f), -2);
  EXPECT_EQ(nearest_int(-2.5f), -2);
  EXPECT_EQ(nearest_int(0.49999997f), 0);
  EXPECT_EQ(nearest_int(-3.7f), -4);
  EXPECT_EQ(nearest_int(4194303.f), 4194303);
  EXPECT_EQ(nearest_int(-4194303.f), -4194303);
  EXPECT_EQ(nearest_int(4194302.5f), 4194302);
  for (int i = -70000; i <= 70000; ++i) {  // every half-integer in a range, against the rule
    const float f = static_cast<float>(i) / 2;
    const int want = (i % 2 == 0) ? i / 2 : ((i / 2) % 2 == 0 ? i / 2 : i / 2 + (i > 0 ? 1 : -1));
    ASSERT_EQ(nearest_int(f), want) << f;
  }
  EXPECT_EQ(nearest_int(1e30f), 4194304);
  EXPECT_EQ(nearest_int(-INFINITY), -4194304);
  EXPECT_EQ(nearest_int(std::nanf("")), 0);
}

}  // namespace
}  // namespace moecheck
