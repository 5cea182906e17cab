// `moecheck sensitivity`: how small a bug the check catches (compare/sensitivity.h). The model is
// mapped twice: read-only for the reference and the legs, copy-on-write for the implementation
// under test, whose bytes the perturbations change in place (private pages: the file and the
// other view never change). Contract: docs/cli.md "sensitivity", docs/detection.md.
#include <cstdio>
#include <memory>

#include "compare/sensitivity.h"
#include "core/error.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/preflight.h"
#include "tools/progress.h"
#include "tools/report.h"
#include "tools/runner.h"

namespace moecheck::cli {
namespace {

struct SensitivityArgs {
  std::string model;
  int layer = 0;
  int64_t tokens = 8;
  uint64_t input_seed = 1;
  std::string adversarial = "on";
  std::string impl = "emu";
  std::string router = "staged";
  int expert = -1;
  std::string classes;
  std::string image_tokens;
  bool json = false;
};

std::vector<PerturbClass> parse_classes(const std::string& list) {
  if (list.empty()) return {std::begin(kAllPerturbClasses), std::end(kAllPerturbClasses)};
  std::vector<PerturbClass> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t c = std::min(list.find(',', pos), list.size());
    out.push_back(parse_perturb_class(list.substr(pos, c - pos), "--classes"));
    pos = c + 1;
  }
  return out;
}

// A size as the table shows it: eps in the ladder's own digits, rows as an integer.
std::string size_text(PerturbClass c, double v) {
  if (c == PerturbClass::kClamp) return "off";
  if (c == PerturbClass::kSwap || c == PerturbClass::kOffset || c == PerturbClass::kQuants)
    return std::to_string(static_cast<int64_t>(v)) + (v == 1 ? " row" : " rows");
  return fmt_num(v);
}

std::string step_text(const SensitivityRow& r, int i) {
  if (i < 0) return "never";
  return size_text(r.cls, r.steps[static_cast<size_t>(i)].size);
}

std::string catch_text(const LegCatch& c) {
  return c.caught ? std::string("FAIL at ") + stage_name(c.stage) : "agree";
}

void text_row(std::string& o, const SensitivityRow& r) {
  char buf[512];
  if (r.no_effect) {
    std::snprintf(
        buf, sizeof buf,
        "  %-18s %-12s no effect at any size: the implementation computed the same bits\n",
        r.tensor.c_str(), perturb_class_name(r.cls));
    o += buf;
    return;
  }
  std::string rule = step_text(r, r.first_rule);
  if (r.first_rule < 0)
    rule += " (NMSE " + fmt_num(r.steps.back().output_nmse) + " at " +
            size_text(r.cls, r.steps.back().size) + ")";
  std::string first = step_text(r, r.first);
  if (r.first >= 0 && r.cls == PerturbClass::kScale)
    first += " (d moved " + fmt_num(r.steps[static_cast<size_t>(r.first)].effective) + ")";
  std::snprintf(buf, sizeof buf, "  %-18s %-12s %-24s %-34s %-10s %-10s %-10s %s\n",
                r.tensor.c_str(), perturb_class_name(r.cls), first.c_str(), r.first_by.c_str(),
                step_text(r, r.first_bounds).c_str(), step_text(r, r.first_stat).c_str(),
                step_text(r, r.first_local).c_str(), rule.c_str());
  o += buf;
}

std::string render_text(const SensitivityReport& r, const std::string& model,
                        const std::string& impl, int64_t adversarial) {
  std::string o = "moecheck sensitivity: model " + model + ", layer " + std::to_string(r.layer) +
                  ", " + std::to_string(r.tokens - adversarial) + " seeded + " +
                  std::to_string(adversarial) + " adversarial token(s), implementation " + impl +
                  "\n";
  o += "  perturbed: routed expert " + std::to_string(r.expert) + " (picked by " +
       std::to_string(r.expert_tokens) +
       " token(s)) and the implementation's config; the reference and every leg read the "
       "unperturbed model\n";
  o += "  baseline (nothing planted): bounds " + catch_text(r.base_bounds) + ", stat " +
       catch_text(r.base_stat) + ", local " + catch_text(r.base_local) + ", output NMSE " +
       fmt_num(r.base_nmse) + "\n";
  o += "  sizes: scale and route-scale: eps of x (1 + eps); swap, offset, quants: rows of the "
       "matrix; clamp: off\n\n";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-18s %-12s %-24s %-34s %-10s %-10s %-10s %s\n", "tensor",
                "class", "smallest caught", "first caught by", "bounds", "stat", "local",
                "NMSE<=5e-4 rule");
  o += buf;
  for (const SensitivityRow& row : r.rows) text_row(o, row);
  o +=
      std::string("\nresult: ") +
      (!r.baseline_clean()
           ? "BASELINE FAILS (the unperturbed implementation does not pass: no size means anything)"
       : r.all_caught() ? "every perturbation caught"
                        : "some perturbation NOT caught within its ladder") +
      "\n";
  return o;
}

void json_catch(Json& j, const char* k, const LegCatch& c) {
  j.key(k).begin_object().kv("caught", c.caught);
  if (c.caught) j.kv("stage", stage_name(c.stage));
  j.end_object();
}

std::string render_json(const SensitivityReport& r, const std::string& model,
                        const std::string& impl) {
  Json j;
  j.begin_object()
      .kv("model", model)
      .kv("implementation", impl)
      .kv("layer", r.layer)
      .kv("tokens", r.tokens);
  j.kv("expert", r.expert).kv("expert_tokens", r.expert_tokens).kv("nmse_rule", kNmseRule);
  j.key("baseline").begin_object();
  json_catch(j, "bounds", r.base_bounds);
  json_catch(j, "stat", r.base_stat);
  json_catch(j, "local", r.base_local);
  j.kv("output_nmse", r.base_nmse).end_object();
  j.key("rows").begin_array();
  for (const SensitivityRow& row : r.rows) {
    auto idx = [&](int i) { return i < 0 ? -1.0 : row.steps[static_cast<size_t>(i)].size; };
    j.begin_object().kv("tensor", row.tensor).kv("class", perturb_class_name(row.cls));
    j.kv("smallest_caught", idx(row.first)).kv("first_caught_by", row.first_by);
    j.kv("smallest_bounds", idx(row.first_bounds)).kv("smallest_stat", idx(row.first_stat));
    j.kv("smallest_local", idx(row.first_local)).kv("smallest_nmse_rule", idx(row.first_rule));
    j.kv("no_effect", row.no_effect);
    j.key("steps").begin_array();
    for (const SensitivityStep& s : row.steps) {
      j.begin_object()
          .kv("size", s.size)
          .kv("effective", s.effective)
          .kv("output_nmse", s.output_nmse);
      j.kv("no_effect", s.no_effect);
      if (s.judged_bounds) json_catch(j, "bounds", s.bounds);
      if (s.judged_stat) json_catch(j, "stat", s.stat);
      if (s.judged_local) json_catch(j, "local", s.local);
      j.end_object();
    }
    j.end_array().end_object();
  }
  j.end_array()
      .kv("baseline_clean", r.baseline_clean())
      .kv("all_caught", r.all_caught())
      .end_object();
  return j.str();
}

// One layer's dominant allocations (docs/cli.md "Checks before any work"): the baseline's taps, a
// step's taps and the implementation's buffers, and the Exact reference's f64 working set with
// its taps, each about one layer of taps.
// `layer_bytes`: a synthetic model's layer (golden/synthetic_model.h), made twice (the truth and
// the copy the steps perturb); 0 for a file.
void require_sensitivity_memory(const SensitivityArgs& a, const MoeConfig& c,
                                uint64_t layer_bytes = 0) {
  const uint64_t T =
      static_cast<uint64_t>(a.tokens + (a.adversarial == "on" ? kAdversarialTokens : 0));
  const uint64_t tap = tap_bytes_per_token(c);
  MemoryNeed need;
  need.bytes = 5 * T * tap + 2 * layer_bytes;
  need.how =
      "5 x " + std::to_string(T) + " token(s) x " + bytes_text(tap) +
      " (baseline and step taps, the implementation's buffers, the Exact reference)" +
      (layer_bytes ? " + 2 x " + bytes_text(layer_bytes) + " (the synthetic layer, twice)" : "");
  require_memory("--tokens", std::to_string(a.tokens), need);
}

int run_sensitivity_cmd(const SensitivityArgs& a) {
  if (a.model.empty()) require_sensitivity_memory(a, default_model_options().config);
  std::unique_ptr<TempDir> tmp;
  std::string path = a.model, note = a.model;
  if (path.empty()) {
    tmp = std::make_unique<TempDir>();
    const GenOptions o = default_model_options();
    path = tmp->path() + "/default-" + o.preset + ".gguf";
    write_model(o, path);
    note = "embedded default (preset " + o.preset + ", " + std::to_string(o.n_layers) +
           " layers, seed " + std::to_string(o.seed) + ")";
  }
  const ModelFile truth = ModelFile::open(path);
  if (!a.model.empty()) require_sensitivity_memory(a, truth.config(), synthetic_layer_bytes(truth));
  const ModelFile cow = ModelFile::open(path, gguf::MapMode::kCopyOnWrite);
  if (a.layer < 0 || a.layer >= truth.n_layers())
    throw InputError("--layer " + std::to_string(a.layer) + ": " + path + " has " +
                     std::to_string(truth.n_layers()) + " layer(s)");
  RunSpec spec;
  spec.impl = parse_impl(a.impl, "--impl");
  if (spec.impl == Impl::kRef)
    throw InputError("--impl ref: the reference is what the legs judge against");
  std::string why;
  if (!impl_available(spec.impl, &why)) throw InputError("--impl " + a.impl + ": " + why);
  spec.knobs.router = a.router == "plain" ? RouterVariant::kPlain : RouterVariant::kStaged;
  spec.tokens = a.tokens;
  spec.input.seed = a.input_seed;
  spec.input.adversarial = a.adversarial == "on";
  SensitivitySetup s;
  s.truth = truth.layer(a.layer);
  s.impl = cow.layer(a.layer);
  s.writable = [&cow](const void* p, size_t n) { return cow.writable(p, n); };
  s.x = seeded_layer_input(spec, s.truth, a.layer);
  s.T = static_cast<int64_t>(s.x.size()) / s.truth.config.dim;
  if (!a.image_tokens.empty()) {
    s.image_mask = parse_image_tokens(a.image_tokens, s.T);
    require_bias_vl(s.truth, path, "--image-tokens");
  }
  s.run = [&spec, &s](const LayerWeights& w, const std::vector<uint16_t>& x, int64_t T) {
    LayerTaps t;
    t.output = forward_one(spec, w, x, T, &t, s.image_mask.empty() ? nullptr : s.image_mask.data());
    t.layer = w.layer;
    t.tokens = T;
    t.input = x;
    t.image_mask = s.image_mask;
    return t;
  };
  s.router = spec.knobs.router;
  s.expert = a.expert;
  s.classes = parse_classes(a.classes);
  Progress p("sensitivity", 0, !a.json);
  s.on_step = [&p](const std::string& what) { p.step(what); };
  const SensitivityReport r = run_sensitivity(s);
  const int64_t adv = s.T - a.tokens;
  std::printf("%s", a.json ? (render_json(r, note, a.impl) + "\n").c_str()
                           : render_text(r, note, a.impl, adv).c_str());
  return r.baseline_clean() && r.all_caught() ? kExitSame : kExitDiffers;
}

}  // namespace

void add_sensitivity(CLI::App& app, int& rc) {
  auto a = std::make_shared<SensitivityArgs>();
  CLI::App* s = app.add_subcommand(
      "sensitivity", "Plant bugs of growing size and report the smallest each leg catches");
  s->footer(
      "Examples:\n"
      "  moecheck sensitivity                                  # embedded default model, layer 0\n"
      "  moecheck sensitivity --model ds41.gguf --tokens 1 --adversarial off --classes scale\n"
      "The implementation under test reads a copy-on-write view of the model with one routed\n"
      "expert's bytes (or its config) perturbed; the reference and every leg read the file as is.\n"
      "Exit codes: 0 every perturbation caught, 1 one was not (or the unperturbed run fails a "
      "leg), 2 error.");
  s->add_option("--model", a->model,
                "GGUF model or synthetic spec (default: the embedded tiny model)");
  s->add_option("--layer", a->layer, "layer to perturb")->capture_default_str();
  s->add_option("--tokens", a->tokens, "seeded tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  s->add_option("--input-seed", a->input_seed, "seed of the generated inputs")
      ->check(kNonNegative)
      ->capture_default_str();
  s->add_option("--adversarial", a->adversarial, "append the layer's adversarial tokens")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  s->add_option("--impl", a->impl, "implementation under test")
      ->check(CLI::IsMember({"emu", "cuda"}))
      ->capture_default_str();
  s->add_option("--router", a->router, "router variant of emu / cuda")
      ->check(CLI::IsMember({"plain", "staged"}))
      ->capture_default_str();
  s->add_option("--expert", a->expert,
                "routed expert to perturb (default: the one most tokens pick)");
  s->add_option("--classes", a->classes,
                "scale,swap,offset,quants,route-scale,clamp (default: all)");
  s->add_option("--image-tokens", a->image_tokens,
                "tokens inside image spans, e.g. 3-5 (adversarial ones included): routed with "
                "bias_vl by the implementation and the reference (needs "
                "blk.N.exp_probs_b_vl.bias)")
      ->check(image_tokens_validator());
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, &rc] { rc = run_sensitivity_cmd(*a); });
}

}  // namespace moecheck::cli
