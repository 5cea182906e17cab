// Runs one implementation (ref, emu, cuda) over the layers of a model file and returns the dump
// (golden/dump.h) with every stage: shared by `run`, `check` and `golden`. Inputs are seeded
// per layer, or a dump's inputs, or chained (layer L+1 gets layer L's output).
// Contract: docs/cli.md "run" (inputs, knobs) and docs/golden-format.md (what is recorded).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/routing.h"
#include "emulate/router_gemv.h"
#include "golden/dump.h"
#include "golden/model_file.h"
#include "golden/provenance.h"
#include "golden/trace_file.h"
#include "tools/stream_run.h"

#if defined(MOECHECK_HAVE_CUDA)
#include "cuda/moe_layer.h"
#endif

namespace moecheck::cli {

class Progress;

enum class Impl { kRef, kEmu, kCuda };
inline constexpr Impl kAllImpls[] = {Impl::kRef, Impl::kEmu, Impl::kCuda};

std::string impl_name(Impl i);
// "ref" | "emu" | "cuda"; InputError naming `where` otherwise.
Impl parse_impl(const std::string& s, const std::string& where);
// Whether the implementation is built and can run here; `why` says why not.
bool impl_available(Impl i, std::string* why);

enum class RefPrecision { kModel, kExact };

struct ImplKnobs {
  RefPrecision precision = RefPrecision::kModel;  // ref
  RouterVariant router = RouterVariant::kStaged;  // emu, cuda
  int expert_warps = 8;                           // emu, cuda: 2, 4 or 8
  bool shared_side_stream = true;                 // cuda
  int mmvq_max_rows = -1;  // cuda: the MMVQ / MMQ split (0..8; -1: by T, cuda::mmvq_max_rows_at)
  RoutePlace route = RoutePlace::kHost;           // cuda: where the top-k selection runs
  StreamKnobs stream;                             // cuda: the expert cache (tools/stream_run.h)
};

struct InputSpec {
  // Seeded inputs: layer L gets generate_input(input_layer_seed(seed, L), T, dim).
  uint64_t seed = 1;
  std::string dump_path;  // non-empty: the dump's input of each layer (same layer id)
  bool chain = false;     // layer L+1's input is layer L's output (in the order run)
  // With chain: layer L+1's input is bf16(x_L + y_L), the residual stream (tools/trace_record.h).
  bool residual = false;
  // Seeded inputs only: the layer's kAdversarialTokens tokens (golden/adversarial.h) follow the
  // T seeded ones, so each layer runs T + 4 tokens.
  bool adversarial = false;
  // --image-tokens: the tokens inside image spans ("3-17,40-60", indices into the layer's whole
  // token list, adversarial ones included), routed with bias_vl; empty: no mask. With dump_path
  // each layer takes the dump's own image mask instead (the two cannot be combined).
  std::string image_tokens;
};

struct RunSpec {
  Impl impl = Impl::kEmu;
  ImplKnobs knobs;
  std::vector<int> layers;  // empty: every layer of the model
  int64_t tokens = 8;       // ignored with a dump input (the dump's token count is used)
  InputSpec input;
  bool taps = false;
};

// An opened model with its identity, shared by several runs: the slice hasher caches the SHA-256
// of every tensor and expert slice a run read (golden/provenance.h), so several runs hash each
// once. The whole file's SHA-256 is computed only when asked (hash_file).
struct LoadedModel {
  std::string path;
  ModelFile file;
  std::string sha256;  // whole file; "" unless hash_file
  std::unique_ptr<SliceHasher> hasher;
};
LoadedModel load_model(const std::string& path, bool hash_file = false);

// The per-layer input seed: stream_key(seed, layer, 0x696e707574 ("input"), 0) of
// golden/generator.h.
uint64_t input_layer_seed(uint64_t seed, int layer);

// "0,2-5" -> {0, 2, 3, 4, 5}; sorted, unique; InputError naming --layers on bad syntax.
std::vector<int> parse_layer_list(const std::string& s);

// "3-17,40-60" -> the image mask [T] (1 at each listed token): comma-separated token indices or
// inclusive ranges, each in [0, T), none reversed or overlapping another. InputError naming
// --image-tokens and the bad piece.
std::vector<uint8_t> parse_image_tokens(const std::string& s, int64_t T);
// The image mask needs the layer's bias_vl: without it model.py ignores the mask, so the flag
// would change nothing. InputError naming `flag`, the model and blk.L.exp_probs_b_vl.bias.
void require_bias_vl(const LayerWeights& w, const std::string& model, const std::string& flag);

// With `trace`: each layer run's picks (the taps' topk_ids) in run order and, for every layer
// after the first, its picks predicted from the previous run layer's input
// (tools/trace_record.h predicted_picks, whatever spec.impl), with origin and expert_bytes.
// A cuda run with spec.knobs.stream.streamed() reads its experts through an expert cache
// (tools/stream_run.h); `report` (nullable) then gets what the cache did.
Dump run_layers(const LoadedModel& m, const RunSpec& spec, Progress* progress,
                TraceFile* trace = nullptr, StreamReport* report = nullptr);

// The root attributes a run of spec.impl on m records (tokens and input_source are the caller's).
DumpMeta make_meta(const LoadedModel& m, const RunSpec& spec);

// One layer forward of spec.impl (with spec.knobs) on weights w and input x [T, dim] with the
// image mask [T] (nullable), every stage in `taps` when given; returns the bf16 output.
// InputError when the implementation cannot run.
std::vector<uint16_t> forward_one(const RunSpec& spec, const LayerWeights& w,
                                  const std::vector<uint16_t>& x, int64_t T, LayerTaps* taps,
                                  const uint8_t* image_mask = nullptr);

#if defined(MOECHECK_HAVE_CUDA)
// The cuda layer's options of the knobs (the expert cache's prefetch depth included).
moecheck::cuda::LayerOptions cuda_layer_options(const ImplKnobs& k);
#endif

// Layer L's seeded input of `spec` (generate_input of the layer's seed, T = spec.tokens), followed
// by its adversarial tokens when spec.input.adversarial.
std::vector<uint16_t> seeded_layer_input(const RunSpec& spec, const LayerWeights& w, int L);

}  // namespace moecheck::cli
