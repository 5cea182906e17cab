// The seeded bf16 GEMV cases of the router and bf16 GEMV GPU tests: random shapes (any K that
// is a multiple of 8, T = 1..11 crossing the 8-token group) and adversarial inputs (identical
// rows: exact logit ties; large magnitudes up to bf16 overflow and subnormal bf16; NaN and Inf
// in x).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck::gputest {

struct GemvCase {
  int64_t rows, K, T;
  std::vector<uint16_t> w, x;
};

// force_T > 0 replaces the drawn token count (the one-token kernels' cases).
inline GemvCase make_gemv_case(uint64_t seed, int64_t force_T = 0) {
  emutest::Gen g(seed);
  GemvCase c;
  c.rows = 1 + g.u32() % 70;
  c.K = 8 * (1 + static_cast<int64_t>(g.u32() % 400));  // any multiple of 8, not only of 256
  c.T = 1 + g.u32() % 11;
  if (force_T > 0) c.T = force_T;
  c.w = g.bf16(c.rows * c.K, 0.05);
  c.x = g.bf16(c.T * c.K, 1.0);
  switch (seed % 5) {
    case 1:  // exact ties: rows repeat, so logits of different experts are equal bits
      for (int64_t r = 1; r < c.rows; r += 2)
        std::copy_n(c.w.begin() + (r - 1) * c.K, c.K, c.w.begin() + r * c.K);
      break;
    case 2:  // large magnitudes (products near f32 overflow) and subnormal bf16
      for (size_t i = 0; i < c.x.size(); i += 7)
        c.x[i] = static_cast<uint16_t>(0x7F00 | (g.u32() & 0x7F));
      for (size_t i = 3; i < c.w.size(); i += 11)
        c.w[i] = static_cast<uint16_t>(1 + g.u32() % 0x7F);
      break;
    case 3:  // NaN and Inf in one token
      c.x[g.u32() % c.K] = 0x7FC1;
      c.x[(c.T - 1) * c.K + g.u32() % c.K] = 0xFF80;
      break;
    default: break;
  }
  return c;
}

// Case `seed` through emu(w, x, y, rows, K, T) on the host and dev(w, x, y, rows, K, T) on the
// device (twice, output poisoned before each run): bitwise equal, or the first mismatch with a
// repro line.
template <class Emu, class Dev>
void check_gemv_case(uint64_t seed, const std::string& stage, Emu emu, Dev dev,
                     int64_t force_T = 0) {
  const GemvCase c = make_gemv_case(seed, force_T);
  std::vector<float> want(static_cast<size_t>(c.T * c.rows));
  emu(c.w.data(), c.x.data(), want.data(), c.rows, c.K, c.T);
  DevArray<uint16_t> dw(c.w), dx(c.x);
  DevArray<float> dy(want.size());
  const std::string r = repro(seed, "rows=" + std::to_string(c.rows) + " K=" + std::to_string(c.K) +
                                        " T=" + std::to_string(c.T));
  for (int run = 0; run < 2; ++run) {
    dy.poison();
    dev(dw.get(), dx.get(), dy.get(), c.rows, c.K, c.T);
    ASSERT_TRUE(same_f32(run == 0 ? stage : stage + " (second run)", dy.host(), want, c.rows, r));
  }
}

}  // namespace moecheck::gputest
