// psoftplus and psigmoid against long double over every f32 input of their computed ranges
// (2.22e9 and 2.24e9 inputs, a few minutes on two cores): the figures of docs/numerics.md
// "Score functions" (max error just above 0.5 ulp; the few results that are not correctly rounded
// sit within the f64 evaluation's error of a rounding midpoint).
#include <gtest/gtest.h>

#include "tests/score_math_sweep.h"

namespace moecheck {
namespace {

TEST(ScoreMathSlow, SoftplusEveryInput) {
  const scoretest::Sweep r = scoretest::sweep<0>(1);
  scoretest::print("psoftplus (every input)", r);
  EXPECT_EQ(r.n, 2221932546u);
  EXPECT_LE(r.worst, 0.5 + 1e-6) << "at z = " << r.at;
  EXPECT_LE(r.misrounded, 10u);
}

TEST(ScoreMathSlow, SigmoidEveryInput) {
  const scoretest::Sweep r = scoretest::sweep<1>(1);
  scoretest::print("psigmoid (every input)", r);
  EXPECT_EQ(r.n, 2241855490u);
  EXPECT_LE(r.worst, 0.5 + 1e-6) << "at z = " << r.at;
  EXPECT_LE(r.misrounded, 100u);
}

}  // namespace
}  // namespace moecheck
