// cuda::quantize_q8_1 (f32 and bf16 input) vs emu::quantize_q8_1, bitwise: >= 100 seeded
// random cases and adversarial blocks (values on rounding ties x/d = k + 0.5, NaN and Inf,
// all zero, subnormal inputs whose amax / 127 underflows, huge values), each launch twice.
// Contract: docs/numerics.md "quantize_q8_1".
#include <cmath>

#include "core/error.h"
#include "cuda/kernels.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;

std::vector<float> make_rows(uint64_t seed, int64_t R, int64_t K) {
  emutest::Gen g(seed);
  std::vector<float> x = g.f32(R * K, std::ldexp(1.0, static_cast<int>(g.u32() % 40) - 20));
  for (int64_t b = 0; b < R * K / kQK8_1; ++b) {
    float* v = x.data() + b * kQK8_1;
    switch (g.u32() % 9) {
      case 0: v[g.u32() % kQK8_1] = std::nanf(""); break;
      case 1: v[g.u32() % kQK8_1] = -INFINITY; break;
      case 2:
        for (int i = 0; i < kQK8_1; ++i) v[i] = 0.0f;
        break;
      case 3:  // amax = 127 makes d = 1: every other value on a tie k + 0.5
        v[0] = 127.0f;
        for (int i = 1; i < kQK8_1; ++i)
          v[i] = static_cast<float>(static_cast<int>(g.u32() % 250) - 125) + 0.5f;
        break;
      case 4:
        for (int i = 0; i < kQK8_1; ++i) v[i] = std::ldexp(static_cast<float>(g.u32() % 64), -149);
        break;
      case 5: v[g.u32() % kQK8_1] = 3.0e38f; break;
      default: break;
    }
  }
  return x;
}

TEST(QuantizeQ8_1, F32EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const int64_t R = 1 + static_cast<int64_t>(seed % 9),
                  K = 32 * (1 + static_cast<int64_t>(seed * 7 % 50));
    const auto x = make_rows(seed, R, K);
    std::vector<BlockQ8_1> want(static_cast<size_t>(R * K / kQK8_1));
    emu::quantize_q8_1(x.data(), want.data(), R, K);
    DevArray<float> dx(x);
    DevArray<BlockQ8_1> dy(want.size());
    for (int run = 0; run < 2; ++run) {
      dy.poison();
      cuda::quantize_q8_1(dx.get(), dy.get(), R, K, nullptr);
      ASSERT_TRUE(gputest::same_q8(run == 0 ? "x_q8" : "x_q8 (second run)", dy.host(), want,
                                   K / kQK8_1, gputest::repro(seed)));
    }
  }
}

TEST(QuantizeQ8_1, Bf16EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed + 5000);
    const int64_t R = 1 + static_cast<int64_t>(seed % 8),
                  K = 32 * (1 + static_cast<int64_t>(seed % 40));
    std::vector<uint16_t> xb = g.bf16(R * K, 1.0);
    if (seed % 4 == 0) xb[g.u32() % xb.size()] = 0x7FC0;
    std::vector<BlockQ8_1> want(static_cast<size_t>(R * K / kQK8_1));
    emu::quantize_q8_1_bf16(xb.data(), want.data(), R, K);
    DevArray<uint16_t> dx(xb);
    DevArray<BlockQ8_1> dy(want.size());
    cuda::quantize_q8_1_bf16(dx.get(), dy.get(), R, K, nullptr);
    ASSERT_TRUE(gputest::same_q8("x_q8 (bf16 input)", dy.host(), want, K / kQK8_1,
                                 gputest::repro(seed + 5000)));
  }
}

TEST(QuantizeQ8_1, KNotMultipleOf32Throws) {
  MOECHECK_REQUIRE_GPU();
  DevArray<float> x(64);
  DevArray<BlockQ8_1> y(4);
  EXPECT_THROW(cuda::quantize_q8_1(x.get(), y.get(), 1, 48, nullptr), InputError);
}

}  // namespace
}  // namespace moecheck
