// run_sensitivity (compare/sensitivity.h): the baseline, then each class's ladder of sizes, each
// step planted in the implementation's writable copy, judged by the reference legs on the
// unperturbed model, and undone.
#include "compare/sensitivity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "compare/bounds.h"
#include "compare/local_leg.h"
#include "core/error.h"
#include "core/numfmt.h"
#include "golden/perturb.h"
#include "reference/moe.h"

namespace moecheck {
namespace {

// The sizes tried, ascending. Scales start near one f16 ulp (smaller ones round back to the same
// d); rows double by 4 up to the whole matrix; route_scale is f32, so it starts far lower.
const std::vector<double> kScaleLadder = {1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0};
const std::vector<double> kRowLadder = {1, 4, 16, 64, 256, 1e9};  // 1e9: every row
const std::vector<double> kRouteLadder = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1};

LegCatch catch_of(const LegReport& r) {
  return LegCatch{!r.ok(), r.ok() ? Stage::kOutput : r.first_failing()};
}

double nmse(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = bf16_to_f32(want[i]), b = bf16_to_f32(got[i]);
    num += (a - b) * (a - b);
    den += a * a;
  }
  return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

bool same_expert(const ExpertTaps& a, const ExpertTaps& b) {
  return a.expert == b.expert && a.tokens == b.tokens && same_bits(a.weights, b.weights) &&
         same_bits(a.gate, b.gate) && same_bits(a.up, b.up) && same_bits(a.h, b.h) &&
         same_bits(a.down, b.down);
}

// Every stage bit for bit (the q8_1 blocks follow from the f32 values they quantise).
bool same_taps(const LayerTaps& a, const LayerTaps& b) {
  if (a.topk_ids != b.topk_ids || !same_bits(a.topk_weights, b.topk_weights) ||
      !same_bits(a.acc, b.acc) || a.output != b.output || a.experts.size() != b.experts.size() ||
      !same_expert(a.shared, b.shared))
    return false;
  for (size_t i = 0; i < a.experts.size(); ++i)
    if (!same_expert(a.experts[i], b.experts[i])) return false;
  return true;
}

class Sensitivity {
 public:
  explicit Sensitivity(const SensitivitySetup& s) : s_(s) {}

  SensitivityReport run() {
    rep_.layer = s_.truth.layer;
    rep_.tokens = s_.T;
    ref_out_ = ref::MoE(s_.truth, ref::Precision::kModel)
                   .forward(s_.x.data(), s_.T, nullptr,
                            s_.image_mask.empty() ? nullptr : s_.image_mask.data());
    SensitivityStep base;
    judge(s_.impl, base, true, true, true);
    rep_.base_bounds = base.bounds;
    rep_.base_stat = base.stat;
    rep_.base_local = base.local;
    rep_.base_nmse = base.output_nmse;
    pick_expert();
    for (PerturbClass c : s_.classes) {
      if (c == PerturbClass::kRouteScale || c == PerturbClass::kClamp) {
        ladder(c, "config");
        continue;
      }
      for (int t = 0; t < 3; ++t) ladder(c, t);
    }
    return rep_;
  }

 private:
  // The routed expert the most tokens picked in the baseline (lowest id on a tie), or the asked
  // one.
  void pick_expert() {
    const int64_t E = s_.truth.config.n_routed;
    std::vector<int64_t> n(static_cast<size_t>(E), 0);
    for (int32_t e : base_taps_.topk_ids) ++n[e];
    rep_.expert = s_.expert >= 0
                      ? s_.expert
                      : static_cast<int>(std::max_element(n.begin(), n.end()) - n.begin());
    if (rep_.expert >= E)
      throw InputError("--expert " + std::to_string(rep_.expert) + ": the layer has " +
                       std::to_string(E) + " routed experts");
    rep_.expert_tokens = n[static_cast<size_t>(rep_.expert)];
  }

  // Runs the implementation on w and judges it with the legs still needed (the statistical leg
  // rides on the bounds leg's pass). A step whose taps equal the baseline's bit for bit changed
  // nothing the implementation computed: there is nothing to catch.
  void judge(const LayerWeights& w, SensitivityStep& st, bool need_bounds, bool need_stat,
             bool need_local) {
    LayerTaps t = s_.run(w, s_.x, s_.T);
    st.output_nmse = nmse(t.output, ref_out_);
    if (!base_taps_.topk_ids.empty() && same_taps(t, base_taps_)) {
      st.no_effect = true;
      return;
    }
    if (need_bounds || need_stat) {
      LegReport stat;
      st.bounds = catch_of(
          check_emu_against_exact(s_.truth, t, s_.router, nullptr, need_stat ? &stat : nullptr));
      st.judged_bounds = true;
      if (need_stat) {
        st.stat = catch_of(stat);
        st.judged_stat = true;
      }
    }
    if (need_local) {
      st.local = catch_of(check_local(s_.truth, t, s_.router));
      st.judged_local = true;
    }

    if (base_taps_.topk_ids.empty()) base_taps_ = std::move(t);
  }

  KQuantMatrix matrix(int tensor) const {
    const ExpertStackView& v = tensor == 0   ? s_.impl.gate_exps
                               : tensor == 1 ? s_.impl.up_exps
                                             : s_.impl.down_exps;
    const MatView m = v.expert(rep_.expert);
    return KQuantMatrix{m.type, m.rows, m.cols,
                        s_.writable(m.data, static_cast<size_t>(m.rows * m.row_stride()))};
  }

  // One class on one of the expert's matrices (0 gate, 1 up, 2 down).
  void ladder(PerturbClass c, int tensor) {
    static const char* const kNames[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const KQuantMatrix m = matrix(tensor);
    SensitivityRow row;
    row.tensor = std::string(kNames[tensor]) + "[" + std::to_string(rep_.expert) + "]";
    row.cls = c;
    for (double size : c == PerturbClass::kScale ? kScaleLadder : kRowLadder) {
      SensitivityStep st;
      st.size =
          c == PerturbClass::kScale ? size : std::min<double>(size, static_cast<double>(m.rows));
      {
        BytePatch undo(m.data, m.bytes());
        const int64_t n = static_cast<int64_t>(st.size);
        if (c == PerturbClass::kScale) st.effective = perturb_scale_d(m, size);
        if (c == PerturbClass::kSwap)
          st.effective = static_cast<double>(perturb_swap_scale_min(m, n));
        if (c == PerturbClass::kOffset)
          st.effective = static_cast<double>(perturb_row_offset(m, n));
        if (c == PerturbClass::kQuants)
          st.effective = static_cast<double>(perturb_shift_quants(m, n));
        step(row, s_.impl, st);
      }
      if (done(row) || (c != PerturbClass::kScale && st.size >= static_cast<double>(m.rows))) break;
    }
    finish(row);
    rep_.rows.push_back(std::move(row));
  }

  // A config class: the implementation's copy of the config changed, the weights untouched.
  void ladder(PerturbClass c, const char* tensor) {
    SensitivityRow row;
    row.tensor = tensor;
    row.cls = c;
    const std::vector<double> sizes =
        c == PerturbClass::kClamp ? std::vector<double>{1.0} : kRouteLadder;
    for (double size : sizes) {
      LayerWeights w = s_.impl;
      SensitivityStep st;
      st.size = st.effective = size;
      if (c == PerturbClass::kRouteScale)
        w.config.route_scale = static_cast<float>(w.config.route_scale * (1.0 + size));
      else w.config.swiglu_limit = 0.0f, w.config.swiglu_limit_shared = 0.0f;
      step(row, w, st);
      if (done(row)) break;
    }
    finish(row);
    rep_.rows.push_back(std::move(row));
  }

  void step(SensitivityRow& row, const LayerWeights& w, SensitivityStep& st) {
    judge(w, st, !caught_by(row, &SensitivityStep::bounds), !caught_by(row, &SensitivityStep::stat),
          !caught_by(row, &SensitivityStep::local));
    row.steps.push_back(st);
    if (s_.on_step) s_.on_step(row.tensor + " " + perturb_class_name(row.cls));
  }

  static bool caught_by(const SensitivityRow& row, LegCatch SensitivityStep::*leg) {
    for (const SensitivityStep& s : row.steps)
      if ((s.*leg).caught) return true;
    return false;
  }

  static bool done(const SensitivityRow& row) {
    bool rule = false;
    for (const SensitivityStep& s : row.steps) rule = rule || s.output_nmse > kNmseRule;
    return rule && caught_by(row, &SensitivityStep::bounds) &&
           caught_by(row, &SensitivityStep::stat) && caught_by(row, &SensitivityStep::local);
  }

  // The smallest step per leg, and the leg and stage that caught the smallest one first (earliest
  // stage in pipeline order; a tie names every leg).
  static void finish(SensitivityRow& row) {
    for (int i = 0; i < static_cast<int>(row.steps.size()); ++i) {
      const SensitivityStep& s = row.steps[static_cast<size_t>(i)];
      if (row.first_bounds < 0 && s.bounds.caught) row.first_bounds = i;
      if (row.first_stat < 0 && s.stat.caught) row.first_stat = i;
      if (row.first_local < 0 && s.local.caught) row.first_local = i;
      if (row.first_rule < 0 && s.output_nmse > kNmseRule) row.first_rule = i;
      if (row.first >= 0 || !(s.bounds.caught || s.stat.caught || s.local.caught)) continue;
      row.first = i;
      Stage best = Stage::kOutput;
      for (const LegCatch* l : {&s.bounds, &s.stat, &s.local})
        if (l->caught) best = std::min(best, l->stage);
      const std::pair<const char*, const LegCatch*> legs[] = {
          {"bounds", &s.bounds}, {"stat", &s.stat}, {"local", &s.local}};
      for (const auto& [name, l] : legs) {
        if (!l->caught || l->stage != best) continue;
        if (!row.first_by.empty()) row.first_by += '+';
        row.first_by += name;
      }
      row.first_by += ' ';
      row.first_by += stage_name(best);
    }
    bool any_effect = false;
    for (const SensitivityStep& s : row.steps) any_effect = any_effect || !s.no_effect;
    row.no_effect = !any_effect;
    if (row.first < 0) row.first_by = row.no_effect ? "no effect" : "never";
  }

  const SensitivitySetup& s_;
  SensitivityReport rep_;
  std::vector<uint16_t> ref_out_;
  LayerTaps base_taps_;
};

}  // namespace

const char* perturb_class_name(PerturbClass c) {
  switch (c) {
    case PerturbClass::kScale: return "scale";
    case PerturbClass::kSwap: return "swap";
    case PerturbClass::kOffset: return "offset";
    case PerturbClass::kQuants: return "quants";
    case PerturbClass::kRouteScale: return "route-scale";
    case PerturbClass::kClamp: return "clamp";
  }
  return "?";
}

PerturbClass parse_perturb_class(const std::string& s, const std::string& where) {
  for (PerturbClass c : kAllPerturbClasses)
    if (s == perturb_class_name(c)) return c;
  throw InputError(where + ": unknown perturbation class \"" + s +
                   "\" (known: scale, swap, offset, quants, route-scale, clamp)");
}

bool SensitivityReport::all_caught() const {
  for (const SensitivityRow& r : rows)
    if (r.first < 0 && !r.no_effect) return false;
  return true;
}

SensitivityReport run_sensitivity(const SensitivitySetup& s) {
  if (s.T <= 0) throw InputError("sensitivity: needs at least one token");
  return Sensitivity(s).run();
}

}  // namespace moecheck
