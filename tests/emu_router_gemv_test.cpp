// emu::router_gemv (both variants) and emu::bf16_gemv (docs/numerics.md "router_gemv",
// "bf16_gemv"): bit equality with a replay that assigns each k to its lane / thread by index,
// the derived bound |z - exact| <= (gamma_D + gamma64_K) sum |w x| with D = 8 ceil(K/256) + 5
// (plain) or 8 ceil(K/2048) + 12 (staged), independence from T, NaN propagation.
// Configs: plain_/staged_ + rows, K, T; repro: --gtest_filter=EmuRouterGemv*.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "emulate/bf16_gemv.h"
#include "emulate/router_gemv.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

// Thread (or lane) of value k: chunk k / 8 dealt round-robin over `threads`; each thread's
// values arrive in increasing k, which is the kernel's chunk order.
float replay(RouterVariant v, const uint16_t* w, const uint16_t* x, int64_t K) {
  const int threads = v == RouterVariant::kPlain ? kWarpSize : kRouterStagedThreads;
  std::vector<float> part(static_cast<size_t>(threads), 0.0f);
  for (int64_t k = 0; k < K; ++k) {
    float& p = part[static_cast<size_t>((k / kGemvChunk) % threads)];
    p = fma_rn(bf16_to_f32(w[k]), bf16_to_f32(x[k]), p);
  }
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    lane[l] = part[l];
    for (int j = 1; j < threads / kWarpSize; ++j)
      lane[l] = add_rn(lane[l], part[l + kWarpSize * j]);
  }
  return butterfly(lane);
}

struct Case {
  RouterVariant v;
  int64_t rows, K, T;
  std::string name() const {
    return std::string(v == RouterVariant::kPlain ? "plain" : "staged") + "_rows" +
           std::to_string(rows) + "_K" + std::to_string(K) + "_T" + std::to_string(T);
  }
};

class EmuRouterGemv : public ::testing::TestWithParam<Case> {};

TEST_P(EmuRouterGemv, ReplayBoundAndTokenIndependence) {
  const Case c = GetParam();
  emutest::Gen g(21);
  const std::vector<uint16_t> w = g.bf16(c.rows * c.K, 0.02), x = g.bf16(c.T * c.K, 1.0);
  std::vector<float> y(static_cast<size_t>(c.T * c.rows)), y1(static_cast<size_t>(c.rows));
  emu::router_gemv(c.v, w.data(), x.data(), y.data(), c.rows, c.K, c.T);
  const int64_t depth = c.v == RouterVariant::kPlain ? 8 * ((c.K + 255) / 256) + 5
                                                     : 8 * ((c.K + 2047) / 2048) + 7 + 5;
  for (int64_t t = 0; t < c.T; ++t) {
    emu::router_gemv(c.v, w.data(), x.data() + t * c.K, y1.data(), c.rows, c.K, 1);
    ASSERT_EQ(std::memcmp(y1.data(), y.data() + t * c.rows, y1.size() * 4), 0)
        << c.name() << " token " << t;
    for (int64_t r = 0; r < c.rows; ++r) {
      const float got = y[t * c.rows + r];
      const float want = replay(c.v, w.data() + r * c.K, x.data() + t * c.K, c.K);
      ASSERT_EQ(f32_bits(got), f32_bits(want)) << c.name() << " row " << r << " token " << t;
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p =
            static_cast<double>(bf16_to_f32(w[r * c.K + k])) * bf16_to_f32(x[t * c.K + k]);
        exact += p;
        mag += std::fabs(p);
      }
      ASSERT_LE(std::fabs(got - exact), (emutest::gamma(depth) + emutest::gamma64(c.K)) * mag)
          << c.name() << " row " << r << " token " << t;
    }
  }
  if (c.v == RouterVariant::kPlain) {  // bf16_gemv is the plain schedule
    std::vector<float> yb(y.size());
    emu::bf16_gemv(w.data(), x.data(), yb.data(), c.rows, c.K, c.T);
    ASSERT_EQ(std::memcmp(yb.data(), y.data(), y.size() * 4), 0) << c.name();
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, EmuRouterGemv,
                         ::testing::Values(Case{RouterVariant::kPlain, 16, 512, 3},
                                           Case{RouterVariant::kStaged, 16, 512, 3},
                                           Case{RouterVariant::kPlain, 24, 5120, 2},
                                           Case{RouterVariant::kStaged, 24, 5120, 2},
                                           Case{RouterVariant::kPlain, 8, 2304, 9},
                                           Case{RouterVariant::kStaged, 8, 2056, 1}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// F16 router weights (the deepseek4 conventions' ffn_gate_inp): widened exactly, the same chain
// as bf16. The weights span f16's range: normals, subnormals (below 2^-14), the largest finite.
TEST(EmuRouterGemvF16, ReplayAndBound_plain_and_staged) {
  emutest::Gen g(23);
  const int64_t rows = 12, K = 2304, T = 3;
  std::vector<uint16_t> w = g.bf16(rows * K, 0.02);
  for (size_t i = 0; i < w.size(); ++i) {
    float v = bf16_to_f32(w[i]) * (i % 7 == 0 ? 0x1p-12f : 1.0f);  // some f16 subnormals
    if (i % 1001 == 0) v = i % 2 ? 65504.0f : -65504.0f;
    w[i] = f32_to_f16(v);
  }
  const std::vector<uint16_t> x = g.bf16(T * K, 1.0);
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    const std::string name = v == RouterVariant::kPlain ? "f16 plain" : "f16 staged";
    std::vector<float> y(static_cast<size_t>(T * rows));
    emu::router_gemv(v, w.data(), x.data(), y.data(), rows, K, T, GgmlType::kF16);
    const int threads = v == RouterVariant::kPlain ? kWarpSize : kRouterStagedThreads;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> part(static_cast<size_t>(threads), 0.0f);
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const float wf = f16_to_f32(w[r * K + k]), xf = bf16_to_f32(x[t * K + k]);
          float& p = part[static_cast<size_t>((k / kGemvChunk) % threads)];
          p = fma_rn(wf, xf, p);
          exact += static_cast<double>(wf) * xf;
          mag += std::fabs(static_cast<double>(wf) * xf);
        }
        float lane[kWarpSize];
        for (int l = 0; l < kWarpSize; ++l) {
          lane[l] = part[l];
          for (int j = 1; j < threads / kWarpSize; ++j)
            lane[l] = add_rn(lane[l], part[l + kWarpSize * j]);
        }
        const float got = y[t * rows + r];
        ASSERT_EQ(f32_bits(got), f32_bits(butterfly(lane))) << name << " row " << r << " tok " << t;
        const int64_t depth = v == RouterVariant::kPlain ? 8 * ((K + 255) / 256) + 5
                                                         : 8 * ((K + 2047) / 2048) + 7 + 5;
        ASSERT_LE(std::fabs(got - exact), (emutest::gamma(depth) + emutest::gamma64(K)) * mag)
            << name << " row " << r << " token " << t;
      }
    // Read as bf16 the same bits give other logits: the type is not ignored.
    std::vector<float> yb(y.size());
    emu::router_gemv(v, w.data(), x.data(), yb.data(), rows, K, T, GgmlType::kBF16);
    EXPECT_NE(std::memcmp(yb.data(), y.data(), y.size() * 4), 0) << name;
  }
}

TEST(EmuRouterGemvEdge, NaNPropagatesToItsRowOnly) {
  emutest::Gen g(3);
  std::vector<uint16_t> w = g.bf16(4 * 256, 0.1);
  const std::vector<uint16_t> x = g.bf16(256, 1.0);
  w[2 * 256 + 77] = 0x7FC1;  // NaN in row 2
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    float y[4];
    emu::router_gemv(v, w.data(), x.data(), y, 4, 256, 1);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_TRUE(std::isfinite(y[0]) && std::isfinite(y[1]) && std::isfinite(y[3]));
  }
}

}  // namespace
}  // namespace moecheck
