// judge_check: the legs of `moecheck check` from the dumps of the implementations that ran.
// Contract: docs/cli.md "check", compare/check_policy.h.
#include "compare/check.h"

#include <cmath>

#include "compare/check_policy.h"
#include "compare/local_leg.h"
#include "core/error.h"
#include "core/numfmt.h"

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
  std::map<int, std::vector<float>> bias;
  for (int L : ref.meta.layers) {
    const LayerWeights w = in.layer(L);
    bias[L].assign(w.bias, w.bias + w.config.n_routed);
  }
  DiffOptions o = ref_info_options();
  o.bias = [&bias](int L) { return bias.at(L).data(); };
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

// Routing histogram of the main dump and every output norm, per layer.
std::vector<CheckLayer> layer_summaries(const CheckInputs& in, const Dump& main,
                                        const std::vector<LayerTaps>& exact) {
  std::vector<CheckLayer> out;
  for (size_t li = 0; li < main.layers.size(); ++li) {
    const LayerTaps& t = main.layers[li];
    CheckLayer l;
    l.layer = t.layer;
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
  r.config = main.meta.config;
  r.model_sha256 = main.meta.model_sha256;
  r.input_seed = main.meta.input_seed;
  std::vector<LayerTaps> exact;
  // ref ~ emu when the emulation ran, else ref ~ cuda (whose every bit the emulation's contract
  // fixes).
  const char* kernel_impl = has("emu") ? "emu" : "cuda";  // the kernels' contract: emu, else cuda
  if (has("ref") && (has("emu") || has("cuda")))
    for (CheckLeg& l : bounds_legs(in, kernel_impl, exact)) r.legs.push_back(std::move(l));
  if (has("emu") || has("cuda")) r.legs.push_back(local_leg(in, kernel_impl));
  if (has("emu") && has("cuda")) r.legs.push_back(exact_leg(in));
  for (const CheckLeg& l : r.legs) r.pass = r.pass && l.same();
  r.layers = layer_summaries(in, main, exact);
  return r;
}

}  // namespace moecheck
