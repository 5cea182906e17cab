// check_emu_against_exact (compare/bounds.h) as named steps: validate the taps, run the Exact
// reference, then router logits, routing flips, routing weights, every expert, acc and output,
// each within the bound of docs/numerics.md "Error bounds vs the reference's Exact mode".
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "compare/bounds_detail.h"
#include "compare/stat_noise.h"
#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "reference/moe.h"

namespace moecheck {
namespace {

using bounds_detail::ExpertDiff;

// The stages this check judges, in pipeline order, and the kind of each check: h, acc and output
// bounds are the measured input differences propagated plus the stage's own rounding.
constexpr std::pair<Stage, CheckKind> kJudged[] = {
    {Stage::kRouterLogits, CheckKind::kAccumulated}, {Stage::kTopkWeights, CheckKind::kAccumulated},
    {Stage::kExpertsGate, CheckKind::kAccumulated},  {Stage::kExpertsUp, CheckKind::kAccumulated},
    {Stage::kExpertsH, CheckKind::kConsistency},     {Stage::kExpertsDown, CheckKind::kAccumulated},
    {Stage::kSharedGate, CheckKind::kAccumulated},   {Stage::kSharedUp, CheckKind::kAccumulated},
    {Stage::kSharedH, CheckKind::kConsistency},      {Stage::kSharedDown, CheckKind::kAccumulated},
    {Stage::kAcc, CheckKind::kConsistency},          {Stage::kOutput, CheckKind::kConsistency}};

// Runs f(0) .. f(n - 1) on up to the host's core count of threads; the first exception (in task
// order) is rethrown after every task finished.
void run_tasks(size_t n, const std::function<void(size_t)>& f) {
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t threads = std::min({n, hw, size_t{16}});
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        f(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

class LayerCheck {
 public:
  LayerCheck(const LayerWeights& w, const LayerTaps& et, RouterVariant router, LayerTaps& rtaps,
             LegReport& rep, Checker* stat)
      : w_(w),
        c_(w.config),
        et_(et),
        router_(router),
        rtaps_(rtaps),
        rep_(rep),
        ck_(rep),
        stat_(stat),
        rb_{w.bias, w.bias_vl, et.image_mask.empty() ? nullptr : et.image_mask.data()},
        T_(et.tokens),
        E_(c_.n_routed),
        K_(c_.topk),
        dim_(c_.dim) {}

  void run() {
    const uint16_t* x = et_.input.data();
    // The reference routes with the implementation's image mask (the same inputs).
    acc_ref_ = ref::MoE(w_, ref::Precision::kExact).forward_exact(x, T_, &rtaps_, rb_.image_mask);
    z_ = ref::Gate(w_).logits_exact(x, T_);
    rr_ = ref::route_from_logits_exact(z_.data(), T_, rb_, c_, w_.layer);
    logits();
    routing();
    weights();
    experts();
    acc_output();
  }

 private:
  // The exact key of expert e for token t, with the token's own bias (bias_vl in image spans).
  double key(int64_t t, int64_t e) const { return band_[t].s[e] + rb_.of(t)[e]; }

  // "Router GEMV": per logit, the chain depth of the variant's schedule times sum |w x|.
  void logits() {
    const int64_t dim = dim_;
    const int64_t depth = router_ == RouterVariant::kPlain ? 8 * ((dim + 255) / 256) + 5
                                                           : 8 * ((dim + 2047) / 2048) + 7 + 5;
    const uint16_t* x = et_.input.data();
    delta_.assign(static_cast<size_t>(T_ * E_), 0.0);
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t e = 0; e < E_; ++e) {
        double mag = 0;
        for (int64_t k = 0; k < dim; ++k)
          mag += std::fabs(static_cast<double>(router_weight(w_, e * dim + k)) *
                           bf16_to_f32(x[t * dim + k]));
        delta_[t * E_ + e] = (gamma_f32(depth) + gamma_f64(dim)) * mag;
        ck_.see(Stage::kRouterLogits, et_.router_logits[t * E_ + e], z_[t * E_ + e],
                delta_[t * E_ + e],
                [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
      }
    }
  }

  // Pick sets compared; each flipped pair must be explained by the logit bound.
  void routing() {
    flipped_.assign(static_cast<size_t>(T_), false);
    band_.clear();
    for (int64_t t = 0; t < T_; ++t)
      band_.push_back(bounds_detail::score_band(c_, z_.data() + t * E_, delta_.data() + t * E_));
    for (int64_t t = 0; t < T_; ++t) {
      std::vector<int32_t> se(et_.topk_ids.begin() + t * K_, et_.topk_ids.begin() + (t + 1) * K_);
      std::vector<int32_t> sr(rr_.ids.begin() + t * K_, rr_.ids.begin() + (t + 1) * K_);
      std::sort(se.begin(), se.end());
      std::sort(sr.begin(), sr.end());
      if (se == sr) continue;
      flipped_[t] = true;
      for (int32_t e : se) {
        if (std::binary_search(sr.begin(), sr.end(), e)) continue;
        for (int32_t f : sr)
          if (!std::binary_search(se.begin(), se.end(), f)) flip(t, e, f);
      }
    }
  }

  // One (emulation-only e, reference-only f) pair of token t: explained when e's key can reach
  // f's within the score band (the logit bound propagated, the f32 evaluation).
  void flip(int64_t t, int32_t e, int32_t f) {
    ++rep_.flips;
    const bounds_detail::ScoreBand& b = band_[t];
    const float* bias = rb_.of(t);
    const bool explained =
        bounds_detail::key_flip_explained(b.s[e], b.err[e], bias[e], b.s[f], b.err[f], bias[f]);
    if (!explained) ++rep_.unexplained_flips;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "layer %d token %lld: flip, emulation picks %d (exact key %.17g), reference "
                  "picks %d (exact key %.17g); margin %.3g, score errors up to %.3g + %.3g: %s",
                  et_.layer, static_cast<long long>(t), e, key(t, e), f, key(t, f),
                  key(t, f) - key(t, e), b.err[e], b.err[f],
                  explained ? "explained" : "UNEXPLAINED");
    rep_.flip_lines.emplace_back(buf);
  }

  // Weights of unflipped tokens: each picked score within its band, renormalised and scaled
  // (bounds_detail::weight_bound).
  void weights() {
    for (int64_t t = 0; t < T_; ++t) {
      if (flipped_[t]) continue;
      const bounds_detail::ScoreBand& b = band_[t];
      double sum = 0, err_sum = 0;
      for (int64_t k = 0; k < K_; ++k) {
        const int32_t e = rr_.ids[t * K_ + k];
        wref_[{t, e}].first = rr_.weights[t * K_ + k];
        sum += b.s[e];
        err_sum += b.err[e];
      }
      for (int64_t k = 0; k < K_; ++k) {
        const int32_t e = et_.topk_ids[t * K_ + k];
        auto& p = wref_[{t, e}];
        p.second = et_.topk_weights[t * K_ + k];
        ck_.see(Stage::kTopkWeights, p.second, p.first,
                bounds_detail::weight_bound(c_, b.s[e], b.err[e], sum, err_sum),
                [t, e] { return "token " + std::to_string(t) + " expert " + std::to_string(e); });
      }
    }
  }

  // Every (expert, token) the implementation computed, then the shared expert.
  void experts() {
    xf_.resize(static_cast<size_t>(T_ * dim_));
    for (int64_t i = 0; i < T_ * dim_; ++i) xf_[i] = bf16_to_f32(et_.input[i]);
    // One task per routed expert, then the shared one, each into its own report parts (merged in
    // this order afterwards: the same report as one pass in order), spread over the host's cores.
    const size_t n = et_.experts.size() + 1;
    std::vector<LegReport> parts(n, rep_.empty_like()), stat_parts;
    if (stat_ != nullptr) stat_parts.assign(n, stat_->report().empty_like());
    for (const ExpertTaps& e : et_.experts)
      diffs_[e.expert];  // the map is not touched by the tasks
    run_tasks(n, [&](size_t i) {
      Checker ck(parts[i]);
      std::unique_ptr<Checker> sk = stat_ ? std::make_unique<Checker>(stat_parts[i]) : nullptr;
      if (i + 1 == n) {
        bounds_detail::check_expert(w_, w_.shared_gate, w_.shared_up, w_.shared_down, et_.shared,
                                    et_.x_q8, xf_, true, ck, shared_, sk.get());
        return;
      }
      const ExpertTaps& e = et_.experts[i];
      bounds_detail::check_expert(w_, w_.gate_exps.expert(e.expert), w_.up_exps.expert(e.expert),
                                  w_.down_exps.expert(e.expert), e, et_.x_q8, xf_, false, ck,
                                  diffs_.at(e.expert), sk.get());
    });
    for (size_t i = 0; i < n; ++i) {
      rep_.merge(parts[i]);
      if (stat_ != nullptr) stat_->report().merge(stat_parts[i]);
    }
    for (const ExpertTaps& e : et_.experts)
      for (size_t j = 0; j < e.tokens.size(); ++j)
        where_of_[{e.tokens[j], e.expert}] = {&e, static_cast<int64_t>(j)};
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t k = 0; k < K_; ++k)
        if (where_of_.count({t, et_.topk_ids[t * K_ + k]}) == 0)
          throw InputError("bounds check, layer " + std::to_string(et_.layer) + ": token " +
                           std::to_string(t) + " picks expert " +
                           std::to_string(et_.topk_ids[t * K_ + k]) +
                           " but that expert's taps lack the token");
  }

  // "Accumulate" of unflipped tokens, then the output: the implementation's own acc rounded once
  // to bf16 (finish), and within the acc bound plus two bf16 half-ulps of the reference's.
  void acc_output() {
    for (int64_t t = 0; t < T_; ++t) {
      if (flipped_[t]) continue;
      for (int64_t i = 0; i < dim_; ++i) {
        const double ae = et_.acc[t * dim_ + i], ar = acc_ref_[t * dim_ + i];
        auto wh = [t, i] { return "token " + std::to_string(t) + " col " + std::to_string(i); };
        ck_.see(Stage::kAcc, ae, ar, acc_bound(t, i), wh);
        const uint16_t y = et_.output[t * dim_ + i];
        const double ye = bf16_to_f32(y);
        if (y != f32_to_bf16(et_.acc[t * dim_ + i]))
          ck_.see(
              Stage::kOutput, ye, bf16_to_f32(f32_to_bf16(et_.acc[t * dim_ + i])), 0.0,
              [&wh] { return wh() + " (output is not bf16(acc) of the same taps)"; }, false);
        ck_.see(Stage::kOutput, ye, bf16_to_f32(rtaps_.output[t * dim_ + i]),
                std::fabs(ae - ar) + 0x1p-8 * (std::fabs(ae) + std::fabs(ar)), wh);
        if (stat_ != nullptr) acc_output_noise(t, i, wh);
      }
    }
  }

  // "Statistical leg", acc and output: the experts' down variances through the squared routing
  // weights, the shared expert's added; the output also carries both sides' bf16 rounding.
  template <class Where>
  void acc_output_noise(int64_t t, int64_t i, const Where& wh) {
    const int64_t q = t * dim_ + i;
    double var = shared_.down_var[q], mag = std::fabs(et_.shared.down[q]);
    for (int64_t k = 0; k < K_; ++k) {
      const int32_t e = et_.topk_ids[t * K_ + k];
      const auto [tap, j] = where_of_.at({t, e});
      const double w = et_.topk_weights[t * K_ + k];
      var += w * w * diffs_.at(e).down_var[j * dim_ + i];
      mag += std::fabs(w * tap->down[j * dim_ + i]);
    }
    const double ae = et_.acc[q], ar = acc_ref_[q], floor = gamma_f32(K_ + 1) * mag;
    stat_->see_z(Stage::kAcc, ae, ar, std::sqrt(var), floor, wh);
    const double var_out =
        var + stat_noise::bf16_round_variance(ae) + stat_noise::bf16_round_variance(ar);
    stat_->see_z(Stage::kOutput, bf16_to_f32(et_.output[q]), bf16_to_f32(rtaps_.output[q]),
                 std::sqrt(var_out), floor, wh);
  }

  double acc_bound(int64_t t, int64_t i) const {
    const int64_t q = t * dim_ + i;
    double b = shared_.down_err[q], mag = std::fabs(et_.shared.down[q]),
           mag_ref = shared_.down_mag[q];
    for (int64_t k = 0; k < K_; ++k) {
      const int32_t e = et_.topk_ids[t * K_ + k];
      const auto [tap, j] = where_of_.at({t, e});
      const auto [wr, we] = wref_.at({t, e});
      const ExpertDiff& d = diffs_.at(e);
      const double de = tap->down[j * dim_ + i];
      b += std::fabs(we - wr) * std::fabs(de) + std::fabs(wr) * d.down_err[j * dim_ + i];
      mag += std::fabs(we * de);
      mag_ref += std::fabs(wr) * d.down_mag[j * dim_ + i];
    }
    return b + gamma_f32(K_ + 1) * mag + gamma_f64(2 * (c_.inter + K_ + 2)) * mag_ref;
  }

  const LayerWeights& w_;
  const MoeConfig& c_;
  const LayerTaps& et_;
  RouterVariant router_;
  LayerTaps& rtaps_;
  LegReport& rep_;
  Checker ck_;
  Checker* stat_;
  const RouteBias rb_;  // the taps' tokens' selection biases (their image mask)
  const int64_t T_, E_, K_, dim_;
  std::vector<double> acc_ref_, z_, delta_;
  ref::ExactRouting rr_;
  std::vector<bool> flipped_;
  std::vector<bounds_detail::ScoreBand> band_;  // per token
  std::vector<float> xf_;
  std::map<std::pair<int64_t, int32_t>, std::pair<double, double>>
      wref_;  // (t, e) -> (w_ref, w_emu)
  std::map<std::pair<int64_t, int32_t>, std::pair<const ExpertTaps*, int64_t>>
      where_of_;  // (t, e) -> taps, row
  std::map<int32_t, ExpertDiff> diffs_;
  ExpertDiff shared_;
};

// The independent noise sources each statistical stage is made of, counted in q8_1 blocks of 32
// values (the unit of shared structure: a block's values share its scale and its f16 rounding,
// and a K-quant sub-block's weights share an offset, so the errors of one block enter every row
// together): x's blocks (dim / 32 per token), h's (inter / 32 per routed pair), the dense shared
// h's bf16 roundings or its q8_1 blocks (inter / 32 per token). docs/numerics.md "Statistical leg".
void set_noise_sources(const LayerWeights& w, const LayerTaps& t, Checker& sk) {
  const MoeConfig& c = w.config;
  int64_t pairs = 0;
  for (const ExpertTaps& e : t.experts) pairs += static_cast<int64_t>(e.tokens.size());
  const int64_t x = t.tokens * c.dim / kQK8_1, h = pairs * c.inter / kQK8_1,
                sh = t.tokens * c.inter / kQK8_1;
  for (Stage s : {Stage::kExpertsGate, Stage::kExpertsUp, Stage::kExpertsH, Stage::kSharedGate,
                  Stage::kSharedUp, Stage::kSharedH})
    sk.set_chi2_limit(s, x);
  sk.set_chi2_limit(Stage::kExpertsDown, x + h);
  sk.set_chi2_limit(Stage::kSharedDown, x + sh);
  sk.set_chi2_limit(Stage::kAcc, x + h + sh);
  sk.set_chi2_limit(Stage::kOutput, x + h + sh);
}

}  // namespace

LegReport check_emu_against_exact(const LayerWeights& w, const LayerTaps& et, RouterVariant router,
                                  LayerTaps* exact_taps, LegReport* stat) {
  bounds_detail::validate_taps(w, et);
  LegReport rep;
  rep.layer = et.layer;
  Checker ck(rep);
  for (const auto& [s, kind] : kJudged) ck.add_stage(s, kind);
  std::unique_ptr<Checker> sk;
  if (stat != nullptr) {
    *stat = LegReport{};
    stat->layer = et.layer;
    sk = std::make_unique<Checker>(*stat);
    for (const auto& [s, kind] : kJudged)
      if (s != Stage::kRouterLogits && s != Stage::kTopkWeights)
        sk->add_stage(s, CheckKind::kStatistical);
  }
  LayerTaps local;
  LayerCheck(w, et, router, exact_taps ? *exact_taps : local, rep, sk.get()).run();
  if (sk) set_noise_sources(w, et, *sk);
  return rep;
}

}  // namespace moecheck
