// HDF5 tensor dumps of layer forwards: what `moecheck run` writes, `moecheck diff` compares and
// golden/data/ holds. Self-describing (format version, tool version and git commit,
// implementation and knobs, device, model file and the SHA-256 of what the run read: header,
// per-layer tensors and expert slices; the whole file's only when asked), config, seeds), one group
// per layer with the stages of core/taps.h. Written to a temporary name and renamed; read back with
// every object validated. Contract: docs/golden-format.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/taps.h"
#include "golden/provenance.h"

namespace moecheck {

// Version 2 records per-slice provenance (the header's and each read tensor / expert slice's
// SHA-256); version 1 recorded the whole file's SHA-256 only. Version 3 is version 2 with an
// image mask in some layer (/layers/<L>/image_mask): written only then, so that a reader that
// would ignore the mask (and re-route those tokens with the wrong bias) refuses the file; a dump
// without a mask stays version 2. All three are read.
inline constexpr int64_t kDumpFormatVersion = 2;
inline constexpr int64_t kDumpFormatVersionImageMask = 3;

struct DumpMeta {
  int64_t format_version = kDumpFormatVersion;
  // Set by the readers, never written: "stamp matches" (exactly as moecheck wrote it), "no stamp"
  // (an older moecheck or another writer), or "stamp does not match: changed since written"
  // (edited, e.g. with h5py, or corrupted; read through the probe process). golden/dump_hdf5.h.
  std::string integrity;
  std::string tool_version;    // MOECHECK_VERSION
  std::string git_commit;      // configure-time `git describe`, "unknown" outside a checkout
  std::string implementation;  // "ref" | "emu" | "cuda" | "import" (moecheck import)
  std::string variant;         // one line, e.g. "router=staged warps=8 shared_side=on"
  // Every knob of the implementation, written as root attributes "knob.<name>" (strings).
  std::vector<std::pair<std::string, std::string>> knobs;
  std::string device;        // "cpu" or the GPU's name
  std::string model_file;    // base name of the GGUF file
  std::string model_sha256;  // hex SHA-256 of the whole GGUF file; "" unless asked (--hash-file)
  std::string model_header_sha256;  // hex SHA-256 of the GGUF header and metadata (version 2)
  MoeConfig config;
  bool has_model_seed = false;  // the GGUF carried the generator's seed key
  uint64_t model_seed = 0;
  std::string input_source;  // "seed", "seed+chain", "seed+chain+residual", "dump:<file name>"
  uint64_t input_seed = 0;   // meaningful when input_source starts with "seed"
  int64_t tokens = 0;
  std::vector<int32_t> layers;  // ascending order of the /layers groups
  bool taps = false;            // every stage present (--taps), else the five basic datasets
  // Where the routing weight multiplies an expert's result: "h" (model.py: weights * h before
  // w2, so the h and down taps are weighted; the reference) or "accumulate" (the emulation and
  // the kernels: h and down unweighted, acc += w * down). Root attribute routing_weight_at.
  std::string routing_weight_at = "accumulate";
  // Layers whose SwiGLU clamps differ from config's (per-layer clamps of the deepseek4 /
  // deepseek41 conventions): layer -> (routed, shared). Attributes config.swiglu_limit and
  // config.swiglu_limit_shared of the layer's group; empty when config holds every layer's.
  std::map<int32_t, std::pair<float, float>> layer_clamps;
  // implementation "import" only (root attribute `stages`, comma-separated): the layer stages
  // the engine's files gave, in pipeline order. input and output always; router_logits,
  // topk_ids + topk_weights (together) when given; the tap stages when taps. The layer datasets
  // not listed are absent (their vectors empty). docs/golden-format.md "Imported dumps".
  std::vector<std::string> stages;
};

// Whether the dump holds the stage (every stage, except in an imported dump with a `stages` list:
// those).
bool dump_has_stage(const DumpMeta& m, Stage s);
// `stages` as written ("input,router_logits,output") and read back: known stage names, input and
// output among them, topk_ids with topk_weights, acc (the tap stages) exactly when taps.
// InputError (the bare reason) otherwise.
std::string join_stage_list(const std::vector<std::string>& v);
std::vector<std::string> parse_stage_list(const std::string& v, bool taps);

struct Dump {
  std::string path;  // where it was read from (messages)
  DumpMeta meta;
  std::vector<LayerTaps> layers;  // matches meta.layers
  // Per layer (matching layers): the SHA-256 of each tensor and expert slice the forward read
  // (golden/provenance.h); empty when the dump records none (version 1, or tensors from elsewhere).
  std::vector<std::vector<SliceHash>> slices;
};

// Writes `path` atomically (temporary "<path>.tmp-<pid>" in the same directory, then rename; the
// temporary is removed on any error). Checks the layers' shapes against meta.config first and
// throws InputError naming the layer and stage on a mismatch.
void write_dump(const std::string& path, const Dump& d);

// Reads and validates a whole dump. Every problem (missing group, dataset or attribute, wrong
// element type, wrong shape, ids out of range) is an InputError naming the file and object path.
Dump read_dump(const std::string& path);

// Only the root attributes (cheap: inspect, diff's compatibility check).
DumpMeta read_dump_meta(const std::string& path);

}  // namespace moecheck
