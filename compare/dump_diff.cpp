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

int64_t explain_flips(LayerDiff& l, double gate_temp) {
  if (l.routing.flip_list.empty()) return 0;
  const StageDiff* logits = l.stage(Stage::kRouterLogits);
  const double max_logit = logits != nullptr ? logits->max_abs : 0.0;
  // Every score function's slope is at most 1 per unit of logit / gate_temp (sqrtsoftplus < 0.5,
  // sigmoid 0.25, softmax 0.5 summed over all logits), so each key moves by at most delta =
  // max_logit / gate_temp (logit margins: max_logit) and a flip that the logit difference
  // explains has its margin within 2 delta on both sides.
  const double bound =
      l.routing.margin_kind == "logit" ? 2.0 * max_logit : 2.0 * max_logit / gate_temp;
  int64_t explained = 0;
  for (const RoutingFlip& f : l.routing.flip_list)
    if (f.margin_a <= bound && f.margin_b <= bound)
      explained += static_cast<int64_t>(f.only_a.size());
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
  RouteBias bias;
  if (o.bias) bias = o.bias(a.layer);
  ld.routing = diff_routing(a, b, c, o.bias ? &bias : nullptr, agree);
  Rescale rescale;
  rescale.a_weighted = A.meta.routing_weight_at == "h";
  rescale.active = rescale.a_weighted != (B.meta.routing_weight_at == "h");
  LayerDiffer d(a, b, c, o, agree, rescale);
  d.token_rows(Stage::kInput, true, a.input.data(), b.input.data(), c.dim, true);
  ld.image_mask_differ = d.image_mask();
  d.token_rows(Stage::kRouterLogits, false, a.router_logits.data(), b.router_logits.data(),
               c.n_routed, true);
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
  // An imported dump may hold only some stages (docs/golden-format.md "Imported dumps"); diff
  // aligns everything on both sides' routing, so it needs router_logits and the picks.
  for (const Dump* d : {&A, &B}) {
    if (dump_has_stage(d->meta, Stage::kRouterLogits) && dump_has_stage(d->meta, Stage::kTopkIds))
      continue;
    const std::string held = join_stage_list(d->meta.stages);
    throw InputError(d->path + ": an imported dump of stages " + held +
                     ": diff needs router_logits, topk_ids and topk_weights on both sides; judge "
                     "it with `moecheck check --against " +
                     d->path + "`");
  }
  DiffReport rep;
  rep.model = check_comparable(A, B);
  rep.a_path = A.path;
  rep.b_path = B.path;
  rep.tolerance = o.tolerance;
  if (A.meta.taps != B.meta.taps)
    rep.note = std::string("tap stages not compared: only ") + (A.meta.taps ? "A" : "B") +
               " was run with --taps";
  for (size_t li = 0; li < A.layers.size(); ++li) {
    rep.layers.push_back(diff_layer(A, B, li, o));
    rep.same = rep.same && rep.layers.back().pass;
  }
  return rep;
}

}  // namespace moecheck
