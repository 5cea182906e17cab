// Stage-by-stage comparison of two dumps: routing first (sets per token), then every stage in
// pipeline order through the per-kind differs of compare/diff_layer.h, on the tokens whose
// routing agrees. Contract: docs/cli.md "diff" (the rules and the statistics' definitions).
#include "compare/dump_diff.h"

#include <cstdio>

#include "compare/diff_layer.h"
#include "core/error.h"

namespace moecheck {

const StageDiff* LayerDiff::stage(Stage s) const {
  for (const StageDiff& x : stages)
    if (x.stage == s) return &x;
  return nullptr;
}

uint64_t ulp_distance_f32(uint32_t a, uint32_t b) {
  auto ord = [](uint32_t u) -> int64_t {
    return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
  };
  const int64_t d = ord(a) - ord(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

uint64_t ulp_distance_bf16(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t u) -> int64_t {
    return (u & 0x8000u) ? -static_cast<int64_t>(u & 0x7FFFu) : static_cast<int64_t>(u);
  };
  const int64_t d = ord(a) - ord(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

std::string Tolerance::describe() const {
  std::string s;
  char buf[96];
  switch (mode) {
    case ToleranceMode::kExact: s = "exact (bit for bit)"; break;
    case ToleranceMode::kUlp: s = "ulp <= " + std::to_string(ulp); break;
    case ToleranceMode::kAbsRel:
      std::snprintf(buf, sizeof buf, "|a-b| <= %g + %g*|a|", atol, rtol);
      s = buf;
      break;
    case ToleranceMode::kNmse:
      std::snprintf(buf, sizeof buf, "NMSE <= %g", nmse);
      s = buf;
      break;
  }
  return s + (nan_equal ? ", NaN == NaN" : "");
}

void check_comparable(const DumpMeta& a, const std::string& ap, const DumpMeta& b, const std::string& bp) {
  const std::string both = ap + " vs " + bp + ": ";
  if (a.model_sha256 != b.model_sha256)
    throw InputError(both + "different model files (attribute model_sha256): " + a.model_file + " " +
                     a.model_sha256 + " vs " + b.model_file + " " + b.model_sha256);
  const MoeConfig &x = a.config, &y = b.config;
  auto field = [&](const char* f, const std::string& u, const std::string& v) {
    if (u != v) throw InputError(both + "different configs: attribute config." + f + " is " + u + " vs " + v);
  };
  auto fs = [](float v) { char buf[32]; std::snprintf(buf, sizeof buf, "%.9g", double(v)); return std::string(buf); };
  field("dim", std::to_string(x.dim), std::to_string(y.dim));
  field("inter", std::to_string(x.inter), std::to_string(y.inter));
  field("n_routed", std::to_string(x.n_routed), std::to_string(y.n_routed));
  field("topk", std::to_string(x.topk), std::to_string(y.topk));
  field("n_shared", std::to_string(x.n_shared), std::to_string(y.n_shared));
  field("score_func", to_string(x.score_func), to_string(y.score_func));
  field("route_scale", fs(x.route_scale), fs(y.route_scale));
  field("swiglu_limit", fs(x.swiglu_limit), fs(y.swiglu_limit));
  field("gate_temp", fs(x.gate_temp), fs(y.gate_temp));
  field("norm_topk_prob", std::to_string(x.norm_topk_prob), std::to_string(y.norm_topk_prob));
  if (a.tokens != b.tokens)
    throw InputError(both + "different token counts (attribute tokens): " + std::to_string(a.tokens) +
                     " vs " + std::to_string(b.tokens));
  if (a.layers != b.layers) {
    auto ls = [](const std::vector<int32_t>& v) {
      std::string s;
      for (int32_t l : v) {
        if (!s.empty()) s += ",";
        s += std::to_string(l);
      }
      return "[" + s + "]";
    };
    throw InputError(both + "different layer lists (attribute layers): " + ls(a.layers) + " vs " + ls(b.layers));
  }
}

int64_t explain_flips(LayerDiff& l, double gate_temp) {
  if (l.routing.flip_list.empty()) return 0;
  const StageDiff* logits = l.stage(Stage::kRouterLogits);
  const double max_logit = logits != nullptr ? logits->max_abs : 0.0;
  // Every score function's slope is at most 1 per unit of logit / gate_temp (sqrtsoftplus < 0.5,
  // sigmoid 0.25, softmax 0.5 summed over all logits), so each key moves by at most delta =
  // max_logit / gate_temp (logit margins: max_logit) and a flip that the logit difference
  // explains has its margin within 2 delta on both sides.
  const double bound = l.routing.margin_kind == "logit" ? 2.0 * max_logit : 2.0 * max_logit / gate_temp;
  int64_t explained = 0;
  for (const RoutingFlip& f : l.routing.flip_list)
    if (f.margin_a <= bound && f.margin_b <= bound) explained += static_cast<int64_t>(f.only_a.size());
  if (explained != l.routing.flips) return explained;
  l.pass = true;
  for (StageDiff& s : l.stages) {
    if (s.stage == Stage::kTopkIds) s.pass = true;
    if (!s.pass && l.pass) {
      l.pass = false;
      l.first_failing = s.stage;
    }
  }
  return explained;
}

namespace {

LayerDiff diff_layer(const Dump& A, const Dump& B, size_t li, const DiffOptions& o) {
  using namespace diff_detail;
  const LayerTaps& a = A.layers[li];
  const LayerTaps& b = B.layers[li];
  const MoeConfig& c = A.meta.config;
  LayerDiff ld;
  ld.layer = a.layer;
  std::vector<bool> agree;
  ld.routing = diff_routing(a, b, c, o.bias ? o.bias(a.layer) : nullptr, agree);
  Rescale rescale;
  rescale.a_weighted = A.meta.routing_weight_at == "h";
  rescale.active = rescale.a_weighted != (B.meta.routing_weight_at == "h");
  LayerDiffer d(a, b, c, o, agree, rescale);
  d.token_rows(Stage::kInput, true, a.input.data(), b.input.data(), c.dim, true);
  d.token_rows(Stage::kRouterLogits, false, a.router_logits.data(), b.router_logits.data(), c.n_routed, true);
  d.topk(ld.routing);
  d.x_q8();
  if (A.meta.taps && B.meta.taps) {
    d.experts(false);
    d.experts(true);
    d.acc();
  }
  d.token_rows(Stage::kOutput, true, a.output.data(), b.output.data(), c.dim, false);
  d.verdict(ld);
  return ld;
}

}  // namespace

DiffReport diff_dumps(const Dump& A, const Dump& B, const DiffOptions& o) {
  check_comparable(A.meta, A.path, B.meta, B.path);
  DiffReport rep;
  rep.a_path = A.path;
  rep.b_path = B.path;
  rep.tolerance = o.tolerance;
  if (A.meta.taps != B.meta.taps)
    rep.note = std::string("tap stages not compared: only ") + (A.meta.taps ? "A" : "B") + " was run with --taps";
  for (size_t li = 0; li < A.layers.size(); ++li) {
    rep.layers.push_back(diff_layer(A, B, li, o));
    rep.same = rep.same && rep.layers.back().pass;
  }
  return rep;
}

}  // namespace moecheck
