// The score functions' accuracy sweep shared by tests/score_math_test.cpp (strided) and
// tests/slow/score_math_full_test.cpp (every f32 input): psoftplus over [-104, 20] and psigmoid
// over [-104, 104] (outside, both return the exact limits) against the exact value in long double
// (x87 80-bit: expl, log1pl, ~1e-19 relative), in ulp of the exact result, and how many results
// differ from the correctly rounded one. docs/numerics.md "Score functions" quotes the figures.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/score_math.h"

namespace moecheck::scoretest {

struct Sweep {
  uint64_t n = 0, misrounded = 0;
  double worst = 0;
  float at = 0;
};

inline double ulp_of(long double v) {
  int ex = 0;
  std::frexp(static_cast<double>(v), &ex);
  return std::ldexp(1.0, ex - 24 < -149 ? -149 : ex - 24);
}

// kFn 0: psoftplus, 1: psigmoid. Inputs with bit patterns m = 0, stride, 2 stride, ... of each
// sign, up to the range's end; two threads.
template <int kFn>
Sweep sweep(uint32_t stride) {
  const float hi = kFn == 0 ? 20.0f : 104.0f;
  auto run = [&](uint32_t sign, Sweep& r) {
    const uint32_t end = f32_bits(sign ? 104.0f : hi);
    for (uint64_t m = 0; m <= end; m += stride) {
      const float z = bits_f32(static_cast<uint32_t>(m) | sign << 31);
      const long double lz = z;
      const long double ex = kFn == 0 ? log1pl(expl(lz)) : 1.0L / (1.0L + expl(-lz));
      const float f = kFn == 0 ? psoftplus(z) : psigmoid(z);
      const double err = static_cast<double>(fabsl(static_cast<long double>(f) - ex)) / ulp_of(ex);
      ++r.n;
      if (static_cast<float>(ex) != f) ++r.misrounded;
      if (err > r.worst) {
        r.worst = err;
        r.at = z;
      }
    }
  };
  Sweep a, b;
  std::thread t1([&] { run(0, a); });
  run(1, b);
  t1.join();
  Sweep r;
  r.n = a.n + b.n;
  r.misrounded = a.misrounded + b.misrounded;
  r = a.worst >= b.worst ? Sweep{r.n, r.misrounded, a.worst, a.at}
                         : Sweep{r.n, r.misrounded, b.worst, b.at};
  return r;
}

inline void print(const char* name, const Sweep& r) {
  std::printf("%s: %llu inputs, max %.9f ulp at %a, %llu not correctly rounded\n", name,
              static_cast<unsigned long long>(r.n), r.worst, static_cast<double>(r.at),
              static_cast<unsigned long long>(r.misrounded));
}

}  // namespace moecheck::scoretest
