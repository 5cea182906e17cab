// The fast MMVQ path (emulate/mmvq_fast.h). Integer parts are exact, so they are computed in
// whatever order is fastest: Q3_K quants are stored offset by +4 (unsigned, as AVX2's u8 x s8
// multiply wants) and the offset is taken back out exactly with the activation half sums. The
// float part follows docs/numerics.md "mmvq_q2k, mmvq_q3k" operation for operation; the loops
// over units and lanes are plain so that the compiler vectorises them without reordering any
// lane's chain. NaN results are canonical at every step (core/fp_ops.h), as in the kernel.
#include "emulate/mmvq_fast.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "core/schedule.h"
#include "emulate/lanes.h"
#include "emulate/mmvq.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MOECHECK_EMU_AVX2 1
#endif

namespace moecheck::emu {

namespace {

std::atomic<int> g_int_kernel{static_cast<int>(MmvqIntKernel::kAuto)};

// One weight row decoded per unit g (units = K / 32): quants [K] in value order (Q3_K + 4), the
// two sub-block scales (int32, and as 16 int16 for AVX2: 8 x sc0 then 8 x sc1), Q2_K's mins,
// and the super-block's d and dmin widened exactly.
struct FastRow {
  std::vector<uint8_t> q;
  std::vector<int16_t> scv;
  std::vector<int32_t> sc0, sc1, m0, m1;
  std::vector<float> d, dmin;

  explicit FastRow(int64_t units)
      : q(static_cast<size_t>(units * kQK8_1)),
        scv(static_cast<size_t>(units * 16)),
        sc0(static_cast<size_t>(units)),
        sc1(sc0.size()),
        m0(sc0.size()),
        m1(sc0.size()),
        d(sc0.size()),
        dmin(sc0.size()) {}

  void set_scales(int64_t g, int s0, int s1) {
    sc0[g] = s0;
    sc1[g] = s1;
    for (int l = 0; l < 8; ++l) {
      scv[16 * g + l] = static_cast<int16_t>(s0);
      scv[16 * g + 8 + l] = static_cast<int16_t>(s1);
    }
  }
};

void decode_q2k(const BlockQ2K* b, int64_t nsb, FastRow& r) {
  for (int64_t s = 0; s < nsb; ++s) {
    const float d = f16_to_f32(b[s].d), dmin = f16_to_f32(b[s].dmin);
    for (int u = 0; u < kQ8PerSuperBlock; ++u) {
      const int64_t g = s * kQ8PerSuperBlock + u;
      const uint8_t* qs = b[s].qs + 32 * (u / 4);
      const int shift = 2 * (u % 4);
      uint8_t* q = r.q.data() + g * kQK8_1;
      for (int l = 0; l < kQK8_1; ++l) q[l] = static_cast<uint8_t>((qs[l] >> shift) & 3);
      r.set_scales(g, q2k_scale(b[s], 2 * u), q2k_scale(b[s], 2 * u + 1));
      r.m0[g] = q2k_min(b[s], 2 * u);
      r.m1[g] = q2k_min(b[s], 2 * u + 1);
      r.d[g] = d;
      r.dmin[g] = dmin;
    }
  }
}

void decode_q3k(const BlockQ3K* b, int64_t nsb, FastRow& r) {
  for (int64_t s = 0; s < nsb; ++s) {
    const float d = f16_to_f32(b[s].d);
    for (int u = 0; u < kQ8PerSuperBlock; ++u) {
      const int64_t g = s * kQ8PerSuperBlock + u;
      const uint8_t* qs = b[s].qs + 32 * (u / 4);
      const int shift = 2 * (u % 4);
      uint8_t* q = r.q.data() + g * kQK8_1;
      // low - 4 + 4 high, stored + 4: low + 4 high in [0, 7].
      for (int l = 0; l < kQK8_1; ++l)
        q[l] = static_cast<uint8_t>(((qs[l] >> shift) & 3) + 4 * ((b[s].hmask[l] >> u) & 1));
      r.set_scales(g, q3k_scale(b[s], 2 * u), q3k_scale(b[s], 2 * u + 1));
      r.d[g] = d;
    }
  }
}

// One token's activation row: its blocks, d8 per unit and the quant sums of each half.
struct FastAct {
  std::vector<float> d8;
  std::vector<int32_t> h0, h1;
};

void unpack(const BlockQ8_1* a, int64_t units, FastAct& out) {
  out.d8.resize(static_cast<size_t>(units));
  out.h0.resize(static_cast<size_t>(units));
  out.h1.resize(static_cast<size_t>(units));
  for (int64_t g = 0; g < units; ++g) {
    out.d8[g] = f16_to_f32(a[g].d);
    int32_t s0 = 0, s1 = 0;
    for (int l = 0; l < 16; ++l) s0 += a[g].qs[l];
    for (int l = 16; l < 32; ++l) s1 += a[g].qs[l];
    out.h0[g] = s0;
    out.h1[g] = s1;
  }
}

// A[g] = sc0 * sum_{l<16} q_l aq_l + sc1 * sum_{l>=16} q_l aq_l over the stored quants.
void int_parts_portable(const FastRow& w, const BlockQ8_1* a, int64_t units, int32_t* A) {
  for (int64_t g = 0; g < units; ++g) {
    const uint8_t* q = w.q.data() + g * kQK8_1;
    int32_t p0 = 0, p1 = 0;
    for (int l = 0; l < 16; ++l) p0 += static_cast<int32_t>(q[l]) * a[g].qs[l];
    for (int l = 16; l < 32; ++l) p1 += static_cast<int32_t>(q[l]) * a[g].qs[l];
    A[g] = w.sc0[g] * p0 + w.sc1[g] * p1;
  }
}

#if defined(MOECHECK_EMU_AVX2)
// The same integers with AVX2: per unit, u8 x s8 pair sums (at most 7 * 128 * 2: no 16-bit
// saturation), times the scales with the pair sums to int32, then the eight int32 of eight
// units reduced together. units is a multiple of 8 (K a multiple of 256).
__attribute__((target("avx2"))) void int_parts_avx2(const FastRow& w, const BlockQ8_1* a,
                                                    int64_t units, int32_t* A) {
  for (int64_t g0 = 0; g0 < units; g0 += 8) {
    __m256i v[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t g = g0 + i;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.q[g * kQK8_1]));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[g].qs));
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.scv[16 * g]));
      v[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), s);
    }
    // hadd twice leaves, per 128-bit half, the 4-sums of v0..v3 (and v4..v7); the halves add.
    const __m256i u0 =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i u1 =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    const __m256i r = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                       _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + g0), r);
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// One (row, token): the integer parts, the unit terms, the lanes' chains and the butterfly.
// Always inlined, so that row_tokens_avx2 below compiles it with 256-bit integer vectors.
[[gnu::always_inline]] inline float row_token(GgmlType t, const FastRow& w, const BlockQ8_1* a,
                                              const FastAct& x, int64_t units, bool avx2,
                                              int32_t* A, float* term) {
#if defined(MOECHECK_EMU_AVX2)
  if (avx2) int_parts_avx2(w, a, units, A);
  else int_parts_portable(w, a, units, A);
#else
  (void)avx2;
  int_parts_portable(w, a, units, A);
#endif
  if (t == GgmlType::kQ2K) {
    for (int64_t g = 0; g < units; ++g)
      term[g] = mmvq_unit_q2k(w.d[g], w.dmin[g], A[g], w.m0[g] * x.h0[g] + w.m1[g] * x.h1[g]);
  } else {
    for (int64_t g = 0; g < units; ++g)
      term[g] = mmvq_unit_q3k(w.d[g], A[g] - 4 * (w.sc0[g] * x.h0[g] + w.sc1[g] * x.h1[g]));
  }
  float lane[kWarpSize] = {};
  for (int64_t g0 = 0; g0 < units; g0 += kWarpSize)
    detail::fma_step(lane, x.d8.data() + g0, term + g0, std::min<int64_t>(kWarpSize, units - g0));
  return detail::butterfly0(lane);
}

// Row r against every token (y[i][r]), the portable build and the AVX2 build of the same code
// (element-wise IEEE operations: the vector width changes no bit).
void row_tokens(GgmlType t, const FastRow& w, const BlockQ8_1* const* a, const FastAct* acts,
                float* const* y, int64_t r, int64_t n, int64_t units, int32_t* A, float* term) {
  for (int64_t i = 0; i < n; ++i) y[i][r] = row_token(t, w, a[i], acts[i], units, false, A, term);
}

#if defined(MOECHECK_EMU_AVX2)
__attribute__((target("avx2,fma"))) void row_tokens_avx2(GgmlType t, const FastRow& w,
                                                         const BlockQ8_1* const* a,
                                                         const FastAct* acts, float* const* y,
                                                         int64_t r, int64_t n, int64_t units,
                                                         int32_t* A, float* term) {
  for (int64_t i = 0; i < n; ++i) y[i][r] = row_token(t, w, a[i], acts[i], units, true, A, term);
}
#else
void row_tokens_avx2(GgmlType t, const FastRow& w, const BlockQ8_1* const* a, const FastAct* acts,
                     float* const* y, int64_t r, int64_t n, int64_t units, int32_t* A,
                     float* term) {
  row_tokens(t, w, a, acts, y, r, n, units, A, term);
}
#endif

}  // namespace

void set_mmvq_int_kernel(MmvqIntKernel k) { g_int_kernel.store(static_cast<int>(k)); }

namespace detail {

bool mmvq_uses_avx2() {
#if defined(MOECHECK_EMU_AVX2)
  return g_int_kernel.load() == static_cast<int>(MmvqIntKernel::kAuto) && cpu_has_avx2();
#else
  return false;
#endif
}

void mmvq_rows(GgmlType t, const uint8_t* w, int64_t K, const BlockQ8_1* const* a, float* const* y,
               int64_t n, int64_t r0, int64_t r1) {
  if (n <= 0 || r0 >= r1) return;
  const int64_t units = K / kQK8_1, nsb = K / kQK_K, rb = row_bytes(t, K);
  const bool avx2 = mmvq_uses_avx2();
  std::vector<FastAct> acts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) unpack(a[i], units, acts[i]);
  FastRow wr(units);
  std::vector<int32_t> A(static_cast<size_t>(units));
  std::vector<float> term(static_cast<size_t>(units));
  for (int64_t r = r0; r < r1; ++r) {
    if (t == GgmlType::kQ2K) decode_q2k(reinterpret_cast<const BlockQ2K*>(w + r * rb), nsb, wr);
    else decode_q3k(reinterpret_cast<const BlockQ3K*>(w + r * rb), nsb, wr);
    if (avx2) row_tokens_avx2(t, wr, a, acts.data(), y, r, n, units, A.data(), term.data());
    else row_tokens(t, wr, a, acts.data(), y, r, n, units, A.data(), term.data());
  }
}

}  // namespace detail

}  // namespace moecheck::emu
