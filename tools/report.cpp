// Text and JSON forms of a DiffReport. Contract: docs/cli.md "diff".
#include "tools/report.h"

#include <cmath>
#include <cstdio>

namespace moecheck::cli {

std::string fmt_num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

namespace {

std::string hex(uint32_t bits, const std::string& dtype) {
  char buf[16];
  if (dtype == "bfloat16") std::snprintf(buf, sizeof buf, "0x%04x", bits);
  else if (dtype == "block_q8_1") std::snprintf(buf, sizeof buf, "0x%02x", bits);
  else std::snprintf(buf, sizeof buf, "0x%08x", bits);
  return buf;
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s + " ";
}

std::string value_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t e : ids) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(e));
  }
  return s;
}

}  // namespace

std::string mismatch_position(const Mismatch& m, const std::string& dtype) {
  std::string s;
  if (m.expert >= 0 && m.stage != Stage::kTopkWeights) s += "expert " + std::to_string(m.expert);
  if (m.token >= 0) s += (s.empty() ? "" : " ") + std::string("token ") + std::to_string(m.token);
  if (!s.empty()) s += " ";
  if (dtype == "block_q8_1") s += "block " + std::to_string(m.index);
  else if (m.stage == Stage::kTopkWeights) s += "expert " + std::to_string(m.index);
  else s += "col " + std::to_string(m.index);
  return s;
}

std::string mismatch_line(const Mismatch& m, const std::string& dtype) {
  std::string s = "layer " + std::to_string(m.layer) + " " + stage_name(m.stage) + " " +
                  mismatch_position(m, dtype);
  s += ": A " + hex(m.a_bits, dtype) + " (" + value_text(m.a) + ") B " + hex(m.b_bits, dtype) +
       " (" + value_text(m.b) + ")";
  if (dtype == "bfloat16" || dtype == "float32")
    s += ", " + std::to_string(m.ulp) + (dtype == "bfloat16" ? " bf16" : " f32") + " ulp";
  if (!m.where.empty()) s += "; " + m.where;
  return s;
}

namespace {

// The weights line, the slices one side read only, the report's note.
std::string report_head(const DiffReport& r) {
  std::string o = "diff " + r.a_path + " (A) vs " + r.b_path + " (B): tolerance " +
                  r.tolerance.describe() + "; NMSE = sum (a-b)^2 / sum a^2 (A's energy)\n";
  o += "weights: " + r.model.note + "\n";
  for (const auto* list : {&r.model.only_a, &r.model.only_b}) {
    if (list->empty()) continue;
    o += std::string("  read by ") + (list == &r.model.only_a ? "A" : "B") + " only:";
    for (size_t i = 0; i < list->size() && i < 6; ++i) o += " " + (*list)[i];
    if (list->size() > 6) o += " ... (" + std::to_string(list->size()) + " in all)";
    o += "\n";
  }
  if (!r.note.empty()) o += "note: " + r.note + "\n";
  return o;
}

std::string routing_lines(const RoutingDiff& rd) {
  std::string o = "  routing: " + std::to_string(rd.tokens_differ) + " token(s) differ, " +
                  std::to_string(rd.flips) + " flip(s)";
  o += rd.flip_list.empty()
           ? "\n"
           : "; margins are " + rd.margin_kind + " of the k-th pick minus the (k+1)-th candidate\n";
  for (const RoutingFlip& f : rd.flip_list) {
    const std::string a = join_ids(f.only_a), b = join_ids(f.only_b);
    o += "    token " + std::to_string(f.token) + ": A only {" + a + "}, B only {" + b +
         "}, margin A " + fmt_num(f.margin_a) + ", B " + fmt_num(f.margin_b) + "\n";
  }
  return o;
}

// The stage table: max_rel and max_ulp over same-sign nonzero pairs, x-zero the pairs that differ
// across zero (docs/cli.md "diff").
std::string stage_table(const LayerDiff& l) {
  std::string o = "  " + pad("stage", 16) + pad("dtype", 11) + pad("compared", 9) +
                  pad("max_abs", 9) + pad("max_rel", 9) + pad("max_ulp", 11) + pad("x-zero", 7) +
                  pad("nmse", 9) + pad("out", 7) + "verdict\n";
  for (const StageDiff& s : l.stages) {
    o += "  " + pad(stage_name(s.stage), 16) + pad(s.dtype, 11);
    if (!s.status.empty()) {
      o += s.status + (s.pass ? "" : "  FAIL") + "\n";
      continue;
    }
    o += pad(std::to_string(s.compared), 9) + pad(fmt_num(s.max_abs), 9) +
         pad(fmt_num(s.max_rel), 9) + pad(std::to_string(s.max_ulp), 11) +
         pad(std::to_string(s.cross_zero), 7) + pad(fmt_num(s.nmse), 9) +
         pad(std::to_string(s.out_of_tol), 7) + (s.pass ? "ok" : "FAIL");
    if (s.skipped_tokens > 0)
      o += " (" + std::to_string(s.skipped_tokens) + " rows of re-routed tokens left out)";
    if (s.nan_mismatch > 0) o += " (" + std::to_string(s.nan_mismatch) + " NaN)";
    if (!s.note.empty()) o += " (" + s.note + ")";
    o += "\n";
  }
  return o;
}

// Where each stage's max_abs and max_ulp are: one line per stage that differs.
std::string worst_lines(const LayerDiff& l) {
  std::string o;
  auto at = [](const Mismatch& m, const std::string& dtype) {
    return " at " + mismatch_position(m, dtype) + " (A " + value_text(m.a) + ", B " +
           value_text(m.b) + ")";
  };
  for (const StageDiff& s : l.stages) {
    if (!s.status.empty() || !s.has_worst_abs) continue;
    if (o.empty()) o = "  worst elements (max_ulp over same-sign nonzero pairs):\n";
    o += "    " + pad(stage_name(s.stage), 16) + "max_abs " + fmt_num(s.max_abs) +
         at(s.worst_abs, s.dtype);
    if (s.has_worst_ulp && s.dtype != "block_q8_1")
      o += "; max_ulp " + std::to_string(s.max_ulp) + at(s.worst_ulp, s.dtype);
    o += "\n";
  }
  return o;
}

// The layer's first mismatches in pipeline order, then the worst by |a - b| of the first failing
// stage (where the difference entered); --json lists both for every stage.
std::string mismatch_lists(const LayerDiff& l) {
  std::string o;
  int64_t total = 0;
  for (const StageDiff& s : l.stages)
    if (!s.pass) total += static_cast<int64_t>(s.first.empty() ? 0 : s.out_of_tol);
  size_t shown = 0;
  for (const StageDiff& s : l.stages) {
    if (s.pass) continue;
    for (const Mismatch& m : s.first) {
      if (shown == kMaxMismatches) break;
      if (shown++ == 0)
        o += "  first mismatches (pipeline order; " + std::to_string(total) + " in all):\n";
      o += "    " + mismatch_line(m, s.dtype) + "\n";
    }
  }
  const StageDiff* f = l.pass ? nullptr : l.stage(l.first_failing);
  if (f == nullptr || f->worst.size() < 2) return o;
  o += "  worst mismatches of " + std::string(stage_name(f->stage)) + " by |a-b| (" +
       std::to_string(f->worst.size()) + " of " + std::to_string(f->out_of_tol) + "):\n";
  for (const Mismatch& m : f->worst)
    o += "    |a-b| " + fmt_num(std::fabs(m.a - m.b)) + ": " + mismatch_line(m, f->dtype) + "\n";
  return o;
}

}  // namespace

std::string diff_text(const DiffReport& r) {
  std::string o = report_head(r);
  int failing = 0;
  for (const LayerDiff& l : r.layers) {
    if (!l.pass) ++failing;
    o += "layer " + std::to_string(l.layer) + ": " +
         (l.pass
              ? "same"
              : "DIFFERS (first failing stage: " + std::string(stage_name(l.first_failing)) + ")") +
         "\n";
    o += routing_lines(l.routing) + stage_table(l) + worst_lines(l) + mismatch_lists(l);
  }
  o += r.same ? "result: same\n"
              : "result: DIFFERS (" + std::to_string(failing) + " of " +
                    std::to_string(r.layers.size()) + " layers)\n";
  return o;
}

namespace {

// One located element: stage position, both values and bits, ULPs, where it comes from.
Json& mismatch_json(Json& j, const Mismatch& m) {
  j.begin_object().kv("token", m.token).kv("expert", static_cast<int64_t>(m.expert));
  j.kv("index", m.index).kv("a", m.a).kv("b", m.b);
  j.kv("a_bits", static_cast<uint64_t>(m.a_bits)).kv("b_bits", static_cast<uint64_t>(m.b_bits));
  return j.kv("ulp", m.ulp).kv("where", m.where).end_object();
}

}  // namespace

void diff_json(Json& j, const DiffReport& r) {
  j.begin_object();
  j.kv("a", r.a_path)
      .kv("b", r.b_path)
      .kv("tolerance", r.tolerance.describe())
      .kv("same", r.same)
      .kv("note", r.note);
  j.key("weights").begin_object().kv("kind", r.model.kind).kv("common_slices", r.model.common);
  j.kv("header_differs", r.model.header_differs)
      .kv("note", r.model.note)
      .key("only_a")
      .begin_array();
  for (const std::string& n : r.model.only_a) j.value(n);
  j.end_array().key("only_b").begin_array();
  for (const std::string& n : r.model.only_b) j.value(n);
  j.end_array().end_object();
  j.key("layers").begin_array();
  for (const LayerDiff& l : r.layers) {
    j.begin_object()
        .kv("layer", l.layer)
        .kv("same", l.pass)
        .kv("first_failing", l.pass ? "" : stage_name(l.first_failing))
        .kv("image_mask_differ", l.image_mask_differ);
    j.key("routing")
        .begin_object()
        .kv("tokens_differ", l.routing.tokens_differ)
        .kv("flips", l.routing.flips);
    j.kv("margin_kind", l.routing.margin_kind).key("flip_list").begin_array();
    for (const RoutingFlip& f : l.routing.flip_list) {
      j.begin_object().kv("token", f.token).key("only_a").begin_array();
      for (int32_t e : f.only_a) j.value(static_cast<int64_t>(e));
      j.end_array().key("only_b").begin_array();
      for (int32_t e : f.only_b) j.value(static_cast<int64_t>(e));
      j.end_array().kv("margin_a", f.margin_a).kv("margin_b", f.margin_b).end_object();
    }
    j.end_array().end_object();
    j.key("stages").begin_array();
    for (const StageDiff& s : l.stages) {
      j.begin_object()
          .kv("stage", stage_name(s.stage))
          .kv("dtype", s.dtype)
          .kv("status", s.status)
          .kv("pass", s.pass)
          .kv("note", s.note);
      j.kv("compared", s.compared).kv("skipped_tokens", s.skipped_tokens).kv("max_abs", s.max_abs);
      j.kv("max_rel", s.max_rel)
          .kv("max_ulp", s.max_ulp)
          .kv("nmse", s.nmse)
          .kv("nan_mismatch", s.nan_mismatch);
      j.kv("cross_zero", s.cross_zero).kv("out_of_tolerance", s.out_of_tol);
      j.key("worst_abs");
      s.has_worst_abs ? mismatch_json(j, s.worst_abs) : j.null();
      j.key("worst_ulp");
      s.has_worst_ulp ? mismatch_json(j, s.worst_ulp) : j.null();
      j.key("worst_mismatches").begin_array();
      for (const Mismatch& m : s.worst) mismatch_json(j, m);
      j.end_array().key("first_mismatches").begin_array();
      for (const Mismatch& m : s.first) mismatch_json(j, m);
      j.end_array().end_object();
    }
    j.end_array().end_object();
  }
  j.end_array().end_object();
}

}  // namespace moecheck::cli
