// Correctly rounded f32 operations with one spelling for host and device, so that the kernels
// and their emulation twins write the same expression: on the device the explicit _rn
// intrinsics (never contracted, never approximated), on the host plain IEEE operations compiled
// with -ffp-contract=off and std::fma. Contract: docs/numerics.md "Conventions".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numfmt.h"

namespace moecheck {

// NaN results: every f32 arithmetic instruction of the GPU returns the canonical NaN 0x7FFFFFFF
// (input payloads are not propagated), while the host propagates payloads or returns
// 0xFFC00000. The host branch canonicalises each NaN result the same way, so that NaN outputs
// also match bit for bit (found on the H200: cuda 0x7FFFFFFF vs emu 0x7FC10000; docs/gpu.md).
inline float canonical_nan_host(float r) {
  if (r != r) {
    const uint32_t u = 0x7FFFFFFFu;
    std::memcpy(&r, &u, sizeof r);
  }
  return r;
}

MOECHECK_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return canonical_nan_host(std::fma(a, b, c));
#endif
}
MOECHECK_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return canonical_nan_host(a * b);
#endif
}
MOECHECK_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return canonical_nan_host(a + b);
#endif
}
MOECHECK_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return canonical_nan_host(a - b);
#endif
}
MOECHECK_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return canonical_nan_host(a / b);
#endif
}
MOECHECK_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return canonical_nan_host(std::sqrt(a));
#endif
}

}  // namespace moecheck
