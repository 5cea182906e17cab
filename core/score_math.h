// The routing score functions, project-owned so that every implementation (host routing, the
// reference's Model mode, the device route_select) computes the same bits on any libm and on the
// GPU: psoftplus and psigmoid (evaluated in f64 from IEEE operations only, then rounded once to
// f32), and softmax's exp, which is pexp (core/portable_math.h). Built from the f64 spellings
// below (correctly rounded on both sides: plain IEEE double operations compiled with
// -ffp-contract=off and std::fma on the host, the explicit _rn intrinsics on the device) and
// integer bit assembly; no libm call. Contract and the exhaustive error measurement:
// docs/numerics.md "Score functions".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck {

// ---- f64 operations with one spelling for host and device (distinct names: an overload of
// mul_rn on double would silently promote float calls with a double literal) ----
MOECHECK_HD double dfma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MOECHECK_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MOECHECK_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MOECHECK_HD double dsub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
MOECHECK_HD double ddiv_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
// f64 -> f32, round to nearest even (the host's default rounding mode; never changed here).
MOECHECK_HD float d2f_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(a);
#else
  return static_cast<float>(a);
#endif
}
MOECHECK_HD uint64_t f64_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}
MOECHECK_HD double bits_f64(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}
// 2^e for e in [-1022, 1023], from its exponent bits.
MOECHECK_HD double pow2d(int e) { return bits_f64(static_cast<uint64_t>(e + 1023) << 52); }

// ln 2 = kLn2HiD + kLn2LoD; kLn2HiD has 32 significant bits, so k * kLn2HiD is exact for
// |k| < 2^21 (fdlibm's split).
inline constexpr double kLn2HiD = 0x1.62e42fee00000p-1;
inline constexpr double kLn2LoD = 0x1.a39ef35793c76p-33;

// e^z in f64 for |z| <= 128 (relative error about 2^-52; the callers' ranges are narrower).
// n = rne(z log2 e) by the 1.5 * 2^52 shifter; r = z - n ln2 by Cody-Waite (the first fma is
// exact up to its one rounding, |r| <= 0.3466); e^r by the degree-13 Taylor polynomial in Horner
// form (truncation < r^14 / 14! = 4.2e-18 relative); times 2^n, exact (n in [-185, 185]).
MOECHECK_HD double pexp_f64(double z) {
  constexpr double kLog2e = 0x1.71547652b82fep+0;
  constexpr double kShifter = 0x1.8p+52;
  const double kn = dsub_rn(dadd_rn(dmul_rn(z, kLog2e), kShifter), kShifter);
  double r = dfma_rn(-kn, kLn2HiD, z);
  r = dfma_rn(-kn, kLn2LoD, r);
  double p = 0x1.6124613a86d09p-33;      // 1/13!
  p = dfma_rn(p, r, 0x1.1eed8eff8d898p-29);  // 1/12!
  p = dfma_rn(p, r, 0x1.ae64567f544e4p-26);  // 1/11!
  p = dfma_rn(p, r, 0x1.27e4fb7789f5cp-22);  // 1/10!
  p = dfma_rn(p, r, 0x1.71de3a556c734p-19);  // 1/9!
  p = dfma_rn(p, r, 0x1.a01a01a01a01ap-16);  // 1/8!
  p = dfma_rn(p, r, 0x1.a01a01a01a01ap-13);  // 1/7!
  p = dfma_rn(p, r, 0x1.6c16c16c16c17p-10);  // 1/6!
  p = dfma_rn(p, r, 0x1.1111111111111p-7);   // 1/5!
  p = dfma_rn(p, r, 0x1.5555555555555p-5);   // 1/4!
  p = dfma_rn(p, r, 0x1.5555555555555p-3);   // 1/3!
  p = dfma_rn(p, r, 0.5);
  p = dfma_rn(p, r, 1.0);
  p = dfma_rn(p, r, 1.0);
  return dmul_rn(p, pow2d(static_cast<int>(kn)));
}

// log(1 + y) in f64 for finite y >= 0 (relative error about 2^-51).
// w = 1 + y rounded, c its exact rounding error (Fast2Sum, larger operand first), so
// log1p(y) = log(w) + c / w to far below an f64 ulp. log(w): w = 2^k m with m in
// [sqrt(1/2), sqrt(2)) from the exponent bits, f = m - 1 (exact), s = f / (2 + f),
// log(m) = 2 atanh(s) = 2s + 2s q P(q), q = s^2 <= 0.0295, P(q) = sum_{j=1..10} q^(j-1) / (2j+1)
// (truncation < q^10 / 23 * 2 = 6e-19 relative); k ln2 in two parts.
MOECHECK_HD double plog1p_f64(double y) {
  const double w = dadd_rn(1.0, y);
  const double c = y <= 1.0 ? dsub_rn(y, dsub_rn(w, 1.0)) : dsub_rn(1.0, dsub_rn(w, y));
  const uint64_t bits = f64_bits(w);
  int k = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  double m = bits_f64((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (m > 0x1.6a09e667f3bcdp+0) {  // sqrt(2)
    m = dmul_rn(m, 0.5);
    ++k;
  }
  const double f = dsub_rn(m, 1.0);
  const double s = ddiv_rn(f, dadd_rn(2.0, f));
  const double q = dmul_rn(s, s);
  double P = 0x1.8618618618618p-5;     // 1/21
  P = dfma_rn(P, q, 0x1.af286bca1af28p-5);  // 1/19
  P = dfma_rn(P, q, 0x1.e1e1e1e1e1e1ep-5);  // 1/17
  P = dfma_rn(P, q, 0x1.1111111111111p-4);  // 1/15
  P = dfma_rn(P, q, 0x1.3b13b13b13b14p-4);  // 1/13
  P = dfma_rn(P, q, 0x1.745d1745d1746p-4);  // 1/11
  P = dfma_rn(P, q, 0x1.c71c71c71c71cp-4);  // 1/9
  P = dfma_rn(P, q, 0x1.2492492492492p-3);  // 1/7
  P = dfma_rn(P, q, 0x1.999999999999ap-3);  // 1/5
  P = dfma_rn(P, q, 0x1.5555555555555p-2);  // 1/3
  const double two_s = dmul_rn(2.0, s);  // exact
  const double log_m = dfma_rn(dmul_rn(two_s, q), P, two_s);
  const double kd = static_cast<double>(k);
  const double tail = dadd_rn(log_m, dfma_rn(kd, kLn2LoD, ddiv_rn(c, w)));
  return dadd_rn(dmul_rn(kd, kLn2HiD), tail);
}

// torch.nn.functional.softplus (beta 1, threshold 20) of an f32, rounded once to f32:
// NaN -> the canonical NaN; z > 20 -> z (torch's threshold; log1p(e^z) - z < 2.1e-9 is below
// 0.002 ulp of z there, so z is also the correctly rounded value); z < -104 -> +0 (the exact value
// is below e^z < 2^-150, half the smallest subnormal); else d2f_rn(plog1p_f64(pexp_f64(z))).
MOECHECK_HD float psoftplus(float z) {
  if (!(z == z)) return add_rn(z, z);
  if (z > 20.0f) return z;
  if (z < -104.0f) return 0.0f;
  return d2f_rn(plog1p_f64(pexp_f64(static_cast<double>(z))));
}

// torch.sigmoid of an f32, rounded once to f32: NaN -> the canonical NaN; z < -104 -> +0 (below
// 2^-150); z > 104 -> 1 (1 - e^-z rounds to 1 from z > 17.33 on); else
// d2f_rn(1 / (1 + pexp_f64(-z))).
MOECHECK_HD float psigmoid(float z) {
  if (!(z == z)) return add_rn(z, z);
  if (z < -104.0f) return 0.0f;
  if (z > 104.0f) return 1.0f;
  return d2f_rn(ddiv_rn(1.0, dadd_rn(1.0, pexp_f64(-static_cast<double>(z)))));
}

// The sqrt-softplus score of DeepSeek-V4.1 (model.py Gate: F.softplus(scores).sqrt()).
MOECHECK_HD float psqrt_softplus(float z) { return sqrt_rn(psoftplus(z)); }

}  // namespace moecheck
