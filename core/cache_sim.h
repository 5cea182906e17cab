// The expert-cache simulator: a routing trace (core/routing_trace.h) replayed, forward by
// forward in a ReplayOrder, through a cache of S slots of one expert each, under
//  - LRU: the real ExpertLruPolicy (core/expert_lru_policy.h); each forward is acquired, its
//    misses marked loaded, and released; with prefetch, after forward i is acquired the first
//    prefetch_k keys of its predicted_next are prefetched and marked loaded at once (the
//    simulator's reads complete before the next forward: no late prefetch), then i is released;
//  - Belady: the offline optimum (MIN) under the same rules: a forward's keys are pinned
//    together, each miss evicts the unpinned cached key whose next use is farthest away (never
//    used again first), ties to the lowest (layer, expert); no prefetch;
// and the trace's prefetch accuracy at K (recall, precision), which does not depend on S.
// Contract: docs/streaming.md "Cache simulation".
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "core/expert_lru_policy.h"
#include "core/routing_trace.h"

namespace moecheck {

// prefetch_k meaning every candidate of predicted_next.
inline constexpr int64_t kPrefetchAll = std::numeric_limits<int64_t>::max();

// What one policy did at one size. hits + misses = the keys forwards asked for (accesses).
struct SimCounts {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t reads = 0;  // experts read from the source: misses + prefetches issued
  // hits / (hits + misses); 0 when nothing was asked for.
  double hit_rate() const;
  CacheCounters counters;  // the policy's own counters (LRU runs; Belady fills hits, misses,
                           // evictions)
};

// Prefetch accuracy at K over the forwards that had a prediction (a forward i whose
// predicted_next is non-empty predicts forward i + 1): recall = picked keys of those forwards
// that were among the first K predicted / all their picked keys; precision = predicted keys
// issued (the first K) that forward i + 1 then picked / predicted keys issued.
struct PrefetchAccuracy {
  int64_t forwards = 0;          // forwards with a prediction
  int64_t picked = 0;            // their keys
  int64_t picked_predicted = 0;  // of those, among the first K predicted
  int64_t issued = 0;            // predicted keys issued (min(K, candidates) per forward)
  int64_t issued_picked = 0;     // of those, picked by the forward predicted
  double recall() const;         // picked_predicted / picked (0 when picked == 0)
  double precision() const;      // issued_picked / issued (0 when issued == 0)
};

// What a trace asks of any cache.
struct TraceDemand {
  int64_t forwards = 0;
  int64_t accesses = 0;       // keys asked for, summed over forwards
  int64_t distinct_keys = 0;  // distinct (layer, expert) picked
  int64_t min_slots = 0;      // the largest forward: no cache below it can run the trace
  bool has_predictions = false;
};
TraceDemand trace_demand(const std::vector<TraceForward>& forwards);
PrefetchAccuracy prefetch_accuracy(const std::vector<TraceForward>& forwards, int64_t prefetch_k);

struct CacheSimResult {
  int64_t slots = 0;
  // slots < min_slots: nothing was simulated (every count below is 0).
  bool below_minimum = false;
  int64_t min_slots = 0;
  SimCounts lru;
  bool has_prefetch = false;  // prefetch_k > 0 and some forward has predictions
  SimCounts lru_prefetch;
  SimCounts belady;
};

// The trace's forwards at S = `slots` (>= 1) slots; prefetch_k 0 turns the prefetch run off,
// kPrefetchAll takes every candidate. InputError for slots < 1 or prefetch_k < 0.
CacheSimResult simulate_cache(const std::vector<TraceForward>& forwards, int64_t slots,
                              int64_t prefetch_k);

// The two policies alone (slots >= the largest forward; InputError otherwise).
SimCounts simulate_lru(const std::vector<TraceForward>& forwards, int64_t slots,
                       int64_t prefetch_k);
SimCounts simulate_belady(const std::vector<TraceForward>& forwards, int64_t slots);

}  // namespace moecheck
