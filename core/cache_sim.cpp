// The expert-cache simulator (core/cache_sim.h): LRU through ExpertLruPolicy, Belady's MIN with
// pinned forwards, and the prefetch accuracy of a trace.
#include "core/cache_sim.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "core/error.h"

namespace moecheck {

double SimCounts::hit_rate() const {
  const int64_t n = hits + misses;
  return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
}

double PrefetchAccuracy::recall() const {
  return picked == 0 ? 0.0 : static_cast<double>(picked_predicted) / static_cast<double>(picked);
}

double PrefetchAccuracy::precision() const {
  return issued == 0 ? 0.0 : static_cast<double>(issued_picked) / static_cast<double>(issued);
}

namespace {

// The keys forward f prefetches: the first min(K, candidates) of its predicted_next.
std::vector<ExpertKey> issued_keys(const TraceForward& f, int64_t prefetch_k) {
  std::vector<ExpertKey> out;
  const size_t n = static_cast<size_t>(
      std::min<int64_t>(prefetch_k, static_cast<int64_t>(f.predicted_next.size())));
  out.reserve(n);
  for (size_t j = 0; j < n; ++j) out.push_back(ExpertKey{f.next_layer, f.predicted_next[j]});
  return out;
}

void require_slots(const std::vector<TraceForward>& forwards, int64_t slots, const char* who) {
  if (slots < 1)
    throw InputError(std::string(who) + ": the slot count must be >= 1, found " +
                     std::to_string(slots));
  const int64_t need = trace_demand(forwards).min_slots;
  if (slots < need)
    throw InputError(std::string(who) + ": a cache of " + std::to_string(slots) +
                     " slot(s) is below the trace's minimum of " + std::to_string(need) +
                     " (its largest forward's distinct experts)");
}

void require_prefetch_k(int64_t prefetch_k) {
  if (prefetch_k < 0)
    throw InputError("cache simulation: prefetch_k must be >= 0, found " +
                     std::to_string(prefetch_k));
}

}  // namespace

TraceDemand trace_demand(const std::vector<TraceForward>& forwards) {
  TraceDemand d;
  std::set<ExpertKey> seen;
  d.forwards = static_cast<int64_t>(forwards.size());
  for (const TraceForward& f : forwards) {
    const int64_t n = static_cast<int64_t>(f.keys.size());
    d.accesses += n;
    d.min_slots = std::max(d.min_slots, n);
    seen.insert(f.keys.begin(), f.keys.end());
    d.has_predictions = d.has_predictions || !f.predicted_next.empty();
  }
  d.distinct_keys = static_cast<int64_t>(seen.size());
  return d;
}

PrefetchAccuracy prefetch_accuracy(const std::vector<TraceForward>& forwards, int64_t prefetch_k) {
  require_prefetch_k(prefetch_k);
  PrefetchAccuracy a;
  for (size_t i = 0; i + 1 < forwards.size(); ++i) {
    if (forwards[i].predicted_next.empty()) continue;
    const std::vector<ExpertKey> issued = issued_keys(forwards[i], prefetch_k);
    const std::vector<ExpertKey>& picked = forwards[i + 1].keys;
    int64_t both = 0;
    for (ExpertKey k : picked) both += std::find(issued.begin(), issued.end(), k) != issued.end();
    ++a.forwards;
    a.picked += static_cast<int64_t>(picked.size());
    a.issued += static_cast<int64_t>(issued.size());
    a.picked_predicted += both;  // keys are distinct on both sides: one intersection
    a.issued_picked += both;
  }
  return a;
}

SimCounts simulate_lru(const std::vector<TraceForward>& forwards, int64_t slots,
                       int64_t prefetch_k) {
  require_slots(forwards, slots, "LRU simulation");
  require_prefetch_k(prefetch_k);
  // Slots beyond the keys that can ever enter the cache are never taken (misses take the lowest
  // free slot): the policy runs with at most that many, the same decisions.
  std::set<ExpertKey> can_enter;
  for (const TraceForward& f : forwards) {
    can_enter.insert(f.keys.begin(), f.keys.end());
    for (ExpertKey k : issued_keys(f, prefetch_k)) can_enter.insert(k);
  }
  ExpertLruPolicy p(std::min<int64_t>(slots, static_cast<int64_t>(can_enter.size())));
  std::vector<ExpertLruPolicy::Grant> grants;
  for (const TraceForward& f : forwards) {
    const int64_t lease = p.acquire(f.keys, &grants);
    for (const ExpertLruPolicy::Grant& g : grants)
      if (g.kind == ExpertLruPolicy::GrantKind::kMiss) p.loaded(g.slot);
    for (ExpertKey k : issued_keys(f, prefetch_k))
      if (const auto g = p.prefetch(k)) p.loaded(g->slot);
    p.release(lease);
  }
  SimCounts s;
  s.counters = p.counters();
  s.hits = static_cast<int64_t>(s.counters.hits);
  s.misses = static_cast<int64_t>(s.counters.misses);
  s.reads = s.misses + static_cast<int64_t>(s.counters.prefetch_issued);
  return s;
}

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// next[f][j]: the index of the next forward after f that asks for forwards[f].keys[j], kNever
// when none does.
std::vector<std::vector<int64_t>> next_uses(const std::vector<TraceForward>& forwards) {
  std::vector<std::vector<int64_t>> next(forwards.size());
  std::map<ExpertKey, int64_t> later;
  for (size_t f = forwards.size(); f-- > 0;) {
    const std::vector<ExpertKey>& keys = forwards[f].keys;
    next[f].resize(keys.size());
    for (size_t j = 0; j < keys.size(); ++j) {
      auto it = later.find(keys[j]);
      next[f][j] = it == later.end() ? kNever : it->second;
    }
    for (ExpertKey k : keys) later[k] = static_cast<int64_t>(f);
  }
  return next;
}

// Eviction order: the farthest next use first, ties to the lowest (layer, expert).
struct VictimFirst {
  bool operator()(const std::pair<int64_t, ExpertKey>& a,
                  const std::pair<int64_t, ExpertKey>& b) const {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  }
};

}  // namespace

SimCounts simulate_belady(const std::vector<TraceForward>& forwards, int64_t slots) {
  require_slots(forwards, slots, "Belady simulation");
  const std::vector<std::vector<int64_t>> next = next_uses(forwards);
  std::map<ExpertKey, int64_t> cached;  // key -> its next use
  std::set<std::pair<int64_t, ExpertKey>, VictimFirst> unpinned;
  SimCounts s;
  for (size_t f = 0; f < forwards.size(); ++f) {
    const std::vector<ExpertKey>& keys = forwards[f].keys;
    // Pin the forward's cached keys (out of the eviction order), then place its misses.
    std::vector<bool> hit(keys.size(), false);
    for (size_t j = 0; j < keys.size(); ++j) {
      auto it = cached.find(keys[j]);
      if (it == cached.end()) continue;
      hit[j] = true;
      unpinned.erase({it->second, keys[j]});
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      if (hit[j]) {
        ++s.hits;
        continue;
      }
      ++s.misses;
      if (static_cast<int64_t>(cached.size()) >= slots) {
        const auto victim = *unpinned.begin();  // non-empty: slots >= the largest forward
        unpinned.erase(unpinned.begin());
        cached.erase(victim.second);
        ++s.counters.evictions;
      }
      cached[keys[j]] = 0;
    }
    for (size_t j = 0; j < keys.size(); ++j) {  // release: the keys' next uses from here
      cached[keys[j]] = next[f][j];
      unpinned.insert({next[f][j], keys[j]});
    }
  }
  s.reads = s.misses;
  s.counters.hits = static_cast<uint64_t>(s.hits);
  s.counters.misses = static_cast<uint64_t>(s.misses);
  return s;
}

CacheSimResult simulate_cache(const std::vector<TraceForward>& forwards, int64_t slots,
                              int64_t prefetch_k) {
  if (slots < 1)
    throw InputError("cache simulation: the slot count must be >= 1, found " +
                     std::to_string(slots));
  require_prefetch_k(prefetch_k);
  const TraceDemand d = trace_demand(forwards);
  CacheSimResult r;
  r.slots = slots;
  r.min_slots = d.min_slots;
  r.below_minimum = slots < d.min_slots;
  r.has_prefetch = prefetch_k > 0 && d.has_predictions;
  if (r.below_minimum) return r;
  r.lru = simulate_lru(forwards, slots, 0);
  if (r.has_prefetch) r.lru_prefetch = simulate_lru(forwards, slots, prefetch_k);
  r.belady = simulate_belady(forwards, slots);
  return r;
}

}  // namespace moecheck
