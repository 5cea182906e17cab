// The agreement rules of `moecheck check`: ref ~ emu by the derived bounds of docs/numerics.md
// (compare/bounds.cpp computes them), NMSE measured for information, emu = cuda exact.
// Contract: docs/cli.md "check".
#include "compare/check_policy.h"

#include <limits>

namespace moecheck {
namespace {

bool input_same(const LayerDiff& info) {
  for (const StageDiff& s : info.stages)
    if (s.stage == "input" || s.stage == "shared.weights") {
      if (!s.pass) return false;
    }
  return true;
}

}  // namespace

DiffOptions ref_info_options() {
  DiffOptions o;
  // No NMSE limit: the verdict is the bounds'. The measured NMSE stays in the table to show how
  // far apart the legs are on the whole (docs/cli.md lists typical values).
  o.tolerance.mode = ToleranceMode::kNmse;
  o.tolerance.nmse = std::numeric_limits<double>::infinity();
  o.stage_tolerance["input"] = Tolerance{};           // both sides got the same bits
  o.stage_tolerance["shared.weights"] = Tolerance{};  // 1 for every token on both sides
  // The reference has no q8_1 blocks.
  o.informational = {"x_q8", "experts.h_q8", "shared.h_q8"};
  return o;
}

DiffOptions exact_leg_options() { return DiffOptions{}; }

bool ref_leg_pass(const LayerDiff& info, const BoundsReport& bounds) {
  return input_same(info) && bounds.ok();
}

std::string ref_leg_first_failing(const LayerDiff& info, const BoundsReport& bounds) {
  if (!input_same(info)) {
    for (const StageDiff& s : info.stages)
      if ((s.stage == "input" || s.stage == "shared.weights") && !s.pass) return s.stage;
  }
  return bounds.first_failing();
}

}  // namespace moecheck
