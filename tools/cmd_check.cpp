// `moecheck check`: the main job. Runs every available implementation on the same inputs
// (the embedded default model when no --model is given), compares ref ~ emu within the bounds
// derived against the reference in Exact mode (compare/bounds.h; NMSE shown for
// information) and emu = cuda bit for bit, and prints one three-way table per layer with the
// first stage that broke on each leg, the routing histogram and the output norms.
// Contract: docs/cli.md "check", compare/check_policy.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/numfmt.h"
#include "compare/dump_diff.h"
#include "golden/generator.h"
#include "compare/bounds.h"
#include "compare/check_policy.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/report.h"
#include "tools/runner.h"

namespace moecheck::cli {
namespace {

struct CheckArgs {
  std::string model;
  std::string impls = "ref,emu,cuda";
  int64_t tokens = 8;
  std::string layers;
  uint64_t input_seed = 1;
  std::string precision = "model";
  std::string keep;
  bool json = false;
};

struct Leg {
  std::string name;  // "ref~emu", "emu=cuda"
  DiffReport report;  // ref~emu: the NMSE comparison (information); emu=cuda: the verdict
  std::vector<BoundsReport> bounds;  // ref~emu: the verdict, per layer
  std::vector<bool> pass;                 // per layer
  std::vector<std::string> first_failing; // per layer
  bool exact = false;
};

double l2(const std::vector<uint16_t>& y) {
  double s = 0;
  for (uint16_t v : y) s += static_cast<double>(bf16_to_f32(v)) * bf16_to_f32(v);
  return std::sqrt(s);
}

const StageDiff* find_stage(const LayerDiff& l, const std::string& stage) {
  for (const StageDiff& x : l.stages)
    if (x.stage == stage) return &x;
  return nullptr;
}

// emu=cuda cell: bitwise or how many values differ.
std::string exact_cell(const StageDiff* s) {
  if (s == nullptr) return "not run";
  if (s->status == "absent") return "-";
  if (!s->status.empty()) return std::string(s->pass ? "n/a " : "FAIL ") + "(" + s->status + ")";
  const std::string v = s->pass ? "ok   " : "FAIL ";
  if (s->stage == "topk_ids") return v + std::to_string(s->out_of_tol) + " flip(s)";
  return v + (s->out_of_tol == 0 ? "bitwise" : std::to_string(s->out_of_tol) + " differ");
}

// A ratio below 1 never prints as "1" (0.99995 -> 0.999): the cell must not look like a bound hit.
std::string ratio_text(double r) {
  const std::string t = fmt_num(r);
  return r < 1 && std::atof(t.c_str()) >= 1 ? "0.999" : t;
}

// ref~emu verdict cell: the worst |diff| / bound of the stage, its routing flips, or the input's bits.
std::string bound_cell(const StageDiff* info, const BoundsReport& b) {
  const std::string stage = info ? info->stage : "";
  if (stage == "input" || stage == "shared.weights")
    return info->pass ? "ok   same bits" : "FAIL " + std::to_string(info->out_of_tol) + " differ";
  if (stage == "topk_ids") {
    if (b.flips == 0) return "ok   0 flips";
    return b.unexplained_flips == 0 ? "ok   " + std::to_string(b.flips) + " flip(s) explained"
                                    : "FAIL " + std::to_string(b.unexplained_flips) + " of " + std::to_string(b.flips) +
                                          " flip(s) unexplained";
  }
  const StageCheck* s = b.stage(stage);
  if (s == nullptr) return "-";
  if (s->checked == 0) return "-   (none checked)";
  if (s->violations == 0) return "ok   " + ratio_text(s->worst_ratio) + " of bound";
  return "FAIL " + std::to_string(s->violations) + " over, worst " + fmt_num(s->worst_ratio);
}

// NMSE (information) cell.
std::string nmse_cell(const StageDiff* s) {
  if (s == nullptr) return "-";
  if (!s->status.empty()) return s->status;
  if (s->stage == "topk_ids") return std::to_string(s->out_of_tol) + " flip(s)";
  return fmt_num(s->nmse);
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s + " ";
}

void bounds_json(Json& j, const BoundsReport& b) {
  j.begin_object().kv("layer", b.layer).kv("ok", b.ok()).kv("first_failing", b.first_failing());
  j.kv("flips", b.flips).kv("unexplained_flips", b.unexplained_flips).key("flip_lines").begin_array();
  for (const std::string& l : b.flip_lines) j.value(l);
  j.end_array().key("stages").begin_array();
  for (const StageCheck& s : b.stages) {
    j.begin_object().kv("stage", s.stage).kv("checked", s.checked).kv("violations", s.violations);
    j.kv("worst_ratio", s.worst_ratio).kv("first_violation", s.first_violation).end_object();
  }
  j.end_array().end_object();
}

int run_check(const CheckArgs& a, bool impls_given) {
  std::vector<Impl> wanted;
  {
    size_t pos = 0;
    while (pos <= a.impls.size()) {
      const size_t c = std::min(a.impls.find(',', pos), a.impls.size());
      wanted.push_back(parse_impl(a.impls.substr(pos, c - pos), "--impls"));
      pos = c + 1;
    }
  }
  std::unique_ptr<TempDir> tmp;
  std::string model_path = a.model;
  std::string model_note;
  if (model_path.empty()) {
    tmp = std::make_unique<TempDir>();
    const GenOptions o = default_model_options();
    model_path = tmp->path() + "/default-" + o.preset + ".gguf";
    write_model(o, model_path);
    model_note = "embedded default (preset " + o.preset + ", " + std::to_string(o.n_layers) + " layers, seed " +
                 std::to_string(o.seed) + ")";
  }
  const LoadedModel m = load_model(model_path);
  const MoeConfig& c = m.file.config();
  if (model_note.empty()) model_note = model_path;

  std::map<Impl, Dump> dumps;
  std::map<Impl, std::string> not_run;
  RunSpec spec;
  spec.tokens = a.tokens;
  spec.input.seed = a.input_seed;
  spec.taps = true;
  spec.knobs.precision = a.precision == "exact" ? RefPrecision::kExact : RefPrecision::kModel;
  if (!a.layers.empty()) spec.layers = parse_layer_list(a.layers);
  const int64_t n_layers = spec.layers.empty() ? m.file.n_layers() : static_cast<int64_t>(spec.layers.size());
  auto has = [&](Impl i) { return dumps.count(i) > 0; };
  // The ref leg's verdict runs the reference once more, in Exact mode, inside the bounds check.
  std::vector<LayerTaps> exact;
  {
    Progress p("check", n_layers * static_cast<int64_t>(wanted.size()), !a.json);
    for (Impl i : kAllImpls) {
      if (std::find(wanted.begin(), wanted.end(), i) == wanted.end()) continue;
      std::string why;
      if (!impl_available(i, &why)) {
        if (impls_given) throw InputError("--impls " + impl_name(i) + ": " + why);
        not_run[i] = why;
        continue;
      }
      spec.impl = i;
      dumps.emplace(i, run_layers(m, spec, &p));
      dumps[i].path = impl_name(i);
    }
  }
  if (dumps.empty())
    throw InputError("no implementation could run: " + (not_run.empty() ? std::string("none requested") : not_run.begin()->second));
  if (!a.keep.empty()) {
    std::filesystem::create_directories(a.keep);
    for (auto& [i, d] : dumps) write_dump(a.keep + "/" + impl_name(i) + ".h5", d);
  }

  std::vector<Leg> legs;
  if (has(Impl::kRef) && (has(Impl::kEmu) || has(Impl::kCuda))) {
    // emu when it ran, else cuda (whose every bit the emulation's contract fixes).
    const Impl other = has(Impl::kEmu) ? Impl::kEmu : Impl::kCuda;
    DiffOptions o = ref_info_options();
    std::vector<std::vector<float>> bias(static_cast<size_t>(m.file.n_layers()));
    for (int L : dumps.at(Impl::kRef).meta.layers) {
      const LayerWeights w = m.file.layer(L);
      bias[L].assign(w.bias, w.bias + c.n_routed);
    }
    o.bias = [&bias](int L) { return bias[static_cast<size_t>(L)].data(); };
    Leg leg{"ref~" + impl_name(other), diff_dumps(dumps.at(Impl::kRef), dumps.at(other), o), {}, {}, {}, false};
    Progress p("bounds", n_layers, !a.json);
    const Dump& od = dumps.at(other);
    leg.report.same = true;
    for (size_t li = 0; li < od.layers.size(); ++li) {
      const LayerTaps& t = od.layers[li];
      exact.emplace_back();
      leg.bounds.push_back(check_emu_against_exact(m.file.layer(t.layer), t, spec.knobs.router, &exact.back()));
      const LayerDiff& info = leg.report.layers[li];
      leg.pass.push_back(ref_leg_pass(info, leg.bounds.back()));
      leg.first_failing.push_back(ref_leg_first_failing(info, leg.bounds.back()));
      leg.report.same = leg.report.same && leg.pass.back();
      p.step("layer " + std::to_string(t.layer) + " bounds");
    }
    legs.push_back(std::move(leg));
  }
  if (has(Impl::kEmu) && has(Impl::kCuda)) {
    Leg leg{"emu=cuda", diff_dumps(dumps.at(Impl::kEmu), dumps.at(Impl::kCuda), exact_leg_options()), {}, {}, {}, true};
    for (const LayerDiff& l : leg.report.layers) {
      leg.pass.push_back(l.pass);
      leg.first_failing.push_back(l.first_failing);
    }
    legs.push_back(std::move(leg));
  }
  bool pass = true;
  for (const Leg& l : legs) pass = pass && l.report.same;

  const Dump& main_dump = has(Impl::kEmu) ? dumps.at(Impl::kEmu) : dumps.begin()->second;
  // Output norms: every implementation run, and the Exact reference when the ref run was Model.
  auto norms_of = [&](size_t li) {
    std::vector<std::pair<std::string, double>> n;
    for (const auto& [i, d] : dumps) n.emplace_back(impl_name(i), l2(d.layers[li].output));
    if (!exact.empty() && spec.knobs.precision != RefPrecision::kExact) n.emplace_back("ref-exact", l2(exact[li].output));
    return n;
  };

  if (a.json) {
    Json j;
    j.begin_object().kv("model", model_note).kv("model_sha256", m.sha256).kv("tokens", main_dump.meta.tokens);
    j.kv("input_seed", a.input_seed).key("ran").begin_array();
    for (const auto& [i, d] : dumps) j.value(impl_name(i));
    j.end_array().key("not_run").begin_object();
    for (const auto& [i, why] : not_run) j.kv(impl_name(i), why);
    j.end_object().key("legs").begin_array();
    for (const Leg& l : legs) {
      j.begin_object().kv("leg", l.name).kv("pass", l.report.same).key("first_failing").begin_array();
      for (const std::string& f : l.first_failing) j.value(f);
      j.end_array();
      if (!l.exact) {
        j.key("bounds").begin_array();
        for (const BoundsReport& b : l.bounds) bounds_json(j, b);
        j.end_array().key("nmse_info");
      } else {
        j.key("report");
      }
      diff_json(j, l.report);
      j.end_object();
    }
    j.end_array().key("layers").begin_array();
    for (size_t li = 0; li < main_dump.layers.size(); ++li) {
      const LayerTaps& t = main_dump.layers[li];
      j.begin_object().kv("layer", t.layer).key("tokens_per_expert").begin_array();
      std::vector<int64_t> hist(static_cast<size_t>(c.n_routed), 0);
      for (int32_t e : t.topk_ids) ++hist[e];
      for (int64_t h : hist) j.value(h);
      j.end_array().key("output_l2").begin_object();
      for (const auto& [name, v] : norms_of(li)) j.kv(name, v);
      j.end_object().end_object();
    }
    j.end_array().kv("pass", pass).end_object();
    std::printf("%s\n", j.str().c_str());
    return pass ? kExitSame : kExitDiffers;
  }

  std::printf("moecheck check: model %s\n  dim %lld, inter %lld, %lld experts, top %lld; %lld token(s) per layer, input seed %llu\n",
              model_note.c_str(), static_cast<long long>(c.dim), static_cast<long long>(c.inter),
              static_cast<long long>(c.n_routed), static_cast<long long>(c.topk),
              static_cast<long long>(main_dump.meta.tokens), static_cast<unsigned long long>(a.input_seed));
  std::string ran;
  for (const auto& [i, d] : dumps) {
    if (!ran.empty()) ran += ", ";
    ran += impl_name(i) + " (" + d.meta.variant + ")";
  }
  std::printf("  ran: %s\n", ran.c_str());
  for (const auto& [i, why] : not_run) std::printf("  not run: %s: %s\n", impl_name(i).c_str(), why.c_str());
  std::printf("  legs: ref~emu within the bounds derived against the reference in Exact mode (docs/numerics.md),\n"
              "        column 'bound': worst |diff| / bound; column 'nmse': vs the ref run above, information only;\n"
              "        emu=cuda bit for bit\n");

  // The emu=cuda column stays in the table when cuda could not run, saying so.
  const bool cuda_column_idle = not_run.count(Impl::kCuda) > 0 && has(Impl::kEmu);
  for (size_t li = 0; li < main_dump.layers.size(); ++li) {
    const LayerTaps& t = main_dump.layers[li];
    std::printf("\nlayer %d\n  %s", t.layer, pad("stage", 15).c_str());
    for (const Leg& l : legs) {
      if (l.exact) std::printf("%s", pad(l.name, 16).c_str());
      else std::printf("%s%s", pad(l.name + " bound", 28).c_str(), pad(l.name + " nmse", 14).c_str());
    }
    if (cuda_column_idle) std::printf("%s", pad("emu=cuda", 16).c_str());
    if (legs.empty()) std::printf("(one implementation ran: nothing to compare)");
    std::printf("\n");
    const std::vector<StageDiff>& stages = legs.empty() ? std::vector<StageDiff>{} : legs[0].report.layers[li].stages;
    for (size_t si = 0; si < stages.size(); ++si) {
      std::printf("  %s", pad(stages[si].stage, 15).c_str());
      for (const Leg& l : legs) {
        const StageDiff* s = find_stage(l.report.layers[li], stages[si].stage);
        if (l.exact) std::printf("%s", pad(exact_cell(s), 16).c_str());
        else std::printf("%s%s", pad(bound_cell(s, l.bounds[li]), 28).c_str(), pad(nmse_cell(s), 14).c_str());
      }
      if (cuda_column_idle) std::printf("not run");
      std::printf("\n");
    }
    for (const Leg& l : legs) {
      std::printf("  %s: %s", l.name.c_str(), l.pass[li] ? "agree" : ("BROKE first at " + l.first_failing[li]).c_str());
      if (l.exact) {
        std::printf("\n");
        const LayerDiff& ld = l.report.layers[li];
        if (!ld.pass)
          if (const StageDiff* s = find_stage(ld, ld.first_failing))
            for (size_t k = 0; k < s->first.size() && k < 3; ++k) std::printf("    %s\n", mismatch_line(s->first[k], s->dtype).c_str());
        continue;
      }
      const BoundsReport& b = l.bounds[li];
      if (b.flips > 0)
        std::printf(" (%lld routing flip(s), %lld explained by the logit bound)", static_cast<long long>(b.flips),
                    static_cast<long long>(b.flips - b.unexplained_flips));
      std::printf("\n");
      for (size_t k = 0; k < b.flip_lines.size() && k < 3; ++k) std::printf("    %s\n", b.flip_lines[k].c_str());
      if (l.pass[li]) continue;
      if (const StageDiff* s = find_stage(l.report.layers[li], l.first_failing[li]);
          s != nullptr && (s->stage == "input" || s->stage == "shared.weights")) {
        for (size_t k = 0; k < s->first.size() && k < 3; ++k) std::printf("    %s\n", mismatch_line(s->first[k], s->dtype).c_str());
      }
      for (const StageCheck& s : b.stages)
        if (s.violations > 0) std::printf("    %s: %lld of %lld over; first: %s\n", s.stage.c_str(),
                                          static_cast<long long>(s.violations), static_cast<long long>(s.checked),
                                          s.first_violation.c_str());
    }
    std::vector<int64_t> hist(static_cast<size_t>(c.n_routed), 0);
    for (int32_t e : t.topk_ids) ++hist[e];
    std::string h;
    for (int64_t e = 0; e < c.n_routed; ++e)
      if (hist[e] > 0) {
        if (!h.empty()) h += " ";
        h += std::to_string(e) + ":" + std::to_string(hist[e]);
      }
    std::printf("  routing (%s): tokens per expert %s\n", main_dump.meta.implementation.c_str(), h.c_str());
    std::string norms;
    for (const auto& [name, v] : norms_of(li)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %.6g", name.c_str(), v);
      if (!norms.empty()) norms += ", ";
      norms += buf;
    }
    std::printf("  output L2 norm: %s\n", norms.c_str());
  }
  std::printf("\nresult: %s\n", pass ? (legs.empty() ? "ran (nothing to compare)" : "PASS") : "FAIL");
  return pass ? kExitSame : kExitDiffers;
}

}  // namespace

void add_check(CLI::App& app, int& rc) {
  auto a = std::make_shared<CheckArgs>();
  CLI::App* s = app.add_subcommand("check", "Run every available implementation and compare them (the main job)");
  s->footer("Examples:\n"
            "  moecheck check                                # embedded default: tiny, 2 layers, seed 1, 8 tokens\n"
            "  moecheck check --model small.gguf --tokens 4 --impls ref,emu\n"
            "  moecheck check --keep out/                    # also write out/ref.h5, out/emu.h5, out/cuda.h5\n"
            "Legs: ref~emu within the per-stage bounds derived against the reference in Exact mode\n"
            "(docs/numerics.md; NMSE vs the --precision run shown for information); emu=cuda bit for bit.\n"
            "cuda runs when a GPU is present\n"
            "(the reason is printed when it is not).\n"
            "Exit codes: 0 every leg agrees, 1 a leg differs, 2 error.");
  s->add_option("--model", a->model, "model GGUF file (default: the embedded tiny model, generated on the fly)");
  CLI::Option* impls = s->add_option("--impls", a->impls, "implementations to run, e.g. ref,emu")->capture_default_str();
  s->add_option("--tokens", a->tokens, "tokens per layer")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--layers", a->layers, "layers, e.g. 0,2-5 (default: all)");
  s->add_option("--input-seed", a->input_seed, "seed of the generated inputs")->capture_default_str();
  s->add_option("--precision", a->precision, "precision of the reference run whose NMSE is shown (the verdict always uses Exact)")->check(CLI::IsMember({"model", "exact"}))
      ->capture_default_str();
  s->add_option("--keep", a->keep, "write each implementation's dump (with taps) into this directory");
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, impls, &rc] { rc = run_check(*a, impls->count() > 0); });
}

}  // namespace moecheck::cli
