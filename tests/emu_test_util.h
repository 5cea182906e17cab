// Helpers shared by the emulation tests (tests/emu_*_test.cpp): seeded generators that know the
// block formats (valid and adversarial Q2_K / Q3_K blocks), the rounding-error constants and
// bounds of docs/numerics.md "Error bounds", and a literal replay of the MMVQ contract written
// from the document with the per-element decoders (independent of emulate/mmvq.cpp's fast path).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "core/blocks.h"
#include "core/fp_ops.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "core/schedule.h"

namespace moecheck::emutest {

// The rounding-error constants of docs/numerics.md, defined once in compare/bounds.h.
inline constexpr double kU = kU32;
inline double gamma(int64_t n) { return gamma_f32(n); }
inline double gamma64(int64_t n) { return gamma_f64(n); }

// Seeded std::mt19937_64 (bit-identical everywhere), uniform and Box-Muller normal values.
class Gen {
 public:
  explicit Gen(uint64_t seed) : r_(seed) {}
  uint32_t u32() { return static_cast<uint32_t>(r_() >> 32); }
  uint8_t byte() { return static_cast<uint8_t>(r_() >> 56); }
  double uni() { return static_cast<double>(r_() >> 11) * 0x1p-53; }
  float normal(double sigma = 1.0) {
    const double a = uni() + 0x1p-60, b = uni();
    return static_cast<float>(sigma * std::sqrt(-2.0 * std::log(a)) *
                              std::cos(6.283185307179586 * b));
  }
  std::vector<float> f32(int64_t n, double sigma) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(sigma);
    return v;
  }
  std::vector<uint16_t> bf16(int64_t n, double sigma) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = f32_to_bf16(normal(sigma));
    return v;
  }

 private:
  std::mt19937_64 r_;
};

// kNanScale / kInfScale (a NaN or +-Inf f16 d, or for Q2_K dmin) are never drawn by make_rows's
// adversarial share: they make whole outputs NaN / Inf, so tests ask for them explicitly.
enum class BlockKind { kValid, kZeroScale, kSubnormalScale, kAllMaxSub, kNanScale, kInfScale };

// A Q2_K block: random quants, scales and mins; d, dmin by kind (valid: ~N(0, dscale) magnitudes).
inline BlockQ2K make_q2k(Gen& g, BlockKind kind, float dscale = 1e-3f) {
  BlockQ2K b{};
  for (auto& q : b.qs) q = g.byte();
  for (auto& s : b.scales) s = kind == BlockKind::kAllMaxSub ? 0xFF : g.byte();
  switch (kind) {
    case BlockKind::kZeroScale:
      b.d = 0;
      b.dmin = f32_to_f16(dscale);
      break;
    case BlockKind::kSubnormalScale:
      b.d = static_cast<uint16_t>(1 + g.u32() % 0x3FF);
      b.dmin = static_cast<uint16_t>(1 + g.u32() % 0x3FF);
      break;
    case BlockKind::kNanScale:    // d or dmin NaN (quiet, either sign)
    case BlockKind::kInfScale: {  // d or dmin +-Inf
      const uint16_t special = kind == BlockKind::kNanScale ? 0x7E00 : 0x7C00;
      const uint16_t v = static_cast<uint16_t>(special | (g.u32() % 2 ? 0x8000 : 0));
      b.d = f32_to_f16(dscale);
      b.dmin = f32_to_f16(dscale);
      (g.u32() % 2 ? b.d : b.dmin) = v;
      break;
    }
    default:
      b.d = f32_to_f16(dscale * static_cast<float>(0.5 + g.uni()));
      b.dmin = f32_to_f16(dscale * static_cast<float>(0.5 + g.uni()));
  }
  return b;
}

inline BlockQ3K make_q3k(Gen& g, BlockKind kind, float dscale = 1e-3f) {
  BlockQ3K b{};
  for (auto& q : b.qs) q = g.byte();
  for (auto& h : b.hmask) h = g.byte();
  // all-max: every 6-bit scale field 63, i.e. s = +31 (and the 4-bit/2-bit parts all ones).
  for (auto& s : b.scales) s = kind == BlockKind::kAllMaxSub ? 0xFF : g.byte();
  switch (kind) {
    case BlockKind::kZeroScale: b.d = 0; break;
    case BlockKind::kSubnormalScale: b.d = static_cast<uint16_t>(1 + g.u32() % 0x3FF); break;
    case BlockKind::kNanScale:
      b.d = static_cast<uint16_t>(0x7E00 | (g.u32() % 2 ? 0x8000 : 0));
      break;
    case BlockKind::kInfScale:
      b.d = static_cast<uint16_t>(0x7C00 | (g.u32() % 2 ? 0x8000 : 0));
      break;
    default: b.d = f32_to_f16(dscale * static_cast<float>(0.5 + g.uni()));
  }
  return b;
}

// One block of `kind` written at `at` (Q2_K: 84 bytes, Q3_K: 110).
inline void put_block(Gen& g, GgmlType t, BlockKind kind, uint8_t* at) {
  if (t == GgmlType::kQ2K) {
    const BlockQ2K b = make_q2k(g, kind);
    std::memcpy(at, &b, sizeof b);
  } else {
    const BlockQ3K b = make_q3k(g, kind);
    std::memcpy(at, &b, sizeof b);
  }
}

// About a third of the first `n` blocks of w get a NaN or a +-Inf scale (kNanScale / kInfScale,
// half each).
inline void sprinkle_nan_inf_scales(Gen& g, GgmlType t, int64_t n, std::vector<uint8_t>& w) {
  const size_t bb = t == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K);
  for (int64_t b = 0; b < n; ++b) {
    if (g.u32() % 3 != 0) continue;
    put_block(g, t, g.u32() % 2 ? BlockKind::kNanScale : BlockKind::kInfScale, w.data() + b * bb);
  }
}

// Rows of K / 256 blocks as raw bytes, block kinds drawn with the given adversarial share.
inline std::vector<uint8_t> make_rows(Gen& g, GgmlType t, int64_t rows, int64_t K,
                                      double adversarial = 0.0) {
  const int64_t nb = rows * (K / kQK_K);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes(t, K)));
  for (int64_t i = 0; i < nb; ++i) {
    BlockKind kind = BlockKind::kValid;
    if (g.uni() < adversarial) kind = static_cast<BlockKind>(1 + g.u32() % 3);
    put_block(g, t, kind,
              out.data() + i * (t == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K)));
  }
  return out;
}

// Rows whose output is +-Inf for positive activations: values in [0.5, 1.5) quantised by the
// reference quantisers (every unit's integer part A > 0), then the first block's d set to +Inf
// (even rows) or -Inf (odd rows). Appended to `out`.
inline void append_inf_rows(Gen& g, GgmlType t, int64_t rows, int64_t K,
                            std::vector<uint8_t>& out) {
  const int64_t rb = row_bytes(t, K);
  std::vector<float> v(static_cast<size_t>(K));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& x : v) x = static_cast<float>(0.5 + g.uni());
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(rb));
    const uint16_t inf = r % 2 ? 0xFC00 : 0x7C00;
    if (t == GgmlType::kQ2K) {
      auto* b = reinterpret_cast<BlockQ2K*>(out.data() + at);
      quantize_row_q2_K_ref(v.data(), b, K);
      b[0].d = inf;
    } else {
      auto* b = reinterpret_cast<BlockQ3K*>(out.data() + at);
      quantize_row_q3_K_ref(v.data(), b, K);
      b[0].d = inf;
    }
  }
}

// docs/numerics.md "q8_1 step" bound; the formula lives once, in compare/bounds.cpp.
using moecheck::q8_block_bound;

// Unit integer parts straight from the contract, with the per-element decoders of blocks.h.
struct UnitInts {
  int64_t A = 0, B = 0;
  float d = 0, dmin = 0;
};
inline UnitInts unit_ints(GgmlType t, const uint8_t* row, const BlockQ8_1& a, int64_t g) {
  UnitInts r;
  const int64_t sb = g / kQ8PerSuperBlock, b = g % kQ8PerSuperBlock;
  for (int l = 0; l < kQK8_1; ++l) {
    const int e = static_cast<int>(32 * b + l), sub = e / 16;
    if (t == GgmlType::kQ2K) {
      const auto& blk = reinterpret_cast<const BlockQ2K*>(row)[sb];
      r.A += int64_t{q2k_scale(blk, sub)} * q2k_quant(blk, e) * a.qs[l];
      r.B += int64_t{q2k_min(blk, sub)} * a.qs[l];
      r.d = f16_to_f32(blk.d);
      r.dmin = f16_to_f32(blk.dmin);
    } else {
      const auto& blk = reinterpret_cast<const BlockQ3K*>(row)[sb];
      r.A += int64_t{q3k_scale(blk, sub)} * q3k_quant(blk, e) * a.qs[l];
      r.d = f16_to_f32(blk.d);
    }
  }
  return r;
}

// The MMVQ contract replayed literally: lanes over units l, l + 32, ..., fma chains, butterfly.
inline float mmvq_replay(GgmlType t, const uint8_t* row, const BlockQ8_1* a, int64_t K) {
  const int64_t units = K / kQK8_1;
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    float acc = 0.0f;
    for (int64_t g = l; g < units; g += kWarpSize) {
      const UnitInts u = unit_ints(t, row, a[g], g);
      const float tt = t == GgmlType::kQ2K ? fma_rn(u.d, static_cast<float>(u.A),
                                                    -mul_rn(u.dmin, static_cast<float>(u.B)))
                                           : mul_rn(u.d, static_cast<float>(u.A));
      acc = fma_rn(f16_to_f32(a[g].d), tt, acc);
    }
    lane[l] = acc;
  }
  return butterfly(lane);
}

// docs/numerics.md "MMVQ" exact value and bound for one (row, token): compare/bounds.cpp.
using Bounded = MmvqBound;
using moecheck::mmvq_exact_bound;

inline std::string hex(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a (0x%08x)", static_cast<double>(v), f32_bits(v));
  return buf;
}

}  // namespace moecheck::emutest
