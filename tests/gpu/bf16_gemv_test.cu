// cuda::bf16_gemv and cuda::bf16_gemv_pair vs emu::bf16_gemv / emu::bf16_gemv_pair, bitwise:
// >= 100 seeded cases (tests/gpu/gemv_cases.h), each launch twice; the pair at the ds41 shared
// expert's shape. Contract: docs/numerics.md "bf16_gemv".
#include "cuda/kernels.h"
#include "emulate/bf16_gemv.h"
#include "tests/gpu/gemv_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::same_f32;

void check(uint64_t seed, int64_t force_T = 0) {
  gputest::check_gemv_case(
      seed, "y", emu::bf16_gemv,
      [](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        cuda::bf16_gemv(w, x, y, rows, K, T, nullptr);
      },
      force_T);
}

TEST(Bf16Gemv, EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(s));
}

// One token: the kernel that loads the lane's whole row first (K up to 3200 here, and beyond
// 8192 values the general kernel).
TEST(Bf16Gemv, OneTokenEqualsEmu_60Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1001; s <= 1060; ++s) ASSERT_NO_FATAL_FAILURE(check(s, 1));
  for (uint64_t s = 1061; s <= 1064; ++s) {  // K beyond the one-token kernel's 8192
    emutest::Gen g(s);
    const int64_t rows = 5, K = 8192 + 8 * (1 + g.u32() % 64);
    const auto w = g.bf16(rows * K, 0.05), x = g.bf16(K, 1.0);
    std::vector<float> want(static_cast<size_t>(rows));
    emu::bf16_gemv(w.data(), x.data(), want.data(), rows, K, 1);
    DevArray<uint16_t> dw(w), dx(x);
    DevArray<float> dy(want.size());
    cuda::bf16_gemv(dw.get(), dx.get(), dy.get(), rows, K, 1, nullptr);
    ASSERT_TRUE(same_f32("y (K > 8192)", dy.host(), want, rows,
                         gputest::repro(s, "K=" + std::to_string(K))));
  }
}

TEST(Bf16Gemv, PairEqualsEmu_Ds41Shared_T1_T8) {
  MOECHECK_REQUIRE_GPU();
  for (int64_t T : {1, 8}) {
    emutest::Gen g(77 + T);
    const int64_t rows = 2304, K = 5120;
    const auto w0 = g.bf16(rows * K, 0.02), w1 = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
    std::vector<float> want0(static_cast<size_t>(T * rows)), want1(want0.size());
    emu::bf16_gemv_pair(w0.data(), w1.data(), x.data(), want0.data(), want1.data(), rows, K, T);
    DevArray<uint16_t> d0(w0), d1(w1), dx(x);
    DevArray<float> y0(want0.size()), y1(want1.size());
    cuda::bf16_gemv_pair(d0.get(), d1.get(), dx.get(), y0.get(), y1.get(), rows, K, T, nullptr);
    const std::string r = gputest::repro(77 + T, "T=" + std::to_string(T));
    ASSERT_TRUE(same_f32("shared gate", y0.host(), want0, rows, r));
    ASSERT_TRUE(same_f32("shared up", y1.host(), want1, rows, r));
  }
}

}  // namespace
}  // namespace moecheck
