// Golden-set verification: the tolerance each implementation's committed dumps are held to and
// the comparison of a committed dump with a freshly computed one. `moecheck golden verify` and
// the golden-set CPU test call it. Contract: docs/golden-format.md "Golden set".
#pragma once

#include <string>

#include "compare/dump_diff.h"
#include "golden/dump.h"

namespace moecheck {

// emu: exact. ref: |a-b| <= 1e-4 + 2^-7 |a| per element (docs/golden-format.md derives it).
Tolerance golden_tolerance(const std::string& impl);

// The committed dump `golden` against `fresh` (same model, inputs and knobs) under
// golden_tolerance(impl).
DiffReport verify_golden_dump(const Dump& golden, const Dump& fresh, const std::string& impl);

// Whether `fresh` holds what the committed dump holds, so that `golden update` leaves the file
// untouched: every stage the same bits (the comparison of verify_golden_dump, exact for every
// implementation: update records a reference that moved within its tolerance), and the same
// implementation, knobs, inputs, layers, taps and model digests. The build's provenance
// (tool_version, git_commit) and the device are not content. Dumps that cannot be compared are
// not the same.
bool same_golden_content(const Dump& committed, const Dump& fresh);

}  // namespace moecheck
