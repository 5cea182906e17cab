// `moecheck check --against FILE`: an imported dump (another engine's tensors, `moecheck import`)
// judged against the reference on the same input with every leg its stages allow; the legs and
// stages that cannot run are listed with the reason. Contract: docs/cli.md "check --against".
#pragma once

#include <string>
#include <vector>

#include "compare/check.h"

namespace moecheck {

struct ImportCheckInputs {
  const Dump* imported = nullptr;  // implementation "import"
  // The kernel contract run on the imported input (the emulation, every stage tapped): its
  // intermediate stages predict the statistical leg's noise where the import has no taps.
  const Dump* contract = nullptr;
  const Dump* ref = nullptr;  // the reference (model precision, taps) on the same input: NMSE
  std::function<LayerWeights(int)> layer;
  RouterVariant router = RouterVariant::kStaged;  // the contract run's router variant
  std::function<void(int)> on_bounds_layer;
};

// The legs: "ref~import" (the bounds of compare/bounds.h) and "ref~import stat" on the stages the
// import holds, "import local" with every stage; CheckResult::legs_not_run says what did not run
// and why. InputError when the dumps do not match (layers, tokens, input bits).
CheckResult judge_import(const ImportCheckInputs& in);

}  // namespace moecheck
