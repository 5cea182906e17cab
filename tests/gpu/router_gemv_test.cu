// cuda::router_gemv (plain, staged) vs emu::router_gemv, bitwise: >= 100 seeded random cases per
// variant (T = 1..11 crosses the 8-token group), adversarial inputs (tests/gpu/gemv_cases.h),
// each launch twice. Contract: docs/numerics.md "router_gemv".
#include "core/error.h"
#include "cuda/kernels.h"
#include "emulate/router_gemv.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gemv_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::same_f32;

// wt: the weights' type; the F16 cases read the same random bits as f16 (normals, subnormals,
// and whatever the adversarial cases plant). force_T = 1: the one-token kernel.
void check(RouterVariant v, uint64_t seed, GgmlType wt = GgmlType::kBF16, int64_t force_T = 0) {
  gputest::check_gemv_case(
      seed, wt == GgmlType::kF16 ? "logits (f16 router)" : "logits",
      [v, wt](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        emu::router_gemv(v, w, x, y, rows, K, T, wt);
      },
      [v, wt](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        cuda::router_gemv(v, w, x, y, rows, K, T, nullptr, wt);
      },
      force_T);
}

TEST(RouterGemv, PlainEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kPlain, s));
}

TEST(RouterGemv, StagedEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kStaged, s));
}

// The F16 routers of the deepseek4 / deepseek41 conventions: both variants, any T and one token.
TEST(RouterGemv, F16WeightsEqualEmu_BothVariants_100Seeds_AndOneToken) {
  MOECHECK_REQUIRE_GPU();
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged})
    for (uint64_t s = 1; s <= 100; ++s) {
      ASSERT_NO_FATAL_FAILURE(check(v, 7000 + s, GgmlType::kF16));
      ASSERT_NO_FATAL_FAILURE(check(v, 7500 + s, GgmlType::kF16, 1));
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
      ASSERT_TRUE(
          same_f32("router logits", dy.host(), want, rows,
                   gputest::repro(4100 + T, v == RouterVariant::kPlain ? "plain" : "staged")));
    }
  }
}

TEST(RouterGemv, BadShapesThrowBeforeLaunch) {
  MOECHECK_REQUIRE_GPU();
  DevArray<uint16_t> w(1024), x(1024);
  DevArray<float> y(64);
  EXPECT_THROW(
      cuda::router_gemv(RouterVariant::kStaged, w.get(), x.get(), y.get(), 2, 12, 1, nullptr),
      InputError);
  EXPECT_THROW(
      cuda::router_gemv(RouterVariant::kPlain, w.get() + 1, x.get(), y.get(), 2, 16, 1, nullptr),
      InputError);
  EXPECT_THROW(cuda::bf16_gemv(w.get(), x.get(), y.get(), -1, 16, 1, nullptr), InputError);
}

}  // namespace
}  // namespace moecheck
