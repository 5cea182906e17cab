// GGUF / ggml block formats read in place by every implementation: Q2_K (84 bytes), Q3_K
// (110 bytes) and q8_1 (36 bytes), with per-element decoders. Layouts: docs/numerics.md
// "Block formats" and docs/blocks.md (ggml's src/ggml-common.h at ggml-org/ggml d99724f2). Host
// and device clean; the CUDA kernels include this header unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/numfmt.h"

namespace moecheck {

inline constexpr int kQK_K = 256;  // values per K-quant super-block
inline constexpr int kQK8_1 = 32;  // values per q8_1 block

// ggml_type ids, as GGUF stores them (ggml's enum ggml_type, include/ggml.h).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ8_1 = 9,
  kQ2K = 10,
  kQ3K = 11,
  kBF16 = 30,
};

// ggml's block_q2_K: 16 sub-blocks of 16 values; scales[j] = (min << 4) | scale, both 4-bit.
struct BlockQ2K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];  // 2-bit quants, element 128n + 32j + l at qs[32n + l] >> 2j
  uint16_t d;             // f16 bits: scale of the sub-block scales
  uint16_t dmin;          // f16 bits: scale of the sub-block mins
};
static_assert(sizeof(BlockQ2K) == 84, "block_q2_K is 84 bytes");
static_assert(offsetof(BlockQ2K, qs) == 16 && offsetof(BlockQ2K, d) == 80 &&
                  offsetof(BlockQ2K, dmin) == 82,
              "block_q2_K field offsets");

// ggml's block_q3_K: 3-bit quants (low 2 bits in qs, high bit in hmask), 16 signed 6-bit scales.
struct BlockQ3K {
  uint8_t hmask[kQK_K / 8];  // bit b of byte m is the high bit of element 32b + m
  uint8_t qs[kQK_K / 4];     // low 2 bits, same layout as Q2_K
  uint8_t scales[12];        // 16 x 6-bit (scale + 32), packed
  uint16_t d;                // f16 bits
};
static_assert(sizeof(BlockQ3K) == 110, "block_q3_K is 110 bytes");
static_assert(offsetof(BlockQ3K, qs) == 32 && offsetof(BlockQ3K, scales) == 96 &&
                  offsetof(BlockQ3K, d) == 108,
              "block_q3_K field offsets");

// ggml's block_q8_1: 32 int8 quants with an f16 scale d and an f16 "sum" s.
struct BlockQ8_1 {
  uint16_t d;  // f16 bits
  uint16_t s;  // f16 bits
  int8_t qs[kQK8_1];
};
static_assert(sizeof(BlockQ8_1) == 36, "block_q8_1 is 36 bytes");
static_assert(offsetof(BlockQ8_1, qs) == 4, "block_q8_1 field offsets");

// Bytes of one row of n values (n a multiple of the block size) in a given type.
inline constexpr int64_t row_bytes(GgmlType t, int64_t n) {
  switch (t) {
    case GgmlType::kF32: return 4 * n;
    case GgmlType::kF16:
    case GgmlType::kBF16: return 2 * n;
    case GgmlType::kQ2K: return n / kQK_K * static_cast<int64_t>(sizeof(BlockQ2K));
    case GgmlType::kQ3K: return n / kQK_K * static_cast<int64_t>(sizeof(BlockQ3K));
    case GgmlType::kQ8_1: return n / kQK8_1 * static_cast<int64_t>(sizeof(BlockQ8_1));
  }
  return -1;
}

// ---- Q2_K element decoders (e in [0, 256)) ----

MOECHECK_HD int q2k_quant(const BlockQ2K& b, int e) {
  const int n = e >> 7, j = (e >> 5) & 3, l = e & 31;
  return (b.qs[32 * n + l] >> (2 * j)) & 3;
}
MOECHECK_HD int q2k_scale(const BlockQ2K& b, int sub) { return b.scales[sub] & 0xF; }
MOECHECK_HD int q2k_min(const BlockQ2K& b, int sub) { return b.scales[sub] >> 4; }

// y = d * scale * q - dmin * min; both products are exact, the subtraction rounds once.
MOECHECK_HD float q2k_dequant(const BlockQ2K& b, int e) {
  const int sub = e >> 4;
  const float dl = f16_to_f32(b.d) * static_cast<float>(q2k_scale(b, sub));
  const float ml = f16_to_f32(b.dmin) * static_cast<float>(q2k_min(b, sub));
  return dl * static_cast<float>(q2k_quant(b, e)) - ml;
}

// ---- Q3_K element decoders ----

// Signed 6-bit sub-block scale in [-32, 31]: low nibble in scales[sub % 8] (high nibble for
// sub >= 8), top two bits in scales[8 + sub % 4] at bit 2 * (sub / 4).
MOECHECK_HD int q3k_scale(const BlockQ3K& b, int sub) {
  const int lo = (b.scales[sub & 7] >> (4 * (sub >> 3))) & 0xF;
  const int hi = (b.scales[8 + (sub & 3)] >> (2 * (sub >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Signed 3-bit quant in [-4, 3]: low bits from qs, minus 4 when the hmask bit is clear.
MOECHECK_HD int q3k_quant(const BlockQ3K& b, int e) {
  const int n = e >> 7, j = (e >> 5) & 3, l = e & 31;
  const int low = (b.qs[32 * n + l] >> (2 * j)) & 3;
  const int high = (b.hmask[e & 31] >> (e >> 5)) & 1;
  return low - (high ? 0 : 4);
}

// y = (d * scale) * q; exact in f32 (at most 11 + 6 + 3 significant bits).
MOECHECK_HD float q3k_dequant(const BlockQ3K& b, int e) {
  const float dl = f16_to_f32(b.d) * static_cast<float>(q3k_scale(b, e >> 4));
  return dl * static_cast<float>(q3k_quant(b, e));
}

}  // namespace moecheck
