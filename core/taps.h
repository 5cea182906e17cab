// What a layer forward can return besides its output: every stage, in the same structure from
// the reference, the emulation and the CUDA driver, so that any stage can be compared (and
// dumped to HDF5 by golden/). Shapes in comments, row-major. Stages an implementation does not
// have (the reference has no q8_1 blocks) stay empty. The Stage enum names each stage once for
// the dump writer and every judge (docs/golden-format.md lists the dataset names).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/blocks.h"

namespace moecheck {

// Every stage of one layer forward, in pipeline order. Routed-expert stages (kExperts*) hold one
// row per (expert, token) the forward computed; shared-expert stages (kShared*) one per token.
enum class Stage : int {
  kInput,
  kRouterLogits,
  kTopkIds,
  kTopkWeights,
  kXQ8,
  kExpertsWeights,
  kExpertsGate,
  kExpertsUp,
  kExpertsH,
  kExpertsHQ8,
  kExpertsDown,
  kSharedWeights,
  kSharedGate,
  kSharedUp,
  kSharedH,
  kSharedHQ8,
  kSharedDown,
  kAcc,
  kOutput,
};
inline constexpr int kStageCount = 19;

// The per-expert fields of ExpertTaps, in pipeline order.
enum class ExpertField : int { kWeights, kGate, kUp, kH, kHQ8, kDown };
inline constexpr int kExpertFieldCount = 6;

// Every stage in pipeline order.
const std::array<Stage, kStageCount>& all_stages();
// The report name: "input", "router_logits", "experts.gate", "shared.h_q8", ...
const char* stage_name(Stage s);
// The HDF5 dataset name: under /layers/<L>/ for layer stages ("router_logits"), under
// experts/<E>/ or shared/ for expert stages ("gate").
const char* stage_dataset(Stage s);
// Whether the stage is a field of a routed or of the shared expert, and which field.
bool is_routed_stage(Stage s);
bool is_shared_stage(Stage s);
ExpertField stage_field(Stage s);  // expert stages only
Stage expert_stage(bool shared, ExpertField f);
// The report name's inverse; false when `name` is no stage.
bool parse_stage(const std::string& name, Stage* out);

struct ExpertTaps {
  int32_t expert = -1;          // routed expert id; -1 for the shared expert
  std::vector<int32_t> tokens;  // the tokens that picked it, ascending
  std::vector<float>
      weights;              // [n_tok] routing weight of this expert for each token (1 for shared)
  std::vector<float> gate;  // [n_tok, inter] w1 . x
  std::vector<float> up;    // [n_tok, inter] w3 . x
  std::vector<float> h;     // [n_tok, inter] the down projection's input, before q8_1 / bf16
  std::vector<BlockQ8_1> h_q8;  // [n_tok, inter / 32] (emu, cuda)
  std::vector<float> down;      // [n_tok, dim] w2 . h
};

struct LayerTaps {
  int layer = 0;
  int64_t tokens = 0;
  std::vector<uint16_t> input;       // bf16 [T, dim]
  std::vector<uint8_t> image_mask;   // [T] 1 = inside an image span (routes with bias_vl); empty =
                                     // no mask given (every token routes with bias)
  std::vector<float> router_logits;  // [T, n_routed] raw dot products (before / gate_temp)
  std::vector<int32_t> topk_ids;     // [T, topk] descending key order
  std::vector<float> topk_weights;   // [T, topk]
  std::vector<BlockQ8_1> x_q8;       // [T, dim / 32] (emu, cuda)
  std::vector<ExpertTaps> experts;   // routed experts that some token picked, ascending id
  ExpertTaps shared;                 // the shared expert on all tokens
  std::vector<float> acc;            // [T, dim] f32 accumulator before the final rounding
  std::vector<uint16_t> output;      // bf16 [T, dim]
};

// The shared expert's identity in the taps: expert -1, every token 0..T-1 in order, weight 1.
// Its stages (gate, up, h, h_q8, down) are the caller's.
void fill_shared_taps(ExpertTaps& s, int64_t T);

// Where one forward's time went (wall clock, host side), like the seeds' MoeV41Timing: route_ms
// until the experts are known (the host route's round trip; 0 on the device route), fetch_ms the
// expert cache's acquisition (reads of the misses, waits for late prefetches; 0 without a cache),
// compute_ms the rest; hits and misses of the cache (without one: 0), bytes_read the bytes read
// from its expert source; weight_bytes the weight bytes the forward's kernels read (router, the
// picked experts, the shared expert: the numerator of a bandwidth figure).
struct LayerTiming {
  double route_ms = 0;
  double fetch_ms = 0;
  double compute_ms = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_read = 0;
  uint64_t weight_bytes = 0;

  void add(const LayerTiming& o) {
    route_ms += o.route_ms;
    fetch_ms += o.fetch_ms;
    compute_ms += o.compute_ms;
    hits += o.hits;
    misses += o.misses;
    bytes_read += o.bytes_read;
    weight_bytes += o.weight_bytes;
  }
};

}  // namespace moecheck
