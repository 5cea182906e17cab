// The one CUDA error path of moecheck (house style rule 7), used by cuda/, the GPU tests and the
// benchmarks: MOECHECK_CUDA_CHECK(stmt) reports the statement, file, line, device and CUDA error
// name, then aborts ([[noreturn]]). After every kernel launch: MOECHECK_CUDA_CHECK(
// cudaGetLastError()). A failed CUDA call is a broken device or a bug, never bad input:
// preconditions (shapes, alignment, token counts, warps) are checked before launch and thrown as
// InputError by the wrappers in cuda/kernels.h.
#pragma once

#include <cuda_runtime.h>

namespace moecheck::cuda {

[[noreturn]] void cuda_fail(cudaError_t err, const char* stmt, const char* file, int line);

}  // namespace moecheck::cuda

#define MOECHECK_CUDA_CHECK(stmt)                                            \
  do {                                                                       \
    const cudaError_t moecheck_err_ = (stmt);                                \
    if (moecheck_err_ != cudaSuccess)                                        \
      ::moecheck::cuda::cuda_fail(moecheck_err_, #stmt, __FILE__, __LINE__); \
  } while (0)
