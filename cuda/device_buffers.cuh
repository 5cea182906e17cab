// Growable device and pinned host allocations of the layer driver (cuda/moe_layer.cu): reserve(n)
// reallocates when n exceeds the current size (contents are not kept) and says whether the
// buffer moved, so a driver can drop CUDA graphs that captured the old address.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/check.h"

namespace moecheck::cuda {

enum class Memory { kDevice, kPinnedHost };

template <Memory kMem>
struct GrowBuf {
  void* p = nullptr;
  size_t bytes = 0;

  bool reserve(size_t n) {
    if (n <= bytes) return false;
    release();
    if constexpr (kMem == Memory::kDevice) MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
    else MOECHECK_CUDA_CHECK(cudaMallocHost(&p, n));
    bytes = n;
    return true;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  GrowBuf() = default;
  GrowBuf(const GrowBuf&) = delete;
  GrowBuf& operator=(const GrowBuf&) = delete;
  ~GrowBuf() {
    if (p == nullptr) return;
    if constexpr (kMem == Memory::kDevice) (void)cudaFree(p);
    else (void)cudaFreeHost(p);
  }

 private:
  void release() {
    if (p == nullptr) return;
    if constexpr (kMem == Memory::kDevice) MOECHECK_CUDA_CHECK(cudaFree(p));
    else MOECHECK_CUDA_CHECK(cudaFreeHost(p));
    p = nullptr;
    bytes = 0;
  }
};

using DevBuf = GrowBuf<Memory::kDevice>;
using PinnedBuf = GrowBuf<Memory::kPinnedHost>;

}  // namespace moecheck::cuda
