// Stage-by-stage bounds of the emulation against the reference in Exact mode: every formula of
// docs/numerics.md "Error bounds vs the reference's Exact mode", each stage's bound widened by the
// measured difference of its inputs (propagation), routing flips explained by the logit bound.
// Contract: docs/numerics.md (the formulas), compare/bounds.h (what is checked where).
#include "compare/bounds.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/numfmt.h"
#include "core/kquant.h"
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

// |d A| + |dmin B| of one MMVQ unit (32 weights against one q8_1 block), integers from the
// per-element decoders of emulate/blocks.h.
double unit_float_mag(GgmlType t, const uint8_t* row, const BlockQ8_1& a, int64_t g) {
  const int64_t sb = g / kQ8PerSuperBlock, b = g % kQ8PerSuperBlock;
  int64_t A = 0, B = 0;
  double d = 0, dmin = 0;
  for (int l = 0; l < kQK8_1; ++l) {
    const int e = static_cast<int>(32 * b + l), sub = e / 16;
    if (t == GgmlType::kQ2K) {
      const auto& blk = reinterpret_cast<const BlockQ2K*>(row)[sb];
      A += int64_t{q2k_scale(blk, sub)} * q2k_quant(blk, e) * a.qs[l];
      B += int64_t{q2k_min(blk, sub)} * a.qs[l];
      d = f16_to_f32(blk.d);
      dmin = f16_to_f32(blk.dmin);
    } else {
      const auto& blk = reinterpret_cast<const BlockQ3K*>(row)[sb];
      A += int64_t{q3k_scale(blk, sub)} * q3k_quant(blk, e) * a.qs[l];
      d = f16_to_f32(blk.d);
    }
  }
  return std::fabs(d * static_cast<double>(A)) + std::fabs(dmin * static_cast<double>(B));
}

}  // namespace

MmvqBound mmvq_exact_bound(GgmlType t, const uint8_t* row, const BlockQ8_1* a, const float* x, int64_t K,
                           const double* eblk) {
  std::vector<float> w(static_cast<size_t>(K));
  dequantize_row(t, row, w.data(), K);
  const int64_t units = K / kQK8_1;
  const int64_t depth = (units + kWarpSize - 1) / kWarpSize + 5 + 2;  // D_U + 2
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
  return {exact, (1 + 2 * kU32) * qerr + gamma_f32(depth) * M + (kU32 + gamma_f64(K)) * mag_wx, mag_wx};
}

bool BoundsReport::ok() const {
  if (unexplained_flips > 0) return false;
  for (const StageCheck& s : stages)
    if (s.violations > 0) return false;
  return true;
}

std::string BoundsReport::first_failing() const {
  for (const StageCheck& s : stages) {
    if (s.stage == "topk_weights" && unexplained_flips > 0) return "topk_ids";
    if (s.violations > 0) return s.stage;
  }
  return unexplained_flips > 0 ? "topk_ids" : "";
}

const StageCheck* BoundsReport::stage(const std::string& name) const {
  for (const StageCheck& s : stages)
    if (s.stage == name) return &s;
  return nullptr;
}

namespace {

enum Stage { kLogits, kWeights, kGate, kUp, kH, kDown, kSharedOff = 4, kAcc = 10, kOutput, kNumStages };
const char* const kStageNames[kNumStages] = {"router_logits", "topk_weights", "experts.gate", "experts.up",
                                             "experts.h", "experts.down", "shared.gate", "shared.up",
                                             "shared.h", "shared.down", "acc", "output"};

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Counts one value against its bound; `where` builds the location only for the first violation.
class Checker {
 public:
  explicit Checker(BoundsReport& r) : r_(r) {}
  // counted: false for a second check of a value already counted (output against its own acc).
  template <class Where>
  void see(int s, double emu, double exact, double bound, const Where& where, bool counted = true) {
    StageCheck& st = r_.stages[static_cast<size_t>(s)];
    if (counted) ++st.checked;
    const double diff = std::fabs(emu - exact);
    const double inf = std::numeric_limits<double>::infinity();
    const double ratio = std::isnan(diff) ? inf : bound > 0 ? diff / bound : (diff > 0 ? inf : 0.0);
    st.worst_ratio = std::max(st.worst_ratio, ratio);
    if (diff <= bound) return;
    if (st.violations++ == 0)
      st.first_violation = "layer " + std::to_string(r_.layer) + " " + st.stage + " " + where() + ": emu " + num(emu) +
                           " exact " + num(exact) + ", |diff| " + num(diff) + " > bound " + num(bound);
  }

 private:
  BoundsReport& r_;
};

double score64(ScoreFunc f, double z) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: return std::sqrt(std::log1p(std::exp(z)));
    case ScoreFunc::kSigmoid: return 1.0 / (1.0 + std::exp(-z));
    case ScoreFunc::kSoftmax: break;
  }
  return NAN;
}

// "SwiGLU", propagated: the emulation's h from its own g, u against the reference's h from its
// g, u (taps rounded to f32 from f64: each tap value is within u |tap| of the exact one).
double h_bound(float ge, float ue, float gr, float ur, float hr, float L) {
  auto cg = [&](double g) { return L > 0 && g > L ? static_cast<double>(L) : g; };
  auto cu = [&](double v) { return L > 0 ? std::clamp(v, -static_cast<double>(L), static_cast<double>(L)) : v; };
  const double dg = std::fabs(cg(ge) - cg(gr)) + kU32 * std::fabs(gr);
  const double du = std::fabs(cu(ue) - cu(ur)) + kU32 * std::fabs(ur);
  const double silu_r = std::fabs(cg(gr) / (1.0 + std::exp(-cg(gr))));
  const double prop = 1.1 * dg * std::fabs(cu(ue)) + silu_r * du;
  return gamma_f32(5) * (std::fabs(hr) + prop) + 0x1p-126 * std::fabs(cu(ue)) + 0x1p-149 + prop + kU32 * std::fabs(hr);
}

// Per (token, column) of one expert's down output: |emu - exact| and the magnitude the
// accumulate bound scales (sum |w2 h| plus the propagated input error).
struct ExpertDiff { std::vector<double> down_ref, down_err, down_mag; };

// One expert's stages (routed or shared: `s0` is kGate or kGate + kSharedOff) on the tokens of
// its emulation taps.
void check_expert(const LayerWeights& w, const MatView& w1, const MatView& w3, const MatView& w2, const ExpertTaps& e,
                  const std::vector<BlockQ8_1>& x_q8, const std::vector<float>& xf, int s0, Checker& ck,
                  ExpertDiff& out) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, inter = c.inter, n = static_cast<int64_t>(e.tokens.size());
  std::vector<double> xe(static_cast<size_t>(n * dim));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < dim; ++k) xe[j * dim + k] = xf[e.tokens[j] * dim + k];
  const ref::Expert rx(w1, w3, w2, c.swiglu_limit);
  ExpertTaps rt;
  out.down_ref = rx.forward_exact(xe.data(), n, nullptr, &rt);
  out.down_err.assign(static_cast<size_t>(n * dim), 0.0);
  out.down_mag.assign(static_cast<size_t>(n * dim), 0.0);
  const bool dense = w1.type == GgmlType::kBF16;
  // bf16_gemv depth: the lane's chain over K / 256 chunks of 8 and the butterfly.
  const int64_t dd = 8 * ((dim + 255) / 256) + 5, di = 8 * ((inter + 255) / 256) + 5;
  const std::string who = e.expert >= 0 ? "expert " + std::to_string(e.expert) + " " : "";
  std::vector<float> wrow(static_cast<size_t>(std::max(inter, dim)));
  std::vector<double> mag(static_cast<size_t>(inter)), xd(static_cast<size_t>(inter)), herr(static_cast<size_t>(inter));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t tok = e.tokens[j];
    auto at = [&](const char* what, int64_t i) {
      return [&who, tok, what, i] { return who + "token " + std::to_string(tok) + " " + what + " " + std::to_string(i); };
    };
    const BlockQ8_1* a = x_q8.data() + tok * dim / kQK8_1;
    const float* xt = xf.data() + tok * dim;
    std::vector<double> ex(static_cast<size_t>(dim / kQK8_1)), eh(static_cast<size_t>(inter / kQK8_1));
    for (int64_t g = 0; g < dim / kQK8_1; ++g) ex[g] = q8_block_bound(xt + g * kQK8_1);
    for (int64_t g = 0; g < inter / kQK8_1; ++g) eh[g] = q8_block_bound(e.h.data() + j * inter + g * kQK8_1);
    for (int p = 0; p < 2; ++p) {  // gate, up
      const MatView& m = p == 0 ? w1 : w3;
      const std::vector<float>& ve = p == 0 ? e.gate : e.up;
      const std::vector<float>& vr = p == 0 ? rt.gate : rt.up;
      if (dense) {  // sum |w_k x_k| per row for the dense bound
        for (int64_t i = 0; i < inter; ++i) {
          dequantize_row(m.type, m.row(i), wrow.data(), dim);
          double s = 0;
          for (int64_t k = 0; k < dim; ++k) s += std::fabs(wrow[k] * xe[j * dim + k]);
          mag[i] = s;
        }
      }
      for (int64_t i = 0; i < inter; ++i) {
        const double b = dense ? (gamma_f32(dd) + gamma_f64(dim)) * mag[i]
                               : mmvq_exact_bound(m.type, m.row(i), a, xt, dim, ex.data()).bound;
        ck.see(s0 + p, ve[j * inter + i], vr[j * inter + i], b + kU32 * std::fabs(vr[j * inter + i]), at("row", i));
      }
    }
    for (int64_t i = 0; i < inter; ++i) {
      const int64_t q = j * inter + i;
      ck.see(s0 + 2, e.h[q], rt.h[q], h_bound(e.gate[q], e.up[q], rt.gate[q], rt.up[q], rt.h[q], c.swiglu_limit),
             at("col", i));
      // The down projection's input as the emulation feeds it (bf16 for the dense shared expert).
      const double hin = dense ? static_cast<double>(round_bf16(e.h[q])) : static_cast<double>(e.h[q]);
      herr[i] = std::fabs(hin - rt.h[q]) + kU32 * std::fabs(rt.h[q]);
      xd[i] = hin;
    }
    for (int64_t r = 0; r < dim; ++r) {
      dequantize_row(w2.type, w2.row(r), wrow.data(), inter);
      double prop = 0, m2 = 0;
      for (int64_t k = 0; k < inter; ++k) {
        prop += std::fabs(wrow[k]) * herr[k];
        m2 += std::fabs(wrow[k] * xd[k]);
      }
      double b = prop;
      if (dense) {
        b += (gamma_f32(di) + gamma_f64(inter)) * m2;
      } else {
        b += mmvq_exact_bound(w2.type, w2.row(r), e.h_q8.data() + j * inter / kQK8_1, e.h.data() + j * inter, inter,
                              eh.data()).bound;
      }
      const int64_t q = j * dim + r;
      ck.see(s0 + 3, e.down[q], out.down_ref[q], b, at("row", r));
      out.down_err[q] = std::fabs(e.down[q] - out.down_ref[q]);
      out.down_mag[q] = m2 + prop;
    }
  }
}

void need(bool ok, const LayerTaps& t, const std::string& stage, size_t expected, size_t found) {
  if (!ok)
    throw InputError("bounds check, layer " + std::to_string(t.layer) + ": stage " + stage + ": expected " +
                     std::to_string(expected) + " values, found " + std::to_string(found) +
                     " (the emulation must run with every stage tapped)");
}

// h_q8 exists only where the down projection is a K-quant MMVQ (not for a bf16 shared expert).
void validate_expert(const LayerTaps& t, const ExpertTaps& e, const std::string& name, const MoeConfig& c, bool q8) {
  const size_t n = e.tokens.size();
  for (int32_t tok : e.tokens)
    if (tok < 0 || tok >= t.tokens)
      throw InputError("bounds check, layer " + std::to_string(t.layer) + ": " + name + ": token " +
                       std::to_string(tok) + " out of range [0, " + std::to_string(t.tokens) + ")");
  const size_t ni = n * static_cast<size_t>(c.inter), nd = n * static_cast<size_t>(c.dim);
  need(e.gate.size() == ni, t, name + ".gate", ni, e.gate.size());
  need(e.up.size() == ni, t, name + ".up", ni, e.up.size());
  need(e.h.size() == ni, t, name + ".h", ni, e.h.size());
  if (q8) need(e.h_q8.size() == ni / kQK8_1, t, name + ".h_q8", ni / kQK8_1, e.h_q8.size());
  need(e.down.size() == nd, t, name + ".down", nd, e.down.size());
}

void validate(const LayerWeights& w, const LayerTaps& t) {
  const MoeConfig& c = w.config;
  const auto T = static_cast<size_t>(t.tokens), dim = static_cast<size_t>(c.dim);
  need(t.input.size() == T * dim, t, "input", T * dim, t.input.size());
  need(t.router_logits.size() == T * static_cast<size_t>(c.n_routed), t, "router_logits",
       T * static_cast<size_t>(c.n_routed), t.router_logits.size());
  need(t.topk_ids.size() == T * static_cast<size_t>(c.topk), t, "topk_ids", T * static_cast<size_t>(c.topk),
       t.topk_ids.size());
  need(t.topk_weights.size() == t.topk_ids.size(), t, "topk_weights", t.topk_ids.size(), t.topk_weights.size());
  need(t.x_q8.size() == T * dim / kQK8_1, t, "x_q8", T * dim / kQK8_1, t.x_q8.size());
  need(t.acc.size() == T * dim, t, "acc", T * dim, t.acc.size());
  need(t.output.size() == T * dim, t, "output", T * dim, t.output.size());
  need(t.shared.tokens.size() == T, t, "shared.tokens", T, t.shared.tokens.size());
  validate_expert(t, t.shared, "shared", c, w.shared_down.type != GgmlType::kBF16);
  for (const ExpertTaps& e : t.experts) {
    if (e.expert < 0 || e.expert >= c.n_routed)
      throw InputError("bounds check, layer " + std::to_string(t.layer) + ": expert id " + std::to_string(e.expert) +
                       " out of range [0, " + std::to_string(c.n_routed) + ")");
    validate_expert(t, e, "experts." + std::to_string(e.expert), c, true);
  }
}

}  // namespace

BoundsReport check_emu_against_exact(const LayerWeights& w, const LayerTaps& et, RouterVariant router,
                                     LayerTaps* exact_taps) {
  validate(w, et);
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, E = c.n_routed, K = c.topk, T = et.tokens;
  BoundsReport rep;
  rep.layer = et.layer;
  for (const char* s : kStageNames) rep.stages.push_back(StageCheck{s, 0, 0, 0.0, ""});
  Checker ck(rep);
  const uint16_t* x = et.input.data();
  LayerTaps local;
  LayerTaps& rtaps = exact_taps ? *exact_taps : local;
  const std::vector<double> acc_ref = ref::MoE(w, ref::Precision::kExact).forward_exact(x, T, &rtaps);
  const std::vector<double> z = ref::Gate(w).logits_exact(x, T);
  const ref::ExactRouting rr = ref::route_from_logits_exact(z.data(), T, w.bias, c, w.layer);

  // Router logits.
  const int64_t depth = router == RouterVariant::kPlain ? 8 * ((dim + 255) / 256) + 5 : 8 * ((dim + 2047) / 2048) + 7 + 5;
  std::vector<double> delta(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double mag = 0;
      for (int64_t k = 0; k < dim; ++k)
        mag += std::fabs(static_cast<double>(bf16_to_f32(w.router[e * dim + k])) * bf16_to_f32(x[t * dim + k]));
      delta[t * E + e] = (gamma_f32(depth) + gamma_f64(dim)) * mag;
      ck.see(kLogits, et.router_logits[t * E + e], z[t * E + e], delta[t * E + e],
             [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
    }
  }

  // Routing: pick sets compared; each flipped pair must be explained by the logit bound.
  const double temp = c.gate_temp;
  auto key = [&](int64_t t, int64_t e, double dz) { return score64(c.score_func, (z[t * E + e] + dz) / temp) + w.bias[e]; };
  auto eps = [&](int64_t t, int64_t e) { return 0x1p-19 * (std::fabs(key(t, e, 0)) + std::fabs(w.bias[e])); };
  std::vector<bool> flipped(static_cast<size_t>(T), false);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> se(et.topk_ids.begin() + t * K, et.topk_ids.begin() + (t + 1) * K);
    std::vector<int32_t> sr(rr.ids.begin() + t * K, rr.ids.begin() + (t + 1) * K);
    std::sort(se.begin(), se.end());
    std::sort(sr.begin(), sr.end());
    if (se == sr) continue;
    flipped[t] = true;
    for (int32_t e : se) {
      if (std::binary_search(sr.begin(), sr.end(), e)) continue;
      for (int32_t f : sr) {
        if (std::binary_search(se.begin(), se.end(), f)) continue;
        ++rep.flips;
        const double hi_e = key(t, e, delta[t * E + e]) + eps(t, e), lo_f = key(t, f, -delta[t * E + f]) - eps(t, f);
        const bool explained = c.score_func != ScoreFunc::kSoftmax && hi_e >= lo_f;
        if (!explained) ++rep.unexplained_flips;
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "layer %d token %lld: flip, emulation picks %d (exact key %.17g), reference picks %d (exact key "
                      "%.17g); margin %.3g, explainable up to %.3g: %s",
                      et.layer, static_cast<long long>(t), e, key(t, e, 0), f, key(t, f, 0), key(t, f, 0) - key(t, e, 0),
                      hi_e - lo_f + key(t, f, 0) - key(t, e, 0),
                      explained ? "explained" : c.score_func == ScoreFunc::kSoftmax ? "UNEXPLAINED (softmax)" : "UNEXPLAINED");
        rep.flip_lines.emplace_back(buf);
      }
    }
  }

  // Weights of unflipped tokens: relative score error r = |s(z +- delta) - s(z)| / s + 2^-19,
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
                                std::fabs(score64(c.score_func, (z[t * E + e] - delta[t * E + e]) / temp) - s0)) / s0 +
                       0x1p-19;
      rel[e] = r;
      rmax = std::max(rmax, r);
    }
    for (int64_t k = 0; k < K; ++k) wref[{t, rr.ids[t * K + k]}].first = rr.weights[t * K + k];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = et.topk_ids[t * K + k];
      auto& p = wref[{t, e}];
      p.second = et.topk_weights[t * K + k];
      const bool norm = c.norm_topk_prob && K > 1;
      const double b = std::fabs(p.first) * (rel[e] + (norm ? rmax : 0.0) + static_cast<double>(K + 4) * kU32);
      ck.see(kWeights, p.second, p.first, b, [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
    }
  }

  // Experts (every (expert, token) the emulation computed), then the shared expert.
  std::vector<float> xf(static_cast<size_t>(T * dim));
  for (int64_t i = 0; i < T * dim; ++i) xf[i] = bf16_to_f32(x[i]);
  std::map<std::pair<int64_t, int32_t>, std::pair<const ExpertTaps*, int64_t>> where_of;  // (t, e) -> taps, row
  std::map<int32_t, ExpertDiff> diffs;
  for (const ExpertTaps& e : et.experts) {
    check_expert(w, w.gate_exps.expert(e.expert), w.up_exps.expert(e.expert), w.down_exps.expert(e.expert), e, et.x_q8,
                 xf, kGate, ck, diffs[e.expert]);
    for (size_t j = 0; j < e.tokens.size(); ++j) where_of[{e.tokens[j], e.expert}] = {&e, static_cast<int64_t>(j)};
  }
  ExpertDiff sd;
  check_expert(w, w.shared_gate, w.shared_up, w.shared_down, et.shared, et.x_q8, xf, kGate + kSharedOff, ck, sd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      if (where_of.count({t, et.topk_ids[t * K + k]}) == 0)
        throw InputError("bounds check, layer " + std::to_string(et.layer) + ": token " + std::to_string(t) +
                         " picks expert " + std::to_string(et.topk_ids[t * K + k]) + " but that expert's taps lack the token");

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
      b += gamma_f32(K + 1) * mag + gamma_f64(2 * (c.inter + K + 2)) * mag_ref;
      const double ae = et.acc[t * dim + i], ar = acc_ref[t * dim + i];
      auto wh = [t, i] { return "token " + std::to_string(t) + " col " + std::to_string(i); };
      ck.see(kAcc, ae, ar, b, wh);
      // The output must be the emulation's own acc rounded once to bf16 (finish), then within
      // the acc bound plus two bf16 half-ulps of the reference's.
      const double ye = bf16_to_f32(et.output[t * dim + i]);
      if (et.output[t * dim + i] != f32_to_bf16(et.acc[t * dim + i]))
        ck.see(kOutput, ye, bf16_to_f32(f32_to_bf16(et.acc[t * dim + i])), 0.0,
               [&wh] { return wh() + " (output is not bf16(acc) of the same taps)"; }, false);
      ck.see(kOutput, ye, bf16_to_f32(rtaps.output[t * dim + i]), std::fabs(ae - ar) + 0x1p-8 * (std::fabs(ae) + std::fabs(ar)), wh);
    }
  }
  return rep;
}

}  // namespace moecheck
