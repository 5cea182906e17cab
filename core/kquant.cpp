// Reference Q2_K / Q3_K quantisers (ggml's quantize_row_q2_K_ref / quantize_row_q3_K_ref and
// their helpers make_qkx2_quants / make_q3_quants) and the row dequantisers. Contract:
// ggml's src/ggml-common.h (layouts) and src/ggml-quants.c (algorithms) at ggml-org/ggml
// d99724f2b141fed9e1a9f402213506c081433465, docs/blocks.md. Every
// float expression keeps C's evaluation order and rounds each operation (-ffp-contract=off, as
// ggml-base is built on x86-64), so the blocks match ggml's bit for bit (docs/blocks.md says
// how that was checked). Where ggml would assert or write a corrupt block we are defined
// instead: nearest_int saturates out of range and maps NaN to 0 (ggml's release build gives 0
// for the default NaN too); Q2_K scale/min codes are clamped to [0, 15].
#include "core/kquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace moecheck {

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS

void check_row_length(const char* fn, int64_t k, int64_t block) {
  if (k < 0 || k % block != 0) {
    throw InputError(std::string(fn) + ": row length must be a non-negative multiple of " +
                     std::to_string(block) + ", found " + std::to_string(k));
  }
}

// ggml's make_qkx2_quants: weighted affine fit x ~ scale * L + min with min <= 0, L in
// [0, nmax]; a grid search over nstep + 1 candidate inverse scales, refined by weighted least
// squares, keeps the candidate with the smallest weighted |error| (use_mad) or squared error.
// Returns the scale and writes -min to *the_min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = fnmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    // (rmin + rdelta * is) + nmax, as C evaluates it.
    iscale = (rmin + rdelta * static_cast<float>(is) + fnmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_q3_quants with do_rmse: symmetric fit x ~ scale * l, l in [-nmax, nmax - 1],
// started from the rounding of x / scale with scale chosen so the largest |x| maps to -nmax,
// then up to 5 coordinate-descent passes that maximise (sum w x l)^2 / sum w l^2 with w = x^2.
// Writes L = l + nmax and returns the signed scale (0 for an all-(near-)zero group).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const float fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Element e = 128 n + 32 j + l goes to qs[32 n + l] at bits 2j (docs/blocks.md "Q2_K").
void pack_qs(const uint8_t* L, uint8_t* qs) {
  for (int base = 0; base < kQK_K; base += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[base / 4 + l] = static_cast<uint8_t>(L[base + l] | (L[base + l + 32] << 2) |
                                              (L[base + l + 64] << 4) | (L[base + l + 96] << 6));
    }
  }
}

void quantize_block_q2_K(const float* x, BlockQ2K& y) {
  uint8_t L[kQK_K];
  uint8_t Laux[16];
  float weights[16];
  float mins[kQK_K / 16];
  float scales[kQK_K / 16];
  const float q4scale = 15.f;

  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  // ggml stores nearest_int(...) into the byte unclamped; the fit normally gives scales and mins
  // >= 0 so the codes lie in [0, 15]. A negative fitted scale (possible only through rounding,
  // or from NaN / overflowing input) would wrap into the min nibble there; here it clamps to 0.
  if (max_scale > 0) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      y.scales[j] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * scales[j]), 0, 15));
    }
    y.d = f32_to_f16(max_scale / q4scale);
  } else {
    for (int j = 0; j < kQK_K / 16; ++j) y.scales[j] = 0;
    y.d = f32_to_f16(0.f);
  }
  if (max_min > 0) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const int m = std::clamp(nearest_int(iscale * mins[j]), 0, 15);
      y.scales[j] = static_cast<uint8_t>(y.scales[j] | (m << 4));
    }
    y.dmin = f32_to_f16(max_min / q4scale);
  } else {
    y.dmin = f32_to_f16(0.f);
  }
  // Re-quantise against the values the decoder will actually see (f16 d, dmin; 4-bit codes).
  // Sub-blocks whose scale decodes to 0 keep the fit's L (they decode to -dm regardless).
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = f16_to_f32(y.d) * static_cast<float>(y.scales[j] & 0xF);
    if (!(d != 0.f)) continue;  // ggml: if (!d) continue; NaN d (NaN f16) proceeds there too
    const float dm = f16_to_f32(y.dmin) * static_cast<float>(y.scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int((x[16 * j + ii] + dm) / d);
      L[16 * j + ii] = static_cast<uint8_t>(std::clamp(l, 0, 3));
    }
  }
  pack_qs(L, y.qs);
}

void quantize_block_q3_K(const float* x, BlockQ3K& y) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];

  float max_scale = 0;
  float amax = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
    const float scale = std::fabs(scales[j]);
    if (scale > amax) {
      amax = scale;
      max_scale = scales[j];
    }
  }
  std::memset(y.scales, 0, sizeof y.scales);
  if (max_scale != 0.f) {
    // The largest |scale| maps to code -32, so d = -max_scale / 32 carries the sign; codes of
    // the opposite sign saturate at +31. |iscale * scales[j]| <= 32 (+ rounding), so the int8
    // temporary of ggml cannot overflow; the clamp here covers it anyway.
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const int ls = std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32;  // [0, 63]
      if (j < 8) {
        y.scales[j] = static_cast<uint8_t>(ls & 0xF);
      } else {
        y.scales[j - 8] = static_cast<uint8_t>(y.scales[j - 8] | ((ls & 0xF) << 4));
      }
      y.scales[8 + j % 4] =
          static_cast<uint8_t>(y.scales[8 + j % 4] | ((ls >> 4) << (2 * (j / 4))));
    }
    y.d = f32_to_f16(1 / iscale);
  } else {
    y.d = f32_to_f16(0.f);
  }
  // Re-quantise with the decoded f16 d and 6-bit scales; a zero product keeps the fit's L.
  for (int j = 0; j < kQK_K / 16; ++j) {
    const int lo = j < 8 ? (y.scales[j] & 0xF) : (y.scales[j - 8] >> 4);
    const int sc = (lo | (((y.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    const float d = f16_to_f32(y.d) * static_cast<float>(sc);
    if (!(d != 0.f)) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = std::clamp(nearest_int(x[16 * j + ii] / d), -4, 3);
      L[16 * j + ii] = static_cast<int8_t>(l + 4);
    }
  }
  // Stored Lq in [0, 7]: bit 2 goes to hmask (element e -> byte e % 32, bit e / 32), the low two
  // bits to qs. make_q3_quants' all-zero groups leave Lq = 0 (hmask bit clear, quant -4).
  std::memset(y.hmask, 0, sizeof y.hmask);
  uint8_t low[kQK_K];
  for (int e = 0; e < kQK_K; ++e) {
    int lq = L[e];
    if (lq > 3) {
      y.hmask[e % 32] = static_cast<uint8_t>(y.hmask[e % 32] | (1u << (e / 32)));
      lq -= 4;
    }
    low[e] = static_cast<uint8_t>(lq);
  }
  pack_qs(low, y.qs);
}

// Row decoders: per sub-block dl = d * sc (and ml = dmin * m) hoisted out of the element loop;
// the same operations as q2k_dequant / q3k_dequant in core/blocks.h, so the same bits.
// Element e = 128 n + 32 j + l (l < 32, sub-block e / 16 = 8 n + 2 j + l / 16) reads
// qs[32 n + l] >> 2 j (and for Q3_K hmask[l] >> (4 n + j)); the loops walk (n, j, half l / 16)
// so that each sub-block's 16 values are one plain loop the compiler vectorises. The same f32
// operations per element as ggml's dequantize_row_q2_K / q3_K (no contraction).
// One Q2_K sub-block: out[i] = dl * q_i - ml, q_i = (qs[i] >> shift) & 3.
void dequantize_q2_16(const uint8_t* __restrict qs, int shift, float dl, float ml,
                      float* __restrict out) {
  for (int i = 0; i < 16; ++i) out[i] = dl * static_cast<float>((qs[i] >> shift) & 3) - ml;
}

void dequantize_block_q2_K(const BlockQ2K& b, float* y) {
  const float d = f16_to_f32(b.d);
  const float dmin = f16_to_f32(b.dmin);
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const int sub = 8 * n + 2 * j + h;
        const float dl = d * static_cast<float>(b.scales[sub] & 0xF);
        const float ml = dmin * static_cast<float>(b.scales[sub] >> 4);
        dequantize_q2_16(b.qs + 32 * n + 16 * h, 2 * j, dl, ml, y + 16 * sub);
      }
}

void dequantize_block_q3_K(const BlockQ3K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const int sub = 8 * n + 2 * j + h;
        const float dl = d * static_cast<float>(q3k_scale(b, sub));
        const uint8_t* qs = b.qs + 32 * n + 16 * h;
        const uint8_t* hm = b.hmask + 16 * h;
        const int bit = 4 * n + j;  // (e >> 5)
        float* out = y + 16 * sub;
        for (int i = 0; i < 16; ++i) {
          const int low = (qs[i] >> (2 * j)) & 3;
          const int high = (hm[i] >> bit) & 1;
          out[i] = dl * static_cast<float>(low - 4 + 4 * high);
        }
      }
}

}  // namespace

int nearest_int(float f) {
  // ggml asserts |f| <= 4194303; out of range we saturate, and NaN gives 0 (what ggml's trick
  // yields for the default quiet NaN), so no input reaches undefined behaviour.
  if (std::isnan(f)) return 0;
  if (!(std::fabs(f) <= 4194303.f)) return f > 0 ? 4194304 : -4194304;
  // Adding 1.5 * 2^23 puts the value in [2^23, 2^24) where the f32 ulp is 1: the addition
  // rounds to an integer (nearest, ties to even) held in the low mantissa bits.
  const float biased = f + 12582912.f;
  uint32_t bits;
  std::memcpy(&bits, &biased, sizeof bits);
  return static_cast<int>(bits & 0x007FFFFFu) - 0x00400000;
}

void quantize_row_q2_K_ref(const float* x, BlockQ2K* y, int64_t k) {
  check_row_length("quantize_row_q2_K_ref", k, kQK_K);
  for (int64_t i = 0; i < k / kQK_K; ++i) quantize_block_q2_K(x + i * kQK_K, y[i]);
}

void quantize_row_q3_K_ref(const float* x, BlockQ3K* y, int64_t k) {
  check_row_length("quantize_row_q3_K_ref", k, kQK_K);
  for (int64_t i = 0; i < k / kQK_K; ++i) quantize_block_q3_K(x + i * kQK_K, y[i]);
}

void dequantize_row_q2_K(const BlockQ2K* x, float* y, int64_t k) {
  check_row_length("dequantize_row_q2_K", k, kQK_K);
  for (int64_t i = 0; i < k / kQK_K; ++i) dequantize_block_q2_K(x[i], y + i * kQK_K);
}

void dequantize_row_q3_K(const BlockQ3K* x, float* y, int64_t k) {
  check_row_length("dequantize_row_q3_K", k, kQK_K);
  for (int64_t i = 0; i < k / kQK_K; ++i) dequantize_block_q3_K(x[i], y + i * kQK_K);
}

void dequantize_row(GgmlType type, const uint8_t* row, float* y, int64_t k) {
  // Rows come from mapped files at any byte offset: every field is read through memcpy, so
  // neither alignment nor aliasing matters.
  switch (type) {
    case GgmlType::kF32:
      check_row_length("dequantize_row(F32)", k, 1);
      if (k > 0) std::memcpy(y, row, static_cast<size_t>(k) * sizeof(float));
      return;
    case GgmlType::kF16:
    case GgmlType::kBF16: {
      check_row_length(type == GgmlType::kF16 ? "dequantize_row(F16)" : "dequantize_row(BF16)", k,
                       1);
      for (int64_t i = 0; i < k; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, sizeof h);
        y[i] = type == GgmlType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    case GgmlType::kQ2K: {
      check_row_length("dequantize_row(Q2_K)", k, kQK_K);
      BlockQ2K b;
      for (int64_t i = 0; i < k / kQK_K; ++i) {
        std::memcpy(&b, row + i * static_cast<int64_t>(sizeof b), sizeof b);
        dequantize_block_q2_K(b, y + i * kQK_K);
      }
      return;
    }
    case GgmlType::kQ3K: {
      check_row_length("dequantize_row(Q3_K)", k, kQK_K);
      BlockQ3K b;
      for (int64_t i = 0; i < k / kQK_K; ++i) {
        std::memcpy(&b, row + i * static_cast<int64_t>(sizeof b), sizeof b);
        dequantize_block_q3_K(b, y + i * kQK_K);
      }
      return;
    }
    case GgmlType::kQ8_1: break;
  }
  throw InputError("dequantize_row: ggml type " + std::to_string(static_cast<uint32_t>(type)) +
                   " is not supported (expected F32 = 0, F16 = 1, BF16 = 30, Q2_K = 10 or "
                   "Q3_K = 11)");
}

}  // namespace moecheck
