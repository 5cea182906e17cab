// What `moecheck check` calls agreement between the implementations (docs/cli.md "check"):
// emu = cuda bit for bit on every stage; ref ~ emu within a stated NMSE bound per stage, with
// routing flips accepted only when the flipped token's margin is within what the router-logit
// difference can explain. The bounds are measured and derived in docs/cli.md.
#pragma once

#include <string>

#include "golden/dump_diff.h"

namespace moecheck::cli {

// Options of the ref ~ emu (or ref ~ cuda) leg. A K-quant shared expert (gate/up Q2_K, down
// Q3_K through the routed kernels) gets the routed experts' bounds on its stages.
DiffOptions ref_leg_options(bool kquant_shared = false);
// Options of the emu = cuda leg: exact everywhere.
DiffOptions exact_leg_options();

}  // namespace moecheck::cli
