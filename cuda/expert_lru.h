// The expert cache (the seeds' ExpertLru): a pool of device slots, each holding one routed
// expert's gate, up and down blocks, keyed by (layer, expert); the slot table the device route
// reads ([kSlotTableLayers][n_routed] i32, -1 = not resident) and the slots' pointer arrays; the
// reader pool that reads misses from an ExpertSource into pinned staging and copies them in on
// its own streams; prefetch. Which slot holds what is decided by core/expert_lru_policy.h (host
// C++ the CPU tests drive); this class only moves bytes and keeps the device tables in step.
// cuda::MoeLayer reads its experts through it (kernels read the slots in place; hits are never
// copied). Contract: docs/streaming.md "The device cache". A plain C++ header (no CUDA types).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/expert_lru_policy.h"
#include "core/expert_source.h"

namespace moecheck::cuda {

struct CacheOptions {
  // The pool: `slots` device slots, or as many as `bytes` holds (exactly one of the two > 0).
  int64_t slots = 0;
  uint64_t bytes = 0;
  // 0: the calling thread reads a forward's misses, one after the other. N > 0: N reader threads,
  // each with its own pinned staging and copy stream, read misses and prefetches in parallel.
  int reader_threads = 0;
  int device = 0;
  // Called once per (layer, expert, projection) the cache reads from its source, on the thread
  // that read it, after the copy to the device has been enqueued (so it runs beside the forward,
  // off its critical path), with the bytes in host memory: the provenance hash and the finite
  // check. An exception from it drops that expert from the cache and is raised by the next call
  // on the cache (acquire, release, prefetch, drain). Null: no checks.
  std::function<void(int layer, int64_t expert, Proj p, const uint8_t* bytes, size_t n)> on_read;
};

// What one forward's acquisition did (LayerTiming takes its counts and times).
struct CacheLease {
  int64_t id = 0;
  int layer = 0;
  std::vector<int32_t> experts;             // as asked
  std::vector<int32_t> slots;               // the slot of each
  uint64_t hits = 0, misses = 0, late = 0;  // late: prefetches still arriving that it waited for
  uint64_t bytes_read = 0;                  // read from the source for this forward
  double fetch_ms = 0;                      // host time the acquisition took (reads, waits)
};

class ExpertLru {
 public:
  // Slots shaped for `layout` (every layer the cache serves must have its types and shapes) and a
  // slot table n_routed wide; allocates the pool on o.device and starts the reader threads.
  // InputError naming the option when the pool cannot work (no slot, too many bytes for the
  // device, reader_threads outside [0, 64]).
  ExpertLru(std::shared_ptr<const ExpertSource> source, const ExpertLayout& layout,
            int64_t n_routed, CacheOptions o);
  ~ExpertLru();
  ExpertLru(const ExpertLru&) = delete;
  ExpertLru& operator=(const ExpertLru&) = delete;

  int64_t n_slots() const;
  int64_t n_routed() const;
  int64_t slot_bytes() const;    // one slot: the three projections, each padded
  int64_t expert_bytes() const;  // bytes read per miss
  const ExpertLayout& layout() const;
  const ExpertSource& source() const;
  const CacheOptions& options() const;

  // DEVICE tables: the slot table [kSlotTableLayers][n_routed] and the slots' gate, up and down
  // base pointers ([n_slots] each: slot_ptrs(), + n_slots(), + 2 n_slots()).
  const int32_t* slot_table() const;
  const uint8_t* const* slot_ptrs() const;
  // DEVICE base of projection p in slot s.
  const uint8_t* slot_data(int32_t slot, Proj p) const;

  // One forward's distinct experts of `layer` (any order): each pinned until release(); misses
  // read from the source (by the reader pool when there is one) and copied into their slots; the
  // stream (a cudaStream_t) then waits for every slot's bytes and for the slot table's updates
  // (evicted keys -1, new keys their slot), so kernels enqueued on it after this call read the
  // experts through the returned slots or through the slot table. A failed read raises its
  // InputError (source, tensor, layer, expert) after the other reads of the forward ended: the
  // failed experts are not cached, the forward's pins are dropped, every other slot stays valid.
  CacheLease acquire(int layer, const std::vector<int32_t>& experts, void* stream);
  // After the forward's kernels have been enqueued on `stream`: a later eviction of these slots
  // waits for them; the pins are dropped.
  void release(const CacheLease& lease, void* stream);
  // Starts reading experts of `layer` not cached yet (in the order given) into free or least
  // recently used unpinned slots, without waiting; needs the reader pool. A forward that asks for
  // one later hits it (waiting for its copy when it is still arriving: late).
  void prefetch(int layer, const std::vector<int32_t>& experts);
  // The device route reads the slot table without naming its experts: `fence` makes `stream`
  // wait for every table update enqueued so far; `layer_used` (after the forward on `stream`)
  // makes a later eviction of any slot of `layer` wait for that forward.
  void fence(void* stream);
  void layer_used(int layer, void* stream);
  // Waits for every read, copy and check in flight, then raises the first check error.
  void drain();
  // Drops every cached expert that no open forward pins (after drain()).
  void evict_all();

  CacheCounters counters() const;
  // The policy's view of a slot (for tests): the key it holds, and whether it is valid.
  std::optional<ExpertKey> slot_key(int32_t slot) const;
  bool slot_valid(int32_t slot) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecheck::cuda
