// emu::swiglu_q8 and emu::swiglu_bf16 (docs/numerics.md "swiglu_q8"): SwiGLU within
// gamma_5 |h| + 2^-126 |u'| + 2^-149 of the f64 formula (P_exp = 1), the clamp, q8_1 blocks equal
// to quantize_q8_1 of h, the bf16 form equal to f32_to_bf16 of the same h. Repro:
// --gtest_filter=EmuSwiglu*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "emulate/quantize_q8_1.h"
#include "emulate/swiglu_q8.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

double silu64(double g) { return g / (1.0 + std::exp(-g)); }

TEST(EmuSwigluQ8, BoundClampAndBlocks_R3_inter256) {
  emutest::Gen gen(31);
  const int64_t R = 3, inter = 256;
  for (float L : {10.0f, 0.0f}) {
    std::vector<float> g = gen.f32(R * inter, 8.0), u = gen.f32(R * inter, 8.0);
    g[0] = 95.0f;
    g[1] = -95.0f;
    g[2] = 1e-40f;
    u[3] = 1e-40f;  // exp over/underflow, subnormals
    std::vector<float> h(g.size());
    std::vector<BlockQ8_1> hq(static_cast<size_t>(R * inter / 32)), want(hq.size());
    emu::swiglu_q8(g.data(), u.data(), h.data(), hq.data(), R, inter, L);
    emu::quantize_q8_1(h.data(), want.data(), R, inter);
    ASSERT_EQ(std::memcmp(hq.data(), want.data(), hq.size() * sizeof(BlockQ8_1)), 0) << "L = " << L;
    std::vector<float> hf(h.size());
    std::vector<uint16_t> hb(h.size());
    emu::swiglu_bf16(g.data(), u.data(), hf.data(), hb.data(), R, inter, L);
    ASSERT_EQ(std::memcmp(hf.data(), h.data(), h.size() * 4), 0) << "swiglu_bf16's h, L = " << L;
    for (size_t i = 0; i < h.size(); ++i)
      ASSERT_EQ(hb[i], f32_to_bf16(h[i])) << "L = " << L << " i = " << i;
    for (int64_t i = 0; i < R * inter; ++i) {
      const double gc = L > 0 ? std::min<double>(g[i], L) : g[i];
      const double uc = L > 0 ? std::clamp<double>(u[i], -L, L) : u[i];
      const double exact = silu64(gc) * uc;
      const double bound =
          emutest::gamma(5) * std::fabs(exact) + 0x1p-126 * std::fabs(uc) + 0x1p-149;
      ASSERT_LE(std::fabs(h[i] - exact), bound)
          << "L = " << L << " i = " << i << " g " << g[i] << " u " << u[i];
    }
  }
}

}  // namespace
}  // namespace moecheck
