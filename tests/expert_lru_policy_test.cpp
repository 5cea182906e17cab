// ExpertLruPolicy (core/expert_lru_policy.h, docs/streaming.md "The cache policy"): a
// rapidcheck state-machine test against the independent model of tests/expert_lru_model.h
// (random command sequences: acquire, release, loaded / failed of an arriving slot, prefetch,
// evict_all; 3 layers x 6 experts, 1..8 slots; after every command the slot table, the key
// index, the pins, the open leases and every counter must equal the model's, and no key of an
// open lease may have left its slot), then one plain test per documented rule.
// Repro: RC_PARAMS="seed=..." build/tests/expert_lru_policy_test (rapidcheck prints the failing
// command sequence; the seed is printed by the test main).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/expert_lru_policy.h"
#include "tests/expect_error.h"
#include "tests/expert_lru_model.h"

namespace moecheck {

std::ostream& operator<<(std::ostream& os, ExpertKey k) {
  return os << "L" << k.layer << "E" << k.expert;
}

namespace {

using lru_model::Kind;
using lru_model::MGrant;
using lru_model::Model;
using Grant = ExpertLruPolicy::Grant;
using Cmd = rc::state::Command<Model, ExpertLruPolicy>;

constexpr int kLayers = 3, kExperts = 6;

ExpertKey key_at(int v) { return ExpertKey{v / kExperts, v % kExperts}; }

// What the property exercised, summed over every case: the test fails when a rule was never hit.
struct Coverage {
  uint64_t evictions = 0, in_flight = 0, refused = 0, prefetch_used = 0, prefetch_late = 0,
           prefetch_wasted = 0, prefetch_dropped = 0, failed = 0, pinned_skips = 0;
};
Coverage g_cov;

void expect_counters(const CacheCounters& got, const CacheCounters& want) {
  RC_ASSERT(got.hits == want.hits);
  RC_ASSERT(got.misses == want.misses);
  RC_ASSERT(got.evictions == want.evictions);
  RC_ASSERT(got.prefetch_issued == want.prefetch_issued);
  RC_ASSERT(got.prefetch_used == want.prefetch_used);
  RC_ASSERT(got.prefetch_late == want.prefetch_late);
  RC_ASSERT(got.prefetch_wasted == want.prefetch_wasted);
  RC_ASSERT(got.prefetch_dropped == want.prefetch_dropped);
  RC_ASSERT(got.failed_reads == want.failed_reads);
}

// The policy's whole observable state against the model's.
void expect_state(const ExpertLruPolicy& p, const Model& m) {
  RC_ASSERT(p.n_slots() == static_cast<int64_t>(m.slots.size()));
  std::vector<int> holders(kLayers * kExperts, 0);
  for (size_t s = 0; s < m.slots.size(); ++s) {
    const int32_t si = static_cast<int32_t>(s);
    const std::optional<ExpertKey> k = p.key_of(si);
    RC_ASSERT(k.has_value() == m.slots[s].used);
    if (k) {
      RC_ASSERT(*k == m.slots[s].key);
      ++holders[static_cast<size_t>(k->layer * kExperts + k->expert)];
    }
    RC_ASSERT(p.valid(si) == m.slots[s].valid);
    RC_ASSERT(p.pinned(si) == m.slot_pinned(s));
  }
  for (int v = 0; v < kLayers * kExperts; ++v) {
    const ExpertKey k = key_at(v);
    RC_ASSERT(holders[static_cast<size_t>(v)] <= 1);  // each key in at most one slot
    RC_ASSERT(p.slot_of(k) == m.slot_of(k));
    if (p.slot_of(k) >= 0) RC_ASSERT(p.key_of(p.slot_of(k)) == std::optional<ExpertKey>(k));
  }
  RC_ASSERT(p.open_leases() == static_cast<int64_t>(m.leases.size()));
  for (const auto& [id, keys] : m.leases)
    for (ExpertKey k : keys) {  // no key of an open lease is evicted
      const int32_t s = p.slot_of(k);
      RC_ASSERT(s >= 0);
      RC_ASSERT(p.key_of(s) == std::optional<ExpertKey>(k));
      RC_ASSERT(p.pinned(s));
    }
  expect_counters(p.counters(), m.c);
}

void expect_grant(const Grant& g, const MGrant& w) {
  RC_ASSERT(g.key == w.key);
  RC_ASSERT(g.slot == w.slot);
  RC_ASSERT(g.kind == w.kind);
  RC_ASSERT(g.evicted == w.evicted);
  if (w.evicted) RC_ASSERT(g.victim == w.victim);
  g_cov.evictions += g.evicted;
  g_cov.in_flight += g.kind == Kind::kInFlight;
}

void show_keys(std::ostream& os, const char* what, const std::vector<ExpertKey>& keys) {
  os << what << "(";
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? " " : "") << keys[i];
  os << ")";
}

struct Acquire : Cmd {
  std::vector<ExpertKey> keys;
  explicit Acquire(const Model&) {
    const int n = *rc::gen::inRange(1, 7);
    for (int v : *rc::gen::container<std::vector<int>>(static_cast<size_t>(n),
                                                       rc::gen::inRange(0, kLayers * kExperts)))
      if (std::find(keys.begin(), keys.end(), key_at(v)) == keys.end()) keys.push_back(key_at(v));
    if (*rc::gen::inRange(0, 20) == 0)  // now and then a duplicate: refused
      keys.push_back(keys[static_cast<size_t>(*rc::gen::inRange<size_t>(0, keys.size()))]);
  }
  void apply(Model& m) const override { (void)m.acquire(keys); }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    Model m = m0;
    const auto want = m.acquire(keys);
    std::vector<Grant> got;
    if (!want) {
      bool refused = false;
      try {
        p.acquire(keys, &got);
      } catch (const InputError&) {
        refused = true;
      }
      RC_ASSERT(refused);
      ++g_cov.refused;
    } else {
      const int64_t lease = p.acquire(keys, &got);
      RC_ASSERT(lease == m0.next_lease);
      RC_ASSERT(got.size() == want->size());
      for (size_t i = 0; i < got.size(); ++i) expect_grant(got[i], (*want)[i]);
    }
    for (size_t s = 0; s < m0.slots.size(); ++s)
      g_cov.pinned_skips += m0.slot_pinned(s) && m0.slots[s].valid;
    expect_state(p, m);
  }
  void show(std::ostream& os) const override { show_keys(os, "acquire", keys); }
};

struct Release : Cmd {
  int64_t lease = 0;
  explicit Release(const Model& m) {
    RC_PRE(!m.leases.empty());
    std::vector<int64_t> ids;
    for (const auto& kv : m.leases) ids.push_back(kv.first);
    lease = *rc::gen::elementOf(ids);
  }
  void checkPreconditions(const Model& m) const override { RC_PRE(m.leases.count(lease) == 1u); }
  void apply(Model& m) const override { m.release(lease); }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    p.release(lease);
    expect_state(p, nextState(m0));
  }
  void show(std::ostream& os) const override { os << "release(" << lease << ")"; }
};

// A lease that is not open (never given, or released): ignored.
struct ReleaseUnknown : Cmd {
  int64_t lease = 0;
  explicit ReleaseUnknown(const Model& m) { lease = m.next_lease + *rc::gen::inRange(-3, 3); }
  void checkPreconditions(const Model& m) const override { RC_PRE(m.leases.count(lease) == 0u); }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    p.release(lease);
    expect_state(p, m0);
  }
  void show(std::ostream& os) const override { os << "release_unknown(" << lease << ")"; }
};

// loaded() or failed() of a slot whose bytes are arriving.
template <bool kFails>
struct Arrive : Cmd {
  int32_t slot = -1;
  explicit Arrive(const Model& m) {
    RC_PRE(!m.arriving().empty());
    slot = *rc::gen::elementOf(m.arriving());
  }
  void checkPreconditions(const Model& m) const override {
    const std::vector<int32_t> a = m.arriving();
    RC_PRE(std::find(a.begin(), a.end(), slot) != a.end());
  }
  void apply(Model& m) const override {
    if (kFails) m.failed(slot);
    else m.loaded(slot);
  }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    if (kFails) {
      p.failed(slot);
      ++g_cov.failed;
    } else {
      p.loaded(slot);
    }
    expect_state(p, nextState(m0));
  }
  void show(std::ostream& os) const override {
    os << (kFails ? "failed(" : "loaded(") << slot << ")";
  }
};

struct Prefetch : Cmd {
  ExpertKey key;
  explicit Prefetch(const Model&) { key = key_at(*rc::gen::inRange(0, kLayers * kExperts)); }
  void apply(Model& m) const override { (void)m.prefetch(key); }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    Model m = m0;
    const std::optional<MGrant> want = m.prefetch(key);
    const std::optional<Grant> got = p.prefetch(key);
    RC_ASSERT(got.has_value() == want.has_value());
    if (want) expect_grant(*got, *want);
    expect_state(p, m);
    g_cov.prefetch_used = std::max<uint64_t>(g_cov.prefetch_used, m.c.prefetch_used);
    g_cov.prefetch_late = std::max<uint64_t>(g_cov.prefetch_late, m.c.prefetch_late);
    g_cov.prefetch_wasted = std::max<uint64_t>(g_cov.prefetch_wasted, m.c.prefetch_wasted);
    g_cov.prefetch_dropped = std::max<uint64_t>(g_cov.prefetch_dropped, m.c.prefetch_dropped);
  }
  void show(std::ostream& os) const override { os << "prefetch(" << key << ")"; }
};

struct EvictAll : Cmd {
  void apply(Model& m) const override { (void)m.evict_all(); }
  void run(const Model& m0, ExpertLruPolicy& p) const override {
    Model m = m0;
    const int64_t want = m.evict_all();
    RC_ASSERT(p.evict_all() == want);
    expect_state(p, m);
  }
  void show(std::ostream& os) const override { os << "evict_all()"; }
};

TEST(ExpertLruPolicyModel, RandomCommandSequencesMatchTheModel) {
  g_cov = Coverage{};
  const bool ok = rc::check("ExpertLruPolicy against tests/expert_lru_model.h", [] {
    const int n = *rc::gen::inRange(1, 9);
    ExpertLruPolicy sut(n);
    rc::state::check(
        Model(n), sut,
        rc::state::gen::execOneOfWithArgs<Acquire, Acquire, Acquire, Release, Release,
                                          ReleaseUnknown, Arrive<false>, Arrive<false>,
                                          Arrive<true>, Prefetch, Prefetch, EvictAll>());
  });
  EXPECT_TRUE(ok) << "rapidcheck printed the failing command sequence above";
  // The sequences reached every rule (else the property proved less than it claims).
  EXPECT_GT(g_cov.evictions, 0u);
  EXPECT_GT(g_cov.in_flight, 0u);
  EXPECT_GT(g_cov.refused, 0u);
  EXPECT_GT(g_cov.prefetch_used, 0u);
  EXPECT_GT(g_cov.prefetch_late, 0u);
  EXPECT_GT(g_cov.prefetch_wasted, 0u);
  EXPECT_GT(g_cov.prefetch_dropped, 0u);
  EXPECT_GT(g_cov.failed, 0u);
  EXPECT_GT(g_cov.pinned_skips, 0u);
}

// ---- One test per documented rule (core/expert_lru_policy.h) ----

const ExpertKey A{0, 1}, B{0, 2}, C{1, 3}, D{2, 4}, E{2, 5};

std::vector<Grant> acquire(ExpertLruPolicy& p, const std::vector<ExpertKey>& keys,
                           int64_t* lease = nullptr) {
  std::vector<Grant> g;
  const int64_t id = p.acquire(keys, &g);
  if (lease) *lease = id;
  return g;
}

// acquire, load every miss, release: the keys end up valid, unpinned, most recent in key order.
void use(ExpertLruPolicy& p, const std::vector<ExpertKey>& keys) {
  int64_t lease = 0;
  for (const Grant& g : acquire(p, keys, &lease))
    if (g.kind == Kind::kMiss) p.loaded(g.slot);
  p.release(lease);
}

TEST(ExpertLruPolicy, MissesTakeTheLowestFreeSlotFirst) {
  ExpertLruPolicy p(4);
  const std::vector<Grant> g = acquire(p, {C, A, B});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].slot, 0);
  EXPECT_EQ(g[1].slot, 1);
  EXPECT_EQ(g[2].slot, 2);
  for (const Grant& x : g) EXPECT_FALSE(x.evicted);
  p.failed(1);  // A's read fails: slot 1 is free again, below the never-used slot 3
  EXPECT_EQ(p.slot_of(A), -1);
  const std::vector<Grant> h = acquire(p, {D});
  EXPECT_EQ(h[0].slot, 1);
  EXPECT_FALSE(h[0].evicted);
  EXPECT_EQ(acquire(p, {E})[0].slot, 3);
}

TEST(ExpertLruPolicy, VictimIsTheLeastRecentlyUsedValidUnpinnedEntry) {
  ExpertLruPolicy p(4);
  use(p, {A, B, C, D});  // recency A < B < C < D
  use(p, {A});           // B < C < D < A
  int64_t pin_b = 0;
  acquire(p, {B}, &pin_b);  // B pinned: C is the LRU that may go
  int64_t pin_e = 0;
  const std::vector<Grant> g = acquire(p, {E}, &pin_e);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Kind::kMiss);
  EXPECT_TRUE(g[0].evicted);
  EXPECT_EQ(g[0].victim, C);
  EXPECT_EQ(g[0].slot, 2);
  EXPECT_EQ(p.slot_of(C), -1);
  EXPECT_EQ(p.counters().evictions, 1u);
  // E is still arriving (not valid) and pinned; after release it is arriving only: neither is
  // evicted, D (the LRU valid unpinned entry) goes.
  p.release(pin_b);
  p.release(pin_e);
  const std::vector<Grant> h = acquire(p, {C});
  EXPECT_EQ(h[0].victim, D);
  EXPECT_EQ(p.slot_of(E), 2);
}

TEST(ExpertLruPolicy, KeysBecomeMostRecentInTheOrderGiven) {
  ExpertLruPolicy p(2);
  use(p, {B, A});  // B before A: B is the older
  EXPECT_EQ(acquire(p, {C})[0].victim, B);
  ExpertLruPolicy q(2);
  use(q, {A, B});
  EXPECT_EQ(acquire(q, {C})[0].victim, A);
}

TEST(ExpertLruPolicy, HeldKeysAreGrantedBeforeMissesTakeSlots) {
  ExpertLruPolicy p(2);
  use(p, {A, B});  // A is the LRU
  // C comes first in the forward, but A (held, the LRU) is the forward's too: C evicts B.
  const std::vector<Grant> g = acquire(p, {C, A});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].key, C);
  EXPECT_EQ(g[0].kind, Kind::kMiss);
  EXPECT_EQ(g[0].slot, 1);
  EXPECT_TRUE(g[0].evicted);
  EXPECT_EQ(g[0].victim, B);
  EXPECT_EQ(g[1].key, A);
  EXPECT_EQ(g[1].kind, Kind::kHit);
  EXPECT_EQ(g[1].slot, 0);
  EXPECT_EQ(p.counters().hits, 1u);
  EXPECT_EQ(p.counters().misses, 3u);
}

TEST(ExpertLruPolicy, KeysStillArrivingAreGrantedInFlight) {
  ExpertLruPolicy p(3);
  int64_t first = 0;
  const std::vector<Grant> m = acquire(p, {A}, &first);  // a miss not yet loaded
  const std::vector<Grant> g = acquire(p, {A, B});       // another open forward asks for A
  EXPECT_EQ(g[0].kind, Kind::kInFlight);
  EXPECT_EQ(g[0].slot, m[0].slot);
  EXPECT_EQ(g[1].kind, Kind::kMiss);
  EXPECT_EQ(p.counters().hits, 1u);  // in flight counts as a hit
  EXPECT_EQ(p.counters().misses, 2u);
  p.release(first);
  EXPECT_TRUE(p.pinned(m[0].slot));  // the second forward still pins it
  p.loaded(m[0].slot);
  EXPECT_EQ(acquire(p, {A})[0].kind, Kind::kHit);
}

TEST(ExpertLruPolicy, RefusalsNameTheCountsAndChangeNothing) {
  ExpertLruPolicy p(3);
  testutil::expect_error(
      [&] {
        acquire(p, {A, B, C, D});
      },
      {"needs 4 distinct experts", "3 slot(s)", "at least 4"}, "too many");
  testutil::expect_error([&] { acquire(p, {A, B, A}); }, {"layer 0 expert 1", "twice"}, "dup");
  int64_t lease = 0;
  acquire(p, {A, B}, &lease);  // pinned, not loaded
  p.loaded(p.slot_of(A));
  testutil::expect_error(
      [&] {
        acquire(p, {C, D});
      },
      {"needs 2 distinct experts", "2 not cached", "2 are pinned"}, "pinned");
  EXPECT_EQ(p.slot_of(C), -1);
  EXPECT_FALSE(p.key_of(2).has_value());
  EXPECT_EQ(p.open_leases(), 1);
  EXPECT_EQ(p.counters().misses, 2u);
  EXPECT_EQ(p.counters().hits, 0u);
  p.release(lease);
  p.release(lease);  // released twice, and a lease never given: ignored
  p.release(12345);
  EXPECT_EQ(p.open_leases(), 0);
  EXPECT_EQ(acquire(p, {C, D})[1].slot, 0);  // C takes free slot 2, D the LRU valid entry (A)
}

TEST(ExpertLruPolicy, PrefetchUsedLateWastedDropped) {
  ExpertLruPolicy p(2);
  const std::optional<Grant> a = p.prefetch(A);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->slot, 0);
  EXPECT_EQ(a->kind, Kind::kMiss);
  p.loaded(a->slot);
  EXPECT_FALSE(p.prefetch(A).has_value());         // held: no read, not dropped
  EXPECT_EQ(acquire(p, {A})[0].kind, Kind::kHit);  // used (lease 1 stays open)
  const std::optional<Grant> b = p.prefetch(B);    // arriving when asked for: late
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(acquire(p, {B})[0].kind, Kind::kInFlight);
  EXPECT_FALSE(p.prefetch(C).has_value());  // both slots pinned: dropped
  const CacheCounters& c = p.counters();
  EXPECT_EQ(c.prefetch_issued, 2u);
  EXPECT_EQ(c.prefetch_used, 2u);
  EXPECT_EQ(c.prefetch_late, 1u);
  EXPECT_EQ(c.prefetch_dropped, 1u);
  EXPECT_EQ(c.prefetch_wasted, 0u);

  ExpertLruPolicy q(2);
  const std::optional<Grant> x = q.prefetch(A);
  q.loaded(x->slot);
  const std::optional<Grant> y = q.prefetch(B);
  q.failed(y->slot);  // a failed prefetch is wasted
  EXPECT_EQ(q.counters().prefetch_wasted, 1u);
  EXPECT_EQ(q.counters().failed_reads, 1u);
  const std::vector<Grant> g = acquire(q, {C, D});  // evicts the unused prefetch of A: wasted
  EXPECT_TRUE(g[1].evicted);
  EXPECT_EQ(g[1].victim, A);
  EXPECT_EQ(q.counters().prefetch_wasted, 2u);
  EXPECT_EQ(q.counters().prefetch_used, 0u);
  EXPECT_EQ(q.counters().evictions, 1u);
}

TEST(ExpertLruPolicy, PrefetchTakesNoPinnedOrArrivingSlotAndBecomesMostRecent) {
  ExpertLruPolicy p(3);
  use(p, {A});
  int64_t lease = 0;
  acquire(p, {B}, &lease);  // B pinned and arriving
  const std::optional<Grant> c = p.prefetch(C);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->slot, 2);                         // the free slot
  const std::optional<Grant> d = p.prefetch(D);  // C arriving, B pinned: only A may go
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->victim, A);
  EXPECT_FALSE(p.prefetch(E).has_value());  // D and C arriving, B pinned
  p.loaded(d->slot);
  p.loaded(c->slot);
  p.release(lease);
  p.loaded(p.slot_of(B));
  // Recency now B (acquired) < C < D (prefetched in that order).
  EXPECT_EQ(acquire(p, {E})[0].victim, B);
}

TEST(ExpertLruPolicy, EvictAllDropsValidUnpinnedEntriesOnly) {
  ExpertLruPolicy p(4);
  use(p, {A});
  const std::optional<Grant> b = p.prefetch(B);  // loaded, never used: wasted when dropped
  p.loaded(b->slot);
  int64_t lease = 0;
  acquire(p, {C}, &lease);
  p.loaded(p.slot_of(C));  // valid but pinned: stays
  (void)p.prefetch(D);     // arriving: stays
  EXPECT_EQ(p.evict_all(), 2);
  EXPECT_EQ(p.slot_of(A), -1);
  EXPECT_EQ(p.slot_of(B), -1);
  EXPECT_GE(p.slot_of(C), 0);
  EXPECT_GE(p.slot_of(D), 0);
  EXPECT_EQ(p.counters().evictions, 2u);
  EXPECT_EQ(p.counters().prefetch_wasted, 1u);
  EXPECT_EQ(acquire(p, {E})[0].slot, 0);  // the freed slots are free: lowest first
}

TEST(ExpertLruPolicy, FailedReadOfAPinnedMissFreesTheSlotAndUnpinsIt) {
  ExpertLruPolicy p(2);
  int64_t lease = 0;
  const std::vector<Grant> g = acquire(p, {A, B}, &lease);
  p.loaded(g[1].slot);
  p.failed(g[0].slot);
  EXPECT_EQ(p.slot_of(A), -1);
  EXPECT_FALSE(p.pinned(g[0].slot));
  EXPECT_FALSE(p.key_of(g[0].slot).has_value());
  EXPECT_EQ(p.counters().failed_reads, 1u);
  int64_t other = 0;
  const std::vector<Grant> h = acquire(p, {C}, &other);  // takes the freed slot
  EXPECT_EQ(h[0].slot, g[0].slot);
  p.release(lease);  // must not unpin C
  EXPECT_TRUE(p.pinned(h[0].slot));
  EXPECT_FALSE(p.pinned(g[1].slot));
}

TEST(ExpertLruPolicy, SlotCountOutsideRangeAndLoadedWithoutReadAreRefused) {
  testutil::expect_error([] { ExpertLruPolicy p(0); }, {"slot count", "found 0"}, "0 slots");
  ExpertLruPolicy p(1);
  EXPECT_THROW(p.loaded(0), std::logic_error);
  EXPECT_THROW(p.failed(0), std::logic_error);
  EXPECT_THROW(p.loaded(1), std::logic_error);
}

}  // namespace
}  // namespace moecheck
