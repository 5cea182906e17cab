// Non-finite weights reported on the first read of a tensor or expert slice (never by scanning a
// whole model at load): bf16 / f16 / f32 values that are NaN or Inf, and the f16 super-block
// scales of Q2_K (d, dmin) and Q3_K (d). Called by SliceHasher::slice, which reads every piece a
// run used exactly once. The layer APIs keep their own NaN contract (docs/reliability.md "Bad
// input (weights and inputs)").
#pragma once

#include <cstdint>
#include <string>

namespace moecheck {

// Throws InputError "<file>: tensor <slice>: <what> is <NaN|+Inf|-Inf> (bits 0x...) at row r,
// column c" (dense types) or "... super-block b of row r: <d|dmin> is NaN (f16 0x7e00)" (K-quants)
// for the first non-finite value of `n` bytes at `p`, a slice of rows of `cols` values of ggml type
// `type`. Types without floats to check (none here) pass.
void check_finite_slice(const std::string& file, const std::string& slice, uint32_t type,
                        int64_t cols, const uint8_t* p, uint64_t n);

}  // namespace moecheck
