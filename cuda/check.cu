// The [[noreturn]] failure of MOECHECK_CUDA_CHECK (cuda/check.h): one message on stderr naming
// the statement, file, line, current device and CUDA error name and string, then abort(), so a
// debugger or core dump stops at the failing call. Also the pointer precondition shared by the
// wrappers of cuda/kernels.h (bad input, so an InputError, not a CUDA error).
#include "cuda/check.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/kernels.h"

namespace moecheck::cuda {

void cuda_fail(cudaError_t err, const char* stmt, const char* file, int line) {
  int dev = -1;
  (void)cudaGetDevice(&dev);  // best effort: the device may be the thing that broke
  std::fprintf(stderr, "moecheck: CUDA error %s (%s) in `%s` at %s:%d on device %d\n",
               cudaGetErrorName(err), cudaGetErrorString(err), stmt, file, line, dev);
  std::fflush(stderr);
  std::abort();
}

void require_aligned(const void* p, int bytes, const char* op, const char* what) {
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) != 0)
    throw InputError(std::string("cuda::") + op + ": device pointer " + what +
                     " must be non-null and " + std::to_string(bytes) + "-byte aligned");
}

}  // namespace moecheck::cuda
