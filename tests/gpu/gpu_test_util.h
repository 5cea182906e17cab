// Helpers of the GPU tests (tests/gpu/*_test.cu): the skip when no device is present (printed
// reason, never a vacuous pass), device arrays, and bitwise comparison that reports the first
// mismatch with its stage, token, row, both values in hex, the ULP distance and a repro line.
// Contract under test: every kernel equals its emulation twin bit for bit (docs/numerics.md).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "core/numfmt.h"
#include "cuda/moe_layer.h"

#define MOECHECK_REQUIRE_GPU()                                    \
  do {                                                            \
    std::string moecheck_why_;                                    \
    if (!::moecheck::cuda::device_available(&moecheck_why_))      \
      GTEST_SKIP() << "no usable CUDA device: " << moecheck_why_; \
  } while (0)

namespace moecheck::gputest {

// A device copy of a host vector (or n elements, poisoned with 0xFF bytes so unwritten output
// shows as NaN / -1, never as a plausible zero).
template <class T>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    if (cudaMalloc(&p_, bytes() + 16) != cudaSuccess) p_ = nullptr;
    if (p_ != nullptr) (void)cudaMemset(p_, 0xFF, bytes() + 16);
  }
  explicit DevArray(const std::vector<T>& v) : DevArray(v.size()) {
    if (p_ != nullptr && !v.empty())
      (void)cudaMemcpy(p_, v.data(), bytes(), cudaMemcpyHostToDevice);
  }
  ~DevArray() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_ * sizeof(T); }
  void poison() { (void)cudaMemset(p_, 0xFF, bytes()); }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    if (n_ > 0) (void)cudaMemcpy(v.data(), p_, bytes(), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

inline std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", u);
  return b;
}

// Distance in units in the last place between two floats on the ordered integer line.
inline int64_t ulp_distance(float a, float b) {
  auto key = [](float f) {
    const int64_t u = f32_bits(f);
    return (u & 0x80000000) ? -(u & 0x7FFFFFFF) : u;
  };
  return std::llabs(key(a) - key(b));
}

// got vs want bitwise ([tokens, cols] row-major). First mismatch: stage, token, column, hex
// values, ULP distance, then the repro line.
inline ::testing::AssertionResult same_f32(const std::string& stage, const std::vector<float>& got,
                                           const std::vector<float>& want, int64_t cols,
                                           const std::string& repro) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << stage << ": size " << got.size() << " vs emu "
                                         << want.size() << "\n  repro: " << repro;
  for (size_t i = 0; i < got.size(); ++i) {
    if (f32_bits(got[i]) != f32_bits(want[i])) {
      return ::testing::AssertionFailure()
             << "first mismatch in " << stage << " at token/row " << static_cast<int64_t>(i) / cols
             << ", column " << static_cast<int64_t>(i) % cols << ": cuda " << got[i] << " ("
             << hex32(f32_bits(got[i])) << ") vs emu " << want[i] << " ("
             << hex32(f32_bits(want[i])) << "), " << ulp_distance(got[i], want[i])
             << " ulp\n  repro: " << repro;
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_u16(const std::string& stage,
                                           const std::vector<uint16_t>& got,
                                           const std::vector<uint16_t>& want, int64_t cols,
                                           const std::string& repro) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << stage << ": size " << got.size() << " vs emu "
                                         << want.size() << "\n  repro: " << repro;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << "first mismatch in " << stage << " at token/row " << static_cast<int64_t>(i) / cols
             << ", column " << static_cast<int64_t>(i) % cols << ": cuda " << hex32(got[i]) << " ("
             << bf16_to_f32(got[i]) << ") vs emu " << hex32(want[i]) << " (" << bf16_to_f32(want[i])
             << "), " << ulp_distance(bf16_to_f32(got[i]), bf16_to_f32(want[i])) / 65536
             << " bf16 ulp\n  repro: " << repro;
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_q8(const std::string& stage,
                                          const std::vector<BlockQ8_1>& got,
                                          const std::vector<BlockQ8_1>& want,
                                          int64_t blocks_per_row, const std::string& repro) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << stage << ": " << got.size() << " blocks vs emu "
                                         << want.size() << "\n  repro: " << repro;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(BlockQ8_1)) != 0) {
      int j = 0;
      while (j < kQK8_1 && got[i].qs[j] == want[i].qs[j]) ++j;
      return ::testing::AssertionFailure()
             << "first mismatch in " << stage << " at row "
             << static_cast<int64_t>(i) / blocks_per_row << ", block "
             << static_cast<int64_t>(i) % blocks_per_row << ": d " << hex32(got[i].d) << "/"
             << hex32(want[i].d) << ", s " << hex32(got[i].s) << "/" << hex32(want[i].s)
             << ", first quant diff at " << j
             << (j < kQK8_1 ? " (" + std::to_string(got[i].qs[j]) + " vs " +
                                  std::to_string(want[i].qs[j]) + ")"
                            : "")
             << " (cuda/emu)\n  repro: " << repro;
    }
  }
  return ::testing::AssertionSuccess();
}

// "--gtest_filter=<this test> seed=<seed>" for the failure messages.
// The current device's multiprocessors (shapes that must exceed one tile a multiprocessor).
inline int sm_count() {
  int dev = 0, sms = 0;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms > 0 ? sms : 132;
}

inline std::string repro(uint64_t seed, const std::string& extra = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name() + " (seed " +
         std::to_string(seed) + (extra.empty() ? "" : ", " + extra) + ")";
}

}  // namespace moecheck::gputest
