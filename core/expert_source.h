// Where a routed expert's raw GGUF bytes come from when no device slot holds them: the interface
// the expert cache (cuda/expert_lru.h) reads its misses and prefetches through, and the source
// over LayerWeights already in host memory. The file source (pread from a GGUF) and the
// synthetic source (blocks made from a seed on demand) are golden/expert_sources.h.
// Contract: docs/streaming.md "Sources".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/layer_weights.h"

namespace moecheck {

// The three projections of an expert: gate (w1) and up (w3) [inter, dim], down (w2) [dim, inter].
enum class Proj { kGate, kUp, kDown };
inline constexpr Proj kAllProjs[3] = {Proj::kGate, Proj::kUp, Proj::kDown};
// "gate", "up", "down".
const char* proj_name(Proj p);
// llama.cpp's stacked tensor of a projection: "blk.L.ffn_gate_exps.weight".
std::string stack_tensor_name(int layer, Proj p);

// One layer's routed experts as stacks (type, rows, cols, n_experts per projection); `data` is
// the host bytes when the holder has them, nullptr otherwise.
struct ExpertLayout {
  ExpertStackView gate, up, down;

  const ExpertStackView& stack(Proj p) const;
  // Bytes of projection p of one expert, and of the whole expert (gate + up + down).
  int64_t bytes(Proj p) const { return stack(p).expert_stride(); }
  int64_t expert_bytes() const {
    return bytes(Proj::kGate) + bytes(Proj::kUp) + bytes(Proj::kDown);
  }
  int64_t n_experts() const { return gate.n_experts; }
  // Same types, rows and columns in every projection (n_experts and data may differ).
  bool same_shape(const ExpertLayout& o) const;
  // "gate Q2_K [2304, 5120], up Q2_K [2304, 5120], down Q3_K [5120, 2304]".
  std::string describe() const;
};

// The layout of a LayerWeights' stacks (their views, data included).
ExpertLayout expert_layout(const LayerWeights& w);

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Names the source in every message: "file model.gguf", "synthetic ds41 seed 1", ...
  virtual std::string name() const = 0;
  // Layer L's routed experts (data nullptr unless view() can serve them); InputError naming the
  // source and the layer when it has no such layer.
  virtual ExpertLayout layout(int layer) const = 0;
  // Copies projection p of expert e of layer L (layout(L).bytes(p) bytes) into dst. Safe to call
  // from several threads at once. Throws InputError naming the source, the tensor, the layer and
  // the expert (expert out of range, short read, I/O error, offset or size outside the file,
  // wrong type or shape); dst's content is then unspecified, and the caller marks nothing valid.
  virtual void read(int layer, int64_t expert, Proj p, uint8_t* dst) const = 0;
  // The bytes in host memory when the source holds them there (valid while the source lives),
  // else nullptr: then read() is the only way.
  virtual const uint8_t* view(int /*layer*/, int64_t /*expert*/, Proj /*p*/) const {
    return nullptr;
  }
};

// A source over layers already in host memory (their stacks' views; each LayerWeights'
// keep_alive is held). read() copies from the view, view() returns it.
class HostExpertSource : public ExpertSource {
 public:
  explicit HostExpertSource(const std::vector<LayerWeights>& layers,
                            std::string name = "host memory");
  std::string name() const override { return name_; }
  ExpertLayout layout(int layer) const override;
  void read(int layer, int64_t expert, Proj p, uint8_t* dst) const override;
  const uint8_t* view(int layer, int64_t expert, Proj p) const override;

 private:
  const LayerWeights& find(int layer) const;
  // InputError naming the source, the layer's tensor and the expert when e is outside the stack.
  void check_expert(const LayerWeights& w, int64_t expert, Proj p) const;
  std::map<int, LayerWeights> layers_;
  std::string name_;
};

}  // namespace moecheck
