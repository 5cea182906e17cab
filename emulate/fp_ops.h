// Correctly rounded f32 operations with one spelling for host and device, so that the kernels
// and their emulation twins write the same expression: on the device the explicit _rn
// intrinsics (never contracted, never approximated), on the host plain IEEE operations compiled
// with -ffp-contract=off and std::fma. Contract: docs/numerics.md "Conventions".
#pragma once

#include <cmath>

#include "emulate/numfmt.h"

namespace moecheck {

MOECHECK_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MOECHECK_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MOECHECK_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MOECHECK_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MOECHECK_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MOECHECK_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace moecheck
