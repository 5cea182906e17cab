// Runs ref / emu / cuda over a model's layers into a Dump. Each layer's forward is asked for
// every stage (LayerTaps); without --taps only the five basic datasets are kept. Contract:
// docs/cli.md "run".
#include "tools/runner.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "golden/sha256.h"
#include "tools/progress.h"
#include "tools/trace_record.h"

#include "emulate/moe_layer.h"
#include "reference/moe.h"
#if defined(MOECHECK_HAVE_CUDA)
#include "cuda/moe_layer.h"
#endif

#ifndef MOECHECK_GIT_COMMIT
#define MOECHECK_GIT_COMMIT "unknown"
#endif

namespace moecheck::cli {

std::string impl_name(Impl i) {
  switch (i) {
    case Impl::kRef: return "ref";
    case Impl::kEmu: return "emu";
    case Impl::kCuda: return "cuda";
  }
  return "?";
}

Impl parse_impl(const std::string& s, const std::string& where) {
  if (s == "ref") return Impl::kRef;
  if (s == "emu") return Impl::kEmu;
  if (s == "cuda") return Impl::kCuda;
  throw InputError(where + ": expected \"ref\", \"emu\" or \"cuda\", found \"" + s + "\"");
}

bool impl_available(Impl i, std::string* why) {
  switch (i) {
    case Impl::kRef:
    case Impl::kEmu: return true;
    case Impl::kCuda:
#if defined(MOECHECK_HAVE_CUDA)
      return moecheck::cuda::device_available(why);
#else
      if (why)
        *why =
            "cuda implementation not built (this build has no CUDA: nvcc not found or "
            "MOECHECK_ENABLE_CUDA=OFF)";
      return false;
#endif
  }
  return false;
}

LoadedModel load_model(const std::string& path, bool hash_file) {
  // A synthetic spec names no file (golden/synthetic_model.h); ModelFile::open makes its header.
  if (!is_synthetic_spec(path) && !std::filesystem::exists(path))
    throw InputError(path + ": model file does not exist");
  LoadedModel m{path, ModelFile::open(path), "", nullptr};
  if (hash_file) m.sha256 = m.file.sha256();
  m.hasher = std::make_unique<SliceHasher>(m.file);
  return m;
}

uint64_t input_layer_seed(uint64_t seed, int layer) {
  return stream_key(seed, static_cast<uint64_t>(layer), 0x696e707574ull, 0);
}

namespace {

std::string router_name(RouterVariant v) { return v == RouterVariant::kPlain ? "plain" : "staged"; }

}  // namespace

#if defined(MOECHECK_HAVE_CUDA)
moecheck::cuda::LayerOptions cuda_layer_options(const ImplKnobs& k) {
  moecheck::cuda::LayerOptions o;
  o.router = k.router;
  o.expert_warps = k.expert_warps;
  o.shared_side_stream = k.shared_side_stream;
  o.route = k.route;
  o.mmvq_max_rows = k.mmvq_max_rows;
  o.prefetch_k = k.stream.prefetch_k;
  return o;
}
#endif

std::vector<uint16_t> forward_one(const RunSpec& spec, const LayerWeights& w,
                                  const std::vector<uint16_t>& x, int64_t T, LayerTaps* taps,
                                  const uint8_t* image_mask) {
  switch (spec.impl) {
    case Impl::kRef: {
      const ref::MoE moe(w, spec.knobs.precision == RefPrecision::kExact ? ref::Precision::kExact
                                                                         : ref::Precision::kModel);
      return moe.forward(x.data(), T, taps, image_mask);
    }
    case Impl::kEmu: {
      emu::LayerOptions o;
      o.router = spec.knobs.router;
      o.expert_warps = spec.knobs.expert_warps;
      const emu::MoeLayer layer(w, o);
      return layer.forward(x.data(), T, taps, nullptr, image_mask);
    }
    case Impl::kCuda: {
#if defined(MOECHECK_HAVE_CUDA)
      moecheck::cuda::MoeLayer layer(w, cuda_layer_options(spec.knobs));
      return layer.forward(x.data(), T, taps, nullptr, image_mask);
#else
      break;
#endif
    }
  }
  std::string why;
  impl_available(spec.impl, &why);
  throw InputError(why);
}

DumpMeta make_meta(const LoadedModel& m, const RunSpec& spec) {
  DumpMeta meta;
  meta.tool_version = MOECHECK_VERSION;
  meta.git_commit = MOECHECK_GIT_COMMIT;
  meta.implementation = impl_name(spec.impl);
  const ImplKnobs& k = spec.knobs;
  switch (spec.impl) {
    case Impl::kRef:
      meta.knobs = {{"precision", k.precision == RefPrecision::kExact ? "exact" : "model"}};
      meta.device = "cpu";
      break;
    case Impl::kEmu:
      meta.knobs = {{"router", router_name(k.router)},
                    {"expert_warps", std::to_string(k.expert_warps)}};
      meta.device = "cpu";
      break;
    case Impl::kCuda:
      meta.knobs = {
          {"router", router_name(k.router)},
          {"expert_warps", std::to_string(k.expert_warps)},
          {"shared_side_stream", k.shared_side_stream ? "on" : "off"},
          {"route", route_place_name(k.route)},
          {"mmvq_max_rows", k.mmvq_max_rows < 0 ? "auto" : std::to_string(k.mmvq_max_rows)}};
      if (k.stream.streamed()) {  // the expert cache's knobs (no bit depends on any of them)
        const StreamKnobs& s = k.stream;
        meta.knobs.emplace_back(
            s.cache_slots > 0 ? "cache_slots" : "cache_bytes",
            std::to_string(s.cache_slots > 0 ? s.cache_slots
                                             : static_cast<int64_t>(s.cache_bytes)));
        meta.knobs.emplace_back("reader_threads", std::to_string(s.reader_threads));
        meta.knobs.emplace_back("prefetch_k", std::to_string(s.prefetch_k));
        meta.knobs.emplace_back("pipeline", s.pipeline ? "on" : "off");
        meta.knobs.emplace_back("expert_source", expert_source_name(s.source));
      }
#if defined(MOECHECK_HAVE_CUDA)
      meta.device = moecheck::cuda::device_name(0);
#else
      meta.device = "none";
#endif
      break;
  }
  for (const auto& [name, value] : meta.knobs) {
    if (!meta.variant.empty()) meta.variant += " ";
    meta.variant += name + "=" + value;
  }
  meta.model_file = std::filesystem::path(m.path).filename().string();
  meta.model_sha256 = m.sha256;
  meta.model_header_sha256 = m.hasher->header();
  meta.config = m.file.config();
  if (m.file.provenance()) {
    meta.has_model_seed = true;
    meta.model_seed = m.file.provenance()->seed;
  }
  meta.taps = spec.taps;
  // model.py multiplies h by the routing weight before w2; the emulation and the kernels apply
  // it in the accumulation (docs/numerics.md "accumulate, finish").
  meta.routing_weight_at = spec.impl == Impl::kRef ? "h" : "accumulate";
  return meta;
}

std::vector<uint16_t> seeded_layer_input(const RunSpec& spec, const LayerWeights& w, int L) {
  std::vector<uint16_t> x =
      generate_input(input_layer_seed(spec.input.seed, L), spec.tokens, w.config.dim);
  if (spec.input.adversarial)
    for (const AdversarialToken& a : adversarial_tokens(w, spec.input.seed))
      x.insert(x.end(), a.x.begin(), a.x.end());
  return x;
}

namespace {

// The run's inputs besides the seeded ones: the --input dump (its token count becomes the run's)
// and the --image-tokens mask; fills meta.tokens and meta.input_source.
struct RunInputs {
  std::unique_ptr<Dump> dump;
  std::vector<uint8_t> mask;  // [T] from --image-tokens, or empty
};

// Non-finite inputs are refused before any layer runs, by file, layer, token and column (the
// layer APIs would turn them into NaN outputs or a routing error naming only an expert).
void require_finite_input(const std::string& file, int layer, const std::vector<uint16_t>& x,
                          int64_t dim) {
  for (size_t i = 0; i < x.size(); ++i) {
    if ((x[i] & 0x7F80u) != 0x7F80u) continue;
    char bits[8];
    std::snprintf(bits, sizeof bits, "0x%04X", x[i]);
    throw InputError(file + ": /layers/" + std::to_string(layer) + "/input token " +
                     std::to_string(static_cast<int64_t>(i) / dim) + " column " +
                     std::to_string(static_cast<int64_t>(i) % dim) + " is " +
                     ((x[i] & 0x7Fu) != 0 ? "NaN"
                      : (x[i] & 0x8000u)  ? "-Inf"
                                          : "+Inf") +
                     " (bf16 " + bits + "); non-finite inputs are refused (--input)");
  }
}

RunInputs open_inputs(const LoadedModel& m, const RunSpec& spec, DumpMeta& meta) {
  RunInputs in;
  const MoeConfig& c = m.file.config();
  if (spec.input.residual && !spec.input.chain)
    throw InputError(
        "--residual: the residual stream feeds layer L's input + output to the next layer run; "
        "it needs --chain");
  if (!spec.input.dump_path.empty()) {
    if (!spec.input.image_tokens.empty())
      throw InputError(
          "--image-tokens: --input takes each layer's input and image mask from the dump; the two "
          "cannot be combined");
    in.dump = std::make_unique<Dump>(read_dump(spec.input.dump_path));
    if (in.dump->meta.config.dim != c.dim)
      throw InputError(spec.input.dump_path + ": attribute config.dim is " +
                       std::to_string(in.dump->meta.config.dim) + ", the model " + m.path +
                       " has dim " + std::to_string(c.dim));
    meta.tokens = in.dump->meta.tokens;
    meta.input_source = "dump:" + std::filesystem::path(spec.input.dump_path).filename().string();
    for (const LayerTaps& t : in.dump->layers)
      require_finite_input(spec.input.dump_path, t.layer, t.input, c.dim);
    return in;
  }
  if (spec.tokens <= 0)
    throw InputError("--tokens: expected a positive token count, found " +
                     std::to_string(spec.tokens));
  if (spec.input.adversarial && spec.input.chain)
    throw InputError(
        "--adversarial: adversarial tokens are made per layer from its weights; they cannot be "
        "chained");
  meta.tokens = spec.tokens + (spec.input.adversarial ? kAdversarialTokens : 0);
  meta.input_source = spec.input.residual      ? "seed+chain+residual"
                      : spec.input.chain       ? "seed+chain"
                      : spec.input.adversarial ? "seed+adversarial"
                                               : "seed";
  meta.input_seed = spec.input.seed;
  if (!spec.input.image_tokens.empty())
    in.mask = parse_image_tokens(spec.input.image_tokens, meta.tokens);
  return in;
}

// The dump's layer L, or InputError naming the missing group.
const LayerTaps& dump_layer(const Dump& d, const std::string& path, int L) {
  auto it = std::find(d.meta.layers.begin(), d.meta.layers.end(), L);
  if (it == d.meta.layers.end())
    throw InputError(path + ": no /layers/" + std::to_string(L) + " to take the input of layer " +
                     std::to_string(L) + " from");
  return d.layers[static_cast<size_t>(it - d.meta.layers.begin())];
}

// Layer L's image mask: the dump's, else --image-tokens'. Refused (before any layer runs) where
// the layer has no bias_vl to select with.
const std::vector<uint8_t>& layer_mask(const LoadedModel& m, const RunSpec& spec,
                                       const RunInputs& in, const LayerWeights& w) {
  if (in.dump) {
    const std::vector<uint8_t>& mask =
        dump_layer(*in.dump, spec.input.dump_path, w.layer).image_mask;
    if (!mask.empty())
      require_bias_vl(
          w, m.path,
          spec.input.dump_path + ": /layers/" + std::to_string(w.layer) + "/image_mask (--input)");
    return mask;
  }
  if (!in.mask.empty()) require_bias_vl(w, m.path, "--image-tokens");
  return in.mask;
}

// The trace's header: the sizes and where it came from (model file, impl, tokens, inputs).
void begin_trace(TraceFile& f, const DumpMeta& meta) {
  f.trace = RoutingTrace{};
  f.trace.n_routed = meta.config.n_routed;
  f.trace.topk = meta.config.topk;
  f.trace.tokens = meta.tokens;
  f.trace.origin = meta.model_file + " " + meta.implementation + " " + std::to_string(meta.tokens) +
                   " tokens " + meta.input_source;
  f.expert_bytes = 0;
}

// Layer w's picks and, after the first layer run, its picks predicted from `prev_x`.
void record_trace_layer(TraceFile& f, const RunSpec& spec, const LayerWeights& w,
                        const LayerTaps& taps, const std::vector<uint16_t>* prev_x,
                        const std::vector<uint8_t>& mask) {
  TraceLayer l;
  l.layer = w.layer;
  l.picks = taps.topk_ids;
  if (prev_x != nullptr)
    l.predicted = predicted_picks(spec.knobs.router, w, *prev_x, taps.tokens, mask);
  f.trace.layers.push_back(std::move(l));
  f.expert_bytes = std::max(f.expert_bytes, routed_expert_bytes(w));
}

}  // namespace

namespace {

// One layer of a run between its forward and the dump.
struct LayerRun {
  int L = 0;
  LayerWeights w;
  std::vector<uint8_t> mask;
  std::vector<uint16_t> x, y;
  LayerTaps taps;
};

// Layer L's input: the dump's, the previous layer's output (chained), or the seeded one (with the
// adversarial tokens, made from every expert of the layer: a streamed layer's resident view has
// none, so the whole layer is read for them).
std::vector<uint16_t> layer_input(const LoadedModel& m, const RunSpec& spec, const RunInputs& in,
                                  size_t i, const LayerWeights& w,
                                  const std::vector<uint16_t>& carried) {
  if (in.dump) return dump_layer(*in.dump, spec.input.dump_path, w.layer).input;
  if (spec.input.chain && i > 0) return carried;
  if (spec.input.adversarial && w.gate_exps.data == nullptr)
    return seeded_layer_input(spec, m.file.layer(w.layer), w.layer);
  return seeded_layer_input(spec, w, w.layer);
}

// The layer's weights and mask, with the first read of its resident tensors (router, bias,
// bias_vl, shared expert) hashed and refused when not finite before anything computes with them.
LayerRun open_layer(const LoadedModel& m, const RunSpec& spec, const RunInputs& in, int L,
                    bool streamed) {
  LayerRun r;
  r.L = L;
  r.w = streamed ? m.file.resident_layer(L) : m.file.layer(L);
  r.mask = layer_mask(m, spec, in, r.w);
  (void)m.hasher->layer_slices(L, {}, !r.mask.empty());
  return r;
}

// The forward's taps into the dump (its expert slices' digests now, or later: `slices` false).
void fold_layer(Dump& d, const LoadedModel& m, const RunSpec& spec, LayerRun& r, TraceFile* trace,
                const std::vector<uint16_t>* prev_x, bool slices) {
  LayerTaps& taps = r.taps;
  taps.layer = r.L;
  taps.tokens = d.meta.tokens;
  taps.input = r.x;
  taps.image_mask = r.mask;  // every implementation's taps record the mask it was given
  taps.output = r.y;
  if (trace) record_trace_layer(*trace, spec, r.w, taps, prev_x, r.mask);
  if (!spec.taps) {
    taps.x_q8.clear();
    taps.experts.clear();
    taps.shared = ExpertTaps{};
    taps.acc.clear();
  }
  if (slices)
    d.slices.push_back(m.hasher->layer_slices(r.L, experts_used(taps.topk_ids), !r.mask.empty()));
  d.meta.layers.push_back(r.L);
  const MoeConfig& c = r.w.config;
  if (c.swiglu_limit != d.meta.config.swiglu_limit ||
      c.shared_swiglu_limit() != d.meta.config.shared_swiglu_limit())
    d.meta.layer_clamps[r.L] = {c.swiglu_limit, c.shared_swiglu_limit()};
  d.layers.push_back(std::move(taps));
}

std::vector<int> run_layer_list(const LoadedModel& m, const RunSpec& spec) {
  std::vector<int> layers = spec.layers;
  // By default every layer moecheck can run: hash-routed layers (deepseek4's first ones) pick
  // experts by token id and are left out; naming one in --layers gets ModelFile's refusal.
  if (layers.empty())
    for (int l = 0; l < m.file.n_layers(); ++l)
      if (!m.file.hash_routed(l)) layers.push_back(l);
  for (int l : layers)
    if (l >= m.file.n_layers())
      throw InputError("--layers: layer " + std::to_string(l) + " is not in " + m.path +
                       " (it has " + std::to_string(m.file.n_layers()) + " layers)");
  return layers;
}

// A streamed run's expert slices: their digests were taken by the reader threads (or, with the
// checks after the run, are read now), once the cache has drained.
void streamed_slices(Dump& d, const LoadedModel& m, StreamedRun& sr) {
  sr.drain();
  for (const LayerTaps& t : d.layers)
    d.slices.push_back(
        m.hasher->layer_slices(t.layer, experts_used(t.topk_ids), !t.image_mask.empty()));
}

// Every layer staged while the one before computes (the inputs are known up front).
void run_pipelined(Dump& d, const LoadedModel& m, const RunSpec& spec, const RunInputs& in,
                   const std::vector<int>& layers, StreamedRun& sr, TraceFile* trace,
                   Progress* progress) {
  std::vector<LayerRun> runs;
  std::vector<std::vector<uint16_t>> xs;
  std::vector<const uint8_t*> masks;
  for (size_t i = 0; i < layers.size(); ++i) {
    runs.push_back(open_layer(m, spec, in, layers[i], true));
    xs.push_back(layer_input(m, spec, in, i, runs.back().w, {}));
  }
  for (const LayerRun& r : runs) masks.push_back(r.mask.empty() ? nullptr : r.mask.data());
  std::vector<LayerTaps> taps;
  std::vector<std::vector<uint16_t>> ys = sr.forward_all(xs, d.meta.tokens, &taps, masks);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].x = std::move(xs[i]);
    runs[i].y = std::move(ys[i]);
    runs[i].taps = std::move(taps[i]);
    fold_layer(d, m, spec, runs[i], trace, i > 0 ? &runs[i - 1].x : nullptr, false);
    if (progress) progress->step("layer " + std::to_string(runs[i].L) + " cuda (pipelined)");
  }
}

}  // namespace

Dump run_layers(const LoadedModel& m, const RunSpec& spec, Progress* progress, TraceFile* trace,
                StreamReport* report) {
  std::string why;
  if (!impl_available(spec.impl, &why)) throw InputError(why);
  const std::vector<int> layers = run_layer_list(m, spec);
  Dump d;
  d.meta = make_meta(m, spec);
  const RunInputs in = open_inputs(m, spec, d.meta);
  const int64_t T = d.meta.tokens;
  // Refusals before any run; resident_layer: a synthetic model's experts are not made for this.
  for (int L : layers) layer_mask(m, spec, in, m.file.resident_layer(L));
  if (trace) begin_trace(*trace, d.meta);
  const bool streamed = spec.impl == Impl::kCuda && spec.knobs.stream.streamed();
  std::unique_ptr<StreamedRun> sr;
  if (streamed) sr = std::make_unique<StreamedRun>(m, spec, layers);
  if (streamed && spec.knobs.stream.pipeline) {
    run_pipelined(d, m, spec, in, layers, *sr, trace, progress);
  } else {
    std::vector<uint16_t> carried, prev_x;
    for (size_t i = 0; i < layers.size(); ++i) {
      LayerRun r = open_layer(m, spec, in, layers[i], streamed);
      r.x = layer_input(m, spec, in, i, r.w, carried);
      const uint8_t* mk = r.mask.empty() ? nullptr : r.mask.data();
      r.y = streamed ? sr->forward(i, r.x, T, &r.taps, mk)
                     : forward_one(spec, r.w, r.x, T, &r.taps, mk);
      carried = spec.input.residual ? residual_input(r.x, r.y, r.w.config.dim, r.L) : r.y;
      fold_layer(d, m, spec, r, trace, i > 0 ? &prev_x : nullptr, !streamed);
      prev_x = std::move(r.x);
      if (progress) progress->step("layer " + std::to_string(r.L) + " " + impl_name(spec.impl));
    }
  }
  if (streamed) {
    streamed_slices(d, m, *sr);
    if (report != nullptr) *report = sr->report();
  }
  return d;
}

}  // namespace moecheck::cli
