// Stage-by-stage bounds of the emulation against the reference in Exact mode: every formula of
// docs/numerics.md "Error bounds vs the reference's Exact mode", each stage's bound widened by the
// measured difference of its inputs (propagation), routing flips explained by the logit bound.
// Contract: docs/numerics.md (the formulas), compare/bounds.h (what is checked where).
#include "compare/bounds.h"

#include "compare/bounds_detail.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "core/schedule.h"
#include "reference/moe.h"

namespace moecheck {

double q8_block_bound(const float* x) {
  // |x_i - q_i d16| <= d/2 + 128 u d + 127 |d - d16| + max(0, amax - 127 d).
  double amax = 0;
  for (int i = 0; i < kQK8_1; ++i) amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
  const float d = div_rn(static_cast<float>(amax), 127.0f);
  const double d16 = f16_to_f32(f32_to_f16(d));
  return d / 2.0 + 128.0 * kU32 * d + 127.0 * std::fabs(d - d16) + std::fmax(0.0, amax - 127.0 * d);
}

namespace {

// The exact integer parts of one MMVQ unit (32 weights against one q8_1 block) and the block's
// float scales, from the per-element decoders of core/blocks.h.
struct UnitParts {
  int64_t A = 0, B = 0;
  double d = 0, dmin = 0;
};

UnitParts unit_parts(GgmlType t, const uint8_t* row, const BlockQ8_1& a, int64_t g) {
  const int64_t sb = g / kQ8PerSuperBlock, b = g % kQ8PerSuperBlock;
  UnitParts u;
  if (t == GgmlType::kQ2K) {
    BlockQ2K blk;  // rows come from files at any offset: copied, never aliased
    std::memcpy(&blk, row + sb * static_cast<int64_t>(sizeof blk), sizeof blk);
    for (int l = 0; l < kQK8_1; ++l) {
      const int e = static_cast<int>(32 * b + l), sub = e / 16;
      u.A += int64_t{q2k_scale(blk, sub)} * q2k_quant(blk, e) * a.qs[l];
      u.B += int64_t{q2k_min(blk, sub)} * a.qs[l];
    }
    u.d = f16_to_f32(blk.d);
    u.dmin = f16_to_f32(blk.dmin);
  } else {
    BlockQ3K blk;
    std::memcpy(&blk, row + sb * static_cast<int64_t>(sizeof blk), sizeof blk);
    for (int l = 0; l < kQK8_1; ++l) {
      const int e = static_cast<int>(32 * b + l);
      u.A += int64_t{q3k_scale(blk, e / 16)} * q3k_quant(blk, e) * a.qs[l];
    }
    u.d = f16_to_f32(blk.d);
  }
  return u;
}

// |d A| + |dmin B| of one unit.
double unit_float_mag(GgmlType t, const uint8_t* row, const BlockQ8_1& a, int64_t g) {
  const UnitParts u = unit_parts(t, row, a, g);
  return std::fabs(u.d * static_cast<double>(u.A)) + std::fabs(u.dmin * static_cast<double>(u.B));
}

}  // namespace

MmvqLocal mmvq_local(GgmlType t, const uint8_t* row, const BlockQ8_1* a, int64_t K) {
  const int64_t units = K / kQK8_1;
  const int64_t depth = mmvq_depth(units);
  double exact = 0, M = 0;
  for (int64_t g = 0; g < units; ++g) {
    const UnitParts u = unit_parts(t, row, a[g], g);
    const double d8 = f16_to_f32(a[g].d);
    exact += d8 * (u.d * static_cast<double>(u.A) - u.dmin * static_cast<double>(u.B));
    M += std::fabs(d8) *
         (std::fabs(u.d * static_cast<double>(u.A)) + std::fabs(u.dmin * static_cast<double>(u.B)));
  }
  return {exact, (gamma_f32(depth) + gamma_f64(units + 2)) * M};
}

MmvqBound mmvq_exact_bound(GgmlType t, const uint8_t* row, const BlockQ8_1* a, const float* x,
                           int64_t K, const double* eblk) {
  std::vector<float> w(static_cast<size_t>(K));
  dequantize_row(t, row, w.data(), K);
  const int64_t units = K / kQK8_1;
  const int64_t depth = mmvq_depth(units);
  double exact = 0, qerr = 0, mag_wx = 0, M = 0;
  for (int64_t g = 0; g < units; ++g) {
    const double e_blk = eblk ? eblk[g] : q8_block_bound(x + g * kQK8_1);
    for (int l = 0; l < kQK8_1; ++l) {
      const double wk = w[g * kQK8_1 + l], xk = x[g * kQK8_1 + l];
      exact += wk * xk;
      qerr += std::fabs(wk) * e_blk;
      mag_wx += std::fabs(wk * xk);
    }
    M += std::fabs(static_cast<double>(f16_to_f32(a[g].d))) * unit_float_mag(t, row, a[g], g);
  }
  return {exact, (1 + 2 * kU32) * qerr + gamma_f32(depth) * M + (kU32 + gamma_f64(K)) * mag_wx,
          mag_wx};
}

namespace bounds_detail {

// "SwiGLU", propagated: the emulation's h from its own g, u against the reference's h from its
// g, u (taps rounded to f32 from f64: each tap value is within u |tap| of the exact one).
double h_bound(float ge, float ue, float gr, float ur, float hr, float L) {
  auto cg = [&](double g) { return L > 0 && g > L ? static_cast<double>(L) : g; };
  auto cu = [&](double v) {
    return L > 0 ? std::clamp(v, -static_cast<double>(L), static_cast<double>(L)) : v;
  };
  const double dg = std::fabs(cg(ge) - cg(gr)) + kU32 * std::fabs(gr);
  const double du = std::fabs(cu(ue) - cu(ur)) + kU32 * std::fabs(ur);
  const double silu_r = std::fabs(cg(gr) / (1.0 + std::exp(-cg(gr))));
  const double prop = 1.1 * dg * std::fabs(cu(ue)) + silu_r * du;
  return swiglu_own_bound(std::fabs(hr) + prop, cu(ue)) + prop + kU32 * std::fabs(hr);
}

double swiglu_own_bound(double h, double uc) {
  return gamma_f32(5) * std::fabs(h) + kSiluAbs * std::fabs(uc) + 0x1p-149;
}

}  // namespace bounds_detail

}  // namespace moecheck
