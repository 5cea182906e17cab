// The one CUDA error path of moecheck::cuda (house style rule 7): MOECHECK_CUDA_CHECK(stmt)
// reports the statement, file, line, device and CUDA error name, then aborts ([[noreturn]]).
// A failed CUDA call is a broken device or a bug, never bad input: preconditions (shapes,
// alignment, token counts, warps) are checked before launch and thrown as InputError or
// std::invalid_argument by the wrappers in cuda/kernels.h. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace moecheck::cuda {

[[noreturn]] void cuda_fail(cudaError_t err, const char* stmt, const char* file, int line);

}  // namespace moecheck::cuda

#define MOECHECK_CUDA_CHECK(stmt)                                              \
  do {                                                                         \
    const cudaError_t moecheck_err_ = (stmt);                                  \
    if (moecheck_err_ != cudaSuccess)                                          \
      ::moecheck::cuda::cuda_fail(moecheck_err_, #stmt, __FILE__, __LINE__);   \
  } while (0)

// After every kernel launch: the launch itself (bad configuration) fails here.
#define MOECHECK_CUDA_LAUNCHED() MOECHECK_CUDA_CHECK(cudaGetLastError())
