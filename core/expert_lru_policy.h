// The expert cache's bookkeeping (the seeds' ExpertLru, its host half): which device slot holds
// which (layer, expert), least-recently-used eviction, pins held by open forwards, entries whose
// bytes are still arriving, prefetches and the counters. Pure C++ with no device, so the CPU
// tests drive it and the cache simulator (core/cache_sim.h) replays traces through the very
// same decisions; cuda/expert_lru.h moves the bytes and fills the slot table as it says.
// Contract: docs/streaming.md "The cache policy".
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace moecheck {

struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;
  friend auto operator<=>(const ExpertKey&, const ExpertKey&) = default;
};
// "layer 3 expert 17".
std::string key_name(ExpertKey k);

// What the cache did. hits + misses = the keys forwards asked for.
struct CacheCounters {
  uint64_t hits = 0;             // keys found in a slot (valid, or a prefetch still arriving)
  uint64_t misses = 0;           // keys a forward had to read
  uint64_t evictions = 0;        // entries dropped to make room (prefetched ones included)
  uint64_t prefetch_issued = 0;  // prefetches that took a slot and started a read
  uint64_t prefetch_used = 0;    // prefetched entries a forward then asked for (late ones too)
  uint64_t prefetch_late = 0;    // of those, still arriving when asked for: the forward waited
  uint64_t prefetch_wasted =
      0;  // prefetched entries evicted or failed before any forward used them
  uint64_t prefetch_dropped = 0;  // prefetches refused: every slot pinned or arriving
  uint64_t failed_reads = 0;      // reads that failed (failed())
  // Filled by the device side: bytes read from the source, host time forwards waited for reads.
  uint64_t bytes_read = 0;
  double stall_ms = 0;
};

// acquire()'s refusal when the forward's keys do not fit the slots that open leases and arriving
// reads leave (a caller that pipelines forwards can finish one and try again).
class CacheFullError : public InputError {
 public:
  using InputError::InputError;
};

class ExpertLruPolicy {
 public:
  enum class GrantKind {
    kHit,       // valid in `slot`
    kInFlight,  // in `slot`, its bytes still arriving (a prefetch, or another open forward's miss)
    kMiss,      // `slot` is the key's now; the caller reads it, then loaded() or failed()
  };
  struct Grant {
    ExpertKey key;
    int32_t slot = -1;
    GrantKind kind = GrantKind::kMiss;
    bool evicted = false;  // the slot held `victim` until now (its slot-table entry must go)
    ExpertKey victim;
  };

  // n_slots >= 1 device slots, all free.
  explicit ExpertLruPolicy(int64_t n_slots);

  int64_t n_slots() const { return static_cast<int64_t>(slots_.size()); }

  // One forward's distinct keys (duplicates refused). Every key is pinned until release(lease);
  // one grant per key, in the order given. The keys already held are granted first, so no key of
  // the forward is evicted for another of it; each miss then takes the lowest free slot, else the
  // least recently used entry that is valid and unpinned. Every key of the forward becomes the
  // most recently used, in the order given. Throws, leaving the policy unchanged, an InputError
  // when the forward needs more slots than there are, a CacheFullError when it needs more than
  // open leases and arriving reads leave free (the messages give the counts).
  int64_t acquire(const std::vector<ExpertKey>& keys, std::vector<Grant>* grants);
  // The slot's bytes (a miss's or a prefetch's) have fully arrived: hits from now on.
  void loaded(int32_t slot);
  // The slot's read failed: its entry is dropped and the slot is free; nothing became valid.
  void failed(int32_t slot);
  // Drops the slot's entry whatever its state (bytes found bad after they arrived): counted as a
  // failed read; the slot is free and no open lease pins it any more.
  void discard(int32_t slot);
  // Drops the lease's pins (its keys stay cached). Unknown leases are ignored.
  void release(int64_t lease);
  // Starts a prefetch of `key` unless the cache holds it: takes the lowest free slot, else the
  // least recently used valid unpinned entry, and the entry becomes the most recently used. The
  // grant (kind kMiss: the caller reads, then loaded() / failed()), or nullopt when the key is
  // held already or no slot can be taken (counted as dropped).
  std::optional<Grant> prefetch(ExpertKey key);
  // Drops every valid unpinned entry (free slots from now on); returns how many.
  int64_t evict_all();

  // The slot holding `key` (valid or arriving), -1 when none.
  int32_t slot_of(ExpertKey key) const;
  // Slot state: holds a key (valid or arriving), valid, pinned by an open lease.
  std::optional<ExpertKey> key_of(int32_t slot) const;
  bool valid(int32_t slot) const;
  bool pinned(int32_t slot) const;
  int64_t open_leases() const { return static_cast<int64_t>(leases_.size()); }

  const CacheCounters& counters() const { return counters_; }
  CacheCounters& counters() { return counters_; }

 private:
  struct Slot {
    bool used = false, valid = false, prefetched = false;
    int32_t pins = 0;
    uint64_t stamp = 0;  // last use: larger is more recent
    ExpertKey key;
  };
  struct KeyHash {
    size_t operator()(ExpertKey k) const {
      return std::hash<uint64_t>()((static_cast<uint64_t>(static_cast<uint32_t>(k.layer)) << 32) |
                                   static_cast<uint32_t>(k.expert));
    }
  };
  // The slot a new entry takes (lowest free, else least recently used valid unpinned), -1 if none;
  // `skip` marks slots already chosen in this acquire.
  int32_t victim(const std::vector<bool>* skip) const;
  void drop(int32_t slot);  // the slot becomes free (no counter moves)
  // The slot becomes key's (not valid, not pinned): its old entry, if any, evicted into *g.
  void take(int32_t slot, ExpertKey key, Grant* g);
  Slot& at(int32_t slot, const char* op);

  std::vector<Slot> slots_;
  std::unordered_map<ExpertKey, int32_t, KeyHash> index_;
  std::unordered_map<int64_t, std::vector<int32_t>> leases_;
  int64_t next_lease_ = 1;
  uint64_t tick_ = 0;
  CacheCounters counters_;
};

}  // namespace moecheck
