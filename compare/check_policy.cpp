// The agreement rules of `moecheck check`: ref ~ emu by the derived bounds of docs/numerics.md
// (compare/bounds.cpp computes them), NMSE measured for information, emu = cuda exact.
// Contract: docs/cli.md "check".
#include "compare/check_policy.h"

#include <limits>

namespace moecheck {
namespace {

// The stages both sides must hold bit for bit in the ref ~ emu comparison.
constexpr Stage kSameBits[] = {Stage::kInput, Stage::kSharedWeights};

const StageDiff* first_bits_failure(const LayerDiff& info) {
  for (Stage s : kSameBits)
    if (const StageDiff* d = info.stage(s); d != nullptr && !d->pass) return d;
  return nullptr;
}

}  // namespace

DiffOptions ref_info_options() {
  DiffOptions o;
  // No NMSE limit: the verdict is the bounds'. The measured NMSE stays in the table to show how
  // far apart the legs are on the whole (docs/cli.md lists typical values).
  o.tolerance.mode = ToleranceMode::kNmse;
  o.tolerance.nmse = std::numeric_limits<double>::infinity();
  o.stage_tolerance[Stage::kInput] = Tolerance{};          // both sides got the same bits
  o.stage_tolerance[Stage::kSharedWeights] = Tolerance{};  // 1 for every token on both sides
  // The reference has no q8_1 blocks.
  o.informational = {Stage::kXQ8, Stage::kExpertsHQ8, Stage::kSharedHQ8};
  return o;
}

DiffOptions exact_leg_options() { return DiffOptions{}; }

bool ref_leg_pass(const LayerDiff& info, const LegReport& bounds) {
  return first_bits_failure(info) == nullptr && bounds.ok();
}

Stage ref_leg_first_failing(const LayerDiff& info, const LegReport& bounds) {
  if (const StageDiff* d = first_bits_failure(info)) return d->stage;
  return bounds.first_failing();
}

}  // namespace moecheck
