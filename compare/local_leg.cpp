// check_local (compare/local_leg.h): each stage from the implementation's own inputs of the
// stage, in f64, within that stage's own rounding. Contract: docs/numerics.md "Stage-local
// legs" (every bound below is derived there).
#include "compare/local_leg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "compare/bounds.h"
#include "compare/bounds_detail.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "core/routing.h"

namespace moecheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Distance of two f16 bit patterns on the ordered integer line.
int64_t ulp_f16(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t u) -> int64_t {
    return (u & 0x8000u) ? -int64_t{u & 0x7FFFu} : int64_t{u};
  };
  return std::llabs(ord(a) - ord(b));
}

// "q8_1 block": the block must be the rule applied to its own 32 inputs, by the model's
// semantics: a NaN or Inf input poisons it; amax / 127 is the f32 scale d (0: all zero); the
// stored d is f16(d); each quant is the nearest integer to x / d (either neighbour when x / d is
// within 2^-23 relative of a half: the contract divides in f32 first), clamped to +-127; the
// stored s is f16(d sum q) to one f16 ulp. Returns 0 when the rule holds, else at least 2 (the
// worst |x / d - q| / 0.5, or inf for a wrong field), and describes the first wrong field in *why.
double q8_block_ratio(const float* x, const BlockQ8_1& b, std::string* why) {
  bool bad = false;
  float amax = 0.0f;
  for (int i = 0; i < kQK8_1; ++i) {
    bad = bad || !std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  bool zero_q = true;
  for (int i = 0; i < kQK8_1; ++i) zero_q = zero_q && b.qs[i] == 0;
  if (bad || amax / 127.0f == 0.0f) {
    const uint16_t want = bad ? 0x7E00 : 0;
    if (b.d == want && b.s == want && zero_q) return 0.0;
    *why = bad ? "a block with NaN or Inf input must be d = s = f16 NaN, quants 0"
               : "an all-zero (or underflowing) block must be all zero";
    return kInf;
  }
  const float d = amax / 127.0f;  // IEEE f32 division, correctly rounded
  if (b.d != f32_to_f16(d)) {
    char buf[120];
    std::snprintf(buf, sizeof buf, "stored d 0x%04x, expected f16(amax / 127 = %.9g) = 0x%04x", b.d,
                  static_cast<double>(d), f32_to_f16(d));
    *why = buf;
    return kInf;
  }
  double worst = 0;
  int64_t sum = 0;
  for (int i = 0; i < kQK8_1; ++i) {
    const double r = static_cast<double>(x[i]) / static_cast<double>(d);
    const double lo = std::floor(r);
    const bool near_half = std::fabs(r - lo - 0.5) <= 0x1p-23 * std::fabs(r);
    const double want = std::clamp(std::nearbyint(r), -127.0, 127.0);
    const int q = b.qs[i];
    sum += q;
    const bool ok = q == want || (near_half && (q == lo || q == lo + 1));
    if (ok) continue;  // the rule holds: nothing to measure (the quant is the rule's integer)
    worst = std::max(worst, std::max(2.0, std::fabs(r - q) / 0.5));
    if (why->empty()) {
      char buf[120];
      std::snprintf(buf, sizeof buf, "quant %d is %d, x / d = %.9g rounds to %d", i, q, r,
                    static_cast<int>(want));
      *why = buf;
    }
  }
  const uint16_t s_want =
      f32_to_f16(static_cast<float>(static_cast<double>(d) * static_cast<double>(sum)));
  if (ulp_f16(b.s, s_want) > 1) {
    if (why->empty()) *why = "stored s is not f16(d sum q)";
    worst = kInf;
  }
  return worst;
}

// model.py's SwiGLU in f64 on f32 inputs: clamps (L > 0; a NaN passes), silu(g) u.
double swiglu64(double g, double u, double L) {
  if (L > 0) {
    g = g > L ? L : g;
    u = u > L ? L : (u < -L ? -L : u);
  }
  return g / (1.0 + std::exp(-g)) * u;
}

class LocalCheck {
 public:
  LocalCheck(const LayerWeights& w, const LayerTaps& t, RouterVariant router, LegReport& rep)
      : w_(w),
        c_(w.config),
        t_(t),
        router_(router),
        ck_(rep),
        rb_{w.bias, w.bias_vl, t.image_mask.empty() ? nullptr : t.image_mask.data()},
        T_(t.tokens) {}

  void run() {
    xf_.resize(t_.input.size());
    for (size_t i = 0; i < xf_.size(); ++i) xf_[i] = bf16_to_f32(t_.input[i]);
    logits();
    routing();
    q8(Stage::kXQ8, xf_.data(), t_.x_q8.data(), T_ * c_.dim / kQK8_1,
       [](int64_t) { return std::string(); });
    for (const ExpertTaps& e : t_.experts)
      expert(e, w_.gate_exps.expert(e.expert), w_.up_exps.expert(e.expert),
             w_.down_exps.expert(e.expert), false);
    expert(t_.shared, w_.shared_gate, w_.shared_up, w_.shared_down, true);
    acc_output();
  }

 private:
  // "Router logits": the exact dot products of the router rows with x; the chain depth of the
  // variant's schedule.
  void logits() {
    const int64_t dim = c_.dim, E = c_.n_routed;
    const int64_t depth = router_ == RouterVariant::kPlain ? 8 * ((dim + 255) / 256) + 5
                                                           : 8 * ((dim + 2047) / 2048) + 7 + 5;
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < dim; ++k) {
          const double p = static_cast<double>(router_weight(w_, e * dim + k)) * xf_[t * dim + k];
          exact += p;
          mag += std::fabs(p);
        }
        ck_.see(Stage::kRouterLogits, t_.router_logits[t * E + e], exact,
                (gamma_f32(depth) + gamma_f64(dim)) * mag,
                [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
      }
  }

  // The key of expert e for token t with the token's own bias (bias_vl in image spans).
  double key(int64_t t, int64_t e) const { return band_[t].s[e] + rb_.of(t)[e]; }

  // "Routing": the picks are the top-k of the keys of the implementation's own logits (ties to
  // the lower id); a pair differing from it is explained only by keys within their evaluation
  // error (the score band with no logit error), and never when both experts had the same logit
  // and bias (equal inputs give equal f32 keys, so the lower id must win). The weights are the own
  // picks' scores, renormalised (+1e-20) and scaled, within bounds_detail::weight_bound.
  void routing() {
    const int64_t E = c_.n_routed, K = c_.topk;
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::vector<double> z(static_cast<size_t>(E));
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t e = 0; e < E; ++e) z[e] = t_.router_logits[t * E + e];
      band_.push_back(bounds_detail::score_band(c_, z.data(), nullptr));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return key(t, a) > key(t, b); });
      std::vector<int32_t> want(order.begin(), order.begin() + K),
          got(t_.topk_ids.begin() + t * K, t_.topk_ids.begin() + (t + 1) * K);
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      for (int32_t e : got)
        if (!std::binary_search(want.begin(), want.end(), e))
          for (int32_t f : want)
            if (!std::binary_search(got.begin(), got.end(), f)) flip(t, e, f);
      weights(t);
    }
  }

  void flip(int64_t t, int32_t e, int32_t f) {
    LegReport& rep = ck_.report();
    ++rep.flips;
    const int64_t E = c_.n_routed;
    const bounds_detail::ScoreBand& b = band_[t];
    const float* bias = rb_.of(t);
    const bool same_inputs =
        t_.router_logits[t * E + e] == t_.router_logits[t * E + f] && bias[e] == bias[f];
    const bool explained =
        !same_inputs &&
        bounds_detail::key_flip_explained(b.s[e], b.err[e], bias[e], b.s[f], b.err[f], bias[f]);
    if (!explained) ++rep.unexplained_flips;
    char buf[300];
    std::snprintf(buf, sizeof buf,
                  "layer %d token %lld: picks %d (key %.17g) over %d (key %.17g) of its own "
                  "logits; margin %.3g, evaluation error up to %.3g + %.3g: %s",
                  t_.layer, static_cast<long long>(t), e, key(t, e), f, key(t, f),
                  key(t, f) - key(t, e), b.err[e], b.err[f],
                  explained     ? "explained"
                  : same_inputs ? "UNEXPLAINED (equal logit and bias: the lower id must win)"
                                : "UNEXPLAINED");
    rep.flip_lines.emplace_back(buf);
  }

  void weights(int64_t t) {
    const int64_t K = c_.topk;
    const bounds_detail::ScoreBand& b = band_[t];
    double sum = 0, err_sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = t_.topk_ids[t * K + k];
      sum += b.s[e];
      err_sum += b.err[e];
    }
    const bool norm = c_.norm_topk_prob && K > 1;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = t_.topk_ids[t * K + k];
      const double want =
          (norm ? b.s[e] / (sum + 1e-20) : b.s[e]) * static_cast<double>(c_.route_scale);
      ck_.see(Stage::kTopkWeights, t_.topk_weights[t * K + k], want,
              bounds_detail::weight_bound(c_, b.s[e], b.err[e], sum, err_sum),
              [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
    }
  }

  // Blocks [0, n) of q8_1 quantisation of x (32 values a block).
  template <class Who>
  void q8(Stage s, const float* x, const BlockQ8_1* b, int64_t n, const Who& who) {
    StageCheck& st = ck_.find(s);
    for (int64_t g = 0; g < n; ++g) {
      std::string why;
      const double r = q8_block_ratio(x + g * kQK8_1, b[g], &why);
      ++st.checked;
      st.worst_ratio = std::max(st.worst_ratio, r);
      if (r <= 1.0) continue;
      if (st.violations++ == 0)
        st.first_violation = "layer " + std::to_string(t_.layer) + " " + stage_name(s) + " " +
                             who(g) + "block " + std::to_string(g) + ": " + why;
    }
  }

  // gate / up / down of one expert on its own token rows.
  void expert(const ExpertTaps& e, const MatView& w1, const MatView& w3, const MatView& w2,
              bool shared) {
    const int64_t dim = c_.dim, inter = c_.inter, n = static_cast<int64_t>(e.tokens.size());
    const bool dense = w1.type == GgmlType::kBF16;
    const std::string who = shared ? std::string() : "expert " + std::to_string(e.expert) + " ";
    const double L = shared ? c_.shared_swiglu_limit() : c_.swiglu_limit;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t tok = e.tokens[j];
      auto at = [&who, tok](const char* what, int64_t i) {
        return [&who, tok, what, i] {
          return who + "token " + std::to_string(tok) + " " + what + " " + std::to_string(i);
        };
      };
      const BlockQ8_1* xq = t_.x_q8.data() + tok * dim / kQK8_1;
      projection(expert_stage(shared, ExpertField::kGate), w1, dense, xq, xf_.data() + tok * dim,
                 nullptr, e.gate.data() + j * inter, at);
      projection(expert_stage(shared, ExpertField::kUp), w3, dense, xq, xf_.data() + tok * dim,
                 nullptr, e.up.data() + j * inter, at);
      for (int64_t i = 0; i < inter; ++i) {
        const double g = e.gate[j * inter + i], u = e.up[j * inter + i];
        const double h = swiglu64(g, u, L), uc = L > 0 ? std::clamp(u, -L, L) : u;
        ck_.see(expert_stage(shared, ExpertField::kH), e.h[j * inter + i], h,
                bounds_detail::swiglu_own_bound(h, uc), at("col", i));
      }
      const float* h = e.h.data() + j * inter;
      const BlockQ8_1* hq = e.h_q8.empty() ? nullptr : e.h_q8.data() + j * inter / kQK8_1;
      if (hq != nullptr)
        q8(expert_stage(shared, ExpertField::kHQ8), h, hq, inter / kQK8_1,
           [&who, tok](int64_t) { return who + "token " + std::to_string(tok) + " "; });
      projection(expert_stage(shared, ExpertField::kDown), w2, dense, hq, nullptr, h,
                 e.down.data() + j * dim, at);
    }
  }

  // One projection's rows on one token: "MMVQ" on the implementation's own q8_1 blocks, or the
  // bf16 GEMV on its bf16 input (x, or bf16(h) for the dense down projection).
  template <class At>
  void projection(Stage s, const MatView& m, bool dense, const BlockQ8_1* aq, const float* xin,
                  const float* h, const float* got, const At& at) {
    const int64_t K = m.cols;
    std::vector<double> xb;
    if (dense) {
      xb.resize(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) xb[k] = h != nullptr ? round_bf16(h[k]) : xin[k];
    }
    std::vector<float> wrow(static_cast<size_t>(K));
    const int64_t depth = 8 * ((K + 255) / 256) + 5;
    for (int64_t r = 0; r < m.rows; ++r) {
      if (!dense) {
        const MmvqLocal l = mmvq_local(m.type, m.row(r), aq, K);
        ck_.see(s, got[r], l.exact, l.bound, at("row", r));
        continue;
      }
      dequantize_row(m.type, m.row(r), wrow.data(), K);
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += wrow[k] * xb[k];
        mag += std::fabs(wrow[k] * xb[k]);
      }
      ck_.see(s, got[r], exact, (gamma_f32(depth) + gamma_f64(K)) * mag, at("row", r));
    }
  }

  // "Accumulate" from the implementation's own down rows, routing weights and shared output;
  // the output is bf16 of its own acc.
  void acc_output() {
    const int64_t dim = c_.dim, K = c_.topk;
    std::map<std::pair<int64_t, int32_t>, const float*> down_of;  // (token, expert) -> its down row
    for (const ExpertTaps& e : t_.experts)
      for (size_t j = 0; j < e.tokens.size(); ++j)
        down_of[{e.tokens[j], e.expert}] = e.down.data() + j * dim;
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        const double s = t_.shared.down[t * dim + i];
        double exact = s, mag = std::fabs(s);
        for (int64_t k = 0; k < K; ++k) {
          const auto it = down_of.find({t, t_.topk_ids[t * K + k]});
          const double p = static_cast<double>(t_.topk_weights[t * K + k]) *
                           (it != down_of.end() ? it->second[i] : NAN);
          exact += p;
          mag += std::fabs(p);
        }
        auto wh = [t, i] { return "token " + std::to_string(t) + " col " + std::to_string(i); };
        ck_.see(Stage::kAcc, t_.acc[t * dim + i], exact,
                gamma_f32(K + 1) * mag + gamma_f64(K + 1) * mag, wh);
        ck_.see(Stage::kOutput, bf16_to_f32(t_.output[t * dim + i]),
                bf16_to_f32(f32_to_bf16(t_.acc[t * dim + i])), 0.0, wh);
      }
    }
  }

  const LayerWeights& w_;
  const MoeConfig& c_;
  const LayerTaps& t_;
  RouterVariant router_;
  Checker ck_;
  const RouteBias rb_;  // the taps' tokens' selection biases (their image mask)
  int64_t T_;
  std::vector<float> xf_;
  std::vector<bounds_detail::ScoreBand> band_;  // per token, from its own logits
};

}  // namespace

LegReport check_local(const LayerWeights& w, const LayerTaps& t, RouterVariant router) {
  bounds_detail::validate_taps(w, t);
  LegReport rep;
  rep.layer = t.layer;
  Checker ck(rep);
  for (Stage s : all_stages())
    if (s != Stage::kInput && s != Stage::kTopkIds && s != Stage::kExpertsWeights &&
        s != Stage::kSharedWeights &&
        !(s == Stage::kSharedHQ8 && w.shared_down.type == GgmlType::kBF16))
      ck.add_stage(s, CheckKind::kLocal);
  LocalCheck(w, t, router, rep).run();
  return rep;
}

}  // namespace moecheck
