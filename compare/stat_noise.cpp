// The statistical leg's noise model (compare/stat_noise.h; derivation in docs/numerics.md
// "Statistical leg").
#include "compare/stat_noise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numfmt.h"

namespace moecheck::stat_noise {
namespace {

// Half the ulp of v in a format with `bits` significand bits (implicit bit included): the bound
// of its rounding error, uniform on [-half, half].
double half_ulp(double v, int bits) {
  if (v == 0.0 || !std::isfinite(v)) return 0.0;
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 1 - bits);
}

// 2^e as a double, for e in the normal range of f64 (no libm call: this runs per weight).
double pow2(int e) {
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Half the spacing of the floats of `bits` significand bits (f32: 24, bf16: 8) around an f32 v:
// from its exponent field, subnormals at the smallest spacing.
double half_ulp_of_f32(float v, int bits) {
  const int E = static_cast<int>((f32_bits(v) >> 23) & 0xFF);
  if (E == 0xFF) return 0.0;
  return pow2(std::max(E, 1) - 127 - bits);
}

// Half the spacing of f16 values around v (normal: half an ulp; subnormal or underflowing,
// below 2^-14: half of 2^-24), the bound of the error of rounding v to f16.
double half_ulp_f16(double v) { return std::fabs(v) < 0x1p-14 ? 0x1p-25 : half_ulp(v, 11); }

// The f32 scale the quantiser derived from a block's 32 inputs: amax / 127.
double block_scale(const float* x) {
  float amax = 0.0f;
  for (int l = 0; l < kQK8_1; ++l) amax = std::max(amax, std::fabs(x[l]));
  return static_cast<double>(amax / 127.0f);
}

// The value of a block whose quant is +-127 is the block's amax, exact up to the scale's
// rounding: its rounding error is 0 (one per block; the first one, as the quantiser's amax).
int amax_index(const BlockQ8_1& b) {
  for (int l = 0; l < kQK8_1; ++l)
    if (b.qs[l] == 127 || b.qs[l] == -127) return l;
  return -1;
}

}  // namespace

double q8_dot_variance(const float* w, const BlockQ8_1* a, const float* x, int64_t K) {
  double var = 0;
  for (int64_t g = 0; g < K / kQK8_1; ++g) {
    const double d = block_scale(x + g * kQK8_1);
    const int m = amax_index(a[g]);
    double w2 = 0, wq = 0;
    for (int l = 0; l < kQK8_1; ++l) {
      const double wk = w[g * kQK8_1 + l];
      if (l != m) w2 += wk * wk;
      wq += wk * a[g].qs[l];
    }
    const double h16 = half_ulp_f16(d);  // the f16 rounding of the block's scale
    var += d * d / 12.0 * w2 + h16 * h16 / 3.0 * wq * wq;
  }
  return var;
}

double q8_dot_covariance(const float* w1, const float* w3, const BlockQ8_1* a, const float* x,
                         int64_t K) {
  double cov = 0;
  for (int64_t g = 0; g < K / kQK8_1; ++g) {
    const double d = block_scale(x + g * kQK8_1);
    const int m = amax_index(a[g]);
    double w13 = 0, q1 = 0, q3 = 0;
    for (int l = 0; l < kQK8_1; ++l) {
      const int64_t k = g * kQK8_1 + l;
      if (l != m) w13 += static_cast<double>(w1[k]) * w3[k];
      q1 += static_cast<double>(w1[k]) * a[g].qs[l];
      q3 += static_cast<double>(w3[k]) * a[g].qs[l];
    }
    const double h16 = half_ulp_f16(d);
    cov += d * d / 12.0 * w13 + h16 * h16 / 3.0 * q1 * q3;
  }
  return cov;
}

double dequant_variance(GgmlType t, const float* w, const float* x, int64_t K) {
  if (t != GgmlType::kQ2K) return 0.0;
  double s = 0;
  for (int64_t k = 0; k < K; ++k) {
    const double hw = half_ulp_of_f32(w[k], 24);
    s += hw * hw * x[k] * x[k];
  }
  return s / 3.0;
}

double bf16_round_variance(double v) {
  const double h = v == 0.0 ? 0.0 : half_ulp_of_f32(static_cast<float>(v), 8);
  return h * h / 3.0;
}

}  // namespace moecheck::stat_noise
