// Emulation twins of the accumulation of weighted expert outputs and the final bf16 rounding.
// Contract: docs/numerics.md "accumulate, finish".
#pragma once

#include <cstdint>

namespace moecheck::emu {

// ids, weights [T, topk] (a token's picks in any order, distinct ids); down f32 [T, topk, dim],
// down[(t * topk + k) * dim + i] the down projection of pick k of token t (unweighted); shared
// f32 [T, dim]. acc f32 [T, dim]: per token, acc = +0, fma_rn(weight, down, acc) over the picks
// in ascending expert id, then add_rn(acc, shared).
void accumulate(const int32_t* ids, const float* weights, const float* down, const float* shared,
                float* acc, int64_t T, int64_t topk, int64_t dim);

// y bf16 = f32_to_bf16(acc) for n values.
void finish(const float* acc, uint16_t* y, int64_t n);

}  // namespace moecheck::emu
