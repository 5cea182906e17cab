// An independent model of ExpertLruPolicy (core/expert_lru_policy.h) for the state-machine test
// (tests/expert_lru_policy_test.cpp), written from the header's documented rules and not from the
// policy's code: slots as a plain vector searched linearly, recency as a list of keys (least
// recently used first) instead of stamps, pins as lease membership (a key is pinned while some
// open lease lists it) instead of counts.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "core/expert_lru_policy.h"

namespace moecheck::lru_model {

using Kind = ExpertLruPolicy::GrantKind;

struct MSlot {
  bool used = false, valid = false, prefetched = false;
  ExpertKey key;
};

struct MGrant {
  ExpertKey key;
  int32_t slot = -1;
  Kind kind = Kind::kMiss;
  bool evicted = false;
  ExpertKey victim;
};

struct Model {
  std::vector<MSlot> slots;
  std::vector<ExpertKey> recency;                    // least recently used first
  std::map<int64_t, std::vector<ExpertKey>> leases;  // open leases and the keys they pin
  int64_t next_lease = 1;
  CacheCounters c;

  explicit Model(int n) : slots(static_cast<size_t>(n)) {}

  int32_t slot_of(ExpertKey k) const {
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].used && slots[s].key == k) return static_cast<int32_t>(s);
    return -1;
  }
  bool pinned(ExpertKey k) const {
    for (const auto& [id, keys] : leases)
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) return true;
    return false;
  }
  bool slot_pinned(size_t s) const { return slots[s].used && pinned(slots[s].key); }
  std::vector<int32_t> arriving() const {
    std::vector<int32_t> out;
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].used && !slots[s].valid) out.push_back(static_cast<int32_t>(s));
    return out;
  }
  void touch(ExpertKey k) {
    recency.erase(std::remove(recency.begin(), recency.end(), k), recency.end());
    recency.push_back(k);
  }
  void drop(size_t s) {
    const ExpertKey k = slots[s].key;
    recency.erase(std::remove(recency.begin(), recency.end(), k), recency.end());
    slots[s] = MSlot{};
  }
  // Lowest free slot not taken, else the least recently used valid unpinned one not taken.
  int32_t victim(const std::vector<bool>& taken) const {
    for (size_t s = 0; s < slots.size(); ++s)
      if (!slots[s].used && !taken[s]) return static_cast<int32_t>(s);
    for (ExpertKey k : recency) {
      const int32_t s = slot_of(k);
      const MSlot& x = slots[static_cast<size_t>(s)];
      if (x.valid && !pinned(k) && !taken[static_cast<size_t>(s)]) return s;
    }
    return -1;
  }
  // A new entry for `k` in slot s: the previous holder (if any) is evicted into `g`.
  void take(int32_t s, ExpertKey k, MGrant* g) {
    MSlot& x = slots[static_cast<size_t>(s)];
    if (x.used) {
      g->evicted = true;
      g->victim = x.key;
      ++c.evictions;
      if (x.prefetched) ++c.prefetch_wasted;
      drop(static_cast<size_t>(s));
    }
    x.used = true;
    x.key = k;
  }

  // nullopt: refused (the model unchanged).
  std::optional<std::vector<MGrant>> acquire(const std::vector<ExpertKey>& keys) {
    for (size_t i = 0; i < keys.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (keys[i] == keys[j]) return std::nullopt;
    std::vector<bool> taken(slots.size(), false);
    std::vector<int32_t> where(keys.size(), -1);
    for (size_t i = 0; i < keys.size(); ++i) {
      where[i] = slot_of(keys[i]);
      if (where[i] >= 0) taken[static_cast<size_t>(where[i])] = true;
    }
    std::vector<bool> held(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      held[i] = where[i] >= 0;
      if (held[i]) continue;
      where[i] = victim(taken);
      if (where[i] < 0) return std::nullopt;
      taken[static_cast<size_t>(where[i])] = true;
    }
    std::vector<MGrant> grants;
    for (size_t i = 0; i < keys.size(); ++i) {
      MGrant g;
      g.key = keys[i];
      g.slot = where[i];
      MSlot& x = slots[static_cast<size_t>(where[i])];
      if (held[i]) {
        g.kind = x.valid ? Kind::kHit : Kind::kInFlight;
        ++c.hits;
        if (x.prefetched) {
          ++c.prefetch_used;
          if (!x.valid) ++c.prefetch_late;
          x.prefetched = false;
        }
      } else {
        g.kind = Kind::kMiss;
        ++c.misses;
        take(where[i], keys[i], &g);
      }
      touch(keys[i]);
      grants.push_back(g);
    }
    leases[next_lease++] = keys;
    return grants;
  }

  std::optional<MGrant> prefetch(ExpertKey k) {
    if (slot_of(k) >= 0) return std::nullopt;
    const int32_t s = victim(std::vector<bool>(slots.size(), false));
    if (s < 0) {
      ++c.prefetch_dropped;
      return std::nullopt;
    }
    MGrant g;
    g.key = k;
    g.slot = s;
    take(s, k, &g);
    slots[static_cast<size_t>(s)].prefetched = true;
    touch(k);
    ++c.prefetch_issued;
    return g;
  }

  void loaded(int32_t s) { slots[static_cast<size_t>(s)].valid = true; }

  void failed(int32_t s) {
    MSlot& x = slots[static_cast<size_t>(s)];
    ++c.failed_reads;
    if (x.prefetched) ++c.prefetch_wasted;
    for (auto& [id, keys] : leases)
      keys.erase(std::remove(keys.begin(), keys.end(), x.key), keys.end());
    drop(static_cast<size_t>(s));
  }

  void release(int64_t lease) { leases.erase(lease); }

  int64_t evict_all() {
    int64_t n = 0;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!slots[s].valid || slot_pinned(s)) continue;
      ++c.evictions;
      if (slots[s].prefetched) ++c.prefetch_wasted;
      drop(s);
      ++n;
    }
    return n;
  }
};

}  // namespace moecheck::lru_model
