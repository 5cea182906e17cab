// Device discovery for the command line and the tests: whether a CUDA device can be used (and
// why not), and its name. Never aborts: a machine without a GPU is a normal case. Also the
// current device's multiprocessor count for the kernels' persistent grids (cuda/device_util.cuh).
#include <cuda_runtime.h>

#include <string>

#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/moe_layer.h"

namespace moecheck::cuda {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why != nullptr)
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device present (cudaGetDeviceCount returned 0)";
    return false;
  }
  return true;
}

std::string device_name(int device) {
  if (!device_available(nullptr)) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

int current_sm_count() {
  int dev = 0, sms = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

}  // namespace moecheck::cuda
