// Scalar number formats shared by every implementation: bf16 and f16 to and from f32.
// Contract: docs/numerics.md "Number formats". Round to nearest, ties to even; NaN stays NaN
// (quieted, sign kept); Inf stays Inf; overflow rounds to Inf; f16 subnormals exact.
// Integer-only so that host and device produce the same bits with no dependence on FTZ or
// rounding modes. Host and device clean (CUDA includes this header unchanged).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOECHECK_HD __host__ __device__ __forceinline__
#else
#define MOECHECK_HD inline
#endif

namespace moecheck {

MOECHECK_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MOECHECK_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// bf16 is the upper half of an f32. A naive (bits + 0x7FFF + lsb) >> 16 turns NaNs whose
// payload sits only in the low half into Inf, so NaN is handled first and quieted.
MOECHECK_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

MOECHECK_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// f32 value rounded to the nearest bf16, back in f32.
MOECHECK_HD float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

MOECHECK_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: quiet bit set, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 and Inf
  if (a >= 0x38800000u) {  // normal f16: rebias the exponent (127 - 15) and round the mantissa
    const uint32_t odd = (a >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0x0FFFu + odd) >> 13));
  }
  // f16 subnormal or zero: value / 2^-24 rounded to nearest even.
  const uint32_t e = a >> 23;
  if (e < 102u) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14 .. 24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

MOECHECK_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x03FFu;
  if (e == 0x1Fu) {  // Inf, or NaN quieted with its payload kept
    return bits_f32(sign | 0x7F800000u | (m ? ((m << 13) | 0x00400000u) : 0u));
  }
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    e = 1;
    while ((m & 0x0400u) == 0) {  // normalise the subnormal
      m <<= 1;
      --e;
    }
    m &= 0x03FFu;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace moecheck
