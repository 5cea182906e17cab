// `moecheck check`: the main job. Runs every available implementation on the same inputs
// (the embedded default model when no --model is given), compares ref ~ emu within the stated
// bounds and emu = cuda bit for bit, and prints one three-way table per layer with the first
// stage that broke on each leg, the routing histogram and the output norms.
// Contract: docs/cli.md "check", tools/check_policy.h.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "emulate/error.h"
#include "emulate/numfmt.h"
#include "golden/dump_diff.h"
#include "golden/generator.h"
#include "tools/check_policy.h"
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
  DiffReport report;
  std::vector<int64_t> explained;  // per layer
};

double l2(const std::vector<uint16_t>& y) {
  double s = 0;
  for (uint16_t v : y) s += static_cast<double>(bf16_to_f32(v)) * bf16_to_f32(v);
  return std::sqrt(s);
}

std::string cell(const StageDiff* s, bool exact, const DiffOptions& o) {
  if (s == nullptr) return "not run";
  if (s->status == "absent") return "-";
  if (!s->status.empty()) return std::string(s->pass ? "n/a " : "FAIL ") + "(" + s->status + ")";
  std::string v = s->pass ? "ok   " : "FAIL ";
  if (s->stage == "topk_ids") return v + std::to_string(s->out_of_tol) + " flip(s)";
  if (exact || s->dtype == "block_q8_1") return v + (s->out_of_tol == 0 ? "bitwise" : std::to_string(s->out_of_tol) + " differ");
  auto it = o.stage_tolerance.find(s->stage);
  const Tolerance& t = it != o.stage_tolerance.end() ? it->second : o.tolerance;
  if (t.mode == ToleranceMode::kExact) return v + (s->out_of_tol == 0 ? "bitwise" : std::to_string(s->out_of_tol) + " differ");
  return v + "nmse " + fmt_num(s->nmse) + " <= " + fmt_num(t.nmse);
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s + " ";
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

  const int first_layer = dumps.begin()->second.meta.layers.front();
  const bool kquant_shared = m.file.layer(first_layer).shared_gate.type != GgmlType::kBF16;
  const DiffOptions ref_options = ref_leg_options(kquant_shared);
  std::vector<Leg> legs;
  auto has = [&](Impl i) { return dumps.count(i) > 0; };
  if (has(Impl::kRef) && (has(Impl::kEmu) || has(Impl::kCuda))) {
    const Impl other = has(Impl::kEmu) ? Impl::kEmu : Impl::kCuda;
    DiffOptions o = ref_leg_options(kquant_shared);
    std::vector<std::vector<float>> bias(static_cast<size_t>(m.file.n_layers()));
    for (int L : dumps.at(Impl::kRef).meta.layers) {
      const LayerWeights w = m.file.layer(L);
      bias[L].assign(w.bias, w.bias + c.n_routed);
    }
    o.bias = [&bias](int L) { return bias[static_cast<size_t>(L)].data(); };
    Leg leg{"ref~" + impl_name(other), diff_dumps(dumps.at(Impl::kRef), dumps.at(other), o), {}};
    leg.report.same = true;
    for (LayerDiff& l : leg.report.layers) {
      leg.explained.push_back(explain_flips(l, c.gate_temp));
      leg.report.same = leg.report.same && l.pass;
    }
    legs.push_back(std::move(leg));
  }
  if (has(Impl::kEmu) && has(Impl::kCuda)) {
    Leg leg{"emu=cuda", diff_dumps(dumps.at(Impl::kEmu), dumps.at(Impl::kCuda), exact_leg_options()), {}};
    leg.explained.assign(leg.report.layers.size(), 0);
    legs.push_back(std::move(leg));
  }
  bool pass = true;
  for (const Leg& l : legs) pass = pass && l.report.same;

  const Dump& main_dump = has(Impl::kEmu) ? dumps.at(Impl::kEmu) : dumps.begin()->second;

  if (a.json) {
    Json j;
    j.begin_object().kv("model", model_note).kv("model_sha256", m.sha256).kv("tokens", main_dump.meta.tokens);
    j.kv("input_seed", a.input_seed).key("ran").begin_array();
    for (const auto& [i, d] : dumps) j.value(impl_name(i));
    j.end_array().key("not_run").begin_object();
    for (const auto& [i, why] : not_run) j.kv(impl_name(i), why);
    j.end_object().key("legs").begin_array();
    for (const Leg& l : legs) {
      j.begin_object().kv("leg", l.name).key("report");
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
      for (const auto& [i, d] : dumps) j.kv(impl_name(i), l2(d.layers[li].output));
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
  std::printf("  legs: ref~emu within per-stage NMSE bounds (docs/cli.md), emu=cuda bit for bit\n");

  // The emu=cuda column stays in the table when cuda could not run, saying so.
  const bool cuda_column_idle = not_run.count(Impl::kCuda) > 0 && has(Impl::kEmu);
  for (size_t li = 0; li < main_dump.layers.size(); ++li) {
    const LayerTaps& t = main_dump.layers[li];
    std::printf("\nlayer %d\n  %s", t.layer, pad("stage", 15).c_str());
    for (const Leg& l : legs) std::printf("%s", pad(l.name, 30).c_str());
    if (cuda_column_idle) std::printf("%s", pad("emu=cuda", 30).c_str());
    if (legs.empty()) std::printf("(one implementation ran: nothing to compare)");
    std::printf("\n");
    const std::vector<StageDiff>& stages = legs.empty() ? std::vector<StageDiff>{} : legs[0].report.layers[li].stages;
    for (size_t si = 0; si < stages.size(); ++si) {
      std::printf("  %s", pad(stages[si].stage, 15).c_str());
      for (const Leg& l : legs) {
        const StageDiff* s = nullptr;
        for (const StageDiff& x : l.report.layers[li].stages)
          if (x.stage == stages[si].stage) s = &x;
        std::printf("%s", pad(cell(s, l.name == "emu=cuda", ref_options), 30).c_str());
      }
      if (cuda_column_idle) std::printf("not run");
      std::printf("\n");
    }
    for (const Leg& l : legs) {
      const LayerDiff& ld = l.report.layers[li];
      std::printf("  %s: %s", l.name.c_str(), ld.pass ? "agree" : ("BROKE first at " + ld.first_failing).c_str());
      if (ld.routing.flips > 0)
        std::printf(" (%lld routing flip(s), %lld explained by logit differences)", static_cast<long long>(ld.routing.flips),
                    static_cast<long long>(l.explained[li]));
      std::printf("\n");
      if (!ld.pass)
        for (const StageDiff& s : ld.stages)
          if (s.stage == ld.first_failing)
            for (size_t k = 0; k < s.first.size() && k < 3; ++k) std::printf("    %s\n", mismatch_line(s.first[k], s.dtype).c_str());
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
    for (const auto& [i, d] : dumps) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %.6g", impl_name(i).c_str(), l2(d.layers[li].output));
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
            "Legs: ref~emu within per-stage NMSE bounds; emu=cuda bit for bit. cuda runs when a GPU is present\n"
            "(the reason is printed when it is not).\n"
            "Exit codes: 0 every leg agrees, 1 a leg differs, 2 error.");
  s->add_option("--model", a->model, "model GGUF file (default: the embedded tiny model, generated on the fly)");
  CLI::Option* impls = s->add_option("--impls", a->impls, "implementations to run, e.g. ref,emu")->capture_default_str();
  s->add_option("--tokens", a->tokens, "tokens per layer")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--layers", a->layers, "layers, e.g. 0,2-5 (default: all)");
  s->add_option("--input-seed", a->input_seed, "seed of the generated inputs")->capture_default_str();
  s->add_option("--precision", a->precision, "reference precision model | exact")->check(CLI::IsMember({"model", "exact"}))
      ->capture_default_str();
  s->add_option("--keep", a->keep, "write each implementation's dump (with taps) into this directory");
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, impls, &rc] { rc = run_check(*a, impls->count() > 0); });
}

}  // namespace moecheck::cli
