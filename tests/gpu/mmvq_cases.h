// Inputs shared by the MMVQ and MMQ GPU tests (tests/gpu/mmvq_test.cu, mmq_test.cu): q8_1
// activation rows with adversarial blocks, and device copies of weight bytes at a chosen offset.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/blocks.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck::gputest {

// Activation rows [T, K / 32]: random normals, some blocks adversarial when asked (a NaN, a
// huge value, all zeros, values exactly on a q8 rounding tie).
inline std::vector<BlockQ8_1> make_act(emutest::Gen& g, int64_t T, int64_t K, bool adversarial) {
  std::vector<float> x = g.f32(T * K, 1.0);
  if (adversarial) {
    for (int64_t b = 0; b < T * K / kQK8_1; ++b) {
      float* v = x.data() + b * kQK8_1;
      switch (g.u32() % 6) {
        case 0: v[g.u32() % kQK8_1] = std::nanf(""); break;
        case 1: v[g.u32() % kQK8_1] = 6.0e4f; break;
        case 2:
          for (int i = 0; i < kQK8_1; ++i) v[i] = 0.0f;
          break;
        case 3:
          for (int i = 0; i < kQK8_1; ++i)
            v[i] = (static_cast<float>(g.u32() % 254) - 127.0f + 0.5f) / 127.0f;
          break;
        default: break;
      }
    }
  }
  std::vector<BlockQ8_1> a(static_cast<size_t>(T * K / kQK8_1));
  emu::quantize_q8_1(x.data(), a.data(), T, K);
  return a;
}

// Device copy of `bytes` starting `off` bytes past a 256-byte aligned base.
struct OffsetCopy {
  DevArray<uint8_t> buf;
  const uint8_t* p;
  OffsetCopy(const std::vector<uint8_t>& bytes, size_t off)
      : buf(bytes.size() + off + 16), p(buf.get() + off) {
    cudaMemcpy(const_cast<uint8_t*>(p), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
};

}  // namespace moecheck::gputest
