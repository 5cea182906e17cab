// The cache simulator (core/cache_sim.h, docs/streaming.md "Cache simulation"): Belady equals
// the optimum an exhaustive search over every eviction choice finds (tiny random traces), never
// does worse than LRU, never loses hits as the cache grows; with a slot per distinct key both
// miss only the first use of each key; LRU, LRU + prefetch and the prefetch accuracy against
// hand-computed values; sizes below the largest forward are reported, not simulated.
// Repro: RC_PARAMS="seed=..." build/tests/cache_sim_test.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/cache_sim.h"
#include "core/error.h"
#include "core/routing_trace.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

// Forwards over keys (0, e): each forward's experts, ascending.
std::vector<TraceForward> forwards_of(const std::vector<std::vector<int32_t>>& experts) {
  std::vector<TraceForward> out;
  for (const std::vector<int32_t>& ids : experts) {
    TraceForward f;
    for (int32_t e : ids) f.keys.push_back(ExpertKey{0, e});
    std::sort(f.keys.begin(), f.keys.end());
    out.push_back(f);
  }
  return out;
}

std::string show(const std::vector<TraceForward>& fw) {
  std::ostringstream os;
  for (const TraceForward& f : fw) {
    os << "{";
    for (ExpertKey k : f.keys) os << " " << k.layer << ":" << k.expert;
    os << " }";
  }
  return os.str();
}

// The fewest misses any demand-paging schedule of `slots` slots has on the forwards: every
// forward's keys resident together; before a forward any set of unpinned cached keys may be
// evicted (voluntary evictions included) as long as the forward's misses then fit. Exhaustive
// over every choice, memoised on (forward, cached set).
int64_t optimum_misses(const std::vector<TraceForward>& fw, int64_t slots) {
  std::map<ExpertKey, int> bit;
  std::vector<uint32_t> need;
  for (const TraceForward& f : fw) {
    uint32_t m = 0;
    for (ExpertKey k : f.keys)
      m |= 1u << bit.try_emplace(k, static_cast<int>(bit.size())).first->second;
    need.push_back(m);
  }
  std::map<std::pair<size_t, uint32_t>, int64_t> memo;
  std::function<int64_t(size_t, uint32_t)> best = [&](size_t i, uint32_t cached) -> int64_t {
    if (i == fw.size()) return 0;
    auto it = memo.find({i, cached});
    if (it != memo.end()) return it->second;
    const int misses = std::popcount(need[i] & ~cached);
    const uint32_t evictable = cached & ~need[i];
    const int must = std::max(0, std::popcount(cached) + misses - static_cast<int>(slots));
    int64_t b = std::numeric_limits<int64_t>::max();
    for (uint32_t e = evictable;; e = (e - 1) & evictable) {  // every subset of evictable
      if (std::popcount(e) >= must) b = std::min(b, misses + best(i + 1, (cached & ~e) | need[i]));
      if (e == 0) break;
    }
    memo[{i, cached}] = b;
    return b;
  };
  return best(0, 0);
}

// Random forwards over `n_keys` keys of two layers, each forward 1..max_fw distinct keys.
rc::Gen<std::vector<TraceForward>> gen_forwards(int n_keys, int max_forwards, int max_fw) {
  return rc::gen::exec([=] {
    const int n = *rc::gen::inRange(1, max_forwards + 1);
    std::vector<TraceForward> fw;
    for (int i = 0; i < n; ++i) {
      std::set<ExpertKey> keys;
      const int m = *rc::gen::inRange(1, max_fw + 1);
      for (int j = 0; j < m; ++j) {
        const int v = *rc::gen::inRange(0, n_keys);
        keys.insert(ExpertKey{v % 2, v / 2});
      }
      fw.push_back(TraceForward{std::vector<ExpertKey>(keys.begin(), keys.end()), {}, -1});
    }
    return fw;
  });
}

// A random routing trace (repeated layer ids, predictions on some layers) for the replay orders.
rc::Gen<RoutingTrace> gen_trace() {
  return rc::gen::exec([] {
    RoutingTrace t;
    t.n_routed = *rc::gen::inRange<int64_t>(2, 9);
    t.topk = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(t.n_routed, 3) + 1);
    t.tokens = *rc::gen::inRange<int64_t>(1, 5);
    const int n_layers = *rc::gen::inRange(1, 7);
    auto picks = [&] {
      std::vector<int32_t> v;
      for (int64_t tok = 0; tok < t.tokens; ++tok) {
        std::vector<int32_t> ids(static_cast<size_t>(t.n_routed));
        for (size_t e = 0; e < ids.size(); ++e) ids[e] = static_cast<int32_t>(e);
        for (size_t e = 0; e + 1 < ids.size(); ++e)  // a random permutation's first topk
          std::swap(ids[e], ids[*rc::gen::inRange<size_t>(e, ids.size())]);
        v.insert(v.end(), ids.begin(), ids.begin() + t.topk);
      }
      return v;
    };
    for (int i = 0; i < n_layers; ++i) {
      TraceLayer l;
      l.layer = *rc::gen::inRange(0, 3);
      l.picks = picks();
      if (i > 0 && *rc::gen::arbitrary<bool>()) l.predicted = picks();
      t.layers.push_back(l);
    }
    t.validate("generated trace");
    return t;
  });
}

TEST(CacheSim, LruAndBeladyMatchHandComputedCounts) {
  // Five forwards over experts of layer 0, three slots (docs/streaming.md works the LRU run).
  const std::vector<TraceForward> fw = forwards_of({{0, 1}, {2, 3}, {0, 2}, {1, 3}, {0, 1}});
  const SimCounts lru = simulate_lru(fw, 3, 0);
  EXPECT_EQ(lru.hits, 3);
  EXPECT_EQ(lru.misses, 7);
  EXPECT_EQ(lru.counters.evictions, 4u);
  EXPECT_EQ(lru.reads, 7);
  EXPECT_DOUBLE_EQ(lru.hit_rate(), 0.3);
  const SimCounts opt = simulate_belady(fw, 3);
  EXPECT_EQ(opt.hits, 5);
  EXPECT_EQ(opt.misses, 5);
  EXPECT_EQ(opt.counters.evictions, 2u);
  EXPECT_EQ(optimum_misses(fw, 3), 5);
}

TEST(CacheSim, ReplayThroughTraceForwardsMatchesHandComputedCounts) {
  // The same five forwards as a trace of one token: trace_forwards sorts each forward's keys.
  RoutingTrace t;
  t.n_routed = 4;
  t.topk = 2;
  t.tokens = 1;
  for (const std::vector<int32_t>& p :
       std::vector<std::vector<int32_t>>{{1, 0}, {3, 2}, {2, 0}, {3, 1}, {0, 1}})
    t.layers.push_back(TraceLayer{0, p, {}});
  t.validate("hand trace");
  for (ReplayOrder o : {ReplayOrder::kBatch, ReplayOrder::kDecode}) {
    const CacheSimResult r = simulate_cache(trace_forwards(t, o), 3, kPrefetchAll);
    EXPECT_FALSE(r.below_minimum);
    EXPECT_FALSE(r.has_prefetch);  // no predictions
    EXPECT_EQ(r.lru.hits, 3);
    EXPECT_EQ(r.belady.hits, 5);
  }
}

TEST(CacheSim, LruWithPrefetchMatchesHandComputedCounts) {
  // Three layers of one token; layers 1 and 2 carry predictions (ranked 2, 0 and 0, 1).
  RoutingTrace t;
  t.n_routed = 4;
  t.topk = 2;
  t.tokens = 1;
  t.layers = {TraceLayer{0, {0, 1}, {}}, TraceLayer{1, {2, 3}, {2, 0}},
              TraceLayer{2, {0, 1}, {0, 1}}};
  t.validate("hand trace");
  const std::vector<TraceForward> fw = trace_forwards(t, ReplayOrder::kBatch);
  const CacheSimResult r = simulate_cache(fw, 4, 2);
  ASSERT_TRUE(r.has_prefetch);
  EXPECT_EQ(r.lru.hits, 0);
  EXPECT_EQ(r.lru.misses, 6);
  // F0 misses 0:0, 0:1 and prefetches 1:2, 1:0; F1 hits 1:2, misses 1:3 (evicts 0:0), then
  // prefetches 2:0 (evicts 0:1) and 2:1 (evicts the unused 1:0: wasted); F2 hits both.
  const SimCounts& p = r.lru_prefetch;
  EXPECT_EQ(p.hits, 3);
  EXPECT_EQ(p.misses, 3);
  EXPECT_EQ(p.reads, 7);
  EXPECT_EQ(p.counters.prefetch_issued, 4u);
  EXPECT_EQ(p.counters.prefetch_used, 3u);
  EXPECT_EQ(p.counters.prefetch_wasted, 1u);
  EXPECT_EQ(p.counters.prefetch_late, 0u);  // the simulator's reads arrive in time
  EXPECT_EQ(p.counters.evictions, 3u);
}

TEST(CacheSim, PrefetchAccuracyMatchesHandComputedValues) {
  RoutingTrace t;
  t.n_routed = 4;
  t.topk = 2;
  t.tokens = 1;
  t.layers = {TraceLayer{0, {0, 1}, {}}, TraceLayer{1, {2, 3}, {2, 0}},
              TraceLayer{2, {0, 1}, {0, 1}}};
  const std::vector<TraceForward> fw = trace_forwards(t, ReplayOrder::kBatch);
  const PrefetchAccuracy k1 = prefetch_accuracy(fw, 1);  // issued {1:2}, {2:0}
  EXPECT_EQ(k1.forwards, 2);
  EXPECT_EQ(k1.picked, 4);
  EXPECT_EQ(k1.issued, 2);
  EXPECT_EQ(k1.picked_predicted, 2);
  EXPECT_DOUBLE_EQ(k1.recall(), 0.5);
  EXPECT_DOUBLE_EQ(k1.precision(), 1.0);
  for (int64_t k : {int64_t{2}, kPrefetchAll}) {  // issued {1:2, 1:0}, {2:0, 2:1}
    const PrefetchAccuracy a = prefetch_accuracy(fw, k);
    EXPECT_EQ(a.issued, 4);
    EXPECT_EQ(a.issued_picked, 3);
    EXPECT_DOUBLE_EQ(a.recall(), 0.75);
    EXPECT_DOUBLE_EQ(a.precision(), 0.75);
  }
  const PrefetchAccuracy none = prefetch_accuracy(fw, 0);
  EXPECT_EQ(none.issued, 0);
  EXPECT_EQ(none.picked, 4);
  EXPECT_DOUBLE_EQ(none.recall(), 0.0);
  // Two tokens in batch order: layer 1's candidates rank 3 (two tokens), then 1 and 2 (one each,
  // best position 1, by id); it picks {0, 2, 3}.
  RoutingTrace b;
  b.n_routed = 4;
  b.topk = 2;
  b.tokens = 2;
  b.layers = {TraceLayer{0, {0, 1, 1, 2}, {}}, TraceLayer{1, {2, 3, 3, 0}, {3, 1, 3, 2}}};
  b.validate("two tokens");
  const std::vector<TraceForward> bf = trace_forwards(b, ReplayOrder::kBatch);
  EXPECT_DOUBLE_EQ(prefetch_accuracy(bf, 1).recall(), 1.0 / 3);
  EXPECT_DOUBLE_EQ(prefetch_accuracy(bf, 1).precision(), 1.0);
  EXPECT_DOUBLE_EQ(prefetch_accuracy(bf, 2).precision(), 0.5);
  EXPECT_DOUBLE_EQ(prefetch_accuracy(bf, kPrefetchAll).recall(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(prefetch_accuracy(bf, kPrefetchAll).precision(), 2.0 / 3);
  // Decode order: token 1 at layer 1 predicted {3, 2} and picked {3, 0}; token 0 {3, 1} / {2, 3}.
  const PrefetchAccuracy d = prefetch_accuracy(trace_forwards(b, ReplayOrder::kDecode), 2);
  EXPECT_EQ(d.forwards, 2);
  EXPECT_EQ(d.issued_picked, 2);
  EXPECT_DOUBLE_EQ(d.recall(), 0.5);
}

TEST(CacheSim, SizesBelowTheLargestForwardAreReportedNotSimulated) {
  const std::vector<TraceForward> fw = forwards_of({{0, 1}, {0, 1, 2}, {3}});
  const TraceDemand d = trace_demand(fw);
  EXPECT_EQ(d.min_slots, 3);
  EXPECT_EQ(d.accesses, 6);
  EXPECT_EQ(d.distinct_keys, 4);
  const CacheSimResult r = simulate_cache(fw, 2, 0);
  EXPECT_TRUE(r.below_minimum);
  EXPECT_EQ(r.min_slots, 3);
  EXPECT_EQ(r.lru.hits + r.lru.misses + r.belady.hits + r.belady.misses, 0);
  testutil::expect_error([&] { simulate_lru(fw, 2, 0); },
                         {"2 slot(s)", "minimum of 3", "largest forward"}, "lru below");
  testutil::expect_error([&] { simulate_belady(fw, 2); }, {"minimum of 3"}, "belady below");
  testutil::expect_error([&] { simulate_cache(fw, 0, 0); }, {"found 0"}, "zero slots");
  testutil::expect_error([&] { simulate_cache(fw, 3, -1); }, {"prefetch_k", "-1"}, "negative k");
  EXPECT_FALSE(simulate_cache(fw, 3, 0).below_minimum);
}

RC_GTEST_PROP(CacheSim, BeladyEqualsTheExhaustiveOptimum, ()) {
  const std::vector<TraceForward> fw = *gen_forwards(8, 7, 3);
  const TraceDemand d = trace_demand(fw);
  const int64_t slots = *rc::gen::inRange<int64_t>(d.min_slots, d.distinct_keys + 1);
  RC_LOG() << show(fw) << " slots " << slots;
  const SimCounts b = simulate_belady(fw, slots);
  RC_ASSERT(b.hits + b.misses == d.accesses);
  RC_ASSERT(b.misses == optimum_misses(fw, slots));
}

RC_GTEST_PROP(CacheSim, BeladyNeverBelowLruAndMonotoneInSlots, ()) {
  const RoutingTrace t = *gen_trace();
  const ReplayOrder o = *rc::gen::element(ReplayOrder::kBatch, ReplayOrder::kDecode);
  const std::vector<TraceForward> fw = trace_forwards(t, o);
  const TraceDemand d = trace_demand(fw);
  RC_LOG() << show(fw);
  int64_t previous = -1;
  for (int64_t s = d.min_slots; s <= d.distinct_keys + 1; ++s) {
    const CacheSimResult r = simulate_cache(fw, s, kPrefetchAll);
    RC_ASSERT(!r.below_minimum);
    RC_ASSERT(r.lru.hits + r.lru.misses == d.accesses);
    RC_ASSERT(r.belady.hits >= r.lru.hits);
    RC_ASSERT(r.belady.hits >= previous);  // never fewer hits with more slots
    previous = r.belady.hits;
    if (r.has_prefetch) RC_ASSERT(r.lru_prefetch.hits + r.lru_prefetch.misses == d.accesses);
  }
  if (d.min_slots > 1) RC_ASSERT(simulate_cache(fw, d.min_slots - 1, 0).below_minimum);
}

RC_GTEST_PROP(CacheSim, ASlotPerDistinctKeyMissesOnlyFirstUses, ()) {
  const RoutingTrace t = *gen_trace();
  const ReplayOrder o = *rc::gen::element(ReplayOrder::kBatch, ReplayOrder::kDecode);
  const std::vector<TraceForward> fw = trace_forwards(t, o);
  const TraceDemand d = trace_demand(fw);
  const int64_t slots = d.distinct_keys + *rc::gen::inRange<int64_t>(0, 4);
  const CacheSimResult r = simulate_cache(fw, slots, 0);
  RC_ASSERT(r.lru.hits == d.accesses - d.distinct_keys);
  RC_ASSERT(r.belady.hits == d.accesses - d.distinct_keys);
  RC_ASSERT(r.lru.counters.evictions == 0u);
  RC_ASSERT(r.belady.counters.evictions == 0u);
  // With a slot for every key there is (layer ids 0..2), prefetch evicts nothing and can only
  // turn first uses into hits.
  const SimCounts p = simulate_lru(fw, 3 * t.n_routed, kPrefetchAll);
  RC_ASSERT(p.counters.evictions == 0u);
  RC_ASSERT(p.hits >= d.accesses - d.distinct_keys);
}

}  // namespace
}  // namespace moecheck
