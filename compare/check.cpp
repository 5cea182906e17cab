// judge_check: the legs of `moecheck check` from the dumps of the implementations that ran.
// Contract: docs/cli.md "check", compare/check_policy.h.
#include "compare/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compare/check_policy.h"
#include "compare/local_leg.h"
#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "golden/adversarial.h"

namespace moecheck {
namespace {

// Implementations in the order every report lists them.
constexpr const char* kImplOrder[] = {"ref", "emu", "cuda"};

// ref ~ other: the NMSE comparison for information, and per layer the derived bounds as the
// verdict (the Exact reference's taps land in `exact`, one per layer).
std::vector<CheckLeg> bounds_legs(const CheckInputs& in, const std::string& other,
                                  std::vector<LayerTaps>& exact) {
  const Dump& ref = in.dumps.at("ref");
  const Dump& od = in.dumps.at(other);
  std::map<int, LayerWeights> weights;  // kept: their owners keep the viewed bytes alive
  for (int L : ref.meta.layers) weights.emplace(L, in.layer(L));
  DiffOptions o = ref_info_options();
  o.bias = [&weights](int L) {
    const LayerWeights& w = weights.at(L);
    return RouteBias{w.bias, w.bias_vl};
  };
  CheckLeg leg, stat;
  leg.name = "ref~" + other;
  leg.report = diff_dumps(ref, od, o);
  stat.name = "ref~" + other + " stat";
  stat.kind = LegKind::kStat;
  for (size_t li = 0; li < od.layers.size(); ++li) {
    const LayerTaps& t = od.layers[li];
    exact.emplace_back();
    stat.reports.emplace_back();
    leg.reports.push_back(check_emu_against_exact(in.layer(t.layer), t, in.router, &exact.back(),
                                                  &stat.reports.back()));
    const LayerDiff& info = leg.report.layers[li];
    leg.pass.push_back(ref_leg_pass(info, leg.reports.back()));
    leg.first_failing.push_back(ref_leg_first_failing(info, leg.reports.back()));
    stat.pass.push_back(stat.reports.back().ok());
    stat.first_failing.push_back(stat.reports.back().first_failing());
    if (in.on_bounds_layer) in.on_bounds_layer(t.layer);
  }
  return {leg, stat};
}

// impl alone: every stage from its own inputs of the stage.
CheckLeg local_leg(const CheckInputs& in, const std::string& impl) {
  CheckLeg leg;
  leg.name = impl + " local";
  leg.kind = LegKind::kLocal;
  for (const LayerTaps& t : in.dumps.at(impl).layers) {
    leg.reports.push_back(check_local(in.layer(t.layer), t, in.router));
    leg.pass.push_back(leg.reports.back().ok());
    leg.first_failing.push_back(leg.reports.back().first_failing());
  }
  return leg;
}

CheckLeg exact_leg(const CheckInputs& in) {
  CheckLeg leg;
  leg.name = "emu=cuda";
  leg.kind = LegKind::kExact;
  leg.report = diff_dumps(in.dumps.at("emu"), in.dumps.at("cuda"), exact_leg_options());
  for (const LayerDiff& l : leg.report.layers) {
    leg.pass.push_back(l.pass);
    leg.first_failing.push_back(l.first_failing);
  }
  return leg;
}

std::string fmt_e(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// The selection biases of the taps' tokens: bias, or bias_vl where the taps' image mask is set.
RouteBias taps_bias(const LayerWeights& w, const LayerTaps& t) {
  return RouteBias{w.bias, w.bias_vl, t.image_mask.empty() ? nullptr : t.image_mask.data()};
}

// The f32 keys (scores + the token's bias) of token t in descending order with their experts.
std::vector<std::pair<float, int32_t>> sorted_keys(const LayerWeights& w, const LayerTaps& t,
                                                   int64_t tok) {
  const MoeConfig& c = w.config;
  const RouteBias rb = taps_bias(w, t).from(tok);
  const float* bias = rb.of(0);
  const Routing r = route_from_logits(t.router_logits.data() + tok * c.n_routed, 1, rb, c, w.layer);
  std::vector<std::pair<float, int32_t>> k;
  for (int64_t e = 0; e < c.n_routed; ++e)
    k.emplace_back(r.scores[e] + bias[e], static_cast<int32_t>(e));
  std::stable_sort(k.begin(), k.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return k;
}

// What each adversarial token exercised, measured on the taps: the clamps hit by side, the
// routing tie and near tie at the top-k boundary, how much the +1e-20 weighs.
std::vector<std::string> edge_cases(const LayerWeights& w, const LayerTaps& t, int64_t first) {
  std::vector<std::string> out;
  if (first < 0 || first + kAdversarialTokens > t.tokens) return out;
  const MoeConfig& c = w.config;
  const double L = c.swiglu_limit;
  int64_t n[4] = {0, 0, 0, 0};  // gate > L, gate < -L, up > L, up < -L
  for (const ExpertTaps& e : t.experts)
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      if (e.tokens[j] != first) continue;
      for (int64_t i = 0; i < c.inter; ++i) {
        const double g = e.gate[j * c.inter + i], u = e.up[j * c.inter + i];
        n[0] += g > L, n[1] += g<-L, n[2] += u> L, n[3] += u < -L;
      }
    }
  out.push_back("token " + std::to_string(first) + " (clamps): gate > L " + std::to_string(n[0]) +
                ", gate < -L " + std::to_string(n[1]) + ", up > L " + std::to_string(n[2]) +
                ", up < -L " + std::to_string(n[3]) +
                (n[0] && n[1] && n[2] && n[3] ? "" : "  (NOT every side reached)"));
  const int64_t K = c.topk;
  for (int64_t a : {first + 1, first + 2}) {
    if (K >= c.n_routed) break;
    const auto k = sorted_keys(w, t, a);
    const float kk = k[static_cast<size_t>(K - 1)].first, kn = k[static_cast<size_t>(K)].first;
    const int32_t ea = k[static_cast<size_t>(K - 1)].second, eb = k[static_cast<size_t>(K)].second;
    std::string line =
        "token " + std::to_string(a) + (a == first + 1 ? " (zero): " : " (near-tie): ");
    if (kk == kn) {
      // Which of the tied pair the implementation picked, read from its own ids.
      const int32_t* ids = t.topk_ids.data() + a * K;
      const bool lo = std::find(ids, ids + K, std::min(ea, eb)) != ids + K;
      const bool hi = std::find(ids, ids + K, std::max(ea, eb)) != ids + K;
      line += "exact tie at the top-k boundary, experts " + std::to_string(std::min(ea, eb)) +
              " and " + std::to_string(std::max(ea, eb)) + " (key " + fmt_e(kk) + "), " +
              (lo && !hi ? "the lower id picked" : "NOT resolved to the lower id");
    } else
      line += "top-k boundary margin " + fmt_e(static_cast<double>(kk) - kn) + " (" +
              std::to_string(f32_bits(kk) - f32_bits(kn)) + " f32 ulp), experts " +
              std::to_string(ea) + " over " + std::to_string(eb);
    out.push_back(line);
  }
  const Routing r = route_from_logits(t.router_logits.data() + (first + 3) * c.n_routed, 1,
                                      taps_bias(w, t).from(first + 3), c, w.layer);
  double sum = 0;
  for (int64_t j = 0; j < K; ++j) sum += r.scores[r.ids[j]];
  std::string eps =
      "token " + std::to_string(first + 3) + " (eps): picked scores sum to " + fmt_e(sum);
  if (!(c.norm_topk_prob && K > 1)) eps += " (no renormalisation: the +1e-20 is not applied)";
  else if (sum > 0 && 1e-20 > 0x1p-20 * sum)
    eps += ", so the +1e-20 is " + fmt_e(1e-20 / sum) + " times that sum";
  else eps += sum > 0 ? "  (the +1e-20 does NOT matter here)" : "  (the scores underflowed)";
  out.push_back(eps);
  return out;
}

// Routing histogram of the main dump and every output norm, per layer.
std::vector<CheckLayer> layer_summaries(const CheckInputs& in, const Dump& main,
                                        const std::vector<LayerTaps>& exact) {
  std::vector<CheckLayer> out;
  for (size_t li = 0; li < main.layers.size(); ++li) {
    const LayerTaps& t = main.layers[li];
    CheckLayer l;
    l.layer = t.layer;
    l.edge_cases = edge_cases(in.layer(t.layer), t, in.adversarial_from);
    l.tokens_per_expert.assign(static_cast<size_t>(main.meta.config.n_routed), 0);
    for (int32_t e : t.topk_ids) ++l.tokens_per_expert[e];
    for (const char* name : kImplOrder)
      if (auto it = in.dumps.find(name); it != in.dumps.end())
        l.output_l2.emplace_back(name, output_l2(it->second.layers[li].output));
    if (!exact.empty() && !in.ref_exact)
      l.output_l2.emplace_back("ref-exact", output_l2(exact[li].output));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

bool CheckLeg::same() const {
  for (bool p : pass)
    if (!p) return false;
  return true;
}

double output_l2(const std::vector<uint16_t>& y) {
  double s = 0;
  for (uint16_t v : y) s += static_cast<double>(bf16_to_f32(v)) * bf16_to_f32(v);
  return std::sqrt(s);
}

CheckResult judge_check(const CheckInputs& in) {
  if (in.dumps.empty()) throw InputError("check: no implementation ran");
  auto has = [&](const char* i) { return in.dumps.count(i) > 0; };
  CheckResult r;
  for (const char* name : kImplOrder)
    if (auto it = in.dumps.find(name); it != in.dumps.end())
      r.ran.emplace_back(name, it->second.meta.variant);
  r.not_run = in.not_run;
  const Dump& main = has("emu") ? in.dumps.at("emu") : in.dumps.begin()->second;
  r.routing_of = main.meta.implementation;
  r.tokens = main.meta.tokens;
  r.adversarial_tokens = in.adversarial_from < 0 ? 0 : r.tokens - in.adversarial_from;
  r.config = main.meta.config;
  r.model_sha256 = main.meta.model_sha256;
  r.input_seed = main.meta.input_seed;
  if (!main.layers.empty())
    for (uint8_t v : main.layers.front().image_mask) r.image_tokens += v != 0;
  if (has("cuda"))
    for (const auto& [knob, value] : in.dumps.at("cuda").meta.knobs)
      if (knob == "route") r.route = value;
  std::vector<LayerTaps> exact;
  // ref ~ emu when the emulation ran, else ref ~ cuda (whose every bit the emulation's contract
  // fixes).
  const char* kernel_impl = has("emu") ? "emu" : "cuda";  // the kernels' contract: emu, else cuda
  if (has("ref") && (has("emu") || has("cuda")))
    for (CheckLeg& l : bounds_legs(in, kernel_impl, exact)) r.legs.push_back(std::move(l));
  // The stage-local leg on each implementation of the kernels' contract that ran: when emu=cuda
  // breaks, the one whose stage is wrong by itself is the one whose local leg fails.
  for (const char* impl : {"emu", "cuda"})
    if (has(impl)) r.legs.push_back(local_leg(in, impl));
  if (has("emu") && has("cuda")) r.legs.push_back(exact_leg(in));
  for (const CheckLeg& l : r.legs) r.pass = r.pass && l.same();
  r.layers = layer_summaries(in, main, exact);
  return r;
}

}  // namespace moecheck
