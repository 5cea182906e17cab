// emu::bf16_gemv and emu::bf16_gemv_pair (docs/numerics.md "bf16_gemv"): the router's plain
// schedule on [rows, K] bf16 weights, so bit for bit emu::router_gemv(kPlain); the pair equals
// two single GEMVs; within the bf16 GEMV bound of the f64 dot product; T-independent per row.
// Repro: --gtest_filter=EmuBf16Gemv*.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/numfmt.h"
#include "emulate/bf16_gemv.h"
#include "emulate/router_gemv.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

TEST(EmuBf16Gemv, PlainScheduleBoundAndPair_rows37_K2304_T5) {
  emutest::Gen g(19);
  const int64_t rows = 37, K = 2304, T = 5;
  const auto w0 = g.bf16(rows * K, 0.05), w1 = g.bf16(rows * K, 0.05), x = g.bf16(T * K, 1.0);
  std::vector<float> y(static_cast<size_t>(T * rows)), plain(y.size()), p0(y.size()), p1(y.size());
  emu::bf16_gemv(w0.data(), x.data(), y.data(), rows, K, T);
  emu::router_gemv(RouterVariant::kPlain, w0.data(), x.data(), plain.data(), rows, K, T);
  ASSERT_EQ(std::memcmp(y.data(), plain.data(), y.size() * 4), 0)
      << "not the router's plain schedule";
  emu::bf16_gemv_pair(w0.data(), w1.data(), x.data(), p0.data(), p1.data(), rows, K, T);
  ASSERT_EQ(std::memcmp(p0.data(), y.data(), y.size() * 4), 0) << "pair's first output";
  std::vector<float> y1(y.size());
  emu::bf16_gemv(w1.data(), x.data(), y1.data(), rows, K, T);
  ASSERT_EQ(std::memcmp(p1.data(), y1.data(), y.size() * 4), 0) << "pair's second output";
  // One token at a time: the same bits (no result depends on T).
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> one(static_cast<size_t>(rows));
    emu::bf16_gemv(w0.data(), x.data() + t * K, one.data(), rows, K, 1);
    ASSERT_EQ(std::memcmp(one.data(), y.data() + t * rows, one.size() * 4), 0) << "token " << t;
  }
  // Within gamma_D sum |w x| of the f64 dot product, D = 8 K / 256 + 5 (lane chain + butterfly).
  const int64_t D = 8 * K / 256 + 5;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p =
            static_cast<double>(bf16_to_f32(w0[r * K + k])) * bf16_to_f32(x[t * K + k]);
        exact += p;
        mag += std::fabs(p);
      }
      ASSERT_LE(std::fabs(y[t * rows + r] - exact), emutest::gamma(D) * mag)
          << "token " << t << " row " << r;
    }
}

}  // namespace
}  // namespace moecheck
