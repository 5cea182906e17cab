// The planted-bug suite's pipeline (tests only; nothing here is compiled into the shipped
// binary): the emulation's layer forward reassembled from its stage functions (router_gemv,
// route_from_logits and the layer plan, quantize_q8_1, mmvq_groups, swiglu_q8, the shared
// expert's kernels, accumulate), in which one stage can be swapped for a variant with a bug of
// the kind a kernel engineer writes, or for a legal change of its arithmetic (another order of
// the same depth, or an fma split into a multiply and an add). With no bug the
// pipeline equals emu::MoeLayer bit for bit in every stage (tests/planted_bug_test.cpp checks
// it), so every difference a leg sees comes from the planted change. docs/detection.md has the
// list and the results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/fp_ops.h"
#include "core/layer_plan.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "core/routing.h"
#include "core/schedule.h"
#include "core/taps.h"
#include "emulate/accumulate.h"
#include "emulate/bf16_gemv.h"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"
#include "emulate/router_gemv.h"
#include "emulate/swiglu_q8.h"

namespace moecheck::planted {

enum class Bug {
  kNone,
  kRouterSwapsAdjacentInputs,  // router_gemv reads x[k ^ 1] (an indexing bug)
  kRoutingTieToHigherId,       // exact key ties go to the higher expert id
  kRoutingWeightsFromKeys,     // the weights gathered from the biased keys, not the scores
  kRoutingEpsTwice,            // the renormalisation adds 1e-20 twice
  kRoutingNoRouteScale,        // route_scale never applied
  kQ8ScaleAmaxOver128,         // x's q8_1 scale amax / 128 (values clip at 127)
  kQ8Truncates,                // x's q8_1 quants truncated instead of rounded to nearest
  kQ8SumMissing,               // x's q8_1 blocks keep s = 0 (the d * sum q field)
  kHq8Truncates,               // h's q8_1 quants truncated (the down projection's input)
  kQ2KMinIsScale,              // Q2_K decode reads each sub-block's min from its scale nibble
  kQ2KDminIsD,                 // Q2_K decode uses d for dmin
  kQ3KHighBitInverted,         // Q3_K decode subtracts 4 when the hmask bit is set, not clear
  kMmvqLastUnitDropped,        // the MMVQ lane loop stops one q8_1 block early (a loop bound)
  kMmvqLastRowZero,            // the down projection never writes its last row (an edge row)
  kSwigluNoGateClamp,          // SwiGLU drops the gate's clamp at +L
  kSwigluUpClampAboveOnly,     // SwiGLU clamps up at +L only
  kSwigluGateClampedBelow,     // SwiGLU also clamps the gate at -L
  kSwigluSigmoidSign,          // silu(g) = g / (1 + exp(g))
  kAccWeightOfNextExpert,      // accumulate pairs each weight with the next pick's output
  kAccSharedDropped,           // accumulate forgets the shared expert
  kFinishTruncates,            // the bf16 output truncated instead of rounded to nearest even
  kSharedGateUpSwapped,        // the shared expert's gate and up matrices swapped
  // Legal changes of the arithmetic (another order or rounding the contract's bounds allow).
  kLegalAccMulAdd,          // accumulate with mul + add instead of fma
  kLegalAccDescending,      // accumulate the picks in descending expert id
  kLegalMmvqLanesPermuted,  // MMVQ lane l takes lane bitrev(l)'s units, in decreasing order
  kLegalMmvqFmaSplit,       // every MMVQ fma (unit float part, lane chain) a multiply and an add
  kLegalRouterPairwise,     // router logits summed pairwise in f32
  kLegalSiluLibmExp,        // silu through the host's expf instead of pexp
};

struct BugInfo {
  Bug bug;
  const char* name;
  const char* kernel;
  Stage stage;  // where it must be attributed (kInput for the legal changes: nowhere)
  bool legal;
};

inline const std::vector<BugInfo>& all_bugs() {
  static const std::vector<BugInfo> v = {
      {Bug::kRouterSwapsAdjacentInputs, "router reads x[k^1]", "router_gemv", Stage::kRouterLogits,
       false},
      {Bug::kRoutingTieToHigherId, "ties to the higher id", "routing", Stage::kTopkIds, false},
      {Bug::kRoutingWeightsFromKeys, "weights from biased keys", "routing", Stage::kTopkWeights,
       false},
      {Bug::kRoutingEpsTwice, "+1e-20 twice", "routing", Stage::kTopkWeights, false},
      {Bug::kRoutingNoRouteScale, "route_scale dropped", "routing", Stage::kTopkWeights, false},
      {Bug::kQ8ScaleAmaxOver128, "q8_1 scale amax/128", "quantize_q8_1 (x)", Stage::kXQ8, false},
      {Bug::kQ8Truncates, "q8_1 truncates", "quantize_q8_1 (x)", Stage::kXQ8, false},
      {Bug::kQ8SumMissing, "q8_1 s field 0", "quantize_q8_1 (x)", Stage::kXQ8, false},
      {Bug::kHq8Truncates, "h q8_1 truncates", "swiglu_q8 (h_q8)", Stage::kExpertsHQ8, false},
      {Bug::kQ2KMinIsScale, "Q2_K min from scale nibble", "mmvq decode", Stage::kExpertsGate,
       false},
      {Bug::kQ2KDminIsD, "Q2_K dmin read as d", "mmvq scales", Stage::kExpertsGate, false},
      {Bug::kQ3KHighBitInverted, "Q3_K high bit inverted", "mmvq decode", Stage::kExpertsDown,
       false},
      {Bug::kMmvqLastUnitDropped, "MMVQ drops last block", "mmvq reduction", Stage::kExpertsGate,
       false},
      {Bug::kMmvqLastRowZero, "down's last row unwritten", "mmvq edge rows", Stage::kExpertsDown,
       false},
      {Bug::kSwigluNoGateClamp, "gate clamp dropped", "swiglu", Stage::kExpertsH, false},
      {Bug::kSwigluUpClampAboveOnly, "up clamped above only", "swiglu", Stage::kExpertsH, false},
      {Bug::kSwigluGateClampedBelow, "gate clamped below too", "swiglu", Stage::kExpertsH, false},
      {Bug::kSwigluSigmoidSign, "silu sign error", "swiglu", Stage::kExpertsH, false},
      {Bug::kAccWeightOfNextExpert, "weight of the wrong expert", "accumulate", Stage::kAcc, false},
      {Bug::kAccSharedDropped, "shared expert dropped", "accumulate", Stage::kAcc, false},
      {Bug::kFinishTruncates, "bf16 output truncates", "finish", Stage::kOutput, false},
      {Bug::kSharedGateUpSwapped, "shared gate/up swapped", "shared expert", Stage::kSharedGate,
       false},
      {Bug::kLegalAccMulAdd, "acc mul + add (legal)", "accumulate", Stage::kInput, true},
      {Bug::kLegalAccDescending, "acc descending ids (legal)", "accumulate", Stage::kInput, true},
      {Bug::kLegalMmvqLanesPermuted, "MMVQ lanes permuted (legal)", "mmvq", Stage::kInput, true},
      {Bug::kLegalMmvqFmaSplit, "MMVQ fma split (legal)", "mmvq", Stage::kInput, true},
      {Bug::kLegalRouterPairwise, "router pairwise sum (legal)", "router_gemv", Stage::kInput,
       true},
      {Bug::kLegalSiluLibmExp, "silu via libm expf (legal)", "swiglu", Stage::kInput, true},
  };
  return v;
}

// ---- q8_1 with bugs (the contract: docs/numerics.md "quantize_q8_1")

inline BlockQ8_1 q8_block(const float* x, Bug bug) {
  if (bug != Bug::kQ8ScaleAmaxOver128 && bug != Bug::kQ8Truncates && bug != Bug::kQ8SumMissing &&
      bug != Bug::kHq8Truncates)
    return emu::quantize_block_q8_1(x);
  BlockQ8_1 b{};
  float amax = 0.0f;
  for (int i = 0; i < kQK8_1; ++i) {
    if (!std::isfinite(x[i])) {
      b.d = b.s = 0x7E00;
      return b;
    }
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float d = div_rn(amax, bug == Bug::kQ8ScaleAmaxOver128 ? 128.0f : 127.0f);
  if (d == 0.0f) return b;
  int sum = 0;
  for (int i = 0; i < kQK8_1; ++i) {
    const float r = div_rn(x[i], d);
    int q = bug == Bug::kQ8Truncates || bug == Bug::kHq8Truncates
                ? static_cast<int>(std::trunc(r))
                : static_cast<int>(std::nearbyint(r));
    q = std::clamp(q, -127, 127);
    b.qs[i] = static_cast<int8_t>(q);
    sum += q;
  }
  b.d = f32_to_f16(d);
  b.s = bug == Bug::kQ8SumMissing ? 0 : f32_to_f16(mul_rn(d, static_cast<float>(sum)));
  return b;
}

inline void q8_rows(const float* x, BlockQ8_1* y, int64_t R, int64_t K, Bug bug) {
  for (int64_t i = 0; i < R * K / kQK8_1; ++i) y[i] = q8_block(x + i * kQK8_1, bug);
}

// ---- MMVQ with bugs (docs/numerics.md "mmvq_q2k, mmvq_q3k"), one (row, token)

inline float unit_value(GgmlType t, const uint8_t* row, const BlockQ8_1& a, int64_t g, Bug bug) {
  const int64_t sb = g / kQ8PerSuperBlock, b = g % kQ8PerSuperBlock;
  int A = 0, B = 0;
  if (t == GgmlType::kQ2K) {
    BlockQ2K blk;
    std::memcpy(&blk, row + sb * static_cast<int64_t>(sizeof blk), sizeof blk);
    for (int l = 0; l < kQK8_1; ++l) {
      const int sub = static_cast<int>((32 * b + l) / 16);
      const int sc = blk.scales[sub] & 0xF,
                mn = bug == Bug::kQ2KMinIsScale ? sc : blk.scales[sub] >> 4;
      const int q = (blk.qs[32 * (b / 4) + l] >> (2 * (b % 4))) & 3;
      A += sc * q * a.qs[l];
      B += mn * a.qs[l];
    }
    const float d = f16_to_f32(blk.d),
                dmin = f16_to_f32(bug == Bug::kQ2KDminIsD ? blk.d : blk.dmin);
    if (bug == Bug::kLegalMmvqFmaSplit)
      return add_rn(mul_rn(d, static_cast<float>(A)), -mul_rn(dmin, static_cast<float>(B)));
    return mmvq_unit_q2k(d, dmin, A, B);
  }
  BlockQ3K blk;
  std::memcpy(&blk, row + sb * static_cast<int64_t>(sizeof blk), sizeof blk);
  for (int l = 0; l < kQK8_1; ++l) {
    const int e = static_cast<int>(32 * b + l);
    const int low = (blk.qs[32 * (b / 4) + l] >> (2 * (b % 4))) & 3, high = (blk.hmask[l] >> b) & 1;
    const int q = bug == Bug::kQ3KHighBitInverted ? low - (high ? 4 : 0) : low - (high ? 0 : 4);
    A += q3k_scale(blk, e / 16) * q * a.qs[l];
  }
  return mmvq_unit_q3k(f16_to_f32(blk.d), A);
}

inline float mmvq_row(GgmlType t, const uint8_t* row, const BlockQ8_1* a, int64_t K, Bug bug) {
  const int64_t units = K / kQK8_1 - (bug == Bug::kMmvqLastUnitDropped ? 1 : 0);
  auto step = [&](int64_t g, float acc) {
    const float d8 = f16_to_f32(a[g].d), u = unit_value(t, row, a[g], g, bug);
    return bug == Bug::kLegalMmvqFmaSplit ? add_rn(mul_rn(d8, u), acc) : fma_rn(d8, u, acc);
  };
  float lane[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) {
    float acc = 0.0f;
    if (bug == Bug::kLegalMmvqLanesPermuted) {
      // Bit reversal of the lane index: rotations, mirrors and odd multiples map the butterfly's
      // xor groups (lanes equal mod 2^k) onto each other and would change no bit; this does not.
      int m = 0;
      for (int b = 0; b < 5; ++b) m |= ((l >> b) & 1) << (4 - b);
      int64_t last = m;
      while (last + kWarpSize < units) last += kWarpSize;
      for (int64_t g = last; g >= 0 && g < units; g -= kWarpSize) acc = step(g, acc);
    } else {
      for (int64_t g = l; g < units; g += kWarpSize) acc = step(g, acc);
    }
    lane[l] = acc;
  }
  return butterfly(lane);
}

// mmvq_groups with a bug in the given projection (`down`: the down projection, where the edge-row
// bug lives); without one, the emulation's own mmvq_groups.
inline void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n,
                        const BlockQ8_1* a, float* y, int64_t rows, int64_t K, Bug bug, bool down) {
  const bool decode_bug = bug == Bug::kQ2KMinIsScale || bug == Bug::kQ2KDminIsD ||
                          bug == Bug::kQ3KHighBitInverted || bug == Bug::kMmvqLastUnitDropped ||
                          bug == Bug::kLegalMmvqLanesPermuted || bug == Bug::kLegalMmvqFmaSplit;
  const bool edge_bug = bug == Bug::kMmvqLastRowZero && down;
  if (!decode_bug && !edge_bug) {
    emu::mmvq_groups(t, slots, groups, n, a, y, rows, K);
    return;
  }
  const int64_t rb = row_bytes(t, K), nb = K / kQK8_1;
  for (int64_t gi = 0; gi < n; ++gi) {
    const MmvqGroup& gr = groups[gi];
    for (int i = 0; i < gr.n; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        float& out = y[static_cast<int64_t>(gr.y_row[i]) * rows + r];
        if (edge_bug && r == rows - 1) continue;  // never written: stays as the buffer was (0)
        out = mmvq_row(t, slots[gr.slot] + r * rb, a + static_cast<int64_t>(gr.a_row[i]) * nb, K,
                       bug);
      }
  }
}

// ---- SwiGLU with bugs (docs/numerics.md "swiglu_q8"); L > 0 (every preset's limit)

inline float swiglu(float g, float u, float L, Bug bug) {
  switch (bug) {
    case Bug::kSwigluNoGateClamp: u = std::clamp(u, -L, L); break;
    case Bug::kSwigluUpClampAboveOnly: g = std::min(g, L), u = std::min(u, L); break;
    case Bug::kSwigluGateClampedBelow: g = std::clamp(g, -L, L), u = std::clamp(u, -L, L); break;
    case Bug::kSwigluSigmoidSign:
      return mul_rn(div_rn(std::min(g, L), add_rn(1.0f, pexp(std::min(g, L)))),
                    std::clamp(u, -L, L));
    case Bug::kLegalSiluLibmExp: {
      const float gc = std::min(g, L);
      return mul_rn(div_rn(gc, add_rn(1.0f, std::exp(-gc))), std::clamp(u, -L, L));
    }
    default: return moecheck::swiglu(g, u, L);
  }
  return mul_rn(div_rn(g, add_rn(1.0f, pexp(-g))), u);
}

// ---- routing with bugs (core/routing.h's rule with one step changed)

inline Routing route(const float* logits, int64_t T, const float* bias, const MoeConfig& c,
                     int layer, Bug bug) {
  Routing r = route_from_logits(logits, T, bias, c, layer);
  if (bug != Bug::kRoutingTieToHigherId && bug != Bug::kRoutingWeightsFromKeys &&
      bug != Bug::kRoutingEpsTwice && bug != Bug::kRoutingNoRouteScale)
    return r;
  const int64_t n = c.n_routed, k = c.topk;
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t t = 0; t < T; ++t) {
    const float* s = r.scores.data() + t * n;
    std::vector<float> key(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) key[e] = s[e] + bias[e];
    std::iota(order.begin(), order.end(), 0);
    const bool high = bug == Bug::kRoutingTieToHigherId;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return key[a] > key[b] || (key[a] == key[b] && (high ? a > b : a < b));
    });
    float* w = r.weights.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      r.ids[t * k + j] = order[j];
      w[j] = bug == Bug::kRoutingWeightsFromKeys ? key[order[j]] : s[order[j]];
    }
    if (c.norm_topk_prob && k > 1) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += w[j];
      sum += 1e-20f;
      if (bug == Bug::kRoutingEpsTwice) sum += 1e-20f;
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
    }
    if (bug != Bug::kRoutingNoRouteScale)
      for (int64_t j = 0; j < k; ++j) w[j] *= c.route_scale;
  }
  return r;
}

// ---- router with a bug or a legal reordering

inline void router(RouterVariant v, const LayerWeights& w, const uint16_t* x, int64_t T, float* y,
                   Bug bug) {
  const int64_t E = w.config.n_routed, dim = w.config.dim;
  if (bug == Bug::kRouterSwapsAdjacentInputs) {
    std::vector<uint16_t> xs(x, x + T * dim);
    for (int64_t i = 0; i + 1 < T * dim; i += 2) std::swap(xs[i], xs[i + 1]);
    emu::router_gemv(v, w.router, xs.data(), y, E, dim, T);
    return;
  }
  if (bug != Bug::kLegalRouterPairwise) {
    emu::router_gemv(v, w.router, x, y, E, dim, T);
    return;
  }
  std::vector<float> p(static_cast<size_t>(dim));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t k = 0; k < dim; ++k)
        p[k] = mul_rn(bf16_to_f32(w.router[e * dim + k]), bf16_to_f32(x[t * dim + k]));
      int64_t len = dim;
      while (len > 1) {  // one level of the tree: neighbours added, an odd last one carried
        const int64_t half = len / 2;
        for (int64_t k = 0; k < half; ++k) p[k] = add_rn(p[2 * k], p[2 * k + 1]);
        if (len % 2 != 0) p[half] = p[len - 1];
        len = half + len % 2;
      }
      y[t * E + e] = p[0];
    }
}

// ---- accumulate with bugs or legal changes (docs/numerics.md "accumulate, finish")

inline void accumulate(const LayerPlan& p, int64_t topk, const float* down, const float* shared,
                       float* acc, uint16_t* y, int64_t T, int64_t dim, Bug bug) {
  std::vector<float> wts = p.acc_weights;
  std::vector<int32_t> rows = p.acc_rows;
  if (bug == Bug::kAccWeightOfNextExpert)
    for (int64_t t = 0; t < T; ++t)
      std::rotate(wts.begin() + t * topk, wts.begin() + t * topk + 1, wts.begin() + (t + 1) * topk);
  if (bug == Bug::kLegalAccDescending)
    for (int64_t t = 0; t < T; ++t) {
      std::reverse(wts.begin() + t * topk, wts.begin() + (t + 1) * topk);
      std::reverse(rows.begin() + t * topk, rows.begin() + (t + 1) * topk);
    }
  const float* sh = bug == Bug::kAccSharedDropped ? nullptr : shared;
  if (bug != Bug::kLegalAccMulAdd) {
    emu::accumulate(rows.data(), wts.data(), topk, down, sh, acc, y, T, dim);
  } else {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < dim; ++i) {
        float a = 0.0f;
        for (int64_t k = 0; k < topk; ++k)
          a = add_rn(a, mul_rn(wts[t * topk + k],
                               down[static_cast<int64_t>(rows[t * topk + k]) * dim + i]));
        acc[t * dim + i] = add_rn(a, shared[t * dim + i]);
      }
    emu::finish(acc, y, T * dim);
  }
  if (bug == Bug::kFinishTruncates)
    for (int64_t i = 0; i < T * dim; ++i) y[i] = static_cast<uint16_t>(f32_bits(acc[i]) >> 16);
}

// ---- the layer

inline void shared_expert(const LayerWeights& w, const uint16_t* x,
                          const std::vector<BlockQ8_1>& xq, int64_t T, ExpertTaps& s) {
  const MoeConfig& c = w.config;
  const int64_t inter = c.inter, dim = c.dim;
  s.gate.assign(static_cast<size_t>(T * inter), 0.0f);
  s.up.assign(s.gate.size(), 0.0f);
  s.h.assign(s.gate.size(), 0.0f);
  s.down.assign(static_cast<size_t>(T * dim), 0.0f);
  s.h_q8.clear();
  if (w.shared_gate.type == GgmlType::kBF16) {
    auto bf = [](const MatView& m) { return reinterpret_cast<const uint16_t*>(m.data); };
    emu::bf16_gemv_pair(bf(w.shared_gate), bf(w.shared_up), x, s.gate.data(), s.up.data(), inter,
                        dim, T);
    std::vector<uint16_t> hb(s.h.size());
    emu::swiglu_bf16(s.gate.data(), s.up.data(), s.h.data(), hb.data(), T, inter, c.swiglu_limit);
    emu::bf16_gemv(bf(w.shared_down), hb.data(), s.down.data(), dim, inter, T);
    return;
  }
  s.h_q8.resize(static_cast<size_t>(T * inter / kQK8_1));
  emu::mmvq(w.shared_gate.type, w.shared_gate.data, xq.data(), s.gate.data(), inter, dim, T);
  emu::mmvq(w.shared_up.type, w.shared_up.data, xq.data(), s.up.data(), inter, dim, T);
  emu::swiglu_q8(s.gate.data(), s.up.data(), s.h.data(), s.h_q8.data(), T, inter, c.swiglu_limit);
  emu::mmvq(w.shared_down.type, w.shared_down.data, s.h_q8.data(), s.down.data(), dim, inter, T);
}

// One layer forward of x [T, dim] with `bug` planted, every stage in the returned taps.
inline LayerTaps forward(const LayerWeights& w0, const std::vector<uint16_t>& x, int64_t T,
                         RouterVariant v, Bug bug) {
  LayerWeights w = w0;
  if (bug == Bug::kSharedGateUpSwapped) std::swap(w.shared_gate, w.shared_up);
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, inter = c.inter, E = c.n_routed;
  LayerTaps taps;
  taps.layer = w.layer;
  taps.tokens = T;
  taps.input = x;
  taps.router_logits.resize(static_cast<size_t>(T * E));
  router(v, w, x.data(), T, taps.router_logits.data(), bug);
  const Routing rt = route(taps.router_logits.data(), T, w.bias, c, w.layer, bug);
  taps.topk_ids = rt.ids;
  taps.topk_weights = rt.weights;
  const LayerPlan p = build_layer_plan(rt, E);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  taps.x_q8.resize(static_cast<size_t>(T * dim / kQK8_1));
  q8_rows(xf.data(), taps.x_q8.data(), T, dim, bug == Bug::kHq8Truncates ? Bug::kNone : bug);
  const int64_t P = p.pairs(), n = p.n_proj_groups;
  const std::vector<const uint8_t*> slots =
      plan_slots(p, w.gate_exps.data, w.gate_exps.expert_stride(), w.up_exps.data,
                 w.up_exps.expert_stride(), w.down_exps.data, w.down_exps.expert_stride());
  std::vector<float> gu(static_cast<size_t>(2 * P * inter)), h(static_cast<size_t>(P * inter)),
      down(static_cast<size_t>(P * dim), 0.0f);
  std::vector<BlockQ8_1> hq(static_cast<size_t>(P * inter / kQK8_1));
  mmvq_groups(w.gate_exps.type, slots.data(), p.gate_groups(), n, taps.x_q8.data(), gu.data(),
              inter, dim, bug, false);
  mmvq_groups(w.up_exps.type, slots.data(), p.up_groups(), n, taps.x_q8.data(), gu.data(), inter,
              dim, bug, false);
  for (int64_t i = 0; i < P * inter; ++i)
    h[i] = swiglu(gu[i], gu[P * inter + i], c.swiglu_limit, bug);
  q8_rows(h.data(), hq.data(), P, inter, bug == Bug::kHq8Truncates ? bug : Bug::kNone);
  mmvq_groups(w.down_exps.type, slots.data(), p.down_groups(), n, hq.data(), down.data(), dim,
              inter, bug, true);
  fold_routed_taps(p, gu.data(), h.data(), hq.data(), down.data(), inter, dim, taps.experts);
  fill_shared_taps(taps.shared, T);
  shared_expert(w, x.data(), taps.x_q8, T, taps.shared);
  taps.acc.resize(static_cast<size_t>(T * dim));
  taps.output.resize(taps.acc.size());
  accumulate(p, c.topk, down.data(), taps.shared.down.data(), taps.acc.data(), taps.output.data(),
             T, dim, bug);
  return taps;
}

}  // namespace moecheck::planted
