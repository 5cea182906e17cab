// Where a differing dump element comes from, in the terms a kernel engineer debugs with: the
// weight row that produced an output column, or, for an element of a projection's input
// dimension, its q8_1 block and the Q2_K / Q3_K super-block and sub-block that multiply it.
// Contract: docs/cli.md "diff" (mismatch locations).
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/taps.h"

namespace moecheck {

// Element k of x (the gate/up input, K = dim).
std::string where_input_element(const MoeConfig& c, int64_t k);
// Router logit column e.
std::string where_router_row(int64_t e);
// q8_1 block g of x (down_input false, K = dim) or of h (down_input true, K = inter).
std::string where_q8_block(const MoeConfig& c, int64_t g, bool down_input, int32_t expert);
// Column j of an expert stage (weights, gate, up, h, down); expert -1 is the shared one.
std::string where_expert_element(const MoeConfig& c, ExpertField f, int32_t expert, int64_t j);
// Column j of acc / output.
std::string where_output_column(int64_t j);
// Name of byte i of a block_q8_1: "d", "s" or "qs[n]".
std::string q8_field_name(int i);

}  // namespace moecheck
