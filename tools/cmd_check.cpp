// `moecheck check`: the main job. Runs every available implementation on the same inputs (the
// embedded default model when no --model is given), then judge_check (compare/check.h: ref ~ emu
// within the bounds derived against the reference in Exact mode, emu = cuda bit for bit) and
// renders the result (tools/check_render.h). Contract: docs/cli.md "check".
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "compare/check.h"
#include "compare/import_check.h"
#include "core/error.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "tools/check_render.h"
#include "tools/commands.h"
#include "tools/preflight.h"
#include "tools/progress.h"
#include "tools/runner.h"
#include "tools/stream_flags.h"

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
  bool hash_file = false;
  std::string adversarial = "on";
  std::string image_tokens;
  std::string route = "host";
  bool route_given = false;
  bool precision_given = false;
  std::string against;  // an imported dump (moecheck import) to judge
  StreamArgs stream;    // the cuda run's expert cache (tools/stream_flags.h)
};

// The implementations asked for, in the order they run.
std::vector<Impl> wanted_impls(const std::string& list) {
  std::vector<Impl> wanted;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t c = std::min(list.find(',', pos), list.size());
    wanted.push_back(parse_impl(list.substr(pos, c - pos), "--impls"));
    pos = c + 1;
  }
  return wanted;
}

// --route sets the cuda implementation's knob; refused when cuda does not run (not asked for, or
// not available here), where it would change nothing.
RoutePlace route_knob(const CheckArgs& a, const std::vector<Impl>& wanted) {
  const RoutePlace r = parse_route_place(a.route, "--route");
  if (!a.route_given) return r;
  if (std::find(wanted.begin(), wanted.end(), Impl::kCuda) == wanted.end())
    throw InputError("--route " + a.route + ": only the cuda implementation has a route knob, " +
                     "and --impls " + a.impls + " does not run it");
  std::string why;
  if (!impl_available(Impl::kCuda, &why))
    throw InputError("--route " + a.route + ": cuda does not run here (" + why +
                     "), so the knob would change nothing");
  return r;
}

// The cuda run's expert cache (flags and environment overrides); its flags are refused when cuda
// does not run, as --route.
StreamKnobs stream_knob(const CheckArgs& a, const std::vector<Impl>& wanted) {
  const bool cuda = std::find(wanted.begin(), wanted.end(), Impl::kCuda) != wanted.end() &&
                    impl_available(Impl::kCuda, nullptr);
  if (!cuda) {
    if (a.stream.any_given())
      throw InputError(a.stream.first_given() +
                       ": the expert cache is the cuda implementation's, which this check does "
                       "not run (--impls " +
                       a.impls + ", or no GPU here)");
    return {};
  }
  StreamKnobs k = stream_knobs(a.stream, nullptr);
  validate_stream_knobs(k, false, parse_route_place(a.route, "--route") == RoutePlace::kDevice);
  return k;
}

// Runs every wanted implementation that can run here (with every stage tapped) into `in`; one
// that cannot is an error when --impls named it, else it is listed as not run with the reason.
void run_impls(const LoadedModel& m, const CheckArgs& a, bool impls_given, CheckInputs& in) {
  const std::vector<Impl> wanted = wanted_impls(a.impls);
  RunSpec spec;
  spec.knobs.route = route_knob(a, wanted);
  spec.knobs.stream = stream_knob(a, wanted);
  spec.input.image_tokens = a.image_tokens;
  spec.tokens = a.tokens;
  spec.input.seed = a.input_seed;
  spec.input.adversarial = a.adversarial == "on";
  spec.taps = true;
  spec.knobs.precision = a.precision == "exact" ? RefPrecision::kExact : RefPrecision::kModel;
  if (!a.layers.empty()) spec.layers = parse_layer_list(a.layers);
  const int hash = spec.layers.empty() ? m.file.layout().hash_layers : 0;
  if (hash > 0)  // left out by run_layers' default selection; said here
    in.not_run["layer" + std::string(hash > 1 ? "s 0-" + std::to_string(hash - 1) : " 0")] =
        "hash-routed (experts picked by token id, which no moecheck input carries)";
  const int64_t n_layers =
      spec.layers.empty() ? m.file.n_layers() - hash : static_cast<int64_t>(spec.layers.size());
  Progress p("check", n_layers * static_cast<int64_t>(wanted.size()), !a.json);
  for (Impl i : kAllImpls) {
    if (std::find(wanted.begin(), wanted.end(), i) == wanted.end()) continue;
    std::string why;
    if (!impl_available(i, &why)) {
      if (impls_given) throw InputError("--impls " + impl_name(i) + ": " + why);
      in.not_run[impl_name(i)] = why;
      continue;
    }
    spec.impl = i;
    Dump d = run_layers(m, spec, &p);
    d.path = impl_name(i);
    in.dumps.emplace(impl_name(i), std::move(d));
  }
  if (in.dumps.empty())
    throw InputError("no implementation could run: " + (in.not_run.empty()
                                                            ? std::string("none requested")
                                                            : in.not_run.begin()->second));
  in.router = spec.knobs.router;
  in.adversarial_from = spec.input.adversarial ? a.tokens : -1;
  in.ref_exact = spec.knobs.precision == RefPrecision::kExact;
}

// --precision sets the ref run's knob; refused when --impls does not run ref (it would change
// nothing).
void refuse_foreign_precision(const CheckArgs& a) {
  if (!a.precision_given) return;
  const std::vector<Impl> wanted = wanted_impls(a.impls);
  if (std::find(wanted.begin(), wanted.end(), Impl::kRef) == wanted.end())
    refuse_knob("--precision", a.precision, "ref", "precision",
                "--impls " + a.impls + " does not run it");
}

// The check's dominant allocations (docs/cli.md "Checks before any work"): every implementation's
// dump with taps, the Exact reference's taps per other implementation, the file image of one
// --keep dump while it is written, and the layer in flight (the Exact reference's f64 working set
// and its taps).
void require_check_memory(const CheckArgs& a, const MoeConfig& c, int64_t n_layers,
                          uint64_t made = 0) {
  uint64_t runs = 0;
  bool ref = false;
  for (Impl i : wanted_impls(a.impls)) {
    if (!impl_available(i, nullptr)) continue;
    ++runs;
    ref = ref || i == Impl::kRef;
  }
  const uint64_t exact = ref && runs > 1 ? runs - 1 : 0, image = a.keep.empty() ? 0 : 1;
  const uint64_t L =
      a.layers.empty() ? static_cast<uint64_t>(n_layers) : parse_layer_list(a.layers).size();
  const uint64_t T =
      static_cast<uint64_t>(a.tokens + (a.adversarial == "on" ? kAdversarialTokens : 0));
  const uint64_t tap = tap_bytes_per_token(c);
  MemoryNeed need;
  need.bytes = (runs + exact + image) * L * T * tap + 3 * T * tap + made;
  need.how = "(" + std::to_string(runs) + " dump(s) + " + std::to_string(exact) +
             " Exact-reference tap set(s)" + (image ? " + 1 --keep file image" : "") + ") x " +
             std::to_string(L) + " layer(s) x " + std::to_string(T) + " token(s) x " +
             bytes_text(tap) + " + 3 x " + std::to_string(T) + " x " + bytes_text(tap) +
             " (the layer in flight)" +
             (made ? " + " + bytes_text(made) + " (the synthetic model's layer in use)" : "");
  require_memory("--tokens", std::to_string(a.tokens), need);
}

// --against FILE: the reference (model precision, for NMSE), the kernel contract's emulation
// (the statistical leg's noise where the import has no taps) and the legs on the import's input.
int run_against(const CheckArgs& a, const std::string& model_path, const std::string& note) {
  const Dump im = read_dump(a.against);
  const LoadedModel m = load_model(model_path, a.hash_file);
  if (im.meta.config != m.file.config())
    throw InputError("--against " + a.against + ": its config differs from the model " + note);
  RunSpec spec;
  spec.taps = true;
  spec.input.dump_path = a.against;
  spec.layers.assign(im.meta.layers.begin(), im.meta.layers.end());
  spec.impl = Impl::kRef;
  Dump ref = run_layers(m, spec, nullptr);
  spec.impl = Impl::kEmu;
  Dump emu = run_layers(m, spec, nullptr);
  ImportCheckInputs in;
  in.imported = &im, in.contract = &emu, in.ref = &ref;
  in.layer = [&m](int L) { return m.file.layer(L); };
  in.router = spec.knobs.router;
  CheckResult r = judge_import(in);
  r.model = note;
  r.input_seed = im.meta.input_seed;
  std::printf("%s%s", a.json ? render_check_json(r).c_str() : render_check_text(r).c_str(),
              a.json ? "\n" : "");
  return r.pass ? kExitSame : kExitDiffers;
}

int run_check(const CheckArgs& a, bool impls_given) {
  refuse_foreign_precision(a);
  const std::vector<std::string> kept = {"ref.h5", "emu.h5", "cuda.h5"};
  if (!a.keep.empty()) require_output_dir("--keep", a.keep, kept, {{"--model", a.model}});
  if (a.model.empty())
    require_check_memory(a, default_model_options().config, default_model_options().n_layers);
  std::unique_ptr<TempDir> tmp;
  std::string model_path = a.model;
  std::string model_note = a.model;
  if (model_path.empty()) {
    tmp = std::make_unique<TempDir>();
    const GenOptions o = default_model_options();
    model_path = tmp->path() + "/default-" + o.preset + ".gguf";
    write_model(o, model_path);
    model_note = "embedded default (preset " + o.preset + ", " + std::to_string(o.n_layers) +
                 " layers, seed " + std::to_string(o.seed) + ")";
  }
  if (!a.against.empty()) return run_against(a, model_path, model_note);
  const LoadedModel m = load_model(model_path, a.hash_file);
  if (!a.model.empty())
    require_check_memory(a, m.file.config(), m.file.n_layers(), synthetic_layer_bytes(m.file));
  CheckInputs in;
  run_impls(m, a, impls_given, in);
  if (!a.keep.empty()) {
    std::filesystem::create_directories(a.keep);
    for (const auto& [name, d] : in.dumps) write_dump(a.keep + "/" + name + ".h5", d);
  }
  in.layer = [&m](int L) { return m.file.layer(L); };
  std::unique_ptr<Progress> bounds_progress;
  if (in.dumps.count("ref") > 0 && in.dumps.size() > 1) {
    bounds_progress = std::make_unique<Progress>(
        "bounds", static_cast<int64_t>(in.dumps.at("ref").layers.size()), !a.json);
    in.on_bounds_layer = [&](int L) {
      bounds_progress->step("layer " + std::to_string(L) + " bounds");
    };
  }
  CheckResult r = judge_check(in);
  bounds_progress.reset();
  r.model = model_note;
  r.input_seed = a.input_seed;
  std::printf("%s%s", a.json ? render_check_json(r).c_str() : render_check_text(r).c_str(),
              a.json ? "\n" : "");
  return r.pass ? kExitSame : kExitDiffers;
}

}  // namespace

void add_check(CLI::App& app, int& rc) {
  auto a = std::make_shared<CheckArgs>();
  CLI::App* s = app.add_subcommand(
      "check", "Run every available implementation and compare them (the main job)");
  s->footer(
      "Examples:\n"
      "  moecheck check                                # embedded default: tiny, 2 layers, seed 1, "
      "8 tokens\n"
      "  moecheck check --model small.gguf --tokens 4 --impls ref,emu\n"
      "  moecheck check --keep out/                    # also write out/ref.h5, out/emu.h5, "
      "out/cuda.h5\n"
      "  moecheck check --model tiny-vl.gguf --image-tokens 0-3,9  # gen --vision: bias_vl\n"
      "Legs: ref~emu within the per-stage bounds derived against the reference in Exact mode\n"
      "(docs/numerics.md; NMSE vs the --precision run shown for information); emu=cuda bit for "
      "bit.\n"
      "cuda runs when a GPU is present\n"
      "(the reason is printed when it is not).\n"
      "Exit codes: 0 every leg agrees, 1 a leg differs, 2 error.");
  s->add_option("--model", a->model,
                "model GGUF file or synthetic spec, e.g. synthetic:ds41,layers=40 (default: the "
                "embedded tiny model, generated on the fly)");
  CLI::Option* impls = s->add_option("--impls", a->impls, "implementations to run, e.g. ref,emu")
                           ->capture_default_str();
  CLI::Option* tokens = s->add_option("--tokens", a->tokens, "tokens per layer")
                            ->capture_default_str()
                            ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  CLI::Option* layers = s->add_option("--layers", a->layers, "layers, e.g. 0,2-5 (default: all)");
  CLI::Option* seed = s->add_option("--input-seed", a->input_seed, "seed of the generated inputs")
                          ->check(kNonNegative)
                          ->capture_default_str();
  CLI::Option* precision =
      s->add_option(
           "--precision", a->precision,
           "precision of the reference run whose NMSE is shown (the verdict always uses Exact)")
          ->check(CLI::IsMember({"model", "exact"}))
          ->capture_default_str();
  CLI::Option* keep = s->add_option(
      "--keep", a->keep, "write each implementation's dump (with taps) into this directory");
  CLI::Option* adversarial =
      s->add_option(
           "--adversarial", a->adversarial,
           "append the layer's adversarial tokens (clamps, zero / exact tie, near tie, +1e-20) to "
           "the --tokens seeded ones")
          ->check(CLI::IsMember({"on", "off"}))
          ->capture_default_str();
  CLI::Option* image =
      s->add_option(
           "--image-tokens", a->image_tokens,
           "tokens inside image spans, e.g. 3-17,40-60 (indices into each layer's tokens, "
           "adversarial ones included): every implementation routes them with bias_vl (the "
           "model must have blk.N.exp_probs_b_vl.bias)")
          ->check(image_tokens_validator());
  CLI::Option* route =
      s->add_option("--route", a->route,
                    "cuda: where the top-k selection runs, host | device (cuda must run)")
          ->capture_default_str();
  s->add_flag("--hash-file", a->hash_file,
              "also record the whole model file's SHA-256 in the dumps (reads the whole file)");
  add_stream_flags(s, a->stream);
  s->add_flag("--json", a->json, "machine-readable output");
  CLI::Option* against =
      s->add_option("--against", a->against,
                    "judge an imported dump (moecheck import) against the reference on its input");
  // The import fixes the layer, tokens, input and mask; these would be silently ignored.
  for (CLI::Option* o : {impls, route, tokens, layers, seed, precision, keep, adversarial, image})
    against->excludes(o);
  const StreamArgs& st = a->stream;
  for (CLI::Option* o : {st.slots_opt, st.bytes_opt, st.readers_opt, st.prefetch_opt,
                         st.pipeline_opt, st.checks_opt, st.source_opt})
    against->excludes(o);
  s->callback([a, impls, route, precision, &rc] {
    a->route_given = route->count() > 0;
    a->precision_given = precision->count() > 0;
    rc = run_check(*a, impls->count() > 0);
  });
}

}  // namespace moecheck::cli
