// Emulation twin of MMVQ for Q2_K and Q3_K: per unit (one q8_1 block, two weight sub-blocks)
// the exact integer part and the two or three rounded float operations, then per lane the fma
// chain over units l, l + 32, ... and the butterfly. Contract: docs/numerics.md "mmvq_q2k,
// mmvq_q3k". mmvq, mmvq_groups and mmvq_experts run the fast path of emulate/mmvq_fast.h; this
// file keeps the straightforward per-group form (mmvq_groups_plain: each weight row decoded per
// group, one (row, token) at a time) as the oracle the fast path is tested against.
#include "emulate/mmvq.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "core/schedule.h"
#include "emulate/mmvq_fast.h"

namespace moecheck::emu {

namespace {

// One activation row, unpacked: d8 per block and the sums of the quants over each half.
struct ActRow {
  const BlockQ8_1* blocks = nullptr;
  std::vector<float> d8;
  std::vector<int32_t> half_sum;  // [2 * units]
};

void unpack_act(const BlockQ8_1* a, int64_t units, ActRow& out) {
  out.blocks = a;
  out.d8.resize(static_cast<size_t>(units));
  out.half_sum.resize(static_cast<size_t>(2 * units));
  for (int64_t g = 0; g < units; ++g) {
    out.d8[g] = f16_to_f32(a[g].d);
    int32_t s0 = 0, s1 = 0;
    for (int l = 0; l < 16; ++l) s0 += a[g].qs[l];
    for (int l = 16; l < 32; ++l) s1 += a[g].qs[l];
    out.half_sum[2 * g] = s0;
    out.half_sum[2 * g + 1] = s1;
  }
}

// One weight row, decoded: quants [K] in value order, scale and min per 16-value sub-block,
// d and dmin per super-block (f16 widened exactly).
struct WeightRow {
  std::vector<int8_t> q;
  std::vector<int32_t> scale, min;
  std::vector<float> d, dmin;
};

void decode_q2k(const BlockQ2K* b, int64_t nsb, WeightRow& r) {
  for (int64_t s = 0; s < nsb; ++s) {
    int8_t* q = r.q.data() + s * kQK_K;
    for (int n = 0; n < 2; ++n) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          q[128 * n + 32 * j + l] = static_cast<int8_t>((b[s].qs[32 * n + l] >> (2 * j)) & 3);
        }
      }
    }
    for (int sub = 0; sub < 16; ++sub) {
      r.scale[s * 16 + sub] = q2k_scale(b[s], sub);
      r.min[s * 16 + sub] = q2k_min(b[s], sub);
    }
    r.d[s] = f16_to_f32(b[s].d);
    r.dmin[s] = f16_to_f32(b[s].dmin);
  }
}

void decode_q3k(const BlockQ3K* b, int64_t nsb, WeightRow& r) {
  for (int64_t s = 0; s < nsb; ++s) {
    int8_t* q = r.q.data() + s * kQK_K;
    for (int n = 0; n < 2; ++n) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int low = (b[s].qs[32 * n + l] >> (2 * j)) & 3;
          const int high = (b[s].hmask[l] >> (4 * n + j)) & 1;
          q[128 * n + 32 * j + l] = static_cast<int8_t>(low - 4 + 4 * high);
        }
      }
    }
    for (int sub = 0; sub < 16; ++sub) r.scale[s * 16 + sub] = q3k_scale(b[s], sub);
    r.d[s] = f16_to_f32(b[s].d);
  }
}

int32_t dot16(const int8_t* a, const int8_t* b) {
  int32_t s = 0;
  for (int l = 0; l < 16; ++l) s += static_cast<int32_t>(a[l]) * static_cast<int32_t>(b[l]);
  return s;
}

// One (row, token): the unit terms in unit order, then the lanes' chains and the butterfly.
float row_token(GgmlType t, const WeightRow& w, const ActRow& a, int64_t units, float* term) {
  for (int64_t g = 0; g < units; ++g) {
    const int8_t* wq = w.q.data() + g * kQK8_1;
    const int8_t* aq = a.blocks[g].qs;
    const int32_t p0 = dot16(wq, aq), p1 = dot16(wq + 16, aq + 16);
    const int64_t j0 = 2 * g, j1 = 2 * g + 1, sb = g / kQ8PerSuperBlock;
    const int32_t A = w.scale[j0] * p0 + w.scale[j1] * p1;
    if (t == GgmlType::kQ2K) {
      const int32_t B = w.min[j0] * a.half_sum[2 * g] + w.min[j1] * a.half_sum[2 * g + 1];
      term[g] = mmvq_unit_q2k(w.d[sb], w.dmin[sb], A, B);
    } else {
      term[g] = mmvq_unit_q3k(w.d[sb], A);
    }
  }
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    float acc = 0.0f;
    for (int64_t g = l; g < units; g += kWarpSize) acc = fma_rn(a.d8[g], term[g], acc);
    lane[l] = acc;
  }
  return butterfly(lane);
}

void check_args(GgmlType t, int64_t rows, int64_t K, int64_t T, const char* what) {
  if ((t != GgmlType::kQ2K && t != GgmlType::kQ3K) || K % kQK_K != 0 || K <= 0 || rows < 0 ||
      T < 0) {
    throw InputError(std::string("emu::") + what +
                     ": expected a Q2_K or Q3_K matrix with K a "
                     "positive multiple of 256; found type " +
                     std::to_string(static_cast<uint32_t>(t)) + ", K = " + std::to_string(K) +
                     ", rows = " + std::to_string(rows) + ", tokens = " + std::to_string(T));
  }
}

// check_args, the row range and every group's row count, before anything is computed.
void check_group_args(GgmlType t, const MmvqGroup* groups, int64_t n_groups, int64_t rows,
                      int64_t K, int64_t r0, int64_t r1, const char* what) {
  check_args(t, rows, K, n_groups, what);
  if (r1 < 0) r1 = rows;
  if (r0 < 0 || r0 > r1 || r1 > rows)
    throw InputError(std::string("emu::") + what + ": row range [" + std::to_string(r0) + ", " +
                     std::to_string(r1) + ") is not inside [0, " + std::to_string(rows) + ")");
  for (int64_t g = 0; g < n_groups; ++g)
    if (groups[g].n < 0 || groups[g].n > kMaxGroupRows)
      throw InputError(std::string("emu::") + what + ": group " + std::to_string(g) + " has " +
                       std::to_string(groups[g].n) + " rows, outside [0, 8]");
}

WeightRow make_weight_row(int64_t K) {
  const int64_t nsb = K / kQK_K;
  WeightRow wr;
  wr.q.resize(static_cast<size_t>(K));
  wr.scale.resize(static_cast<size_t>(nsb * 16));
  wr.min.resize(static_cast<size_t>(nsb * 16));
  wr.d.resize(static_cast<size_t>(nsb));
  wr.dmin.resize(static_cast<size_t>(nsb));
  return wr;
}

void decode_row(GgmlType t, const uint8_t* row, int64_t K, WeightRow& wr) {
  if (t == GgmlType::kQ2K) decode_q2k(reinterpret_cast<const BlockQ2K*>(row), K / kQK_K, wr);
  else decode_q3k(reinterpret_cast<const BlockQ3K*>(row), K / kQK_K, wr);
}

}  // namespace

void mmvq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
          int64_t T) {
  check_args(t, rows, K, T, "mmvq");
  const int64_t units = K / kQK8_1;
  std::vector<const BlockQ8_1*> ap(static_cast<size_t>(T));
  std::vector<float*> yp(static_cast<size_t>(T));
  for (int64_t k = 0; k < T; ++k) {
    ap[k] = a + k * units;
    yp[k] = y + k * rows;
  }
  detail::mmvq_rows(t, w, K, ap.data(), yp.data(), T, 0, rows);
}

void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                 const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int64_t r0, int64_t r1) {
  check_group_args(t, groups, n_groups, rows, K, r0, r1, "mmvq_groups");
  const int64_t units = K / kQK8_1;
  std::vector<const BlockQ8_1*> ap;
  std::vector<float*> yp;
  for (int64_t g = 0; g < n_groups;) {
    // The run of consecutive groups reading slot s: one matrix, all their tokens in group order.
    const int32_t s = groups[g].slot;
    ap.clear();
    yp.clear();
    for (; g < n_groups && groups[g].slot == s; ++g)
      for (int i = 0; i < groups[g].n; ++i) {
        ap.push_back(a + static_cast<int64_t>(groups[g].a_row[i]) * units);
        yp.push_back(y + static_cast<int64_t>(groups[g].y_row[i]) * rows);
      }
    detail::mmvq_rows(t, slots[s], K, ap.data(), yp.data(), static_cast<int64_t>(ap.size()), r0,
                      r1 < 0 ? rows : r1);
  }
}

void mmvq_groups_plain(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                       int64_t n_groups, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
                       int64_t r0, int64_t r1) {
  check_group_args(t, groups, n_groups, rows, K, r0, r1, "mmvq_groups_plain");
  if (r1 < 0) r1 = rows;
  const int64_t units = K / kQK8_1, rb = row_bytes(t, K);
  std::vector<ActRow> acts(kMaxGroupRows);
  WeightRow wr = make_weight_row(K);
  std::vector<float> term(static_cast<size_t>(units));
  for (int64_t g = 0; g < n_groups; ++g) {
    const MmvqGroup& gr = groups[g];
    for (int i = 0; i < gr.n; ++i)
      unpack_act(a + static_cast<int64_t>(gr.a_row[i]) * units, units, acts[i]);
    for (int64_t r = r0; r < r1; ++r) {
      decode_row(t, slots[gr.slot] + r * rb, K, wr);
      for (int i = 0; i < gr.n; ++i)
        y[static_cast<int64_t>(gr.y_row[i]) * rows + r] =
            row_token(t, wr, acts[i], units, term.data());
    }
  }
}

void mmvq_experts(GgmlType t, const uint8_t* const* expert_w, int64_t n, const BlockQ8_1* a,
                  bool a_per_expert, float* y, int64_t rows, int64_t K) {
  check_args(t, rows, K, 1, "mmvq_experts");
  const int64_t units = K / kQK8_1;
  for (int64_t i = 0; i < n; ++i) {
    mmvq(t, expert_w[i], a + (a_per_expert ? i * units : 0), y + i * rows, rows, K, 1);
  }
}

}  // namespace moecheck::emu
