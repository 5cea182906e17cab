// Emulation twin of quantize_q8_1: f32 activation rows to q8_1 blocks, one block of 32 values
// per warp (lane i holds x_i). Contract: docs/numerics.md "quantize_q8_1". The kernel's
// maximum and integer sum are butterflies over exact operations (max, int add), so any order
// gives the same bits; the per-value division and rounding are written once below.
#include "emulate/quantize_q8_1.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"

namespace moecheck::emu {

namespace {

constexpr uint16_t kF16NaN = 0x7E00;

// Round to nearest integer, ties to even (the device's __float2int_rn); v is finite and
// |v| < 2^31 here. std::nearbyint uses the current mode, which moecheck never changes from
// round-to-nearest-even.
int rne_int(float v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

BlockQ8_1 quantize_block_q8_1(const float* x) {
  BlockQ8_1 b{};
  float amax = 0.0f;
  for (int i = 0; i < kQK8_1; ++i) {
    if (!std::isfinite(x[i])) {  // step 1: a NaN or Inf poisons the block
      b.d = kF16NaN;
      b.s = kF16NaN;
      return b;
    }
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;  // step 2: exact, order-free
  }
  const float d = div_rn(amax, 127.0f);  // step 4
  if (d == 0.0f) return b;  // step 3: all zero, or amax so small that amax / 127 underflows
  int sum = 0;
  for (int i = 0; i < kQK8_1; ++i) {  // step 5
    int q = rne_int(div_rn(x[i], d));
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    b.qs[i] = static_cast<int8_t>(q);
    sum += q;
  }
  b.d = f32_to_f16(d);  // step 6
  b.s = f32_to_f16(mul_rn(d, static_cast<float>(sum)));
  return b;
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t R, int64_t K) {
  if (K % kQK8_1 != 0 || R < 0) {
    throw InputError("emu::quantize_q8_1: row length K = " + std::to_string(K) +
                     " must be a multiple of 32 (rows " + std::to_string(R) + ")");
  }
  const int64_t nb = K / kQK8_1;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t b = 0; b < nb; ++b) y[r * nb + b] = quantize_block_q8_1(x + r * K + b * kQK8_1);
  }
}

void quantize_q8_1_bf16(const uint16_t* x, BlockQ8_1* y, int64_t R, int64_t K) {
  if (K % kQK8_1 != 0 || R < 0) {
    throw InputError("emu::quantize_q8_1_bf16: row length K = " + std::to_string(K) +
                     " must be a multiple of 32 (rows " + std::to_string(R) + ")");
  }
  std::vector<float> xf(static_cast<size_t>(K));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) xf[static_cast<size_t>(k)] = bf16_to_f32(x[r * K + k]);
    quantize_q8_1(xf.data(), y + r * (K / kQK8_1), 1, K);
  }
}

}  // namespace moecheck::emu
