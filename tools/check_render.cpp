// Text and JSON forms of a CheckResult (compare/check.h): one three-way table per layer, the
// first stage that broke on each leg, the routing histogram and the output norms. Reads the
// verdicts; decides none. Contract: docs/cli.md "check".
#include "tools/check_render.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "tools/report.h"

namespace moecheck::cli {
namespace {

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s + " ";
}

// emu=cuda cell: bitwise or how many values differ.
std::string exact_cell(const StageDiff* s) {
  if (s == nullptr) return "not run";
  if (s->status == "absent") return "-";
  if (!s->status.empty()) return std::string(s->pass ? "n/a " : "FAIL ") + "(" + s->status + ")";
  const std::string v = s->pass ? "ok   " : "FAIL ";
  if (s->stage == Stage::kTopkIds) return v + std::to_string(s->out_of_tol) + " flip(s)";
  return v + (s->out_of_tol == 0 ? "bitwise" : std::to_string(s->out_of_tol) + " differ");
}

// A ratio below 1 never prints as "1" (0.99995 -> 0.999): the cell must not look like a bound hit.
std::string ratio_text(double r) {
  const std::string t = fmt_num(r);
  return r < 1 && std::atof(t.c_str()) >= 1 ? "0.999" : t;
}

// A leg report's cell for one stage: its routing flips, the worst |diff| / bound (accuracy and
// local checks), or only the verdict (consistency checks, which are not accuracy ratios).
std::string report_cell(const LegReport& b, Stage stage) {
  if (stage == Stage::kTopkIds) {
    if (b.flips == 0) return "ok   0 flips";
    return b.unexplained_flips == 0 ? "ok   " + std::to_string(b.flips) + " flip(s) explained"
                                    : "FAIL " + std::to_string(b.unexplained_flips) + " of " +
                                          std::to_string(b.flips) + " flip(s) unexplained";
  }
  const StageCheck* s = b.stage(stage);
  if (s == nullptr) return "-";
  if (s->checked == 0 && s->kind != CheckKind::kStatistical) return "-   (none checked)";
  if (s->kind == CheckKind::kStatistical) {
    if (s->checked == 0) return "n/a  (no predicted noise)";
    char buf[64];
    const bool fail = s->violations > 0 || s->chi2 > s->chi2_limit;
    std::snprintf(buf, sizeof buf, "%s|z| %.2g, chi2/n %.2g", fail ? "FAIL " : "ok   ",
                  6.0 * s->worst_ratio, s->chi2 / static_cast<double>(s->checked));
    return buf;
  }
  if (s->kind == CheckKind::kConsistency)
    return s->violations == 0 ? "ok   consistent"
                              : "FAIL " + std::to_string(s->violations) + " over (consistency)";
  if (stage == Stage::kXQ8 || stage == Stage::kExpertsHQ8 || stage == Stage::kSharedHQ8)  // a rule
    return s->violations == 0 ? "ok   rule holds"
                              : "FAIL " + std::to_string(s->violations) + " block(s) break it";
  if (s->violations == 0) return "ok   " + ratio_text(s->worst_ratio) + " of bound";
  return "FAIL " + std::to_string(s->violations) + " over, worst " + fmt_num(s->worst_ratio);
}

// ref~emu verdict cell: the input's bits, else the bounds leg's report.
std::string bound_cell(const StageDiff* info, const LegReport& b, Stage stage) {
  if (stage == Stage::kInput || stage == Stage::kSharedWeights) {
    if (info == nullptr || !info->status.empty()) return "-";
    return info->pass ? "ok   same bits" : "FAIL " + std::to_string(info->out_of_tol) + " differ";
  }
  return report_cell(b, stage);
}

// NMSE (information) cell.
std::string nmse_cell(const StageDiff* s) {
  if (s == nullptr) return "-";
  if (!s->status.empty()) return s->status;
  if (s->stage == Stage::kTopkIds) return std::to_string(s->out_of_tol) + " flip(s)";
  return fmt_num(s->nmse);
}

const char* leg_kind_name(LegKind k) {
  switch (k) {
    case LegKind::kBounds: return "bounds";
    case LegKind::kStat: return "statistical";
    case LegKind::kLocal: return "local";
    case LegKind::kExact: return "exact";
  }
  return "?";
}

void report_json(Json& j, const LegReport& b) {
  j.begin_object()
      .kv("layer", b.layer)
      .kv("ok", b.ok())
      .kv("first_failing", b.ok() ? "" : stage_name(b.first_failing()));
  j.kv("flips", b.flips)
      .kv("unexplained_flips", b.unexplained_flips)
      .key("flip_lines")
      .begin_array();
  for (const std::string& l : b.flip_lines) j.value(l);
  j.end_array().key("stages").begin_array();
  for (const StageCheck& s : b.stages) {
    j.begin_object()
        .kv("stage", stage_name(s.stage))
        .kv("kind", check_kind_name(s.kind))
        .kv("checked", s.checked)
        .kv("violations", s.violations);
    j.kv("worst_ratio", s.worst_ratio).kv("first_violation", s.first_violation);
    if (s.kind == CheckKind::kStatistical)
      j.kv("not_applicable", s.not_applicable).kv("chi2", s.chi2).kv("chi2_limit", s.chi2_limit);
    j.end_object();
  }
  j.end_array().end_object();
}

void header_text(std::string& o, const CheckResult& r) {
  const MoeConfig& c = r.config;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "moecheck check: model %s\n  dim %lld, inter %lld, %lld experts, top %lld; %lld"
      "%s",
      r.model.c_str(), static_cast<long long>(c.dim), static_cast<long long>(c.inter),
      static_cast<long long>(c.n_routed), static_cast<long long>(c.topk),
      static_cast<long long>(r.tokens - r.adversarial_tokens),
      r.routing_of == "import" || r.routing_of.rfind("emu, the", 0) == 0 ? "" : " seeded");
  o += buf;
  if (r.adversarial_tokens > 0) o += " + " + std::to_string(r.adversarial_tokens) + " adversarial";
  bool imported = false;
  for (const auto& [name, v] : r.ran) imported = imported || name == "import";
  o += imported ? " token(s) per layer, the imported input\n"
                : " token(s) per layer, input seed " + std::to_string(r.input_seed) + "\n";
  if (r.image_tokens > 0)
    o += "  image spans: " + std::to_string(r.image_tokens) +
         " token(s) select their experts with bias_vl (--image-tokens)\n";
  std::string ran;
  for (const auto& [name, variant] : r.ran) {
    if (!ran.empty()) ran += ", ";
    ran += name + " (" + variant + ")";
  }
  o += "  ran: " + ran + "\n";
  for (const auto& [name, why] : r.not_run) o += "  not run: " + name + ": " + why + "\n";
  o += "  legs: ref~emu: accumulated bounds against the reference in Exact mode, worst |diff| / "
       "bound\n"
       "          ('consistent': the measured input differences propagated, no accuracy claim);\n"
       "        nmse: ref~emu against the ref run above, information only;\n"
       "        stat: ref~emu as z-scores against the noise the formats predict; a value over 6 "
       "sigma\n"
       "          or a stage's chi2 over n (1 + 6 sqrt(2 / m)), m its noise sources, fails\n"
       "          (docs/numerics.md \"Statistical leg\");\n"
       "        local: every stage recomputed from the implementation's own inputs of that stage,\n"
       "          worst |diff| / its own rounding bound (docs/numerics.md \"Stage-local legs\");\n"
       "        emu=cuda: bit for bit\n";
  for (const std::string& l : r.legs_not_run) o += "  not run: " + l + "\n";
}

// The stages a layer's table lists: those of the first dump comparison, else of the first report.
std::vector<Stage> table_stages(const CheckResult& r, size_t li) {
  std::vector<Stage> out;
  for (const CheckLeg& l : r.legs) {
    if (l.kind == LegKind::kLocal || l.kind == LegKind::kStat) continue;
    for (const StageDiff& s : l.report.layers[li].stages) out.push_back(s.stage);
    return out;
  }
  for (const CheckLeg& l : r.legs) {
    out.push_back(Stage::kTopkIds);
    for (const StageCheck& s : l.reports[li].stages) out.push_back(s.stage);
    std::sort(out.begin(), out.end());
    return out;
  }
  return out;
}

// One layer's table: a row per stage, a column (two for the bounds leg) per leg.
void table_text(std::string& o, const CheckResult& r, size_t li, bool cuda_idle) {
  o += "\nlayer " + std::to_string(r.layers[li].layer) + "\n  " + pad("stage", 15);
  for (const CheckLeg& l : r.legs) {
    if (l.kind == LegKind::kExact) o += pad(l.name, 16);
    else if (l.kind == LegKind::kLocal) o += pad(l.name, 24);
    else if (l.kind == LegKind::kStat) o += pad(l.name, 26);
    else o += pad(l.name + " bound", 28) + pad(l.name + " nmse", 14);
  }
  if (cuda_idle) o += pad("emu=cuda", 16);
  if (r.legs.empty()) o += "(one implementation ran: nothing to compare)";
  o += "\n";
  for (Stage st : table_stages(r, li)) {
    o += "  " + pad(stage_name(st), 15);
    for (const CheckLeg& l : r.legs) {
      if (l.kind == LegKind::kStat && st == Stage::kTopkIds) {  // routing is not a noise question
        o += pad("-", 26);
        continue;
      }
      if (!l.routing_judged && st == Stage::kTopkIds) {  // an import without routing
        o += pad("-   (not imported)", 28) + pad("not imported", 14);
        continue;
      }
      if (l.kind == LegKind::kLocal || l.kind == LegKind::kStat) {
        o += pad(report_cell(l.reports[li], st), l.kind == LegKind::kLocal ? 24 : 26);
        continue;
      }
      const StageDiff* s = l.report.layers[li].stage(st);
      if (l.kind == LegKind::kExact) o += pad(exact_cell(s), 16);
      else o += pad(bound_cell(s, l.reports[li], st), 28) + pad(nmse_cell(s), 14);
    }
    if (cuda_idle) o += "not run";
    o += "\n";
  }
}

// The leg's verdict line for a layer and what broke first.
void leg_text(std::string& o, const CheckLeg& l, size_t li) {
  o += "  " + l.name + ": " +
       (l.pass[li] ? "agree" : std::string("BROKE first at ") + stage_name(l.first_failing[li]));
  if (l.kind == LegKind::kExact) {
    const LayerDiff& ld = l.report.layers[li];
    o += "\n";
    if (const StageDiff* s = ld.pass ? nullptr : ld.stage(ld.first_failing))
      for (size_t k = 0; k < s->first.size() && k < 3; ++k)
        o += "    " + mismatch_line(s->first[k], s->dtype) + "\n";
    return;
  }
  const LegReport& b = l.reports[li];
  if (b.flips > 0)
    o += " (" + std::to_string(b.flips) + " routing flip(s), " +
         std::to_string(b.flips - b.unexplained_flips) + " explained)";
  o += "\n";
  for (size_t k = 0; k < b.flip_lines.size() && k < 3; ++k) o += "    " + b.flip_lines[k] + "\n";
  if (l.pass[li]) return;
  if (const StageDiff* s =
          l.kind == LegKind::kBounds ? l.report.layers[li].stage(l.first_failing[li]) : nullptr;
      s != nullptr && (s->stage == Stage::kInput || s->stage == Stage::kSharedWeights))
    for (size_t k = 0; k < s->first.size() && k < 3; ++k)
      o += "    " + mismatch_line(s->first[k], s->dtype) + "\n";
  for (const StageCheck& s : b.stages)
    if (s.violations > 0)
      o += "    " + std::string(stage_name(s.stage)) + ": " + std::to_string(s.violations) +
           " of " + std::to_string(s.checked) + " over; first: " + s.first_violation + "\n";
}

void summary_text(std::string& o, const CheckResult& r, const CheckLayer& l) {
  std::string h;
  for (size_t e = 0; e < l.tokens_per_expert.size(); ++e) {
    if (l.tokens_per_expert[e] == 0) continue;
    if (!h.empty()) h += ' ';
    h += std::to_string(e) + ":" + std::to_string(l.tokens_per_expert[e]);
  }
  o += "  routing (" + r.routing_of + "): tokens per expert " + h + "\n";
  for (const std::string& e : l.edge_cases) o += "  edge case: " + e + "\n";
  std::string norms;
  for (const auto& [name, v] : l.output_l2) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s %.6g", name.c_str(), v);
    if (!norms.empty()) norms += ", ";
    norms += buf;
  }
  o += "  output L2 norm: " + norms + "\n";
}

}  // namespace

std::string render_check_text(const CheckResult& r) {
  std::string o;
  header_text(o, r);
  // The emu=cuda column stays in the table when cuda could not run, saying so.
  bool has_emu = false;
  for (const auto& [name, v] : r.ran) has_emu = has_emu || name == "emu";
  const bool cuda_idle = r.not_run.count("cuda") > 0 && has_emu;
  for (size_t li = 0; li < r.layers.size(); ++li) {
    table_text(o, r, li, cuda_idle);
    for (const CheckLeg& l : r.legs) leg_text(o, l, li);
    summary_text(o, r, r.layers[li]);
  }
  o += std::string("\nresult: ") +
       (r.pass ? (r.legs.empty() ? "ran (nothing to compare)" : "PASS") : "FAIL") + "\n";
  return o;
}

std::string render_check_json(const CheckResult& r) {
  Json j;
  j.begin_object()
      .kv("model", r.model)
      .kv("model_sha256", r.model_sha256)
      .kv("tokens", r.tokens)
      .kv("adversarial_tokens", r.adversarial_tokens);
  j.kv("input_seed", r.input_seed).kv("image_tokens", r.image_tokens).kv("route", r.route);
  j.key("ran").begin_array();
  for (const auto& [name, v] : r.ran) j.value(name);
  j.end_array().key("variants").begin_object();  // each implementation's knobs on one line
  for (const auto& [name, v] : r.ran) j.kv(name, v);
  j.end_object().key("not_run").begin_object();
  for (const auto& [name, why] : r.not_run) j.kv(name, why);
  j.end_object().key("legs_not_run").begin_array();
  for (const std::string& l : r.legs_not_run) j.value(l);
  j.end_array().key("legs").begin_array();
  for (const CheckLeg& l : r.legs) {
    j.begin_object().kv("leg", l.name).kv("pass", l.same()).key("first_failing").begin_array();
    for (size_t li = 0; li < l.pass.size(); ++li)
      j.value(l.pass[li] ? "" : stage_name(l.first_failing[li]));
    j.end_array();
    j.kv("kind", leg_kind_name(l.kind));
    if (l.kind != LegKind::kExact) {
      j.key("reports").begin_array();
      for (const LegReport& b : l.reports) report_json(j, b);
      j.end_array();
    }
    if (l.kind == LegKind::kBounds) {
      j.key("nmse_info");
      diff_json(j, l.report);
    } else if (l.kind == LegKind::kExact) {
      j.key("report");
      diff_json(j, l.report);
    }
    j.end_object();
  }
  j.end_array().key("layers").begin_array();
  for (const CheckLayer& l : r.layers) {
    j.begin_object().kv("layer", l.layer).key("tokens_per_expert").begin_array();
    for (int64_t h : l.tokens_per_expert) j.value(h);
    j.end_array().key("edge_cases").begin_array();
    for (const std::string& e : l.edge_cases) j.value(e);
    j.end_array().key("output_l2").begin_object();
    for (const auto& [name, v] : l.output_l2) j.kv(name, v);
    j.end_object().end_object();
  }
  j.end_array().kv("pass", r.pass).end_object();
  return j.str();
}

}  // namespace moecheck::cli
