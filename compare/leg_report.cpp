// LegReport and its Checker (compare/leg_report.h).
#include "compare/leg_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace moecheck {

const char* check_kind_name(CheckKind k) {
  switch (k) {
    case CheckKind::kAccumulated: return "accumulated";
    case CheckKind::kConsistency: return "consistency";
    case CheckKind::kLocal: return "local";
    case CheckKind::kStatistical: return "statistical";
  }
  return "?";
}

std::string fmt_g9(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

bool LegReport::stage_failed(const StageCheck& s) const {
  return s.violations > 0 || (s.kind == CheckKind::kStatistical && s.chi2 > s.chi2_limit);
}

bool LegReport::ok() const {
  if (unexplained_flips > 0) return false;
  for (const StageCheck& s : stages)
    if (stage_failed(s)) return false;
  return true;
}

Stage LegReport::first_failing() const {
  for (const StageCheck& s : stages) {
    if (s.stage >= Stage::kTopkWeights && unexplained_flips > 0) return Stage::kTopkIds;
    if (stage_failed(s)) return s.stage;
  }
  return Stage::kTopkIds;
}

LegReport LegReport::empty_like() const {
  LegReport r;
  r.layer = layer;
  for (const StageCheck& s : stages) {
    StageCheck c;
    c.stage = s.stage;
    c.kind = s.kind;
    r.stages.push_back(c);
  }
  return r;
}

void LegReport::merge(const LegReport& part) {
  for (const StageCheck& p : part.stages) {
    StageCheck* s = nullptr;
    for (StageCheck& x : stages)
      if (x.stage == p.stage) s = &x;
    if (s == nullptr)
      throw std::logic_error(std::string("leg merge: stage ") + stage_name(p.stage) + " missing");
    if (s->violations == 0 && p.violations > 0) s->first_violation = p.first_violation;
    s->checked += p.checked;
    s->violations += p.violations;
    s->not_applicable += p.not_applicable;
    s->chi2 += p.chi2;
    s->worst_ratio = std::max(s->worst_ratio, p.worst_ratio);
  }
}

const StageCheck* LegReport::stage(Stage s) const {
  for (const StageCheck& x : stages)
    if (x.stage == s) return &x;
  return nullptr;
}

void Checker::set_chi2_limit(Stage s, int64_t sources) {
  StageCheck& st = find(s);
  const double n = static_cast<double>(st.checked);
  const double m = static_cast<double>(std::min(st.checked, sources));
  st.chi2_limit = m > 0 ? n * (1.0 + 6.0 * std::sqrt(2.0 / m)) : 0.0;
}

void Checker::add_stage(Stage s, CheckKind k) {
  StageCheck c;
  c.stage = s;
  c.kind = k;
  r_.stages.push_back(c);
}

StageCheck& Checker::find(Stage s) {
  for (StageCheck& st : r_.stages)
    if (st.stage == s) return st;
  throw std::logic_error(std::string("leg check: stage ") + stage_name(s) +
                         " is not in the report");
}

bool Checker::record(StageCheck& st, double impl, double expected, double bound) {
  const double diff = std::fabs(impl - expected);
  const double inf = std::numeric_limits<double>::infinity();
  const bool nan = std::isnan(diff) && !(std::isnan(impl) && std::isnan(expected));
  const double d = std::isnan(diff) ? (nan ? inf : 0.0) : diff;
  const double ratio = bound > 0 ? d / bound : (d > 0 ? inf : 0.0);
  st.worst_ratio = std::max(st.worst_ratio, ratio);
  if (d <= bound) return false;
  ++st.violations;
  return true;
}

std::string Checker::message(const StageCheck& st, const std::string& where, double impl,
                             double expected, double bound) const {
  return "layer " + std::to_string(r_.layer) + " " + stage_name(st.stage) + " " + where +
         ": impl " + fmt_g9(impl) + " expected " + fmt_g9(expected) + ", |diff| " +
         fmt_g9(std::fabs(impl - expected)) + " > bound " + fmt_g9(bound);
}

}  // namespace moecheck
