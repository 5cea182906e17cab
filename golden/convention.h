// The metadata conventions of DeepSeek MoE GGUF files, keyed by general.architecture: moecheck's
// own ("deepseek2" keys plus moecheck.*), llama.cpp's "deepseek4" (DeepSeek-V4) and "deepseek41"
// (DeepSeek-V4.1). Each is read into a MoeConfig plus what varies by layer (the SwiGLU clamps,
// hash-routed layers) and written back by the generator. Contract: docs/gguf.md "Conventions".
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "golden/gguf.h"

namespace moecheck {

enum class Convention { kMoecheck, kDeepseek4, kDeepseek41 };

// general.architecture of a convention: "deepseek2", "deepseek4", "deepseek41".
const char* architecture_name(Convention c);
// The convention of an architecture name (what `gen --convention` takes too); InputError naming
// `where` and listing the known ones otherwise.
Convention parse_convention(const std::string& name, const std::string& where);

// The value of `key` when it has exactly `type`; nullptr when absent and not required. InputError
// naming the file and key for a missing required key or another type ("expected uint32, found
// int32 4").
const gguf::Value* metadata_value(const gguf::Reader& r, const std::string& key,
                                  gguf::ValueType type, bool required);

// A metadata key that was absent and took model.py's (or llama.cpp's) default.
struct DefaultedKey {
  std::string key;
  std::string value;  // the value used, as text
};

// What a file's metadata says beyond the file-wide MoeConfig.
struct ModelLayout {
  Convention convention = Convention::kMoecheck;
  int n_layers = 0;      // MoE layers moecheck can address: block_count less the MTP blocks
  int hash_layers = 0;   // layers [0, hash_layers) route by a token-id table (deepseek4)
  int nextn_layers = 0;  // MTP blocks after the main stack (not addressed)
  // Per-layer SwiGLU clamps of the routed and the shared experts (block_count entries), or empty
  // when the file has one value for every layer (then the MoeConfig's).
  std::vector<float> clamp_exp, clamp_shexp;
  std::vector<DefaultedKey> defaulted;

  // The config of layer L: `file` with that layer's clamps.
  MoeConfig layer_config(const MoeConfig& file, int L) const;
};

// Reads general.architecture and that convention's keys (exact types; a key of another type, a
// missing required key, an array of the wrong length, an unknown gating function: InputError
// naming the file and the key), then MoeConfig::validate. config.swiglu_limit(_shared) hold layer
// 0's clamps when they vary by layer.
void read_model_metadata(const gguf::Reader& r, MoeConfig& config, ModelLayout& layout);

// Writes general.architecture, general.quantization_version and the convention's keys for
// `layout.n_layers` layers (clamp arrays when layout has them; deepseek4 / deepseek41 always write
// the arrays, one entry per layer, as their converters do).
void write_model_metadata(gguf::Writer& w, const MoeConfig& c, const ModelLayout& layout);

}  // namespace moecheck
