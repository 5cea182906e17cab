// ExpertLruPolicy (core/expert_lru_policy.h): slots, the key index, leases and the counters.
#include "core/expert_lru_policy.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "core/error.h"

namespace moecheck {

std::string key_name(ExpertKey k) {
  return "layer " + std::to_string(k.layer) + " expert " + std::to_string(k.expert);
}

ExpertLruPolicy::ExpertLruPolicy(int64_t n_slots) {
  if (n_slots < 1 || n_slots > (int64_t{1} << 30))
    throw InputError("expert cache: the slot count must be in [1, 2^30], found " +
                     std::to_string(n_slots));
  slots_.resize(static_cast<size_t>(n_slots));
}

ExpertLruPolicy::Slot& ExpertLruPolicy::at(int32_t slot, const char* op) {
  if (slot < 0 || slot >= n_slots())
    throw std::logic_error(std::string("ExpertLruPolicy::") + op + ": slot " +
                           std::to_string(slot) + " out of range");
  return slots_[static_cast<size_t>(slot)];
}

int32_t ExpertLruPolicy::victim(const std::vector<bool>* skip) const {
  auto skipped = [&](size_t s) { return skip != nullptr && (*skip)[s]; };
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s].used && !skipped(s)) return static_cast<int32_t>(s);
  int32_t best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& x = slots_[s];
    if (!x.valid || x.pins > 0 || skipped(s)) continue;
    if (best < 0 || x.stamp < slots_[static_cast<size_t>(best)].stamp)
      best = static_cast<int32_t>(s);
  }
  return best;
}

void ExpertLruPolicy::take(int32_t slot, ExpertKey key, Grant* g) {
  Slot& x = slots_[static_cast<size_t>(slot)];
  if (x.used) {
    g->evicted = true;
    g->victim = x.key;
    ++counters_.evictions;
    if (x.prefetched) ++counters_.prefetch_wasted;
    drop(slot);
  }
  x.used = true;
  x.key = key;
  index_[key] = slot;
}

void ExpertLruPolicy::drop(int32_t slot) {
  Slot& x = slots_[static_cast<size_t>(slot)];
  if (x.used) index_.erase(x.key);
  x = Slot{};
}

int64_t ExpertLruPolicy::acquire(const std::vector<ExpertKey>& keys, std::vector<Grant>* grants) {
  {
    std::set<ExpertKey> seen;
    for (ExpertKey k : keys)
      if (!seen.insert(k).second)
        throw InputError("expert cache: " + key_name(k) + " asked for twice by one forward");
  }
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n > n_slots())
    throw InputError("expert cache: a forward needs " + std::to_string(n) +
                     " distinct experts, the cache has " + std::to_string(n_slots()) +
                     " slot(s); give it at least " + std::to_string(n));
  // Plan first (no change until every miss has a slot).
  std::vector<int32_t> slot_for(static_cast<size_t>(n), -1);
  std::vector<bool> taken(slots_.size(), false);
  for (int64_t i = 0; i < n; ++i) {
    auto it = index_.find(keys[static_cast<size_t>(i)]);
    if (it == index_.end()) continue;
    slot_for[static_cast<size_t>(i)] = it->second;
    taken[static_cast<size_t>(it->second)] = true;
  }
  const int64_t absent = std::count(slot_for.begin(), slot_for.end(), -1);
  for (int64_t i = 0; i < n; ++i) {
    if (slot_for[static_cast<size_t>(i)] >= 0) continue;
    const int32_t v = victim(&taken);
    if (v < 0) {
      int64_t pinned = 0, arriving = 0;
      for (const Slot& x : slots_) {
        pinned += x.pins > 0;
        arriving += x.used && !x.valid && x.pins == 0;
      }
      throw CacheFullError("expert cache: a forward needs " + std::to_string(n) +
                           " distinct experts (" + std::to_string(absent) +
                           " not cached), but of the " + std::to_string(n_slots()) + " slot(s) " +
                           std::to_string(pinned) + " are pinned by open forwards and " +
                           std::to_string(arriving) + " hold prefetches still arriving");
    }
    slot_for[static_cast<size_t>(i)] = v;
    taken[static_cast<size_t>(v)] = true;
  }
  // Commit.
  grants->clear();
  grants->reserve(static_cast<size_t>(n));
  std::vector<int32_t> held;
  held.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const ExpertKey k = keys[static_cast<size_t>(i)];
    const int32_t s = slot_for[static_cast<size_t>(i)];
    Slot& x = slots_[static_cast<size_t>(s)];
    Grant g;
    g.key = k;
    g.slot = s;
    if (x.used && x.key == k) {
      g.kind = x.valid ? GrantKind::kHit : GrantKind::kInFlight;
      ++counters_.hits;
      if (x.prefetched) {
        ++counters_.prefetch_used;
        if (!x.valid) ++counters_.prefetch_late;
        x.prefetched = false;
      }
    } else {
      g.kind = GrantKind::kMiss;
      ++counters_.misses;
      take(s, k, &g);
    }
    ++x.pins;
    x.stamp = ++tick_;
    held.push_back(s);
    grants->push_back(g);
  }
  const int64_t lease = next_lease_++;
  leases_.emplace(lease, std::move(held));
  return lease;
}

void ExpertLruPolicy::loaded(int32_t slot) {
  Slot& x = at(slot, "loaded");
  if (!x.used || x.valid)
    throw std::logic_error("ExpertLruPolicy::loaded: slot " + std::to_string(slot) +
                           " has no read in flight");
  x.valid = true;
}

void ExpertLruPolicy::failed(int32_t slot) {
  Slot& x = at(slot, "failed");
  if (!x.used || x.valid)
    throw std::logic_error("ExpertLruPolicy::failed: slot " + std::to_string(slot) +
                           " has no read in flight");
  ++counters_.failed_reads;
  if (x.prefetched) ++counters_.prefetch_wasted;
  for (auto& [id, held] : leases_)
    held.erase(std::remove(held.begin(), held.end(), slot), held.end());
  drop(slot);
}

void ExpertLruPolicy::discard(int32_t slot) {
  Slot& x = at(slot, "discard");
  if (!x.used) return;
  ++counters_.failed_reads;
  if (x.prefetched) ++counters_.prefetch_wasted;
  for (auto& [id, held] : leases_)
    held.erase(std::remove(held.begin(), held.end(), slot), held.end());
  drop(slot);
}

void ExpertLruPolicy::release(int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  for (int32_t s : it->second) {
    Slot& x = slots_[static_cast<size_t>(s)];
    if (x.pins > 0) --x.pins;
  }
  leases_.erase(it);
}

std::optional<ExpertLruPolicy::Grant> ExpertLruPolicy::prefetch(ExpertKey key) {
  if (index_.count(key) != 0) return std::nullopt;
  const int32_t s = victim(nullptr);
  if (s < 0) {
    ++counters_.prefetch_dropped;
    return std::nullopt;
  }
  Grant g;
  g.key = key;
  g.slot = s;
  g.kind = GrantKind::kMiss;
  take(s, key, &g);
  Slot& x = slots_[static_cast<size_t>(s)];
  x.prefetched = true;
  x.stamp = ++tick_;
  ++counters_.prefetch_issued;
  return g;
}

int64_t ExpertLruPolicy::evict_all() {
  int64_t n = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot& x = slots_[s];
    if (!x.valid || x.pins > 0) continue;
    ++counters_.evictions;
    if (x.prefetched) ++counters_.prefetch_wasted;
    drop(static_cast<int32_t>(s));
    ++n;
  }
  return n;
}

int32_t ExpertLruPolicy::slot_of(ExpertKey key) const {
  auto it = index_.find(key);
  return it == index_.end() ? -1 : it->second;
}

std::optional<ExpertKey> ExpertLruPolicy::key_of(int32_t slot) const {
  if (slot < 0 || slot >= n_slots() || !slots_[static_cast<size_t>(slot)].used) return std::nullopt;
  return slots_[static_cast<size_t>(slot)].key;
}

bool ExpertLruPolicy::valid(int32_t slot) const {
  return slot >= 0 && slot < n_slots() && slots_[static_cast<size_t>(slot)].valid;
}

bool ExpertLruPolicy::pinned(int32_t slot) const {
  return slot >= 0 && slot < n_slots() && slots_[static_cast<size_t>(slot)].pins > 0;
}

}  // namespace moecheck
