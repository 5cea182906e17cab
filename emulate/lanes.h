// Internal helpers of the emulation twins' fast paths: the lanes' chains written as plain loops
// over a prefix of lanes (the compiler vectorises them; each lane's chain keeps its order) and
// lane 0's value of the butterfly. Contract: docs/numerics.md "Conventions".
#pragma once

#include <cstdint>

#include "core/fp_ops.h"
#include "core/schedule.h"

namespace moecheck::emu::detail {

// acc[i] = fma_rn(a[i], b[i], acc[i]) for the lanes i < n: one step of n independent chains.
inline void fma_step(float* __restrict acc, const float* __restrict a, const float* __restrict b,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = fma_rn(a[i], b[i], acc[i]);
}

// Lane 0's value of butterfly(v) (core/schedule.h), computing only what lane 0 reads: after the
// step of offset o only lanes below o are read again, and for l < o the partner l ^ o is l + o.
// add_rn is commutative bit for bit (NaN results are canonical), so v[l] + v[l + o] is the value
// lane l holds in the full butterfly. Clobbers v.
inline float butterfly0(float* v) {
  for (int o = kWarpSize / 2; o >= 1; o /= 2)
    for (int l = 0; l < o; ++l) v[l] = add_rn(v[l], v[l + o]);
  return v[0];
}

}  // namespace moecheck::emu::detail
