// pexp against exp in double over every f32 in [-104, 88.7228] (2.24e9 inputs, ~70 s): the
// figures of docs/numerics.md "pexp" (max 0.939 ulp normal, 0.849 ulp of 2^-149 subnormal),
// asserted against the used bound P_exp = 1 ulp.
#include <gtest/gtest.h>

#include "tests/emu_pexp_sweep.h"

namespace moecheck {
namespace {

TEST(EmuPexpSlow, EveryInputWithinOneUlp) {
  const emutest::SweepResult r = emutest::sweep_pexp(1);
  emutest::print_sweep("full sweep", r);
  EXPECT_EQ(r.n, 2239853080u);
  EXPECT_LE(r.worst_normal, 1.0) << "at x = " << r.x_normal;
  EXPECT_LE(r.worst_subnormal, 1.0) << "at x = " << r.x_subnormal;
}

}  // namespace
}  // namespace moecheck
