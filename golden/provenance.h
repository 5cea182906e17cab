// Provenance that scales to a 200 GB model: SHA-256 over what a run actually read, not over the
// whole file. Digests of the GGUF header (metadata and tensor infos), of each layer's router,
// bias and shared expert, and of each expert slice (layer, expert, projection) a forward used;
// each computed once per model and cached. Dumps record them per layer (docs/golden-format.md
// "Provenance"); `diff` compares the slices both dumps recorded. Contract: docs/golden-format.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "golden/model_file.h"

namespace moecheck {

// One hashed piece of a layer: a whole tensor (expert -1) or one expert of a stacked tensor.
struct SliceHash {
  LayerTensor tensor = LayerTensor::kRouter;
  int32_t expert = -1;
  std::string sha256;  // 64 lower-case hex digits

  bool same_slice(const SliceHash& o) const { return tensor == o.tensor && expert == o.expert; }
};

// "blk.3.ffn_gate_exps.weight[expert 17]" or "blk.3.ffn_gate_inp.weight".
std::string slice_name(int layer, LayerTensor t, int32_t expert);
// The stable code of a tensor in dumps (its LayerTensor order: 0 = ffn_gate_inp ... 7 =
// ffn_down_shexp, 8 = exp_probs_b_vl) and back; false for an unknown code.
int32_t tensor_code(LayerTensor t);
bool tensor_from_code(int32_t code, LayerTensor* out);

class SliceHasher {
 public:
  explicit SliceHasher(ModelFile m);

  // The GGUF header: bytes [0, data offset) of the file.
  std::string header();
  // One tensor of layer L (expert < 0) or one expert's slice of a stacked tensor. A file's bytes
  // are read through its mapping; of a synthetic model an expert's slice is hashed in place when
  // its layer is filled now (someone holds it), else made through expert_source() into a buffer
  // (the layer is not filled for it); a whole tensor is read while the layer (resident_layer, or
  // layer for a whole stack) holds it.
  std::string slice(int layer, LayerTensor t, int32_t expert);
  // Hands in the digest of a slice hashed (and finite-checked) elsewhere, e.g. by an expert cache's
  // reader threads; slice() then returns it without reading. `sha256` must be 64 lower-case hex
  // digits (std::invalid_argument otherwise); a digest already known for the slice that differs is
  // an InputError naming the slice and both digests (the bytes changed between two reads).
  void record(int layer, LayerTensor t, int32_t expert, std::string sha256);
  // What a forward of layer L read: router, bias, bias_vl (when `bias_vl`: the forward routed
  // image-span tokens with it), the shared expert's three tensors, and the gate, up and down
  // slices of each of `experts` (ascending, distinct), in that order.
  std::vector<SliceHash> layer_slices(int layer, const std::vector<int32_t>& experts,
                                      bool bias_vl = false);

 private:
  // The bytes of a slice in a buffer of the hasher's own (a synthetic model's expert).
  std::vector<uint8_t> read_expert(int layer, LayerTensor t, int32_t expert, uint64_t n) const;

  ModelFile m_;  // a copy: it shares the mapping, so the hasher outlives any one owner
  std::shared_ptr<const ExpertSource> source_;  // a synthetic model's; nullptr for a file
  std::mutex mu_;
  std::string header_;
  std::map<std::tuple<int, int, int32_t>, std::string> cache_;
};

// The distinct experts of a routing's picks, ascending.
std::vector<int32_t> experts_used(const std::vector<int32_t>& topk_ids);

}  // namespace moecheck
