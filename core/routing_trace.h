// Routing traces: which experts each (layer, token) of a run picked, in the order the run visited
// its layers, with the picks predicted for each layer from the previous layer's input (what
// prefetch would have started reading). `moecheck run --trace` records them, `moecheck cache`
// replays them through the cache policy, Belady's rule and the prefetch list
// (core/cache_sim.h); the CUDA layer's prefetch (cuda/expert_lru.h) ranks its predictions with
// the same prefetch_order. Contract: docs/streaming.md "Traces".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/expert_lru_policy.h"

namespace moecheck {

struct TraceLayer {
  int32_t layer = 0;
  // [tokens, topk] each token's picks in descending key order (Routing::ids).
  std::vector<int32_t> picks;
  // [tokens, topk] the picks this layer's router and bias make on the input of the layer run
  // before it (the prefetch prediction), same order; empty for the first layer of a run.
  std::vector<int32_t> predicted;
};

struct RoutingTrace {
  int64_t n_routed = 0;
  int64_t topk = 0;
  int64_t tokens = 0;
  std::string origin;              // free text: the model and the run that recorded it
  std::vector<TraceLayer> layers;  // in the run's order

  // InputError naming `where` and the first bad field (sizes, ids outside [0, n_routed), a
  // token picking an expert twice, picks / predicted of the wrong length).
  void validate(const std::string& where) const;
};

// The order a trace is replayed in. kBatch: each layer of the run is one forward of all its
// tokens (its distinct experts). kDecode: token 0 through every layer, then token 1, ...: one
// forward per (token, layer), as a one-token decoding loop over independent tokens.
enum class ReplayOrder { kBatch, kDecode };
const char* replay_order_name(ReplayOrder o);
ReplayOrder parse_replay_order(const std::string& s, const std::string& where);

// One forward of a replay: its keys (distinct experts of the layer, ascending) and the prefetch
// candidates for the forward that follows it (prefetch_order of that forward's predictions; empty
// when the next forward has none, or this is the last one).
struct TraceForward {
  std::vector<ExpertKey> keys;
  std::vector<int32_t> predicted_next;  // ranked, every candidate (cut to prefetch_k by the user)
  int32_t next_layer = -1;
};
std::vector<TraceForward> trace_forwards(const RoutingTrace& t, ReplayOrder order);

// The prefetch list of one layer's predicted picks [tokens, topk] (descending key order per
// token): experts ranked by how many tokens' predictions hold them (more first), then by their
// best pick position over those tokens (earlier first), then by id; all candidates, ranked. At
// one token: the predicted picks in key order. The first prefetch_k of it are what prefetch reads.
std::vector<int32_t> prefetch_order(const std::vector<int32_t>& predicted, int64_t tokens,
                                    int64_t topk);

}  // namespace moecheck
