// emu::swiglu_q8, emu::accumulate, emu::finish (docs/numerics.md "swiglu_q8", "accumulate,
// finish"): SwiGLU within gamma_5 |h| + 2^-126 |u'| + 2^-149 of the f64 formula (P_exp = 1), the clamp,
// q8_1 blocks equal to quantize_q8_1 of h; accumulate independent of pick order, within
// gamma_{topk+1} of the f64 sum; finish = f32_to_bf16. Repro: --gtest_filter=EmuSwiglu*:EmuAcc*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "emulate/accumulate.h"
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
    g[0] = 95.0f; g[1] = -95.0f; g[2] = 1e-40f; u[3] = 1e-40f;  // exp over/underflow, subnormals
    std::vector<float> h(g.size());
    std::vector<BlockQ8_1> hq(static_cast<size_t>(R * inter / 32)), want(hq.size());
    emu::swiglu_q8(g.data(), u.data(), h.data(), hq.data(), R, inter, L);
    emu::quantize_q8_1(h.data(), want.data(), R, inter);
    ASSERT_EQ(std::memcmp(hq.data(), want.data(), hq.size() * sizeof(BlockQ8_1)), 0) << "L = " << L;
    for (int64_t i = 0; i < R * inter; ++i) {
      const double gc = L > 0 ? std::min<double>(g[i], L) : g[i];
      const double uc = L > 0 ? std::clamp<double>(u[i], -L, L) : u[i];
      const double exact = silu64(gc) * uc;
      const double bound = emutest::gamma(5) * std::fabs(exact) + 0x1p-126 * std::fabs(uc) + 0x1p-149;
      ASSERT_LE(std::fabs(h[i] - exact), bound) << "L = " << L << " i = " << i << " g " << g[i] << " u " << u[i];
    }
  }
}

TEST(EmuAccumulate, PickOrderFreeBoundAndFinish_T3_topk4_dim64) {
  emutest::Gen gen(41);
  const int64_t T = 3, K = 4, dim = 64;
  std::vector<int32_t> ids = {7, 2, 9, 0, 1, 3, 5, 4, 15, 14, 13, 12};
  std::vector<float> w = gen.f32(T * K, 0.5), down = gen.f32(T * K * dim, 3.0), sh = gen.f32(T * dim, 1.0);
  std::vector<float> acc(static_cast<size_t>(T * dim)), acc2(acc.size());
  emu::accumulate(ids.data(), w.data(), down.data(), sh.data(), acc.data(), T, K, dim);
  // Reverse every token's picks (ids, weights and down rows together): same bits.
  std::vector<int32_t> ids2(ids.size());
  std::vector<float> w2(w.size()), down2(down.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t s = t * K + k, d = t * K + (K - 1 - k);
      ids2[d] = ids[s];
      w2[d] = w[s];
      std::copy_n(down.begin() + s * dim, dim, down2.begin() + d * dim);
    }
  }
  emu::accumulate(ids2.data(), w2.data(), down2.data(), sh.data(), acc2.data(), T, K, dim);
  ASSERT_EQ(std::memcmp(acc.data(), acc2.data(), acc.size() * 4), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < dim; ++i) {
      double exact = sh[t * dim + i], mag = std::fabs(sh[t * dim + i]);
      for (int64_t k = 0; k < K; ++k) {
        exact += static_cast<double>(w[t * K + k]) * down[(t * K + k) * dim + i];
        mag += std::fabs(static_cast<double>(w[t * K + k]) * down[(t * K + k) * dim + i]);
      }
      ASSERT_LE(std::fabs(acc[t * dim + i] - exact), emutest::gamma(K + 1) * mag) << "t " << t << " i " << i;
    }
  }
  std::vector<uint16_t> y(acc.size());
  emu::finish(acc.data(), y.data(), T * dim);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], f32_to_bf16(acc[i]));
  ids[1] = 7;  // token 0 picks 7 twice
  EXPECT_THROW(emu::accumulate(ids.data(), w.data(), down.data(), sh.data(), acc.data(), T, K, dim), std::exception);
}

}  // namespace
}  // namespace moecheck
