// Growable device and pinned host allocations of the layer driver (cuda/moe_layer.cu): reserve(n)
// reallocates when n exceeds the current size (contents are not kept) and says whether the
// buffer moved, so a driver can drop CUDA graphs that captured the old address.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/check.h"

namespace moecheck::cuda {

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  bool reserve(size_t n) {
    if (n <= bytes) return false;
    if (p != nullptr) MOECHECK_CUDA_CHECK(cudaFree(p));
    MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
    bytes = n;
    return true;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p != nullptr) (void)cudaFree(p);
  }
};

struct PinnedBuf {
  void* p = nullptr;
  size_t bytes = 0;
  bool reserve(size_t n) {
    if (n <= bytes) return false;
    if (p != nullptr) MOECHECK_CUDA_CHECK(cudaFreeHost(p));
    MOECHECK_CUDA_CHECK(cudaMallocHost(&p, n));
    bytes = n;
    return true;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  PinnedBuf() = default;
  PinnedBuf(const PinnedBuf&) = delete;
  PinnedBuf& operator=(const PinnedBuf&) = delete;
  ~PinnedBuf() {
    if (p != nullptr) (void)cudaFreeHost(p);
  }
};

}  // namespace moecheck::cuda
