// Human and machine forms of a dump comparison (compare/dump_diff.h): the per-layer stage
// table, routing flips with their margins, the first located mismatches. Used by `diff`,
// `check` and `golden verify`. Contract: docs/cli.md "diff" (output).
#pragma once

#include <string>

#include "compare/dump_diff.h"
#include "tools/json.h"

namespace moecheck::cli {

// Full text report: one table per layer, mismatches, the verdict line.
std::string diff_text(const DiffReport& r);
// One mismatch on one line: stage, token, expert, column / block, both values (hex), ULPs, where.
std::string mismatch_line(const Mismatch& m, const std::string& dtype);
// Its position in the stage: "expert 3 token 5 col 17", "token 2 block 4", "token 1 expert 6".
std::string mismatch_position(const Mismatch& m, const std::string& dtype);
// Appends the report as one JSON object.
void diff_json(Json& j, const DiffReport& r);
// "%.3g" with inf/nan spelled out.
std::string fmt_num(double v);

}  // namespace moecheck::cli
