// judge_import: the legs of `check --against` on an imported dump (compare/import_check.h). With
// every stage imported (taps) the legs of `check` run on the import as they run on the emulation.
// Without taps, the judged layer is the kernel contract's run with the imported stages put in
// place of its own, and only the checks that read nothing but imported stages and the reference
// are kept: router_logits and topk_weights by their bounds, the output by the statistical leg
// (its noise predicted on the contract's intermediates, the formats a q8_1 engine has).
// Contract: docs/cli.md "check --against".
#include "compare/import_check.h"

#include <algorithm>

#include "compare/check_policy.h"
#include "compare/local_leg.h"
#include "core/error.h"

namespace moecheck {
namespace {

bool same_sets(const int32_t* a, const int32_t* b, int64_t k) {
  std::vector<int32_t> x(a, a + k), y(b, b + k);
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  return x == y;
}

// The layer the legs read, and which of its stages are the engine's.
struct Judged {
  Dump dump;
  bool full = false, logits = false, routing = false;
  std::string routing_why;  // why the imported routing is not judged ("" when it is)
};

Judged judged_dump(const Dump& im, const Dump& ct) {
  Judged j;
  j.full = im.meta.taps;
  j.logits = dump_has_stage(im.meta, Stage::kRouterLogits);
  const bool has_routing = dump_has_stage(im.meta, Stage::kTopkIds);
  if (j.full) {
    j.dump = im;
    j.routing = true;
    return j;
  }
  j.dump = ct;
  j.dump.meta.implementation = "import";
  j.routing = has_routing;
  if (!has_routing) j.routing_why = "no topk_ids / topk_weights imported";
  const int64_t K = ct.meta.config.topk;
  for (size_t li = 0; li < im.layers.size(); ++li) {
    const LayerTaps& a = im.layers[li];
    LayerTaps& t = j.dump.layers[li];
    t.output = a.output;
    if (j.logits) t.router_logits = a.router_logits;
    for (int64_t tok = 0; j.routing && tok < a.tokens; ++tok)
      if (!same_sets(a.topk_ids.data() + tok * K, t.topk_ids.data() + tok * K, K)) {
        j.routing = false;
        j.routing_why = "the engine picks other experts than the kernel contract on layer " +
                        std::to_string(a.layer) + " token " + std::to_string(tok) +
                        ": its weights cannot be judged without the expert taps";
      }
    if (j.routing) t.topk_ids = a.topk_ids, t.topk_weights = a.topk_weights;
  }
  return j;
}

void keep_stages(LegReport& r, const std::vector<Stage>& keep, bool routing) {
  std::erase_if(r.stages, [&](const StageCheck& s) {
    return std::find(keep.begin(), keep.end(), s.stage) == keep.end();
  });
  if (!routing) r.flips = 0, r.unexplained_flips = 0, r.flip_lines.clear();
}

void validate(const ImportCheckInputs& in) {
  const Dump &im = *in.imported, &ct = *in.contract;
  if (im.meta.implementation != "import")
    throw InputError(im.path + ": implementation \"" + im.meta.implementation +
                     "\": --against takes a dump written by moecheck import");
  if (im.meta.layers != ct.meta.layers || im.meta.tokens != ct.meta.tokens)
    throw InputError(im.path + ": layers or token count differ from the run on its input");
  for (size_t li = 0; li < im.layers.size(); ++li)
    if (im.layers[li].input != ct.layers[li].input)
      throw InputError(im.path + ": layer " + std::to_string(im.layers[li].layer) +
                       ": input differs from the one the reference ran on");
}

}  // namespace

CheckResult judge_import(const ImportCheckInputs& in) {
  validate(in);
  const Dump &im = *in.imported, &rf = *in.ref;
  Judged j = judged_dump(im, *in.contract);
  std::vector<Stage> bound_keep, stat_keep{Stage::kOutput};
  if (j.logits) bound_keep.push_back(Stage::kRouterLogits);
  if (j.routing) bound_keep.push_back(Stage::kTopkWeights);
  CheckResult r;
  r.ran = {{"ref", rf.meta.variant}, {"import", im.meta.variant}};
  r.routing_of = j.routing ? "import" : "emu, the kernel contract (the import's is not judged)";
  r.tokens = im.meta.tokens;
  r.config = im.meta.config;
  r.model_sha256 = im.meta.model_sha256;
  r.input_seed = im.meta.input_seed;
  std::map<int, LayerWeights> weights;
  for (int L : im.meta.layers) weights.emplace(L, in.layer(L));
  DiffOptions o = ref_info_options();
  o.bias = [&weights](int L) { return RouteBias{weights.at(L).bias, weights.at(L).bias_vl}; };
  CheckLeg leg, stat, local;
  leg.name = "ref~import", stat.name = "ref~import stat", local.name = "import local";
  stat.kind = LegKind::kStat, local.kind = LegKind::kLocal;
  leg.routing_judged = stat.routing_judged = j.routing;
  leg.report = diff_dumps(rf, j.dump, o);
  std::vector<LayerTaps> exact(im.layers.size());
  for (size_t li = 0; li < im.layers.size(); ++li) {
    const LayerTaps& t = j.dump.layers[li];
    LayerDiff& info = leg.report.layers[li];
    for (StageDiff& s : info.stages)
      if (!j.full && s.stage != Stage::kInput && s.stage != Stage::kOutput &&
          !(s.stage == Stage::kRouterLogits && j.logits) &&
          !((s.stage == Stage::kTopkIds || s.stage == Stage::kTopkWeights) && j.routing))
        s.status = "not imported", s.pass = true;
    stat.reports.emplace_back();
    leg.reports.push_back(check_emu_against_exact(weights.at(t.layer), t, in.router, &exact[li],
                                                  &stat.reports.back()));
    if (!j.full) {
      keep_stages(leg.reports.back(), bound_keep, j.routing);
      keep_stages(stat.reports.back(), stat_keep, j.routing);
    }
    leg.pass.push_back(ref_leg_pass(info, leg.reports.back()));
    leg.first_failing.push_back(ref_leg_first_failing(info, leg.reports.back()));
    stat.pass.push_back(stat.reports.back().ok());
    stat.first_failing.push_back(stat.reports.back().first_failing());
    if (j.full) {
      local.reports.push_back(check_local(weights.at(t.layer), t, in.router));
      local.pass.push_back(local.reports.back().ok());
      local.first_failing.push_back(local.reports.back().first_failing());
    }
    if (in.on_bounds_layer) in.on_bounds_layer(t.layer);
  }
  r.legs = {leg, stat};
  if (j.full) r.legs.push_back(local);
  auto not_run = [&r](const std::string& s) { r.legs_not_run.push_back(s); };
  if (!j.full) {
    std::string have;
    for (const std::string& s : im.meta.stages) have += (have.empty() ? "" : ", ") + s;
    not_run("import local: needs every stage (taps); the import holds " + have);
    not_run("ref~import acc, output (bounds): consistency checks need the engine's acc (no taps)");
    not_run("ref~import x_q8, experts.*, shared.* (bounds, stat): no taps imported");
    if (!j.logits) not_run("ref~import router_logits: not imported");
    if (!j.routing) not_run("ref~import topk_ids, topk_weights: " + j.routing_why);
  }
  not_run("emu=cuda: not applicable to an imported dump (it compares two kernel runs bit for bit)");
  for (const CheckLeg& l : r.legs) r.pass = r.pass && l.same();
  for (size_t li = 0; li < im.layers.size(); ++li) {
    CheckLayer l;
    l.layer = im.layers[li].layer;
    l.tokens_per_expert.assign(static_cast<size_t>(r.config.n_routed), 0);
    for (int32_t e : j.dump.layers[li].topk_ids) ++l.tokens_per_expert[e];
    l.output_l2 = {{"ref", output_l2(rf.layers[li].output)},
                   {"import", output_l2(im.layers[li].output)},
                   {"ref-exact", output_l2(exact[li].output)}};
    r.layers.push_back(std::move(l));
  }
  return r;
}

}  // namespace moecheck
