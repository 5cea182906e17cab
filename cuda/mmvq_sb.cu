// The streamed MMVQ engine (cuda::MmvqEngine::kStreamed): Q2_K / Q3_K rows read in place
// against q8_1 activation rows, the float parts exactly as docs/numerics.md "mmvq_q2k, mmvq_q3k"
// writes them (the same bits as the dp4a kernel of cuda/mmvq.cu and emu::mmvq). It takes the
// one-token launches and the groups launches of every layer it fits (cuda/kernels.h).
//
// Threads and chains. A pass is 8 consecutive rows of one group against one token; lane 4 r + c
// of a warp takes row r of the pass and the super-blocks of class c = sb % 4. Unit g of a row
// (super-block sb = g / 8, position b = g % 8) belongs to contract lane g % 32 = 8 (sb % 4) + b,
// so the lane keeps the eight chains acc[b] of contract lanes 8 c + b and extends each in
// increasing sb, i.e. in increasing g, as numerics.md's lane does. A whole super-block per thread
// and step means its bytes are read once for its eight units (the dp4a kernel's lane reads 32
// quant bytes to use 8 of them). At the end of a pass the butterfly's tree is replayed: levels 16
// and 8 (classes c ^ 2, c ^ 1) by shuffles within the row's four lanes, then 4, 2 and 1 (b ^ 4,
// b ^ 2, b ^ 1) inside the lane; addition is commutative, so every level takes the same two
// partial sums as the butterfly's.
//
// The last super-blocks. When K / 256 is not a multiple of 4 (the down projection: 9), the
// classes below rem = (K / 256) % 4 own one super-block more than the others. The four lanes of
// a row share that work instead of its owner doing it alone: lane 4 r + j computes t of units
// 2 j and 2 j + 1 of each such super-block (t is a pure function of its unit: the same bits on
// any lane), and the owner takes the eight values by shuffles and extends its chains. Those
// blocks travel with the pass's last step of 4 (one copy a row and one step a pass fewer: each
// step costs its copies and bookkeeping, about 260 instructions, docs/performance.md); rows of
// fewer than 4 super-blocks have one step of them alone.
//
// Tokens. A group of n tokens is ceil(n / kTok) chunks of up to kTok consecutive tokens (kTok 1
// or 2, the launch's pass tokens), each a full set of passes over the group's rows: a pass reads
// its 8 rows once, forms each unit's masked quant words and scales once, and extends the chains
// of each of its tokens with the same operations as a one-token pass (the rows are streamed
// again per chunk, from L2 in practice). Blocks (one per multiprocessor) take contiguous ranges
// of the launch's passes in chunk order, of equal counts when every chunk holds one token and of
// equal work otherwise (cuda/mmvq_sb.cuh first_item: a two-token pass costs about 1.3 - 1.5
// one-token ones); the warps of a block take every W-th pass of the range, each walking its
// passes with a cursor (no division per pass).
//
// Steps. A step is 4 super-blocks of each of the pass's rows (a block a class), or 8 (double
// steps, kPer = 2: two a class, taken in increasing sb), which pays a step's copies and
// bookkeeping once for twice the arithmetic in rings twice the size; the launch's StepPlan says
// which blocks each step holds (a row of 20: 8, 8, 4; of 9: 8 + the rem).
//
// Copies. Each warp owns a ring of S stages; a stage holds one step: the pass's 8 rows x 4 (or 8)
// super-blocks (the last step also the rem), each row copied by one lane with cp.async.bulk (its
// 16-byte aligned covering span) into a slot whose pitch, an odd multiple of 16 bytes, spreads the
// rows over the banks; an mbarrier per stage says the bytes landed. The warp walks its passes
// step by step, issuing step s + S as soon as step s is computed, so S - 1 steps are in flight
// across pass boundaries with no block-wide barrier after the start. The block stages
// the activation rows of the pairs its range touches (one slot each: quants per unit; d8 as f32,
// the half sums packed for dp2a and times -4 for Q3_K) once, while the first stages are in
// flight.
// Performance: docs/performance.md "GPU".
#include "cuda/mmvq_sb.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/portable_math.h"
#include "cuda/bulk_copy.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/mmvq_units.cuh"
#include "cuda/pdl.cuh"

namespace moecheck::cuda::mmvq_sb {
namespace {

using namespace mmvq_tiles;

template <GgmlType kType>
constexpr int kBB = kType == GgmlType::kQ2K ? 84 : 110;

__device__ __forceinline__ int act_q_off(int g) { return kActQSb * (g >> 3) + 32 * (g & 7); }
__device__ __forceinline__ int act_m_off(int g) { return kActMSb * (g >> 3) + 16 * (g & 7); }

using mmvq_units::dp4a_us;  // masked quants reach 192: unsigned times the signed activation

// The f16 in the low half of a shared word, widened (cuda/mmvq_units.cuh f16_arith).
__device__ __forceinline__ float low_f16(uint32_t w) {
  return mmvq_units::f16_arith(static_cast<uint16_t>(w));
}

// The block's activation slots: slot j gets the q8_1 row rows[j] (units blocks each; rows[j] < 0:
// left unwritten, its pair has no token). Every thread of the block takes part; the words of all
// slots are loaded 8 at a time before any is stored (one round trip to L2 per 8 words a thread),
// then the half sums are formed from shared memory. d8 is widened by the hardware: its NaN bits
// never reach an output unchanged (only through fma_rn), as in cuda/mmvq.cu.
template <int kThreads>
__device__ __forceinline__ void stage_acts(const BlockQ8_1* a, const int* rows, int n_act,
                                           int units, uint8_t* acts, int act_bytes, int act_m) {
  const int words = 9 * units, total = n_act * words;
  for (int base = static_cast<int>(threadIdx.x); base < total; base += 8 * kThreads) {
    uint32_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int idx = base + i * kThreads;
      const int j = idx / words;
      v[i] =
          idx < total && rows[j] >= 0
              ? __ldg(reinterpret_cast<const uint32_t*>(a + static_cast<int64_t>(rows[j]) * units) +
                      (idx - j * words))
              : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int idx = base + i * kThreads;
      if (idx >= total) break;
      const int j = idx / words, w = idx - j * words;
      const int g = w / 9, k = w - 9 * g;
      uint8_t* slot = acts + j * act_bytes;
      if (k == 0) *reinterpret_cast<float*>(slot + act_m + act_m_off(g)) = low_f16(v[i]);
      else *reinterpret_cast<uint32_t*>(slot + act_q_off(g) + 4 * (k - 1)) = v[i];
    }
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < n_act * units; idx += kThreads) {
    const int j = idx / units, g = idx - j * units;
    uint8_t* slot = acts + j * act_bytes;
    const uint8_t* q = slot + act_q_off(g);
    const uint4 x0 = *reinterpret_cast<const uint4*>(q);
    const uint4 x1 = *reinterpret_cast<const uint4*>(q + 16);
    int s0 = __dp4a(static_cast<int>(x0.x), 0x01010101, 0);
    s0 = __dp4a(static_cast<int>(x0.y), 0x01010101, s0);
    s0 = __dp4a(static_cast<int>(x0.z), 0x01010101, s0);
    s0 = __dp4a(static_cast<int>(x0.w), 0x01010101, s0);
    int s1 = __dp4a(static_cast<int>(x1.x), 0x01010101, 0);
    s1 = __dp4a(static_cast<int>(x1.y), 0x01010101, s1);
    s1 = __dp4a(static_cast<int>(x1.z), 0x01010101, s1);
    s1 = __dp4a(static_cast<int>(x1.w), 0x01010101, s1);
    int* m = reinterpret_cast<int*>(slot + act_m + act_m_off(g));
    m[1] =
        static_cast<int>((static_cast<uint32_t>(s0) & 0xFFFFu) | (static_cast<uint32_t>(s1) << 16));
    m[2] = -4 * s0;
    m[3] = -4 * s1;
  }
  __syncthreads();
}

// A unit's quant plane: words q[0..7] masked by mask (one plane of 2-bit quants, or Q3_K's
// high bits), formed once per unit for all the tokens of a pass.
__device__ __forceinline__ void mask_words(const uint32_t* q, uint32_t mask, uint32_t (&out)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = q[k] & mask;
}

// The dots of one unit's masked quant plane mq with the activation quants x0 (values 0-15) and
// x1 (16-31): the two halves' sums.
__device__ __forceinline__ void plane_dots(const uint32_t (&mq)[8], const uint4& x0,
                                           const uint4& x1, int& p0, int& p1) {
  p0 = dp4a_us(mq[0], static_cast<int>(x0.x), 0);
  p1 = dp4a_us(mq[4], static_cast<int>(x1.x), 0);
  p0 = dp4a_us(mq[1], static_cast<int>(x0.y), p0);
  p1 = dp4a_us(mq[5], static_cast<int>(x1.y), p1);
  p0 = dp4a_us(mq[2], static_cast<int>(x0.z), p0);
  p1 = dp4a_us(mq[6], static_cast<int>(x1.z), p1);
  p0 = dp4a_us(mq[3], static_cast<int>(x0.w), p0);
  p1 = dp4a_us(mq[7], static_cast<int>(x1.w), p1);
}

// t of numerics.md for Q2_K unit b (s = b % 4, hi = b odd): mq its half's 8 quant words masked
// to plane s, sw the scale word holding scales[2b], scales[2b + 1] (bytes 2 (b % 2), + 1), hs16
// its half sums. The masked dots are 4^s times the true ones, shifted back exactly; A and B by
// dp2a with the conversion bias as the accumulator input, so float(A) is one subtraction
// (cuda/device_util.cuh).
__device__ __forceinline__ float q2k_t_masked(const uint32_t (&mq)[8], int s, uint32_t sw, float d,
                                              float dmin, const uint4& x0, const uint4& x1,
                                              int hs16, bool hi) {
  int p0, p1;
  plane_dots(mq, x0, x1, p0, p1);
  p0 >>= 2 * s;
  p1 >>= 2 * s;
  const int pp = static_cast<int>(__byte_perm(p0, p1, 0x5410));
  const int sc = static_cast<int>(sw & 0x0F0F0F0Fu), mn = static_cast<int>((sw >> 4) & 0x0F0F0F0Fu);
  const int A = hi ? __dp2a_hi(pp, sc, kBias) : __dp2a_lo(pp, sc, kBias);
  const int B = hi ? __dp2a_hi(hs16, mn, kBias) : __dp2a_lo(hs16, mn, kBias);
  return fma_rn(d, biased_float(A), -mul_rn(dmin, biased_float(B)));
}

// t of numerics.md for Q3_K unit b (hi = b odd): ml its half's 8 quant words masked to plane
// b % 4, mh the 8 high-bit words masked to bit b of each byte, sw the word of six-bit scales
// (plus 32) holding sub-blocks 2b, 2b + 1; quant = low - 4 + 4 high, so p = (low dot) +
// 4 (high dot) - 4 (half sum), and A = sum (u - 32) p.
__device__ __forceinline__ float q3k_t_masked(const uint32_t (&ml)[8], const uint32_t (&mh)[8],
                                              int b, uint32_t sw, float d, const uint4& x0,
                                              const uint4& x1, const int4& am, bool hi) {
  const int s = b & 3;
  int l0, l1, h0, h1;
  plane_dots(ml, x0, x1, l0, l1);
  plane_dots(mh, x0, x1, h0, h1);
  // 4 (h >> b), exact: h is a multiple of 2^b.
  const int f0 = b >= 2 ? h0 >> (b - 2) : h0 * (4 >> b);
  const int f1 = b >= 2 ? h1 >> (b - 2) : h1 * (4 >> b);
  const int p0 = (l0 >> (2 * s)) + f0 + am.z, p1 = (l1 >> (2 * s)) + f1 + am.w;
  const int pp = static_cast<int>(__byte_perm(p0, p1, 0x5410));
  const int u = static_cast<int>(sw);
  const int A = (hi ? __dp2a_hi(pp, u, kBias) : __dp2a_lo(pp, u, kBias)) - 32 * (p0 + p1);
  return mul_rn(d, biased_float(A));
}

// The four words of Q3_K six-bit scales (plus 32) from the 12 scale bytes: word w holds
// sub-blocks 4 w .. 4 w + 3 (low nibbles in scales[j % 8] >> 4 (j / 8), high pairs in
// scales[8 + j % 4] >> 2 (j / 4)).
__device__ __forceinline__ uint32_t q3k_scale_word(uint32_t L0, uint32_t L1, uint32_t H, int w) {
  const uint32_t lo = ((w & 1) ? L1 : L0) >> (4 * (w >> 1));
  const uint32_t hi = w < 3 ? H << (4 - 2 * w) : H >> 2;
  return (lo & 0x0F0F0F0Fu) | (hi & 0x30303030u);
}

// The tokens of a pass (kN of them, warp-uniform) against the same weight words: the masked
// quant words and the scale extraction of a unit are formed once, then each token's dots, t and
// chain step (the same operations in the same order as a pass of one token: the arithmetic per
// (row, token, unit) does not depend on kN).
struct TokActs {
  const uint8_t* aq;  // token 0's staged activation of the super-block's unit 0
  const uint8_t* am;
  int stride;  // bytes between consecutive tokens' slots
};

// Token i's staged activation of the super-block's unit b: its quants (values 0-15 in x0, 16-31
// in x1) and {d8, half sums, -4 a0, -4 a1} in m.
struct UnitAct {
  uint4 x0, x1;
  int4 m;
};
__device__ __forceinline__ UnitAct unit_act(const TokActs& ta, int i, int b) {
  const uint8_t* aq = ta.aq + i * ta.stride + 32 * b;
  return {*reinterpret_cast<const uint4*>(aq), *reinterpret_cast<const uint4*>(aq + 16),
          *reinterpret_cast<const int4*>(ta.am + i * ta.stride + 16 * b)};
}

// One whole super-block of the lane's row: the block's words from shared offset blk of the
// stage (2-byte aligned; kAligned: 4), its eight units into the chains of kN tokens (acc[i],
// i < kN). Token i's staged activation of the super-block's unit 0 is at ta.aq + i ta.stride
// (units b at + 32 b), its {d8, sums} at ta.am + i ta.stride (+ 16 b).
template <GgmlType kType, bool kAligned, int kN, int kTok>
__device__ __forceinline__ void super_block(const uint8_t* st, int blk, const TokActs& ta,
                                            float (&acc)[kTok][8]) {
  static_assert(kN >= 1 && kN <= kTok);
  if constexpr (kType == GgmlType::kQ2K) {
    uint32_t w[21];  // scales 0-3, qs 4-19, d | dmin 20
    if constexpr (kAligned) lds_words_aligned<21>(st, blk, w);
    else lds_words<21>(st, blk, w);
    const float d = low_f16(w[20]), dmin = low_f16(w[20] >> 16);
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      const int s = b & 3;
      uint32_t mq[8];
      mask_words(w + 4 + 8 * (b >> 2), 0x03030303u << (2 * s), mq);
      const uint32_t sw = w[b >> 1];
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const UnitAct u = unit_act(ta, i, b);
        const float t = q2k_t_masked(mq, s, sw, d, dmin, u.x0, u.x1, u.m.y, (b & 1) != 0);
        acc[i][b] = fma_rn(__int_as_float(u.m.x), t, acc[i][b]);
      }
    }
  } else {
    uint32_t w[28];  // hmask 0-7, qs 8-23, scales 24-26, d 27
    lds_words<28>(st, blk, w);
    const float d = low_f16(w[27]);
    uint32_t S[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) S[k] = q3k_scale_word(w[24], w[25], w[26], k);
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      uint32_t ml[8], mh[8];
      mask_words(w + 8 + 8 * (b >> 2), 0x03030303u << (2 * (b & 3)), ml);
      mask_words(w, 0x01010101u << b, mh);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const UnitAct u = unit_act(ta, i, b);
        const float t = q3k_t_masked(ml, mh, b, S[b >> 1], d, u.x0, u.x1, u.m, (b & 1) != 0);
        acc[i][b] = fma_rn(__int_as_float(u.m.x), t, acc[i][b]);
      }
    }
  }
}

// super_block for the pass's ntok tokens (1 .. kTok, warp-uniform): a branch per count, so that
// each count's tokens share the weight work and their chains interleave.
template <GgmlType kType, bool kAligned, int kTok>
__device__ __forceinline__ void tokens_super_block(int ntok, const uint8_t* st, int blk,
                                                   const uint8_t* aq, const uint8_t* am, int stride,
                                                   float (&acc)[kTok][8]) {
  static_assert(kTok == 1 || kTok == 2);
  if constexpr (kTok == 2) {
    if (ntok == 2) return super_block<kType, kAligned, 2, kTok>(st, blk, {aq, am, stride}, acc);
  }
  super_block<kType, kAligned, 1, kTok>(st, blk, {aq, am, stride}, acc);
}

// A token's staged activation of units 2 j and 2 j + 1 of a block: the quants of each unit's two
// 16-value halves (aq: the block's unit 0, 32 bytes a unit) and their half sums (am, 16 bytes a
// unit). The same words as unit_act of units 2 j and 2 j + 1; written out so that the six loads
// issue in this order (two unit_act calls reorder them in the PTX, which the device has not yet
// run: replace it by them once a GPU suite has).
struct UnitActs {
  uint4 q00, q01, q10, q11;
  int4 m0, m1;
  __device__ __forceinline__ UnitActs(int j, const uint8_t* aq, const uint8_t* am)
      : q00(*reinterpret_cast<const uint4*>(aq + 64 * j)),
        q01(*reinterpret_cast<const uint4*>(aq + 64 * j + 16)),
        q10(*reinterpret_cast<const uint4*>(aq + 64 * j + 32)),
        q11(*reinterpret_cast<const uint4*>(aq + 64 * j + 48)),
        m0(*reinterpret_cast<const int4*>(am + 32 * j)),
        m1(*reinterpret_cast<const int4*>(am + 32 * j + 16)) {}
};

// Units 2 j and 2 j + 1 of the block at blk (a super-block shared by a row's four lanes): their
// weight words, loaded and masked once for all the tokens of a pass (as super_block does for a
// class block), and t of each token's activation (a pure function of the unit and the token).
template <GgmlType kType>
struct UnitPair;

template <>
struct UnitPair<GgmlType::kQ2K> {
  uint32_t mq0[8], mq1[8], sw;
  float d, dmin;
  int s;
  __device__ __forceinline__ UnitPair(const uint8_t* st, int blk, int j) {
    uint32_t qs[8];
    lds_words<8>(st, blk + 16 + 32 * (j >> 1), qs);
    sw = lds_u32(st, blk + 4 * j);  // scales[4j .. 4j + 3]: units 2j, 2j + 1
    const uint32_t dd = lds_u32(st, blk + 80);
    d = low_f16(dd);
    dmin = low_f16(dd >> 16);
    s = 2 * (j & 1);
    mask_words(qs, 0x03030303u << (2 * s), mq0);
    mask_words(qs, 0x03030303u << (2 * s + 2), mq1);
  }
  // aq, am: the token's staged activation of the block's unit 0 (units 2 j, 2 j + 1 follow).
  __device__ __forceinline__ void t(int j, const uint8_t* aq, const uint8_t* am, float& t0,
                                    float& t1) const {
    const UnitActs x(j, aq, am);
    t0 = q2k_t_masked(mq0, s, sw, d, dmin, x.q00, x.q01, x.m0.y, false);
    t1 = q2k_t_masked(mq1, s + 1, sw, d, dmin, x.q10, x.q11, x.m1.y, true);
  }
};

template <>
struct UnitPair<GgmlType::kQ3K> {
  uint32_t ml0[8], ml1[8], mh0[8], mh1[8], sw;
  float d;
  __device__ __forceinline__ UnitPair(const uint8_t* st, int blk, int j) {
    uint32_t qs[8], hm[8], sc[3];
    lds_words<8>(st, blk + 32 + 32 * (j >> 1), qs);
    lds_words<8>(st, blk, hm);
    lds_words<3>(st, blk + 96, sc);
    d = low_f16(lds_u16(st, blk + 108));
    sw = q3k_scale_word(sc[0], sc[1], sc[2], j);
    mask_words(qs, 0x03030303u << (2 * ((2 * j) & 3)), ml0);
    mask_words(qs, 0x03030303u << (2 * ((2 * j + 1) & 3)), ml1);
    mask_words(hm, 0x01010101u << (2 * j), mh0);
    mask_words(hm, 0x01010101u << (2 * j + 1), mh1);
  }
  __device__ __forceinline__ void t(int j, const uint8_t* aq, const uint8_t* am, float& t0,
                                    float& t1) const {
    const UnitActs x(j, aq, am);
    t0 = q3k_t_masked(ml0, mh0, 2 * j, sw, d, x.q00, x.q01, x.m0, false);
    t1 = q3k_t_masked(ml1, mh1, 2 * j + 1, sw, d, x.q10, x.q11, x.m1, true);
  }
};

// The butterfly's tree over a row's 32 contract lanes, held as acc[b] of lanes 4 r + c (contract
// lane 8 c + b): levels 16 and 8 across the row's lanes, then 4, 2, 1 inside the lane.
__device__ __forceinline__ float row_butterfly(float (&acc)[8]) {
#pragma unroll
  for (int b = 0; b < 8; ++b) acc[b] = add_rn(acc[b], __shfl_xor_sync(0xFFFFFFFFu, acc[b], 2));
#pragma unroll
  for (int b = 0; b < 8; ++b) acc[b] = add_rn(acc[b], __shfl_xor_sync(0xFFFFFFFFu, acc[b], 1));
#pragma unroll
  for (int b = 0; b < 4; ++b) acc[b] = add_rn(acc[b], acc[b + 4]);
#pragma unroll
  for (int b = 0; b < 2; ++b) acc[b] = add_rn(acc[b], acc[b + 2]);
  return add_rn(acc[0], acc[1]);
}

// The launch's pairs (group, token) and passes. One-token launches map pair g to group g; kPlain
// to group pi / 8, token pi % 8; groups of several tokens through pre[g], the tokens of the live
// groups before g, built by each block in shared memory. A pass computes 8 rows of one group
// against a chunk of up to kTok of its tokens (consecutive pairs), so a group of n tokens is
// ceil(n / kTok) chunks, each a full pass over the group's rows that reads them once for all its
// tokens; cpre[g] counts the chunks of the live groups before g. One-token launches: kTok = 1,
// chunk = pair.
template <int kTok>
struct Pairs {
  const MmvqParams& p;
  const int32_t* pre;   // nullptr: every group one token
  const int32_t* cpre;  // chunks before group g (with pre)
  int64_t groups;       // live groups

  __device__ __forceinline__ int64_t chunks() const {
    if (p.form == Form::kPlain) return p.T;
    return cpre != nullptr ? cpre[groups] : groups;
  }
  // The pair's group and token; g is a cursor that only moves forward (a warp's pairs increase).
  __device__ __forceinline__ void at(int64_t pi, int64_t& g, int& tok) const {
    if (p.form == Form::kPlain) {
      g = pi / kMaxGroupRows;
      tok = static_cast<int>(pi - g * kMaxGroupRows);
    } else if (pre == nullptr) {
      g = pi;
      tok = 0;
    } else {
      if (g < 0) g = 0;
      while (pre[g + 1] <= pi) ++g;  // the group holding pair pi (groups of no token skipped)
      tok = static_cast<int>(pi - pre[g]);
    }
  }
  // Chunk ci: its group (a forward cursor, as above), first token, token count (1 .. kTok;
  // one-token launches: 1, the group's n deciding validity) and first pair.
  __device__ __forceinline__ void chunk(int64_t ci, int64_t& g, int& tok0, int& ntok,
                                        int64_t& pi) const {
    if (cpre == nullptr) {
      at(ci, g, tok0);
      ntok = 1;
      pi = ci;
      return;
    }
    if (g < 0) g = 0;
    while (cpre[g + 1] <= ci) ++g;
    tok0 = kTok * static_cast<int>(ci - cpre[g]);
    const int n = pre[g + 1] - pre[g] - tok0;
    ntok = n < kTok ? n : kTok;
    pi = pre[g] + tok0;
  }
};

// pre[0..G] of the live groups' token counts and cpre[0..G] of their chunks of kTok tokens, by
// warp 0 (the caller synchronises the block).
template <int kTok>
__device__ __forceinline__ void build_prefix(const MmvqParams& p, int64_t G, int32_t* pre,
                                             int32_t* cpre) {
  const int lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  int32_t base = 0, cbase = 0;
  if (lane == 0) pre[0] = cpre[0] = 0;
  for (int64_t g0 = 0; g0 < G; g0 += kWarpSize) {
    const int64_t g = g0 + lane;
    int v = g < G ? __ldg(&stored_group(p, g)->n) : 0;
    int cv = (v + kTok - 1) / kTok;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const int u = __shfl_up_sync(0xFFFFFFFFu, v, o);
      const int cu = __shfl_up_sync(0xFFFFFFFFu, cv, o);
      if (lane >= o) {
        v += u;
        cv += cu;
      }
    }
    if (g < G) {
      pre[g + 1] = base + v;
      cpre[g + 1] = cbase + cv;
    }
    base += __shfl_sync(0xFFFFFFFFu, v, kWarpSize - 1);
    cbase += __shfl_sync(0xFFFFFFFFu, cv, kWarpSize - 1);
  }
}

// A warp's position in the launch's items (chunk ci, pass; items are ci passes + pass): it starts
// at the warp's first item and steps by the warps per block, with no division past the start.
struct PassCursor {
  int64_t ci;
  int pass;
  __device__ __forceinline__ PassCursor(int64_t item, int passes)
      : ci(item / passes), pass(static_cast<int>(item - item / passes * passes)) {}
  __device__ __forceinline__ void step(int by, int passes) {
    pass += by;
    while (pass >= passes) {
      pass -= passes;
      ++ci;
    }
  }
};

// The launch diagnostics (cuda::set_mmvq_stream_diagnostic; kDiag 1: a timeline a warp, 2: the
// same with the products and the output left out). Warp w of block b writes its record of
// kMmvqTimelineWords words at g_timeline + kMmvqTimelineWords (b kWarps + w), lane 0 alone; the
// slots are cuda/kernels.h's MmvqTimelineSlot. Clock reads are per multiprocessor (cycles);
// %globaltimer (ns, coarse) places the warps' entries and exits on one axis.
__device__ uint64_t* g_timeline = nullptr;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}

// The launch bounds' thread count: the block's own, except for the one-token shape of 14 warps
// (kOneTokenWarps), whose bound is 17 warps, so that the compiler keeps below 65536 / 544 = 120
// registers a thread (cuda/mmvq_sb.cuh); a bound of 16 warps would allow 128, too many beside a
// pair GEMV block. nvcc 13.0 gives both types' 14-warp kernels 96 registers (cuobjdump
// -res-usage; Q2_K no stack, Q3_K an 8-byte frame, no local memory). A launch bound is an upper
// limit, so the kernel launches with 448 threads.
constexpr int launch_bound_threads(int warps) {
  return (warps == kOneTokenWarps ? 17 : warps) * kWarpSize;
}

// kDiag = 0 is the product kernel (no record, no clock read: its code is as without the
// parameter).
template <GgmlType kType, int kWarps, bool kPrefix, int kTok, int kPer, int kDiag = 0>
__global__ void __launch_bounds__(launch_bound_threads(kWarps), 1)
    mmvq_sb_kernel(MmvqParams p, int stages, int n_act, bool early, int head) {
  static_assert(kTok == 1 || (kPrefix && kTok <= kPassTokens));
  static_assert(kPer == 1 || kPer == 2);
  static_assert(kDiag == 0 || (!kPrefix && kTok == 1 && kPer == 1));
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kB = kBB<kType>;
  constexpr int kThreads = kWarps * kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const int nsb = static_cast<int>(p.K / kQK_K);
  // Steps of a pass (StepPlan): kPer blocks a class each, then (kPer = 2) a step of one a class,
  // the last one also carrying the rem left over (slot_bytes); rows of fewer than 4 super-blocks:
  // one step of the rem alone.
  constexpr int kCB = kChunkSb * kPer;  // super-blocks of a row in a full step
  const StepPlan sp(nsb, kPer);
  const int rem = sp.rem, nq = sp.nq;
  const int kS = slot_bytes(kType, nsb, kPer);
  const Layout L(kS, units, kWarps, stages, n_act);
  uint8_t* ring = smem + warp * stages * L.stage;
  uint8_t* acts = smem + L.acts;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L.bar) + warp * stages;
  int* act_rows = reinterpret_cast<int*>(smem + L.bytes);
  // The warp's diagnostic record (kDiag only): lane 0 writes slot k.
  uint64_t* tl = nullptr;
  auto mark = [&](int k, uint64_t v) {
    if constexpr (kDiag != 0) {
      if (lane == 0) tl[k] = v;
    }
  };
  if constexpr (kDiag != 0) {
    tl = g_timeline + static_cast<int64_t>(kMmvqTimelineWords) *
                          (static_cast<int64_t>(blockIdx.x) * kWarps + warp);
    mark(kTlEntryNs, global_ns());
    mark(kTlEntryClk, clock64());
    mark(kTlSmBlock, sm_id() | static_cast<uint64_t>(blockIdx.x) << 32);
  }
  // Programmatic launch (cuda/pdl.cuh): the activations are the predecessor's output. Under
  // kEarlyReads the plan (group counts, slot pointers) was complete before the predecessor
  // started, so the rings start filling before the wait; otherwise everything waits.
  if (!early) {
    pdl::wait();
    pdl::launch_dependents();
  }
  // The plan into L1 at once (mmvq_groups_planned's warm range): the reads below are a chain
  // (count, then the group, then its slot pointer, then the copy), an L2 round trip each without.
  for (int i = static_cast<int>(threadIdx.x); i < p.warm_lines; i += kThreads)
    bulk::prefetch_l1(p.warm + 128 * static_cast<int64_t>(i));

  const int64_t G = p.form == Form::kPlain ? 0 : live_groups(p);
  int32_t *pre = nullptr, *cpre = nullptr;
  if constexpr (kPrefix) {
    pre = act_rows + n_act;
    cpre = pre + p.n_groups + 1;
    if (warp == 0) build_prefix<kTok>(p, G, pre, cpre);
    __syncthreads();
  }
  const Pairs<kTok> pairs{p, pre, cpre, G};
  const int passes = static_cast<int>((p.rows + kPassRows - 1) / kPassRows);
  const int64_t total = passes * pairs.chunks();
  ItemRange range = block_items(blockIdx.x, gridDim.x, total);
  if constexpr (kPrefix && kTok > 1)  // several-token chunks: split by work (first_item)
    range =
        block_items_by_work(blockIdx.x, gridDim.x, kTok, pass_weight(kType), G, pre, cpre, passes);
  const int64_t b0 = range.b0, b1 = range.b1;
  if (b1 <= b0) {  // block-uniform: no pass here
    pdl::wait();
    if constexpr (kDiag != 0) {
      mark(kTlPasses, 0);
      mark(kTlExitClk, clock64());
      mark(kTlExitNs, global_ns());
    }
    return;
  }
  // The pairs of the block's chunks: pi0 .. pi0 + np - 1 (np <= n_act, the launch's bound).
  int64_t pi0, pi_last;
  {
    int64_t g = -1, pi;
    int t0, nt;
    pairs.chunk(b0 / passes, g, t0, nt, pi0);
    pairs.chunk((b1 - 1) / passes, g, t0, nt, pi);
    pi_last = pi + nt - 1;
  }
  const int np = static_cast<int>(pi_last - pi0 + 1);
  if (np > n_act) __trap();
  const int64_t first = b0 + warp;
  const int n_pass = first < b1 ? static_cast<int>((b1 - first + kWarps - 1) / kWarps) : 0;
  const int steps = n_pass * nq;

  const int r = lane >> 2, c = lane & 3;
  const int64_t rb = p.row_bytes;

  // The issuing side: step (j, q) into stage k; lane i < 8 copies row i of the pass. Its pass
  // cursor (chunk ci, pass) moves by the warps per block from the warp's first item (a 64-bit
  // division per pass otherwise), and its row's address is formed once a pass.
  int64_t i_group = -1, i_cur = -1;
  GroupInfo i_gi{nullptr, 0};
  PassCursor i_at(first, passes);
  bool i_live = false;  // the lane copies a row of this pass
  uintptr_t i_row = 0;  // the lane's row's first byte
  auto issue = [&](int j, int q, int k) {
    if (q == 0) {  // a new pass: its group looked up once
      if (j > 0) i_at.step(kWarps, passes);
      int tok0, ntok;
      int64_t pi;
      pairs.chunk(i_at.ci, i_cur, tok0, ntok, pi);
      if (i_cur != i_group) {
        i_group = i_cur;
        i_gi = group_info(p, i_cur);
      }
      const int64_t row = static_cast<int64_t>(i_at.pass) * kPassRows + lane;
      i_live = lane < kPassRows && i_gi.n > 0 && row < p.rows;
      i_row = reinterpret_cast<uintptr_t>(i_gi.base) + static_cast<uintptr_t>(row * rb);
    }
    uint32_t size = 0;
    uintptr_t a = 0;
    if (i_live) {
      const int nb = sp.blocks(q);
      const uintptr_t s = i_row + static_cast<uintptr_t>(q * kCB * kB);
      a = s & ~uintptr_t{15};
      size = static_cast<uint32_t>(((s + nb * kB + 15) & ~uintptr_t{15}) - a);
    }
    const uint32_t tx = __reduce_add_sync(0xFFFFFFFFu, size);
    if (lane == 0) bulk::bar_expect_tx(bar + k, tx);
    __syncwarp();
    if (size > 0)
      bulk::copy(ring + k * L.stage + lane * kS, reinterpret_cast<const void*>(a), size, bar + k);
  };

  // The ring's head (its first `head` steps, 0 .. stages; Settings::head, kDefaultHead) starts
  // filling before the activation is staged, the rest of the ring right after. Each step issued
  // first delays the staging (its copies are accepted only as the memory system drains the ones
  // before), and with it the first products and the loop's next copies (docs/performance.md,
  // "The ring's head").
  if (lane == 0) {
    for (int k = 0; k < stages; ++k) bulk::bar_init(bar + k, 1);
    bulk::fence_bar_init();
  }
  __syncwarp();
  int ij = 0, iq = 0;  // the next step to issue
  auto fill = [&](int k0, int k1) {
    for (int k = k0; k < k1 && k < steps; ++k) {
      issue(ij, iq, k);
      if (++iq == nq) {
        iq = 0;
        ++ij;
      }
    }
  };
  fill(0, head);
  if constexpr (kDiag != 0) mark(kTlIssuedClk, clock64());
  if (early) {
    pdl::wait();
    pdl::launch_dependents();
  }
  if constexpr (kDiag != 0) mark(kTlPdlClk, clock64());
  // The activation rows of the block's pairs pi0 .. pi0 + np - 1, one slot each.
  for (int j = static_cast<int>(threadIdx.x); j < np; j += kThreads) {
    int64_t g = -1;
    int tok;
    pairs.at(pi0 + j, g, tok);
    const GroupInfo gj = group_info(p, g);
    act_rows[j] = tok < gj.n ? act_row(p, g, tok) : -1;
  }
  __syncthreads();
  stage_acts<kThreads>(p.a, act_rows, np, units, acts, L.act_bytes, L.act_m);
  if constexpr (kDiag != 0) {
    mark(kTlStagedClk, clock64());
    mark(kTlStagedNs, global_ns());
    mark(kTlPasses, static_cast<uint64_t>(n_pass));
    mark(kTlSteps, static_cast<uint64_t>(steps));
  }
  fill(head, stages);
  [[maybe_unused]] uint64_t wait_clk = 0, compute_clk = 0, t_data = 0;

  int64_t group = -1, cur = -1;
  GroupInfo gi{nullptr, 0};
  PassCursor at(first, passes);
  int tok0 = 0, ntok = 1;
  bool valid = false;
  // The lane's row's first byte's address mod 16 (its phase), and whether every lane's is 4-byte
  // aligned (Q2_K: each step's blocks then are; 4 x 84 is a multiple of 4): once a pass.
  uint32_t row_ph = 0;
  bool aligned4 = false;
  const uint8_t* act = acts;
  float acc[kTok][8];
  int k = 0;
  uint32_t parity = 0;
  for (int s = 0, j = 0, q = 0; s < steps; ++s) {
    if (q == 0) {  // a new pass (warp-uniform)
      if (j > 0) at.step(kWarps, passes);
      int64_t pi;
      pairs.chunk(at.ci, cur, tok0, ntok, pi);
      if (cur != group) {
        group = cur;
        gi = group_info(p, cur);
      }
      act = acts + static_cast<int>(pi - pi0) * L.act_bytes;
      const int64_t row = static_cast<int64_t>(at.pass) * kPassRows + r;
      valid = tok0 < gi.n && row < p.rows;
      row_ph = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(gi.base) +
                                     static_cast<uintptr_t>(row * rb));
      aligned4 = kType == GgmlType::kQ2K && __all_sync(0xFFFFFFFFu, (row_ph & 3) == 0);
#pragma unroll
      for (int i = 0; i < kTok; ++i)
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[i][b] = 0.0f;
    }
    if constexpr (kDiag != 0) t_data = clock64();
    bulk::bar_wait(bar + k, parity);
    if constexpr (kDiag != 0) {
      const uint64_t now = clock64();
      wait_clk += now - t_data;
      t_data = now;
      if (s == 0) mark(kTlFirstDataClk, now);
    }
    const uint8_t* st = ring + k * L.stage + r * kS;
    const int64_t row = static_cast<int64_t>(at.pass) * kPassRows + r;
    const int m = static_cast<int>((row_ph + static_cast<uint32_t>(q * kCB * kB)) & 15u);
    // The class's blocks of the step, in increasing sb: 4 i + c of the step's, i < ncb.
    const int ncb = sp.class_blocks(q);
    auto class_block = [&](int i) {
      const int sb = kCB * q + kChunkSb * i + c;
      const uint8_t* aq = act + kActQSb * sb;
      const uint8_t* am = act + L.act_m + kActMSb * sb;
      const int blk = m + (kChunkSb * i + c) * kB;
      // Q2_K rows are whole words: every block 4-byte aligned when the base is (warp-uniform).
      if (aligned4) tokens_super_block<kType, true, kTok>(ntok, st, blk, aq, am, L.act_bytes, acc);
      else tokens_super_block<kType, false, kTok>(ntok, st, blk, aq, am, L.act_bytes, acc);
    };
    if constexpr (kDiag == 2) {
      // Copies alone: the step's bytes landed and are left unread.
    } else if constexpr (kPer == 1) {
      if (ncb != 0) class_block(0);
    } else {
#pragma unroll 1
      for (int i = 0; i < ncb; ++i) class_block(i);
    }
    // The rem super-blocks, shared by the row's four lanes (copies alone: none).
    if (kDiag != 2 && rem != 0 && q == nq - 1) {
      // Their blocks follow the step's class blocks (or start the stage when the row has fewer
      // than 4); each chain meets them after its class's blocks of this step, in increasing sb.
      // Each block's weight words are formed once for the pass's tokens; each token's chains
      // still meet the blocks in increasing sb (the tokens' chains are apart).
      const int o0 = kChunkSb * ncb;
      auto rem_block = [&](int o) {
        const int sb = kCB * q + o0 + o;
        const UnitPair<kType> w(st, m + (o0 + o) * kB, c);
#pragma unroll
        for (int i = 0; i < kTok; ++i) {
          if (i >= ntok) break;  // warp-uniform
          const uint8_t* ai = act + i * L.act_bytes;
          const uint8_t* aq = ai + kActQSb * sb;
          const uint8_t* am = ai + L.act_m + kActMSb * sb;
          float t0, t1;
          w.t(c, aq, am, t0, t1);
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const float v0 = __shfl_sync(0xFFFFFFFFu, t0, (lane & ~3) | jj);
            const float v1 = __shfl_sync(0xFFFFFFFFu, t1, (lane & ~3) | jj);
            if (c == o) {
              const float* d8 = reinterpret_cast<const float*>(am + 32 * jj);
              acc[i][2 * jj] = fma_rn(d8[0], v0, acc[i][2 * jj]);
              acc[i][2 * jj + 1] = fma_rn(d8[4], v1, acc[i][2 * jj + 1]);
            }
          }
        }
      };
      // Unrolled for one-token passes (each block's copy its own registers: no moves of the
      // chains between iterations); a loop for two (the unrolled copies spill there).
      if constexpr (kTok == 1) {
#pragma unroll
        for (int o = 0; o < kChunkSb - 1; ++o) {
          if (o >= rem) break;  // warp-uniform
          rem_block(o);
        }
      } else {
        for (int o = 0; o < rem; ++o) rem_block(o);
      }
    }
    if (kDiag != 2 && q == nq - 1) {
#pragma unroll
      for (int i = 0; i < kTok; ++i) {
        if (i >= ntok) break;  // warp-uniform
        const float v = row_butterfly(acc[i]);
        if (valid && c == 0)
          p.y[static_cast<int64_t>(out_row(p, group, tok0 + i)) * p.rows + row] = v;
      }
    }
    if constexpr (kDiag != 0) {
      const uint64_t now = clock64();
      compute_clk += now - t_data;
      if (q == nq - 1 && j < kTlPassEnds) mark(kTlPassEnd0 + j, now);
    }
    __syncwarp();  // every lane is done with stage k
    if (s + stages < steps) {
      if (lane < kPassRows) bulk::fence_proxy_async();
      issue(ij, iq, k);
      if (++iq == nq) {
        iq = 0;
        ++ij;
      }
    }
    if (++k == stages) {
      k = 0;
      parity ^= 1u;
    }
    if (++q == nq) {
      q = 0;
      ++j;
    }
  }
  if constexpr (kDiag != 0) {
    mark(kTlWaitClk, wait_clk);
    mark(kTlComputeClk, compute_clk);
    mark(kTlExitClk, clock64());
    mark(kTlExitNs, global_ns());
  }
}

// The process's settings (set_pass_shape, set_step; Settings in cuda/mmvq_sb.cuh).
Settings g_settings;

// set_diagnostic's mode and the capacity of its buffer (warps).
struct Diagnostic {
  int mode = 0;
  int64_t capacity = 0;
  uint64_t* written = nullptr;  // g_timeline's value
};
Diagnostic g_diag;

template <GgmlType kType, int kWarps, bool kPrefix, int kTok, int kPer, int kDiag = 0>
void launch_per(const MmvqParams& p, const Geometry& g, void* stream) {
  auto* kernel = mmvq_sb_kernel<kType, kWarps, kPrefix, kTok, kPer, kDiag>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), g.bytes);
  pdl::launch(kernel, dim3(static_cast<unsigned>(g.grid)), dim3(kWarps * kWarpSize),
              static_cast<size_t>(g.bytes), as_stream(stream), p, g.stages, g.n_act,
              pdl::mode() == pdl::Mode::kEarlyReads,
              g_settings.head < 0 ? kDefaultHead : std::min(g_settings.head, g.stages));
}

template <GgmlType kType, int kWarps, bool kPrefix, int kTok>
void launch_one(const MmvqParams& p, const Geometry& g, void* stream) {
  if (g.per == 2) launch_per<kType, kWarps, kPrefix, kTok, 2>(p, g, stream);
  else launch_per<kType, kWarps, kPrefix, kTok, 1>(p, g, stream);
}

template <GgmlType kType, int kWarps>
void launch_prefix(const MmvqParams& p, const Geometry& g, void* stream) {
  if (!prefixed(p)) launch_one<kType, kWarps, false, 1>(p, g, stream);
  else if (g.tok == 1) launch_one<kType, kWarps, true, 1>(p, g, stream);
  else launch_one<kType, kWarps, true, kPassTokens>(p, g, stream);
}

// A one-token launch with steps of 4 under set_diagnostic's mode (1 or 2).
template <GgmlType kType, int kDiag>
void launch_diag(const MmvqParams& p, const Geometry& g, void* stream) {
  switch (g.warps) {
    case 16: launch_per<kType, 16, false, 1, 1, kDiag>(p, g, stream); break;
    case 12: launch_per<kType, 12, false, 1, 1, kDiag>(p, g, stream); break;
    case 8: launch_per<kType, 8, false, 1, 1, kDiag>(p, g, stream); break;
    default: launch_per<kType, 4, false, 1, 1, kDiag>(p, g, stream); break;
  }
}

template <GgmlType kType>
void launch_type(const MmvqParams& p, const Geometry& g, void* stream) {
  if (g_diag.mode != 0) {
    if (prefixed(p) || g.per != 1)
      throw InputError(
          "cuda::set_mmvq_stream_diagnostic: only one-token launches with steps of 4 record a "
          "timeline (this launch has several-token groups or steps of 8)");
    if (g.warps == kOneTokenWarps)
      throw InputError(
          "cuda::set_mmvq_stream_diagnostic: the one-token shape of 14 warps records no timeline "
          "(ask for 4, 8, 12 or 16)");
    if (g.grid * g.warps > g_diag.capacity)
      throw InputError("cuda::set_mmvq_stream_diagnostic: the launch has " +
                       std::to_string(g.grid * g.warps) + " warps, the buffer holds " +
                       std::to_string(g_diag.capacity));
    if (g_diag.mode == 1) launch_diag<kType, 1>(p, g, stream);
    else launch_diag<kType, 2>(p, g, stream);
    return;
  }
  switch (g.warps) {
    case 16: launch_prefix<kType, 16>(p, g, stream); break;
    case kOneTokenWarps:  // choose() gives it to one-token launches with steps of 4 only
      if (prefixed(p) || g.per != 1)
        throw std::logic_error("mmvq_sb: 14 warps chosen for a launch it does not take");
      launch_per<kType, kOneTokenWarps, false, 1, 1>(p, g, stream);
      break;
    case 12: launch_prefix<kType, 12>(p, g, stream); break;
    case 8: launch_prefix<kType, 8>(p, g, stream); break;
    default: launch_prefix<kType, 4>(p, g, stream); break;
  }
}

}  // namespace

void set_pass_shape(int pass_tokens, bool whole_sm) {
  if (pass_tokens < 0 || pass_tokens > kPassTokens)
    throw InputError("cuda::set_mmvq_stream_pass_shape: pass tokens must be in [0, " +
                     std::to_string(kPassTokens) + "], found " + std::to_string(pass_tokens));
  g_settings.pass_tokens = pass_tokens;
  g_settings.whole_sm = whole_sm;
}

void set_step(int blocks) {
  if (blocks != 0 && blocks != 4 && blocks != 8)
    throw InputError("cuda::set_mmvq_stream_step: super-blocks a step must be 0, 4 or 8, found " +
                     std::to_string(blocks));
  g_settings.step = blocks;
}

void set_head(int steps) {
  if (steps < -1 || steps > 8)
    throw InputError(
        "cuda::set_mmvq_stream_head: steps before the staging must be -1 (the "
        "default) or in [0, 8], found " +
        std::to_string(steps));
  g_settings.head = steps;
}

void set_diagnostic(int mode, uint64_t* buffer, int64_t capacity_warps) {
  if (mode < 0 || mode > 2)
    throw InputError("cuda::set_mmvq_stream_diagnostic: mode must be 0, 1 or 2, found " +
                     std::to_string(mode));
  if (mode != 0 && (buffer == nullptr || capacity_warps < 1))
    throw InputError(
        "cuda::set_mmvq_stream_diagnostic: modes 1 and 2 need a buffer of one "
        "record a warp or more");
  // The device's pointer is written only when it changes (a blocking copy): switching the mode
  // between launches of one stream leaves the stream's work undisturbed.
  if (mode != 0 && buffer != g_diag.written) {
    MOECHECK_CUDA_CHECK(cudaMemcpyToSymbol(g_timeline, &buffer, sizeof buffer));
    g_diag.written = buffer;
  }
  g_diag.mode = mode;
  g_diag.capacity = mode != 0 ? capacity_warps : 0;
}

bool supported(const MmvqParams& p, GgmlType t) {
  if ((t != GgmlType::kQ2K && t != GgmlType::kQ3K) || p.max_n < 1 || p.max_n > kMaxGroupRows ||
      p.K <= 0 || p.K % kQK_K != 0 || p.K > (int64_t{1} << 20))
    return false;
  if (p.form == Form::kGroups && p.max_n > 1 && p.n_groups > kMaxPrefixGroups) return false;
  const int slot = slot_bytes(t, static_cast<int>(p.K / kQK_K));
  Geometry g;
  return geometry(p, slot, 4, 2, current_sm_count(), g_settings, g);
}

void launch(const MmvqParams& p, GgmlType t, int warps, int stages, void* stream) {
  Geometry g;
  if (!choose(p, t, warps, stages, current_sm_count(), g_settings, g))
    throw InputError("cuda::mmvq (streamed engine): K=" + std::to_string(p.K) +
                     " does not fit the engine's shared memory");
  if (t == GgmlType::kQ2K) launch_type<GgmlType::kQ2K>(p, g, stream);
  else launch_type<GgmlType::kQ3K>(p, g, stream);
}

}  // namespace moecheck::cuda::mmvq_sb
