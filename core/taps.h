// What a layer forward can return besides its output: every stage, in the same structure from
// the reference, the emulation and the CUDA driver, so that any stage can be compared (and
// dumped to HDF5 by golden/). Shapes in comments, row-major. Stages an implementation does not
// have (the reference has no q8_1 blocks) stay empty.
#pragma once

#include <cstdint>
#include <vector>

#include "core/blocks.h"

namespace moecheck {

struct ExpertTaps {
  int32_t expert = -1;            // routed expert id; -1 for the shared expert
  std::vector<int32_t> tokens;    // the tokens that picked it, ascending
  std::vector<float> weights;     // [n_tok] routing weight of this expert for each token (1 for shared)
  std::vector<float> gate;        // [n_tok, inter] w1 . x
  std::vector<float> up;          // [n_tok, inter] w3 . x
  std::vector<float> h;           // [n_tok, inter] the down projection's input, before q8_1 / bf16
  std::vector<BlockQ8_1> h_q8;    // [n_tok, inter / 32] (emu, cuda)
  std::vector<float> down;        // [n_tok, dim] w2 . h
};

struct LayerTaps {
  int layer = 0;
  int64_t tokens = 0;
  std::vector<uint16_t> input;          // bf16 [T, dim]
  std::vector<float> router_logits;     // [T, n_routed] raw dot products (before / gate_temp)
  std::vector<int32_t> topk_ids;        // [T, topk] descending key order
  std::vector<float> topk_weights;      // [T, topk]
  std::vector<BlockQ8_1> x_q8;          // [T, dim / 32] (emu, cuda)
  std::vector<ExpertTaps> experts;      // routed experts that some token picked, ascending id
  ExpertTaps shared;                    // the shared expert on all tokens
  std::vector<float> acc;               // [T, dim] f32 accumulator before the final rounding
  std::vector<uint16_t> output;         // bf16 [T, dim]
};

// Where one forward's time went (wall clock, host side), like the seeds' MoeV41Timing.
struct LayerTiming {
  double route_ms = 0;
  double fetch_ms = 0;
  double compute_ms = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_read = 0;

  void add(const LayerTiming& o) {
    route_ms += o.route_ms;
    fetch_ms += o.fetch_ms;
    compute_ms += o.compute_ms;
    hits += o.hits;
    misses += o.misses;
    bytes_read += o.bytes_read;
  }
};

}  // namespace moecheck
