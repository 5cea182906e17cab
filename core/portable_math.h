// Project-owned scalar formulas with identical bits on host and device: pexp (exp in f32), the
// MMVQ unit's float part and the SwiGLU scalar. Built only from core/fp_ops.h operations and
// integer bit assembly, so libm's expf and CUDA's expf (different functions) never enter the
// numerics.
// Contract: docs/numerics.md "Conventions" (pexp) and "swiglu_q8" (swiglu).
#pragma once

#include <cstdint>

#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck {

// Largest f32 whose exp is finite is 88.72283172607422; from the next float up exp overflows.
inline constexpr float kPexpOverflow = 88.72283935546875f;
// exp(-104) = 6.8e-46 is below 2^-150 (half the smallest subnormal): it and below round to 0.
inline constexpr float kPexpUnderflow = -104.0f;

// 2^e as an f32 for e in [-126, 127] (a normal number), assembled from its exponent bits.
MOECHECK_HD float pow2i(int e) { return bits_f32(static_cast<uint32_t>(e + 127) << 23); }

// exp(x), max error measured in docs/numerics.md "pexp" (under 1 ulp, normal and subnormal
// results). NaN -> NaN, x >= kPexpOverflow -> +Inf, x < kPexpUnderflow -> +0.
// 1. n = rne(x * log2(e)) via the 1.5 * 2^23 shifter (|x * log2 e| < 152, far below 2^22).
// 2. r = x - n ln2 with ln2 = hi + lo (Cody-Waite): hi has 15 significant bits, so n * hi
//    (n has at most 8) is exact and the first fma is exact (Sterbenz); the second rounds once.
//    |r| <= ln2 / 2 + tiny.
// 3. exp(r) by the degree-7 Taylor polynomial in Horner form (truncation < r^8/8! = 5.2e-9
//    relative, 0.09 ulp); coefficients are 1/k! rounded to f32.
// 4. Scale by 2^n in two exact-or-once-rounded steps, 2^(n/2) then 2^(n - n/2): each factor is a
//    normal f32 for n in [-150, 128], the first product is exact, the second rounds once, so
//    subnormal results are correctly rounded from p and n = 128 does not overflow early.
MOECHECK_HD float pexp(float x) {
  if (!(x == x)) return add_rn(x, x);  // NaN: the canonical NaN of an arithmetic result
  if (x >= kPexpOverflow) return bits_f32(0x7F800000u);
  if (x < kPexpUnderflow) return 0.0f;
  constexpr float kLog2e = 1.44269502162933349609375f;  // 0x3FB8AA3B
  constexpr float kShifter = 12582912.0f;               // 1.5 * 2^23
  constexpr float kLn2Hi = 0.693145751953125f;          // 0x3F317200
  constexpr float kLn2Lo = 1.428606765330187045e-06f;   // 0x35BFBE8E
  const float kn = sub_rn(add_rn(mul_rn(x, kLog2e), kShifter), kShifter);
  const int n = static_cast<int>(kn);
  float r = fma_rn(-kn, kLn2Hi, x);
  r = fma_rn(-kn, kLn2Lo, r);
  float p = 1.98412701138295233249664306640625e-04f;          // 1/5040
  p = fma_rn(p, r, 1.38888889225199818611145019531250e-03f);  // 1/720
  p = fma_rn(p, r, 8.33333376795053482055664062500000e-03f);  // 1/120
  p = fma_rn(p, r, 4.16666679084300994873046875000000e-02f);  // 1/24
  p = fma_rn(p, r, 1.66666671633720397949218750000000e-01f);  // 1/6
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  const int n1 = n / 2;  // truncation toward zero; both halves stay in [-75, 64]
  const int n2 = n - n1;
  return mul_rn(mul_rn(p, pow2i(n1)), pow2i(n2));
}

// The float part t of one MMVQ unit (docs/numerics.md "mmvq_q2k, mmvq_q3k"), from its exact
// integer parts: A = sum over the unit's two sub-blocks of scale * (quant . activation quants),
// B (Q2_K only) = sum of min * (activation half sum). The products' inputs are exact in f32
// (|A|, |B| < 2^24); t rounds once (Q3_K) or in the fma's subtraction after the rounded dmin * B
// (Q2_K). Shared verbatim by emulation and kernels.
MOECHECK_HD float mmvq_unit_q2k(float d, float dmin, int A, int B) {
  return fma_rn(d, static_cast<float>(A), -mul_rn(dmin, static_cast<float>(B)));
}
MOECHECK_HD float mmvq_unit_q3k(float d, int A) { return mul_rn(d, static_cast<float>(A)); }

// The SwiGLU scalar of docs/numerics.md "swiglu_q8": clamp (when limit > 0; NaN passes through),
// silu(g') = g' / (1 + exp(-g')), h = silu(g') * u'. Shared verbatim by emulation and kernel.
MOECHECK_HD float swiglu(float g, float u, float limit) {
  if (limit > 0.0f) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
  }
  const float silu = div_rn(g, add_rn(1.0f, pexp(-g)));
  return mul_rn(silu, u);
}

}  // namespace moecheck
