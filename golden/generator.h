// Seeded synthetic MoE models: presets tiny / small / ds41, written as GGUF files layer by layer
// or built in memory. Every tensor's bytes are a pure function of (seed, layer, tensor, expert)
// through a portable PRNG (xoshiro256** seeded by splitmix64, integer-only normal sampler), so
// any expert can be regenerated on demand and a file written from a seed holds the same bytes.
// Contract: docs/gguf.md "Synthetic models".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/expert_source.h"
#include "core/layer_weights.h"
#include "golden/model_file.h"

namespace moecheck {

// Bumped whenever the bytes produced for a given seed change (recorded in the file).
// 2: each layer's bias holds an exact tie at the top-k boundary (generate_bias).
inline constexpr uint32_t kGeneratorVersion = 2;

// Portable PRNG: xoshiro256** with its state filled by splitmix64 from one 64-bit key.
class Rng {
 public:
  explicit Rng(uint64_t key);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Approximately N(0, 1): the Irwin-Hall sum of twelve 16-bit uniforms, centred. Integer
  // arithmetic and one exact scaling, so the same bits on every platform; |z| < 6.
  float normal();

 private:
  uint64_t s_[4];
};

// Mixes a seed and three indices into one stream key (splitmix64 finaliser per step).
uint64_t stream_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);

// How routed experts' blocks are made: sampled N(0, sigma) values through the reference
// quantisers, or random valid blocks written directly (finite positive f16 scales, random
// quants and sub-scales): fast enough for ds41 (4.9 GB per layer).
enum class ExpertBlocks { kQuantized, kRandomValid };

// general.alignment of generated files: a power of two in [kMinGenAlignment, kMaxGenAlignment].
// The reader takes any power of two (ggml's rule, for files from elsewhere); the generator writes
// only alignments at which every tensor starts aligned for any GGUF scalar (8 bytes: the loader
// views bf16 and f32 tensors in place, and at 1 or 2 it refuses them) and at most the largest
// common page size (64 KiB), beyond which padding only wastes space (2^31 pads each of a layer's
// tensors to 2 GiB). docs/gguf.md "Synthetic models".
inline constexpr uint32_t kMinGenAlignment = 8;
inline constexpr uint32_t kMaxGenAlignment = 65536;

struct GenOptions {
  std::string preset = "tiny";
  MoeConfig config;
  int n_layers = 2;
  uint64_t seed = 1;
  SharedExpertType shared = SharedExpertType::kBF16;
  ExpertBlocks blocks = ExpertBlocks::kQuantized;
  uint32_t alignment = 32;
  // Also write each layer's bias_vl (blk.N.exp_probs_b_vl.bias, model.py Gate.bias_vl): the
  // selection bias of image-span tokens. Off: the file holds the same bytes as without the field.
  bool vision = false;
  // The metadata convention (golden/convention.h) and the router's type: moecheck's "deepseek2"
  // with a BF16 router by default; `gen --convention deepseek4` writes llama.cpp's layout with an
  // F16 router, as V4 converters do. The router's values are the same draws rounded to its type.
  Convention convention = Convention::kMoecheck;
  GgmlType router_type = GgmlType::kBF16;
  // Per-layer SwiGLU clamps of the routed and the shared experts (n_layers entries each), or empty
  // for config.swiglu_limit (and config.shared_swiglu_limit()) on every layer. Per-layer values
  // need the deepseek4 / deepseek41 conventions (their clamp arrays).
  std::vector<float> swiglu_limits, swiglu_limits_shared;
  // deepseek4 only: layers [0, hash_layers) are written hash-routed, as V4's first layers are (a
  // blk.N.ffn_gate_tid2eid.weight I32 [topk, hash_vocab] table, no exp_probs_b), so files that
  // moecheck must refuse by name can be made; generate_layer refuses those layers.
  int hash_layers = 0;
  int64_t hash_vocab = 256;

  // InputError naming the preset and field when the options cannot make a model.
  void validate() const;
  // The layout the options write (convention, layers, clamp arrays).
  ModelLayout layout() const;
};

// "tiny": dim 512, inter 256, 16 experts, top 4. "small": 1024, 512, 64, top 6. "ds41": the
// seeds' config (5120, 2304, 384, top 6), random-valid blocks by default. All: sqrtsoftplus,
// route_scale 1.5, swiglu_limit 10, gate_temp 1, norm_topk_prob, bf16 shared expert, 2 layers,
// seed 1. Unknown name: InputError listing the presets.
GenOptions preset_options(const std::string& preset);
// The embedded model of `moecheck check`: tiny, 2 layers, seed 1.
GenOptions default_model_options();
// Rebuilds the options a generated file was written with (InputError if it has no provenance
// or another generator version); `vision` from the presence of layer 0's bias_vl, the convention,
// clamps and hash layers from the metadata, the router type from the first routable layer's.
GenOptions options_from_model(const ModelFile& m);

// Bytes of one routed expert of a projection (gate/up Q2_K [inter, dim], down Q3_K [dim, inter]).
int64_t expert_bytes(const GenOptions& o, Proj p);
// Writes expert `expert`'s blocks of projection `p` in layer `layer` to out[expert_bytes(o, p)].
void generate_expert_blocks(const GenOptions& o, int layer, Proj p, int64_t expert, uint8_t* out);
// Router [n_routed, dim] in o.router_type (bf16 or f16 bits) and bias f32 [n_routed].
void generate_router(const GenOptions& o, int layer, uint16_t* out);
void generate_bias(const GenOptions& o, int layer, float* out);
// bias_vl f32 [n_routed] (o.vision): drawn like the bias (the same spread: small noise, one expert
// in eight hot or cold) from a stream of its own, so the hot and cold experts differ from the
// bias's and image-span tokens pick differently; no boundary tie.
void generate_bias_vl(const GenOptions& o, int layer, float* out);
// The shared expert's projection in its storage type (bf16 or K-quant).
int64_t shared_bytes(const GenOptions& o, Proj p);
void generate_shared(const GenOptions& o, int layer, Proj p, uint8_t* out);

// One layer in memory (keep_alive owns the buffers); no disk involved.
LayerWeights generate_layer(const GenOptions& o, int layer);
// Told the size of each chunk of tensor bytes a fill callback has just made.
using FillCounter = std::function<void(uint64_t n)>;
// The writer of o's model (validated first): general.name, the convention's metadata, the
// generator keys and every tensor in file order, layer by layer (router, bias or hash table,
// bias_vl, then gate / up / down stacks each followed by its shared-expert tensor). The fill
// callbacks hold a copy of o, are pure functions of their offset (so they may run on several
// threads at once when `counted` is empty) and ask for one expert per chunk of a stack.
// write_model writes it; a synthetic model (golden/synthetic_model.h) fills its image from the
// same callbacks, so the two hold the same bytes.
gguf::Writer model_writer(const GenOptions& o, const FillCounter& counted = {});
// Told (tensor bytes written so far, the file's size) as the tensors are produced: a progress bar.
using WriteProgress = std::function<void(uint64_t done, uint64_t total)>;
// Writes the whole model, streaming each tensor (one expert at a time for the stacks); returns
// the file's SHA-256 (hex), computed as it is written.
std::string write_model(const GenOptions& o, const std::string& path,
                        const WriteProgress& progress = {});

// The hash table of a hash-routed layer: I32 [hash_vocab][topk], token t's experts
// (t + j * max(1, n_routed / topk)) % n_routed for j = 0..topk-1 (distinct while topk * that
// stride fits n_routed; the content is never computed with).
void generate_hash_table(const GenOptions& o, int32_t* out);

// Token inputs x [tokens, dim] bf16, ~N(0, 1), from a seed of their own.
std::vector<uint16_t> generate_input(uint64_t seed, int64_t tokens, int64_t dim);

namespace detail {
// golden/generator_convention.cpp: the convention options' checks, reading them back from a file,
// and a hash-routed layer's table tensor.
void validate_convention(const GenOptions& o, const std::string& where);
void conventions_from_model(const ModelFile& m, GenOptions& o);
void add_hash_table(gguf::Writer& w, const GenOptions& o, int layer);
}  // namespace detail

}  // namespace moecheck
