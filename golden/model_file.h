// A moecheck model file: a GGUF v3 file holding DeepSeek-style MoE layers under llama.cpp's
// "deepseek2" names, with the config in metadata. ModelFile::open validates the metadata into a
// MoeConfig; layer(L) checks that layer's tensors (names, types, shapes) against the config and
// returns views into the mapping. Contract: docs/gguf.md "Metadata keys" and "Tensors". A path
// "synthetic:PRESET[,key=value...]" opens a synthetic model with no file, the image of the file
// `moecheck gen` would write (golden/synthetic_model.h; docs/streaming.md "Synthetic models").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/blocks.h"
#include "core/config.h"
#include "core/expert_source.h"
#include "core/layer_weights.h"
#include "golden/convention.h"
#include "golden/gguf.h"
#include "golden/sha256.h"

namespace moecheck {

// Metadata keys (types in docs/gguf.md).
namespace keys {
inline constexpr const char* kArchitecture = "general.architecture";           // string "deepseek2"
inline constexpr const char* kQuantVersion = "general.quantization_version";   // uint32 2
inline constexpr const char* kName = "general.name";                           // string, optional
inline constexpr const char* kBlockCount = "deepseek2.block_count";            // uint32
inline constexpr const char* kDim = "deepseek2.embedding_length";              // uint32
inline constexpr const char* kInter = "deepseek2.expert_feed_forward_length";  // uint32
inline constexpr const char* kNRouted = "deepseek2.expert_count";              // uint32
inline constexpr const char* kTopk = "deepseek2.expert_used_count";            // uint32
inline constexpr const char* kNShared = "deepseek2.expert_shared_count";       // uint32
inline constexpr const char* kRouteScale = "deepseek2.expert_weights_scale";   // float32
inline constexpr const char* kNormTopk = "deepseek2.expert_weights_norm";      // bool
inline constexpr const char* kGatingFunc = "deepseek2.expert_gating_func";     // uint32, optional
inline constexpr const char* kGateTemp = "moecheck.gate_temp";        // float32, optional (1)
inline constexpr const char* kScoreFunc = "moecheck.score_func";      // string
inline constexpr const char* kSwigluLimit = "moecheck.swiglu_limit";  // float32
inline constexpr const char* kSwigluLimitShared = "moecheck.swiglu_limit_shared";  // optional
inline constexpr const char* kGenSeed = "moecheck.generator.seed";                 // uint64
inline constexpr const char* kGenPreset = "moecheck.generator.preset";             // string
inline constexpr const char* kGenVersion = "moecheck.generator.version";           // uint32
inline constexpr const char* kGenFastBlocks = "moecheck.generator.fast_blocks";    // bool
}  // namespace keys

inline constexpr const char* kArchitectureName = "deepseek2";

// The shared expert's storage: bf16, or K-quant (gate/up Q2_K, down Q3_K) run on the routed
// experts' kernels.
enum class SharedExpertType { kBF16, kKQuant };

enum class LayerTensor {
  kRouter,
  kBias,
  kGateExps,
  kUpExps,
  kDownExps,
  kGateShexp,
  kUpShexp,
  kDownShexp,
  kBiasVl,  // optional: model.py Gate.bias_vl (docs/gguf.md "Tensors")
};
// The tensors every layer must have.
inline constexpr std::array<LayerTensor, 8> kLayerTensors = {
    LayerTensor::kRouter,  LayerTensor::kBias,     LayerTensor::kGateExps,
    LayerTensor::kUpExps,  LayerTensor::kDownExps, LayerTensor::kGateShexp,
    LayerTensor::kUpShexp, LayerTensor::kDownShexp};
// The tensors a layer may have; when present they are validated like the required ones.
inline constexpr std::array<LayerTensor, 1> kOptionalLayerTensors = {LayerTensor::kBiasVl};

// "blk.<layer>.ffn_gate_exps.weight" etc.
std::string tensor_name(int layer, LayerTensor t);
// The stacked tensor of an expert projection: gate -> kGateExps, up -> kUpExps, down -> kDownExps.
LayerTensor stack_tensor(Proj p);
// "blk.<layer>.ffn_gate_tid2eid.weight": a hash-routed layer's I32 [topk, n_vocab] table of
// experts by token id (deepseek4; docs/gguf.md "Conventions"). moecheck refuses such layers.
std::string hash_table_name(int layer);

struct TensorShape {
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order
};
// The type and shape a layer tensor must have for `c`.
TensorShape expected_tensor(const MoeConfig& c, LayerTensor t, SharedExpertType shared);

// Writes general.architecture, general.quantization_version and the config keys of moecheck's own
// convention ("deepseek2"); golden/convention.h write_model_metadata writes any convention.
void add_config_metadata(gguf::Writer& w, const MoeConfig& c, int n_layers);

// What the synthetic generator recorded (absent for files from elsewhere).
struct GeneratorProvenance {
  uint64_t seed = 0;
  std::string preset;
  uint32_t version = 0;
  bool fast_blocks = false;
};

// A model path that names a synthetic model ("synthetic:tiny,layers=2"), not a file. A file whose
// name starts so is reached as "./synthetic:...".
inline constexpr const char* kSyntheticPrefix = "synthetic:";
inline bool is_synthetic_spec(const std::string& path) {
  return path.rfind(kSyntheticPrefix, 0) == 0;
}

namespace detail {
class SyntheticImage;  // golden/synthetic_model.h
}

class ModelFile {
 public:
  // Maps and validates `path`: GGUF structure, metadata keys and types, MoeConfig::validate. A
  // synthetic spec opens the synthetic model instead (open_synthetic, golden/synthetic_model.h):
  // its header is made, no tensor byte is.
  static ModelFile open(const std::string& path, gguf::MapMode mode = gguf::MapMode::kReadOnly);
  // The same checks on an already parsed GGUF (tests build files in memory).
  static ModelFile from_gguf(gguf::Reader reader);

  // The file's path, or a synthetic model's spec.
  const std::string& path() const { return gguf_.name(); }
  bool synthetic() const { return synthetic_ != nullptr; }
  // The synthetic model's image (its fill state and counters), or nullptr for a file.
  const detail::SyntheticImage* synthetic_image() const { return synthetic_.get(); }
  // The file-wide config; with per-layer clamps (deepseek4 / deepseek41) it holds layer 0's, and
  // layer_config(L) (the config of layer(L)) each layer's.
  const MoeConfig& config() const { return config_; }
  MoeConfig layer_config(int L) const;
  // The MoE layers moecheck addresses (MTP blocks excluded).
  int n_layers() const { return n_layers_; }
  const ModelLayout& layout() const { return layout_; }
  Convention convention() const { return layout_.convention; }
  // Layer L selects experts by token id (a hash table, or L < hash_layer_count): layer(L) refuses.
  bool hash_routed(int L) const;
  const std::optional<GeneratorProvenance>& provenance() const { return provenance_; }
  const gguf::Reader& gguf() const { return gguf_; }
  // The writable address of n bytes of a layer view (a copy-on-write open only; see
  // gguf::Reader::writable).
  uint8_t* writable(const void* p, uint64_t n) const {
    return gguf_.writable(static_cast<const uint8_t*>(p), n);
  }

  // Views of layer L's tensors; throws InputError naming the file, layer, tensor and field for a
  // hash-routed layer, a missing tensor, a type moecheck cannot run (routed experts other than
  // Q2_K / Q3_K, a router other than BF16 / F16), a wrong shape or misaligned data. The optional
  // bias_vl (blk.L.exp_probs_b_vl.bias) is nullptr when absent and validated when present. Of a
  // synthetic model the layer's tensors are made on first use (every expert, by several threads)
  // and given back when the last LayerWeights of the layer handed out (keep_alive) ends.
  LayerWeights layer(int L) const;
  // Layer L as the streamed path needs it: everything but the routed stacks viewed (and, for a
  // synthetic model, made), the stacks with their type, shape and n_experts and data nullptr
  // (their experts are read through expert_source()). The same checks as layer(L).
  LayerWeights resident_layer(int L) const;
  // Where the routed experts' bytes are read from by a cache: a FileExpertSource (pread on a
  // descriptor of its own, opened by each call) over the file, or the SyntheticExpertSource of a
  // synthetic model (golden/expert_sources.h).
  std::shared_ptr<const ExpertSource> expert_source() const;
  // The SHA-256 of the whole file (a synthetic model's image, made one layer at a time).
  std::string sha256() const;
  // Whether layer L holds the optional tensor t (by name; layer() validates it).
  bool has_tensor(int L, LayerTensor t) const;

 private:
  friend ModelFile open_synthetic(const std::string& spec, gguf::MapMode mode, int fill_threads);
  void check_layer(int L) const;
  LayerWeights views(int L) const;

  gguf::Reader gguf_;
  MoeConfig config_;
  ModelLayout layout_;
  int n_layers_ = 0;
  std::optional<GeneratorProvenance> provenance_;
  std::shared_ptr<const detail::SyntheticImage> synthetic_;
};

}  // namespace moecheck
