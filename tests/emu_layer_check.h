// Stage-by-stage comparison of the emulation's layer forward with the reference in Exact mode
// (moecheck::ref, f64), each stage within the bound of docs/numerics.md "Error bounds vs the
// reference's Exact mode" given the measured difference of its inputs. Routing flips (different
// pick sets) are printed and must be explained by the logit bound; flipped tokens are left out of
// the weights, acc and output checks (their sums are different sums).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "emulate/moe_layer.h"
#include "emulate/quantize.h"
#include "reference/moe.h"
#include "tests/emu_test_util.h"

namespace moecheck::emutest {

inline double score64(ScoreFunc f, double z) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: return std::sqrt(std::log1p(std::exp(z)));
    case ScoreFunc::kSigmoid: return 1.0 / (1.0 + std::exp(-z));
    case ScoreFunc::kSoftmax: break;
  }
  return NAN;
}

// |row . x| magnitudes and values in f64 for a dequantised [rows, K] view (any type).
inline void dot_rows(const MatView& m, const double* x, double* val, double* mag, double* wabs_x_err,
                     const double* xerr) {
  std::vector<float> w(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    dequantize_row(m.type, m.row(r), w.data(), m.cols);
    double v = 0, a = 0, e = 0;
    for (int64_t k = 0; k < m.cols; ++k) {
      v += w[k] * x[k];
      a += std::fabs(w[k] * x[k]);
      if (xerr) e += std::fabs(w[k]) * xerr[k];
    }
    if (val) val[r] = v;
    if (mag) mag[r] = a;
    if (wabs_x_err) wabs_x_err[r] = e;
  }
}

struct StageStats {
  double worst_ratio = 0;  // max |emu - ref| / bound over the stage
  void see(double diff, double bound) { worst_ratio = std::max(worst_ratio, bound > 0 ? diff / bound : (diff > 0 ? 1e300 : 0)); }
};

// Checks one projection output: emu y (f32) vs ref (f64 or f32-rounded tap) within `bound`.
#define MOECHECK_STAGE_EXPECT(stats, stage, emu_v, ref_v, bound, where)                              \
  do {                                                                                               \
    const double diff_ = std::fabs(static_cast<double>(emu_v) - static_cast<double>(ref_v));        \
    (stats).see(diff_, (bound));                                                                     \
    ASSERT_LE(diff_, (bound)) << (stage) << " " << (where) << ": emu " << (emu_v) << " ref " << (ref_v); \
  } while (0)

// h bound of docs/numerics.md "SwiGLU", propagated: the emulation's h from its own g, u against
// the reference's h from its g, u (taps rounded to f32 from f64: each tap value is within
// u |tap| of the exact one).
inline double h_bound(float ge, float ue, float gr, float ur, float hr, float L) {
  auto cg = [&](double g) { return L > 0 && g > L ? static_cast<double>(L) : g; };
  auto cu = [&](double v) { return L > 0 ? std::clamp(v, -static_cast<double>(L), static_cast<double>(L)) : v; };
  const double dg = std::fabs(cg(ge) - cg(gr)) + kU * std::fabs(gr);
  const double du = std::fabs(cu(ue) - cu(ur)) + kU * std::fabs(ur);
  const double silu_r = std::fabs(cg(gr) / (1.0 + std::exp(-cg(gr))));
  const double prop = 1.1 * dg * std::fabs(cu(ue)) + silu_r * du;
  return gamma(5) * (std::fabs(hr) + prop) + 0x1p-126 * std::fabs(cu(ue)) + 0x1p-149 + prop + kU * std::fabs(hr);
}

// One expert's stages (routed or shared) on the tokens of its emulation taps.
struct ExpertDiff { std::vector<double> down_ref, down_err, down_mag; };

inline void check_expert(const LayerWeights& w, const MatView& w1, const MatView& w3, const MatView& w2,
                         const ExpertTaps& e, const std::vector<BlockQ8_1>& x_q8, const std::vector<float>& xf,
                         const std::string& where, std::map<std::string, StageStats>& st, ExpertDiff& out) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, inter = c.inter, n = static_cast<int64_t>(e.tokens.size());
  std::vector<double> xe(static_cast<size_t>(n * dim));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < dim; ++k) xe[j * dim + k] = xf[e.tokens[j] * dim + k];
  ref::Expert rx(w1, w3, w2, c.swiglu_limit);
  ExpertTaps rt;
  out.down_ref = rx.forward_exact(xe.data(), n, nullptr, &rt);
  out.down_err.assign(static_cast<size_t>(n * dim), 0.0);
  out.down_mag.assign(static_cast<size_t>(n * dim), 0.0);
  const bool dense = w1.type == GgmlType::kBF16;
  const int64_t dd = 8 * ((dim + 255) / 256) + 5, di = 8 * ((inter + 255) / 256) + 5;
  std::vector<double> mag(static_cast<size_t>(std::max(inter, dim))), werr(mag.size()), xd(static_cast<size_t>(std::max(inter, dim)));
  for (int64_t j = 0; j < n; ++j) {
    const std::string wj = where + " token " + std::to_string(e.tokens[j]);
    const BlockQ8_1* a = x_q8.data() + e.tokens[j] * dim / kQK8_1;
    const float* xt = xf.data() + e.tokens[j] * dim;
    std::vector<double> ex(static_cast<size_t>(dim / kQK8_1)), eh(static_cast<size_t>(inter / kQK8_1));
    for (int64_t g = 0; g < dim / kQK8_1; ++g) ex[g] = q8_block_bound(xt + g * kQK8_1);
    for (int64_t g = 0; g < inter / kQK8_1; ++g) eh[g] = q8_block_bound(e.h.data() + j * inter + g * kQK8_1);
    for (int p = 0; p < 2; ++p) {  // gate, up
      const MatView& m = p == 0 ? w1 : w3;
      const std::vector<float>& ve = p == 0 ? e.gate : e.up;
      const std::vector<float>& vr = p == 0 ? rt.gate : rt.up;
      if (dense) dot_rows(m, xe.data() + j * dim, nullptr, mag.data(), nullptr, nullptr);
      for (int64_t i = 0; i < inter; ++i) {
        const double b = dense ? (gamma(dd) + gamma64(dim)) * mag[i]
                               : mmvq_exact_bound(m.type, m.row(i), a, xt, dim, ex.data()).bound;
        MOECHECK_STAGE_EXPECT(st[p == 0 ? "gate" : "up"], p == 0 ? "gate" : "up", ve[j * inter + i],
                              vr[j * inter + i], b + kU * std::fabs(vr[j * inter + i]), wj + " row " + std::to_string(i));
      }
    }
    std::vector<double> herr(static_cast<size_t>(inter));
    for (int64_t i = 0; i < inter; ++i) {
      const int64_t q = j * inter + i;
      MOECHECK_STAGE_EXPECT(st["h"], "h", e.h[q], rt.h[q],
                            h_bound(e.gate[q], e.up[q], rt.gate[q], rt.up[q], rt.h[q], c.swiglu_limit),
                            wj + " col " + std::to_string(i));
      // The down projection's input as the emulation feeds it (bf16 for the dense shared expert).
      const double hin = dense ? static_cast<double>(round_bf16(e.h[q])) : static_cast<double>(e.h[q]);
      herr[i] = std::fabs(hin - rt.h[q]) + kU * std::fabs(rt.h[q]);
      xd[i] = hin;
    }
    std::vector<float> wrow(static_cast<size_t>(inter));
    for (int64_t r = 0; r < dim; ++r) {
      dequantize_row(w2.type, w2.row(r), wrow.data(), inter);
      double prop = 0, m2 = 0;
      for (int64_t k = 0; k < inter; ++k) {
        prop += std::fabs(wrow[k]) * herr[k];
        m2 += std::fabs(wrow[k] * xd[k]);
      }
      double b = prop;
      if (dense) {
        b += (gamma(di) + gamma64(inter)) * m2;
      } else {
        const Bounded bb = mmvq_exact_bound(w2.type, w2.row(r), e.h_q8.data() + j * inter / kQK8_1,
                                            e.h.data() + j * inter, inter, eh.data());
        b += bb.bound;
      }
      const int64_t q = j * dim + r;
      MOECHECK_STAGE_EXPECT(st["down"], "down", e.down[q], out.down_ref[q], b, wj + " row " + std::to_string(r));
      out.down_err[q] = std::fabs(e.down[q] - out.down_ref[q]);
      out.down_mag[q] = m2 + prop;
    }
  }
}

// Runs the emulation and the reference (Exact) on x [T, dim] and checks every stage; prints the
// routing flips and each stage's worst |emu - ref| / bound. `cfg` names the configuration.
inline void check_against_reference(const LayerWeights& w, const std::vector<uint16_t>& x, int64_t T,
                                    const emu::LayerOptions& lo, const std::string& cfg,
                                    int* flips_out = nullptr) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, E = c.n_routed, K = c.topk;
  const emu::MoeLayer layer(w, lo);
  LayerTaps et;
  const std::vector<uint16_t> y = layer.forward(x.data(), T, &et);
  const ref::MoE rmoe(w, ref::Precision::kExact);
  LayerTaps rtaps;
  const std::vector<double> acc_ref = rmoe.forward_exact(x.data(), T, &rtaps);
  const std::vector<double> z = ref::Gate(w).logits_exact(x.data(), T);
  const ref::ExactRouting rr = ref::route_from_logits_exact(z.data(), T, w.bias, c, w.layer);
  std::map<std::string, StageStats> st;

  // Router logits.
  const int64_t depth = lo.router == RouterVariant::kPlain ? 8 * ((dim + 255) / 256) + 5
                                                           : 8 * ((dim + 2047) / 2048) + 7 + 5;
  std::vector<double> delta(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double mag = 0;
      for (int64_t k = 0; k < dim; ++k)
        mag += std::fabs(static_cast<double>(bf16_to_f32(w.router[e * dim + k])) * bf16_to_f32(x[t * dim + k]));
      delta[t * E + e] = (gamma(depth) + gamma64(dim)) * mag;
      MOECHECK_STAGE_EXPECT(st["logits"], "logits", et.router_logits[t * E + e], z[t * E + e], delta[t * E + e],
                            cfg + " token " + std::to_string(t) + " expert " + std::to_string(e));
    }
  }

  // Routing: sets compared; a flip must be explained by the logit bound.
  const double temp = c.gate_temp;
  auto key = [&](int64_t t, int64_t e, double dz) { return score64(c.score_func, (z[t * E + e] + dz) / temp) + w.bias[e]; };
  auto eps = [&](int64_t t, int64_t e) { return 0x1p-19 * (std::fabs(key(t, e, 0)) + std::fabs(w.bias[e])); };
  std::vector<bool> flipped(static_cast<size_t>(T), false);
  int flips = 0;
  if (flips_out) *flips_out = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> se(et.topk_ids.begin() + t * K, et.topk_ids.begin() + (t + 1) * K);
    std::vector<int32_t> sr(rr.ids.begin() + t * K, rr.ids.begin() + (t + 1) * K);
    std::sort(se.begin(), se.end());
    std::sort(sr.begin(), sr.end());
    if (se == sr) continue;
    flipped[t] = true;
    ASSERT_NE(c.score_func, ScoreFunc::kSoftmax) << cfg << " token " << t << ": routing flip under softmax";
    for (int32_t e : se) {
      if (std::binary_search(sr.begin(), sr.end(), e)) continue;
      for (int32_t f : sr) {
        if (std::binary_search(se.begin(), se.end(), f)) continue;
        ++flips;
        const double hi_e = key(t, e, delta[t * E + e]) + eps(t, e), lo_f = key(t, f, -delta[t * E + f]) - eps(t, f);
        std::printf("%s token %lld: flip, emulation picks %d (exact key %.17g), reference picks %d (exact key %.17g); "
                    "margin %.3g, explainable up to %.3g\n", cfg.c_str(), static_cast<long long>(t), e, key(t, e, 0), f,
                    key(t, f, 0), key(t, f, 0) - key(t, e, 0), hi_e - lo_f + key(t, f, 0) - key(t, e, 0));
        ASSERT_GE(hi_e, lo_f) << cfg << " token " << t << ": unexplained routing flip " << e << " <-> " << f;
        if (flips_out) *flips_out = flips;
      }
    }
  }

  // Weights of unflipped tokens: relative score error r = |s(z +- delta) - s(z)| / s + 16 ulp,
  // normalised weight error <= w (r_e + r_max + (topk + 4) u).
  std::map<std::pair<int64_t, int32_t>, std::pair<double, double>> wref;  // (t, e) -> (w_ref, w_emu)
  for (int64_t t = 0; t < T; ++t) {
    if (flipped[t]) continue;
    double rmax = 0;
    std::map<int32_t, double> rel;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = rr.ids[t * K + k];
      const double s0 = score64(c.score_func, z[t * E + e] / temp);
      const double r = std::max(std::fabs(score64(c.score_func, (z[t * E + e] + delta[t * E + e]) / temp) - s0),
                                std::fabs(score64(c.score_func, (z[t * E + e] - delta[t * E + e]) / temp) - s0)) / s0 + 0x1p-19;
      rel[e] = r;
      rmax = std::max(rmax, r);
    }
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = rr.ids[t * K + k];
      wref[{t, e}].first = rr.weights[t * K + k];
    }
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = et.topk_ids[t * K + k];
      auto& p = wref[{t, e}];
      p.second = et.topk_weights[t * K + k];
      const bool norm = c.norm_topk_prob && K > 1;
      const double b = std::fabs(p.first) * (rel[e] + (norm ? rmax : 0.0) + static_cast<double>(K + 4) * kU);
      MOECHECK_STAGE_EXPECT(st["weights"], "weights", p.second, p.first, b, cfg + " token " + std::to_string(t) + " expert " + std::to_string(e));
    }
  }

  // Experts (every (expert, token) the emulation computed), then the shared expert.
  std::vector<float> xf(static_cast<size_t>(T * dim));
  for (int64_t i = 0; i < T * dim; ++i) xf[i] = bf16_to_f32(x[i]);
  std::map<std::pair<int64_t, int32_t>, std::pair<const ExpertTaps*, int64_t>> where_of;  // (t, e) -> taps, row
  std::map<int32_t, ExpertDiff> diffs;
  for (const ExpertTaps& e : et.experts) {
    check_expert(w, w.gate_exps.expert(e.expert), w.up_exps.expert(e.expert), w.down_exps.expert(e.expert), e,
                 et.x_q8, xf, cfg + " expert " + std::to_string(e.expert), st, diffs[e.expert]);
    if (::testing::Test::HasFatalFailure()) return;
    for (size_t j = 0; j < e.tokens.size(); ++j) where_of[{e.tokens[j], e.expert}] = {&e, static_cast<int64_t>(j)};
  }
  ExpertDiff sd;
  check_expert(w, w.shared_gate, w.shared_up, w.shared_down, et.shared, et.x_q8, xf, cfg + " shared", st, sd);
  if (::testing::Test::HasFatalFailure()) return;

  // acc and output of unflipped tokens.
  for (int64_t t = 0; t < T; ++t) {
    if (flipped[t]) continue;
    for (int64_t i = 0; i < dim; ++i) {
      const double s_e = et.shared.down[t * dim + i];
      double b = sd.down_err[t * dim + i], mag = std::fabs(s_e), mag_ref = sd.down_mag[t * dim + i];
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = et.topk_ids[t * K + k];
        const auto [tap, j] = where_of.at({t, e});
        const auto [wr, we] = wref.at({t, e});
        const ExpertDiff& d = diffs.at(e);
        const double de = tap->down[j * dim + i];
        b += std::fabs(we - wr) * std::fabs(de) + std::fabs(wr) * d.down_err[j * dim + i];
        mag += std::fabs(we * de);
        mag_ref += std::fabs(wr) * d.down_mag[j * dim + i];
      }
      b += gamma(K + 1) * mag + gamma64(2 * (c.inter + K + 2)) * mag_ref;
      const double ae = et.acc[t * dim + i], ar = acc_ref[t * dim + i];
      const std::string wh = cfg + " token " + std::to_string(t) + " col " + std::to_string(i);
      MOECHECK_STAGE_EXPECT(st["acc"], "acc", ae, ar, b, wh);
      ASSERT_EQ(y[t * dim + i], f32_to_bf16(et.acc[t * dim + i])) << wh;
      MOECHECK_STAGE_EXPECT(st["output"], "output", bf16_to_f32(y[t * dim + i]), bf16_to_f32(rtaps.output[t * dim + i]),
                            std::fabs(ae - ar) + 0x1p-8 * (std::fabs(ae) + std::fabs(ar)), wh);
    }
  }
  std::printf("%s: %d routing flip(s); worst |emu - ref| / bound per stage:", cfg.c_str(), flips);
  for (const auto& [name, s] : st) std::printf(" %s %.3g", name.c_str(), s.worst_ratio);
  std::printf("\n");
}

}  // namespace moecheck::emutest
