// What `moecheck check` calls agreement between the implementations (docs/cli.md "check"):
// emu = cuda bit for bit on every stage; ref ~ emu (or ref ~ cuda) within the bounds derived in
// docs/numerics.md "Error bounds vs the reference's Exact mode" (compare/bounds.h), stage by
// stage, routing flips only where the logit bound explains them. NMSE of ref ~ emu against the
// reference in the requested precision is measured for information only.
#pragma once

#include <string>

#include "compare/bounds.h"
#include "compare/dump_diff.h"

namespace moecheck {

// Options of the informational ref ~ emu dump comparison: NMSE per stage with no limit, except
// the input (both sides must have run on the same bits) and shared.weights (1 on both sides).
DiffOptions ref_info_options();
// Options of the emu = cuda leg: exact everywhere.
DiffOptions exact_leg_options();

// The ref ~ emu verdict of one layer: every stage within its derived bound, every routing flip
// explained, and the same input bits on both sides (`info` is the NMSE comparison of the dumps).
bool ref_leg_pass(const LayerDiff& info, const LegReport& bounds);
// The first thing that broke in pipeline order (the input's bits before any bound); meaningful
// when ref_leg_pass is false.
Stage ref_leg_first_failing(const LayerDiff& info, const LegReport& bounds);

}  // namespace moecheck
