// The pexp accuracy sweep shared by tests/emu_pexp_test.cpp (strided) and
// tests/slow/emu_pexp_full_test.cpp (every f32 in [-104, 88.7228]): error in ulp of the exact
// result (exp in double), docs/numerics.md "pexp".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/portable_math.h"

namespace moecheck::emutest {

// ulp of an f32 near v (2^-149 below the normal range).
inline double emutest_ulp_d(double v) {
  int ex = 0;
  std::frexp(v, &ex);
  return std::ldexp(1.0, ex - 24 < -149 ? -149 : ex - 24);
}

struct SweepResult {
  uint64_t n = 0;
  double worst_normal = 0, worst_subnormal = 0;
  float x_normal = 0, x_subnormal = 0;
};

inline SweepResult sweep_pexp(uint32_t stride) {
  SweepResult r;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    const uint32_t end = sign ? 0x42D00000u : f32_bits(kPexpOverflow);  // 104 ; 88.7228
    for (uint32_t m = 0; m < end; m += stride) {
      const float x = bits_f32(m | (sign << 31));
      const double e = std::exp(static_cast<double>(x));
      const float f = pexp(x);
      const double err = std::fabs(static_cast<double>(f) - e) / emutest_ulp_d(e);
      ++r.n;
      if (e < 0x1p-126) {
        if (err > r.worst_subnormal) {
          r.worst_subnormal = err;
          r.x_subnormal = x;
        }
      } else if (err > r.worst_normal) {
        r.worst_normal = err;
        r.x_normal = x;
      }
    }
  }
  return r;
}

// One line with the sweep's figures (what docs/numerics.md "pexp" quotes).
inline void print_sweep(const char* what, const SweepResult& r) {
  std::printf("pexp %s: %llu inputs, max %.4f ulp (normal) at %a, %.4f ulp (subnormal) at %a\n",
              what, static_cast<unsigned long long>(r.n), r.worst_normal,
              static_cast<double>(r.x_normal), r.worst_subnormal,
              static_cast<double>(r.x_subnormal));
}

}  // namespace moecheck::emutest

namespace moecheck {
inline double emutest_ulp(float v) { return emutest::emutest_ulp_d(static_cast<double>(v)); }
}  // namespace moecheck
