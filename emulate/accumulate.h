// Emulation twins of the accumulation of weighted expert outputs and the final bf16 rounding.
// Contract: docs/numerics.md "accumulate, finish".
#pragma once

#include <cstdint>

namespace moecheck::emu {

// For token t: acc = +0; for k = 0..topk-1: acc = fma_rn(weights[t, k], down[rows[t, k], :], acc);
// then acc = add_rn(acc, shared[t, :]). rows / weights [T, topk] list each token's picks in
// ascending expert id (core/layer_plan.h acc_rows / acc_weights: the order is the contract);
// down [*, dim] unweighted down projections by pair row; shared [T, dim] (nullable: no shared
// term); acc f32 [T, dim]; y bf16 [T, dim] (nullable) = f32_to_bf16(acc).
void accumulate(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim);

// y bf16 = f32_to_bf16(acc) for n values.
void finish(const float* acc, uint16_t* y, int64_t n);

}  // namespace moecheck::emu
