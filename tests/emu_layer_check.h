// Stage-by-stage comparison of the emulation's layer forward with the reference in Exact mode
// (moecheck::ref, f64): a gtest wrapper over check_emu_against_exact (compare/bounds.h,
// which implements the bounds of docs/numerics.md "Error bounds vs the reference's Exact mode").
// Every stage must be within its bound (a failure names the first violating value with its
// location and bound); routing flips are printed and must be explained by the logit bound.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "emulate/moe_layer.h"

namespace moecheck::emutest {

// Checks a report: no unexplained flip, no stage with a violation, every stage checked something
// (an empty stage would make the check vacuous). Prints the flips and each stage's worst
// |emu - ref| / bound.
inline void expect_within_bounds(const LegReport& r, const std::string& cfg,
                                 bool expect_all_stages) {
  for (const std::string& line : r.flip_lines) std::printf("%s %s\n", cfg.c_str(), line.c_str());
  EXPECT_EQ(r.unexplained_flips, 0) << cfg << ": unexplained routing flip(s), see the lines above";
  for (const StageCheck& s : r.stages) {
    EXPECT_EQ(s.violations, 0)
        << cfg << ": " << stage_name(s.stage) << ": " << s.violations << " of " << s.checked
        << " values outside the bound; first: " << s.first_violation << " (repro: --gtest_filter="
        << ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() << "."
        << ::testing::UnitTest::GetInstance()->current_test_info()->name() << ")";
    if (expect_all_stages) {
      EXPECT_GT(s.checked, 0) << cfg << ": stage " << stage_name(s.stage) << " checked nothing";
    }
  }
  std::printf("%s layer %d: %lld routing flip(s); worst |emu - ref| / bound per stage:",
              cfg.c_str(), r.layer, static_cast<long long>(r.flips));
  for (const StageCheck& s : r.stages) std::printf(" %s %.3g", stage_name(s.stage), s.worst_ratio);
  std::printf("\n");
}

// Runs the emulation on x [T, dim] and checks every stage against the Exact reference. `cfg`
// names the configuration; flips_out receives the number of flipped (emulation, reference) pairs.
inline void check_against_reference(const LayerWeights& w, const std::vector<uint16_t>& x,
                                    int64_t T, const emu::LayerOptions& lo, const std::string& cfg,
                                    int* flips_out = nullptr) {
  const emu::MoeLayer layer(w, lo);
  LayerTaps et;
  layer.forward(x.data(), T, &et);
  const LegReport r = check_emu_against_exact(w, et, lo.router);
  if (flips_out) *flips_out = static_cast<int>(r.flips);
  expect_within_bounds(r, cfg, T > 0);
}

}  // namespace moecheck::emutest
