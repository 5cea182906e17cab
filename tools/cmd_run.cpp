// `moecheck run`: one implementation over a model's layers, written as an HDF5 dump.
// Contract: docs/cli.md "run" (inputs, knobs), docs/golden-format.md (the file).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "compare/check.h"
#include "core/error.h"
#include "core/numfmt.h"
#include "golden/adversarial.h"
#include "golden/trace_file.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/preflight.h"
#include "tools/progress.h"
#include "tools/runner.h"
#include "tools/stream_flags.h"

namespace moecheck::cli {
namespace {

struct RunArgs {
  std::string impl;
  std::string model;
  std::string layers;
  int64_t tokens = 8;
  uint64_t input_seed = 1;
  std::string input;
  bool chain = false;
  bool residual = false;
  std::string trace;
  bool taps = false;
  std::string out;
  std::string precision = "model";
  std::string router = "staged";
  int warps = 8;
  std::string shared_side = "on";
  int mmvq_max_rows = -1;  // cuda::kMmvqRowsAuto
  bool json = false;
  bool hash_file = false;
  bool adversarial = false;
  std::string image_tokens;
  std::string route = "host";
  StreamArgs stream;
};

// The tokens a layer's image mask sets.
int64_t image_token_count(const LayerTaps& t) {
  int64_t n = 0;
  for (uint8_t v : t.image_mask) n += v != 0;
  return n;
}

// Which of the knob flags were given (a knob the implementation does not have is refused).
struct RunGiven {
  CLI::Option *seed = nullptr, *route = nullptr, *precision = nullptr, *router = nullptr,
              *warps = nullptr, *shared_side = nullptr, *mmvq_max_rows = nullptr;
};

// Every knob flag given for an implementation that does not have it is refused (it would be
// ignored): --precision is ref's, --router and --warps emu's and cuda's, --shared-side and --route
// cuda's (docs/cli.md "run", Knobs).
void refuse_foreign_knobs(const RunArgs& a, Impl impl, const RunGiven& g) {
  const std::string chosen = "--impl " + a.impl + " would ignore it";
  if (g.precision->count() > 0 && impl != Impl::kRef)
    refuse_knob("--precision", a.precision, "ref", "precision", chosen);
  if (g.router->count() > 0 && impl == Impl::kRef)
    refuse_knob("--router", a.router, "emu and cuda", "router", chosen);
  if (g.warps->count() > 0 && impl == Impl::kRef)
    refuse_knob("--warps", std::to_string(a.warps), "emu and cuda", "expert-warps", chosen);
  if (g.shared_side->count() > 0 && impl != Impl::kCuda)
    refuse_knob("--shared-side", a.shared_side, "cuda", "shared-side", chosen);
  if (g.mmvq_max_rows->count() > 0 && impl != Impl::kCuda)
    refuse_knob("--mmvq-max-rows", std::to_string(a.mmvq_max_rows), "cuda", "mmvq-max-rows",
                chosen);
  if (g.route->count() > 0 && impl != Impl::kCuda)
    throw InputError("--route " + a.route + ": only the cuda implementation has a route knob (" +
                     "where its top-k selection runs); --impl " + a.impl + " would ignore it");
}

// The run's dominant allocations (docs/cli.md "Checks before any work"): the dump kept in memory
// and once more as its file image while it is written, the layer in flight (the
// implementation's buffers and the taps it fills, every stage whatever --taps says), and the
// --input dump read whole.
void require_run_memory(const RunArgs& a, const LoadedModel& m, const RunSpec& spec) {
  const MoeConfig& c = m.file.config();
  int64_t T = spec.tokens + (spec.input.adversarial ? kAdversarialTokens : 0);
  uint64_t input_bytes = 0;
  if (!a.input.empty()) {
    T = read_dump_meta(a.input).tokens;
    input_bytes = std::filesystem::file_size(a.input);
  }
  const uint64_t L = spec.layers.empty() ? static_cast<uint64_t>(m.file.n_layers())
                                         : static_cast<uint64_t>(spec.layers.size());
  const uint64_t tap = tap_bytes_per_token(c);
  const uint64_t keep = spec.taps ? tap : basic_bytes_per_token(c);
  const uint64_t t = static_cast<uint64_t>(T);
  const uint64_t made = synthetic_layer_bytes(m.file);  // a synthetic model's layer in use
  MemoryNeed need;
  need.bytes = 2 * L * t * keep + 2 * t * tap + input_bytes + made;
  need.how = "2 x " + std::to_string(L) + " layer(s) x " + std::to_string(T) + " token(s) x " +
             bytes_text(keep) + " (the dump and its file image) + 2 x " + std::to_string(T) +
             " x " + bytes_text(tap) + " (the layer in flight)" +
             (input_bytes ? " + " + bytes_text(input_bytes) + " (the --input dump)" : "") +
             (made ? " + " + bytes_text(made) + " (the synthetic model's layer in use)" : "");
  if (a.input.empty()) require_memory("--tokens", std::to_string(a.tokens), need);
  else require_memory("--input", a.input, need);
}

// --trace names a file to write that is neither an input nor the dump (-o).
void require_trace_file(const RunArgs& a) {
  std::error_code ec;
  const auto t = std::filesystem::weakly_canonical(a.trace, ec);
  const auto o = std::filesystem::weakly_canonical(a.out, ec);
  if (t == o || (std::filesystem::exists(a.trace) && std::filesystem::exists(a.out) &&
                 std::filesystem::equivalent(a.trace, a.out, ec)))
    throw InputError("--trace " + a.trace + ": is the same file as -o " + a.out +
                     " (the dump and the trace are two files)");
  require_output_file("--trace", a.trace, {{"--model", a.model}, {"--input", a.input}});
}

// The trace after the dump: when it cannot be written the dump is removed too, so an error
// leaves neither file.
void write_trace_keeping_nothing(const RunArgs& a, const TraceFile& t) {
  try {
    write_trace_file(a.trace, t);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(a.out, ec);
    throw;
  }
}

// The expert cache's counters and each layer's times under "cache" (docs/cli.md "Streaming").
void json_stream_report(Json& j, const StreamReport& r) {
  const CacheCounters& k = r.counters;
  j.key("cache").begin_object();
  j.kv("slots", r.slots).kv("slot_bytes", r.slot_bytes).kv("expert_bytes", r.expert_bytes);
  j.kv("hits", k.hits).kv("misses", k.misses).kv("evictions", k.evictions);
  j.kv("bytes_read", k.bytes_read).kv("failed_reads", k.failed_reads).kv("stall_ms", k.stall_ms);
  j.kv("prefetch_issued", k.prefetch_issued).kv("prefetch_used", k.prefetch_used);
  j.kv("prefetch_late", k.prefetch_late).kv("prefetch_wasted", k.prefetch_wasted);
  j.kv("prefetch_dropped", k.prefetch_dropped).kv("pipeline_serialised", r.serialised);
  j.key("env").begin_array();
  for (const std::string& e : r.env) j.value(e);
  j.end_array().key("layers").begin_array();
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const LayerTiming& t = r.timing[i];
    j.begin_object().kv("layer", r.layers[i]).kv("route_ms", t.route_ms).kv("fetch_ms", t.fetch_ms);
    j.kv("compute_ms", t.compute_ms).kv("hits", t.hits).kv("misses", t.misses);
    j.kv("bytes_read", t.bytes_read).end_object();
  }
  j.end_array().end_object();
}

// What run prints: the files written and each layer's output L2 (and image-span tokens).
void print_run(const RunArgs& a, const Dump& d, const TraceFile& trace, const StreamReport& sr) {
  if (a.json) {
    Json j;
    j.begin_object()
        .kv("file", a.out)
        .kv("implementation", d.meta.implementation)
        .kv("variant", d.meta.variant);
    if (!a.trace.empty()) j.kv("trace", a.trace);
    if (sr.streamed) json_stream_report(j, sr);
    j.kv("tokens", d.meta.tokens).kv("taps", d.meta.taps).key("layers").begin_array();
    for (const LayerTaps& t : d.layers)
      j.begin_object()
          .kv("layer", t.layer)
          .kv("image_tokens", image_token_count(t))
          .kv("output_l2", output_l2(t.output))
          .end_object();
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("wrote %s: %s (%s), %zu layer(s) x %lld token(s)%s, model %s\n", a.out.c_str(),
                d.meta.implementation.c_str(), d.meta.variant.c_str(), d.layers.size(),
                static_cast<long long>(d.meta.tokens), d.meta.taps ? ", all stages" : "",
                d.meta.model_file.c_str());
    if (!a.trace.empty())
      std::printf("wrote %s: the routing trace, %zu layer(s), %zu with predictions\n",
                  a.trace.c_str(), trace.trace.layers.size(),
                  trace.trace.layers.empty() ? size_t{0} : trace.trace.layers.size() - 1);
    for (const std::string& line : stream_report_lines(sr)) std::printf("%s\n", line.c_str());
    for (const LayerTaps& t : d.layers) {
      const int64_t n = image_token_count(t);
      std::printf(
          "  layer %d: output L2 %.6g%s\n", t.layer, output_l2(t.output),
          t.image_mask.empty()
              ? ""
              : (", " + std::to_string(n) + " image-span token(s) routed with bias_vl").c_str());
    }
  }
}

int run_run(const RunArgs& a, const RunGiven& g) {
  const bool input_seed_given = g.seed->count() > 0;
  if (!a.input.empty() && (input_seed_given || a.chain))
    throw InputError(
        "--input takes each layer's input from the dump; it cannot be combined with --input-seed "
        "or --chain");
  if (a.residual && !a.chain)
    throw InputError(
        "--residual: the residual stream feeds layer L's input + output to the next layer run; "
        "it needs --chain");
  RunSpec spec;
  spec.impl = parse_impl(a.impl, "--impl");
  refuse_foreign_knobs(a, spec.impl, g);
  require_output_file("-o", a.out, {{"--model", a.model}, {"--input", a.input}});
  if (!a.trace.empty()) require_trace_file(a);
  spec.knobs.precision = a.precision == "exact" ? RefPrecision::kExact : RefPrecision::kModel;
  spec.knobs.router = a.router == "plain" ? RouterVariant::kPlain : RouterVariant::kStaged;
  spec.knobs.expert_warps = a.warps;
  spec.knobs.shared_side_stream = a.shared_side == "on";
  spec.knobs.mmvq_max_rows = a.mmvq_max_rows;
  spec.knobs.route = parse_route_place(a.route, "--route");
  std::vector<std::string> env;
  if (spec.impl == Impl::kCuda) {
    spec.knobs.stream = stream_knobs(a.stream, &env);
    validate_stream_knobs(spec.knobs.stream, a.chain, spec.knobs.route == RoutePlace::kDevice);
  } else if (a.stream.any_given()) {
    throw InputError(a.stream.first_given() +
                     ": only the cuda implementation has an expert cache; --impl " + a.impl +
                     " would ignore it");
  }
  if (!a.layers.empty()) spec.layers = parse_layer_list(a.layers);
  spec.tokens = a.tokens;
  spec.input.seed = a.input_seed;
  spec.input.dump_path = a.input;
  spec.input.chain = a.chain;
  spec.input.residual = a.residual;
  spec.input.adversarial = a.adversarial;
  spec.input.image_tokens = a.image_tokens;
  spec.taps = a.taps;
  const LoadedModel m = load_model(a.model, a.hash_file);
  require_run_memory(a, m, spec);
  Dump d;
  TraceFile trace;
  StreamReport sr;
  {
    Progress p("run " + a.impl,
               static_cast<int64_t>(spec.layers.empty() ? m.file.n_layers() : spec.layers.size()),
               !a.json);
    d = run_layers(m, spec, &p, a.trace.empty() ? nullptr : &trace, &sr);
  }
  sr.env = env;
  write_dump(a.out, d);
  if (!a.trace.empty()) write_trace_keeping_nothing(a, trace);
  print_run(a, d, trace, sr);
  return kExitSame;
}

}  // namespace

void add_run(CLI::App& app, int& rc) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* s = app.add_subcommand(
      "run", "Run one implementation over a model's layers and write an HDF5 dump");
  s->footer(
      "Examples:\n"
      "  moecheck run --impl emu --model tiny.gguf --tokens 8 --taps -o emu.h5\n"
      "  moecheck run --impl ref --precision exact --model tiny.gguf --layers 0,2-5 -o ref.h5\n"
      "  moecheck run --impl cuda --model tiny.gguf --input emu.h5 --warps 4 -o cuda.h5\n"
      "  moecheck run --impl emu --model vl.gguf --image-tokens 2-5 -o vl.h5  # gen --vision\n"
      "  moecheck run --impl emu --model m.gguf --chain --residual --trace t.json -o d.h5\n"
      "Inputs: each layer gets its own seeded bf16 input (~N(0,1)) unless --chain (layer L+1 "
      "takes\n"
      "layer L's output) or --input (each layer takes the dump's input of the same layer).\n"
      "Exit codes: 0 written, 2 error (nothing is left at -o or --trace on error).");
  s->add_option("--impl", a->impl, "ref | emu | cuda")
      ->required()
      ->check(CLI::IsMember({"ref", "emu", "cuda"}));
  s->add_option("--model", a->model,
                "model GGUF file, or a synthetic spec: synthetic:PRESET[,layers=N][,seed=S]"
                "[,shared=bf16|kquant][,vision]... (docs/streaming.md \"Synthetic models\")")
      ->required();
  s->add_option("--layers", a->layers, "layers to run, e.g. 0,2-5 (default: all)");
  s->add_option("--tokens", a->tokens, "tokens per layer")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  RunGiven g;
  g.seed = s->add_option("--input-seed", a->input_seed, "seed of the generated inputs")
               ->check(kNonNegative)
               ->capture_default_str();
  s->add_option("--input", a->input, "take each layer's input from this dump");
  s->add_flag("--chain", a->chain, "feed layer L's output to the next layer run");
  s->add_flag("--residual", a->residual,
              "with --chain: feed bf16(input + output) of layer L to the next layer run (a "
              "residual stream, as the model's)");
  s->add_option("--trace", a->trace,
                "also write the routing trace (picks, and picks predicted from the previous "
                "layer's input) as JSON, for moecheck cache");
  s->add_flag(
      "--adversarial", a->adversarial,
      "append each layer's adversarial tokens (clamps, zero / exact tie, near tie, +1e-20) to the "
      "seeded ones");
  s->add_flag("--taps", a->taps,
              "store every stage (per-expert gate/up/h/down, q8_1 blocks, shared, acc)");
  s->add_option("-o,--output", a->out, "output HDF5 dump")->required();
  g.precision = s->add_option("--precision", a->precision, "ref: model | exact")
                    ->check(CLI::IsMember({"model", "exact"}))
                    ->capture_default_str();
  g.router = s->add_option("--router", a->router, "emu, cuda: router GEMV variant plain | staged")
                 ->check(CLI::IsMember({"plain", "staged"}))
                 ->capture_default_str();
  g.warps = s->add_option("--warps", a->warps, "emu, cuda: expert warps per block 2 | 4 | 8")
                ->check(CLI::IsMember({2, 4, 8}))
                ->capture_default_str();
  g.shared_side = s->add_option("--shared-side", a->shared_side,
                                "cuda: shared expert on a side stream on | off")
                      ->check(CLI::IsMember({"on", "off"}))
                      ->capture_default_str();
  g.mmvq_max_rows =
      s->add_option("--mmvq-max-rows", a->mmvq_max_rows,
                    "cuda: experts with at most this many token rows on MMVQ, the rest on MMQ, "
                    "0..8 (0: every expert on MMQ; -1: 8 up to 8 tokens, 4 above; no bit "
                    "depends on it)")
          ->check(CLI::Range(-1, 8))
          ->capture_default_str();
  g.route =
      s->add_option("--route", a->route,
                    "cuda: where the top-k selection runs, host | device (no bit depends on it)")
          ->capture_default_str();
  s->add_option("--image-tokens", a->image_tokens,
                "tokens inside image spans, e.g. 3-17,40-60 (indices into each layer's tokens, "
                "adversarial ones included): they select experts with bias_vl (model.py "
                "Gate.bias_vl; the model must have blk.N.exp_probs_b_vl.bias)")
      ->check(image_tokens_validator());
  s->add_flag("--hash-file", a->hash_file,
              "also record the whole model file's SHA-256 (reads the whole file; the tensors and "
              "expert slices the "
              "run read are always recorded)");
  add_stream_flags(s, a->stream);
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, g, &rc] { rc = run_run(*a, g); });
}

}  // namespace moecheck::cli
