// cuda::router_gemv (plain, staged), cuda::bf16_gemv and bf16_gemv_pair vs their emulation
// twins, bitwise: >= 100 seeded random cases per variant (T = 1..11 crosses the 8-token group),
// adversarial inputs (identical rows: exact logit ties; large magnitudes up to bf16 overflow;
// NaN and Inf in x; subnormal bf16), each launch twice. Contract: docs/numerics.md
// "router_gemv", "bf16_gemv".
#include "cuda/kernels.h"
#include "emulate/bf16_gemv.h"
#include "core/error.h"
#include "emulate/router_gemv.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::same_f32;

struct Case {
  int64_t rows, K, T;
  std::vector<uint16_t> w, x;
};

Case make_case(uint64_t seed) {
  emutest::Gen g(seed);
  Case c;
  c.rows = 1 + g.u32() % 70;
  c.K = 8 * (1 + static_cast<int64_t>(g.u32() % 400));  // any multiple of 8, not only of 256
  c.T = 1 + g.u32() % 11;
  c.w = g.bf16(c.rows * c.K, 0.05);
  c.x = g.bf16(c.T * c.K, 1.0);
  switch (seed % 5) {
    case 1:  // exact ties: rows repeat, so logits of different experts are equal bits
      for (int64_t r = 1; r < c.rows; r += 2)
        std::copy_n(c.w.begin() + (r - 1) * c.K, c.K, c.w.begin() + r * c.K);
      break;
    case 2:  // large magnitudes (products near f32 overflow) and subnormal bf16
      for (size_t i = 0; i < c.x.size(); i += 7) c.x[i] = static_cast<uint16_t>(0x7F00 | (g.u32() & 0x7F));
      for (size_t i = 3; i < c.w.size(); i += 11) c.w[i] = static_cast<uint16_t>(1 + g.u32() % 0x7F);
      break;
    case 3:  // NaN and Inf in one token
      c.x[g.u32() % c.K] = 0x7FC1;
      c.x[(c.T - 1) * c.K + g.u32() % c.K] = 0xFF80;
      break;
    default: break;
  }
  return c;
}

void check(RouterVariant v, uint64_t seed, bool dense) {
  const Case c = make_case(seed);
  std::vector<float> want(static_cast<size_t>(c.T * c.rows));
  if (dense) emu::bf16_gemv(c.w.data(), c.x.data(), want.data(), c.rows, c.K, c.T);
  else emu::router_gemv(v, c.w.data(), c.x.data(), want.data(), c.rows, c.K, c.T);
  DevArray<uint16_t> dw(c.w), dx(c.x);
  DevArray<float> dy(want.size());
  const std::string r = gputest::repro(seed, "rows=" + std::to_string(c.rows) + " K=" + std::to_string(c.K) +
                                                 " T=" + std::to_string(c.T));
  for (int run = 0; run < 2; ++run) {
    dy.poison();
    if (dense) cuda::bf16_gemv(dw.get(), dx.get(), dy.get(), c.rows, c.K, c.T, nullptr);
    else cuda::router_gemv(v, dw.get(), dx.get(), dy.get(), c.rows, c.K, c.T, nullptr);
    ASSERT_TRUE(same_f32(run == 0 ? "logits" : "logits (second run)", dy.host(), want, c.rows, r));
  }
}

TEST(RouterGemv, PlainEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kPlain, s, false));
}

TEST(RouterGemv, StagedEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kStaged, s, false));
}

TEST(Bf16Gemv, EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kPlain, s, true));
}

TEST(Bf16Gemv, PairEqualsTwoSingles_Ds41Shared_T1_T8) {
  MOECHECK_REQUIRE_GPU();
  for (int64_t T : {1, 8}) {
    emutest::Gen g(77 + T);
    const int64_t rows = 2304, K = 5120;
    const auto w0 = g.bf16(rows * K, 0.02), w1 = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
    std::vector<float> want0(static_cast<size_t>(T * rows)), want1(want0.size());
    emu::bf16_gemv(w0.data(), x.data(), want0.data(), rows, K, T);
    emu::bf16_gemv(w1.data(), x.data(), want1.data(), rows, K, T);
    DevArray<uint16_t> d0(w0), d1(w1), dx(x);
    DevArray<float> y0(want0.size()), y1(want1.size());
    cuda::bf16_gemv_pair(d0.get(), d1.get(), dx.get(), y0.get(), y1.get(), rows, K, T, nullptr);
    const std::string r = gputest::repro(77 + T, "T=" + std::to_string(T));
    ASSERT_TRUE(same_f32("shared gate", y0.host(), want0, rows, r));
    ASSERT_TRUE(same_f32("shared up", y1.host(), want1, rows, r));
  }
}

TEST(RouterGemv, Ds41Router384x5120_BothVariants_T1_T8) {
  MOECHECK_REQUIRE_GPU();
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    for (int64_t T : {1, 8}) {
      emutest::Gen g(4100 + T);
      const int64_t rows = 384, K = 5120;
      const auto w = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
      std::vector<float> want(static_cast<size_t>(T * rows));
      emu::router_gemv(v, w.data(), x.data(), want.data(), rows, K, T);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      cuda::router_gemv(v, dw.get(), dx.get(), dy.get(), rows, K, T, nullptr);
      ASSERT_TRUE(same_f32("router logits", dy.host(), want, rows,
                           gputest::repro(4100 + T, v == RouterVariant::kPlain ? "plain" : "staged")));
    }
  }
}

TEST(RouterGemv, BadShapesThrowBeforeLaunch) {
  MOECHECK_REQUIRE_GPU();
  DevArray<uint16_t> w(1024), x(1024);
  DevArray<float> y(64);
  EXPECT_THROW(cuda::router_gemv(RouterVariant::kStaged, w.get(), x.get(), y.get(), 2, 12, 1, nullptr), InputError);
  EXPECT_THROW(cuda::router_gemv(RouterVariant::kPlain, w.get() + 1, x.get(), y.get(), 2, 16, 1, nullptr), InputError);
  EXPECT_THROW(cuda::bf16_gemv(w.get(), x.get(), y.get(), -1, 16, 1, nullptr), InputError);
}

}  // namespace
}  // namespace moecheck
