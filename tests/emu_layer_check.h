// Stage-by-stage comparison of the emulation's layer forward with the reference in Exact mode
// (moecheck::ref, f64): a gtest wrapper over the three reference legs, check_emu_against_exact
// (compare/bounds.h: the bounds of docs/numerics.md "Error bounds vs the reference's Exact mode"
// and the statistical leg) and check_local (compare/local_leg.h), each with a floor on its
// looseness.
// Every stage must be within its bound (a failure names the first violating value with its
// location and bound); routing flips are printed and must be explained by the logit bound.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "compare/local_leg.h"
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

// Floors on how loose a passing report may be, so a bound that stopped bounding anything fails
// instead of passing forever. Accumulated and stage-local bounds: the worst |diff| / bound of each
// stage that compared a nonzero difference must reach 2.5e-4 (measured on these configs: 1.0e-3
// for ds41's bf16 shared gate, whose bound is pure f32 rounding, gamma_36 sum |w x| over 5120
// terms; 0.01 .. 0.7 elsewhere). Statistical: chi2 / n of a stage with at least 256 applicable
// values must reach 0.5 (a predicted sigma 1.4x too large gives 0.5; measured 0.85 .. 1.1).
// Stages whose check is a rule (q8_1 blocks), bit-identity (output = bf16(acc)) or propagation
// (consistency) have no floor.
inline constexpr double kRatioFloor = 2.5e-4;
inline constexpr double kChi2Floor = 0.5;

inline void expect_not_vacuous(const LegReport& r, const std::string& cfg, const char* leg) {
  for (const StageCheck& s : r.stages) {
    if (s.checked == 0) continue;
    const std::string where = cfg + ": " + leg + " " + stage_name(s.stage);
    if (s.kind == CheckKind::kStatistical) {
      const int64_t n = s.checked;  // applicable values only (not_applicable counted apart)
      if (n >= 256) {
        EXPECT_GE(s.chi2 / static_cast<double>(n), kChi2Floor)
            << where << ": predicted noise too large";
      }
      continue;
    }
    if (s.kind == CheckKind::kConsistency || s.stage == Stage::kXQ8 ||
        s.stage == Stage::kExpertsHQ8 || s.stage == Stage::kSharedHQ8 ||
        s.stage == Stage::kOutput || s.stage == Stage::kTopkIds)
      continue;
    if (s.worst_ratio > 0) {
      EXPECT_GE(s.worst_ratio, kRatioFloor) << where << ": bound far above every difference";
    }
  }
}

// Runs the emulation on x [T, dim] and checks every stage against the Exact reference with the
// accumulated bounds, the statistical leg and the stage-local leg (compare/local_leg.h), each
// against its floor too. `cfg` names the configuration; flips_out receives the number of flipped
// (emulation, reference) pairs. image_mask [T] (nullable): the image spans, routed with bias_vl
// by the emulation and, through the taps, by every leg.
inline void check_against_reference(const LayerWeights& w, const std::vector<uint16_t>& x,
                                    int64_t T, const emu::LayerOptions& lo, const std::string& cfg,
                                    int* flips_out = nullptr, const uint8_t* image_mask = nullptr) {
  const emu::MoeLayer layer(w, lo);
  LayerTaps et;
  layer.forward(x.data(), T, &et, nullptr, image_mask);
  LegReport stat;
  const LegReport r = check_emu_against_exact(w, et, lo.router, nullptr, &stat);
  if (flips_out) *flips_out = static_cast<int>(r.flips);
  expect_within_bounds(r, cfg, T > 0);
  expect_not_vacuous(r, cfg, "bounds");
  const LegReport local = check_local(w, et, lo.router);
  expect_within_bounds(local, cfg + " local", false);
  expect_not_vacuous(local, cfg, "local");
  for (const StageCheck& s : stat.stages) {
    EXPECT_FALSE(s.violations > 0 || s.chi2 > s.chi2_limit)
        << cfg << ": statistical " << stage_name(s.stage) << ": " << s.violations
        << " values over 6 sigma, chi2 " << s.chi2 << " of limit " << s.chi2_limit
        << "; first: " << s.first_violation;
    const int64_t n = s.checked;
    std::printf("%s stat %s: n %lld, chi2/n %.3g\n", cfg.c_str(), stage_name(s.stage),
                static_cast<long long>(n), n > 0 ? s.chi2 / static_cast<double>(n) : 0.0);
  }
  expect_not_vacuous(stat, cfg, "statistical");
}

}  // namespace moecheck::emutest
