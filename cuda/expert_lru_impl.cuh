// cuda::ExpertLru's private state (cuda/expert_lru.h), shared by cuda/expert_lru.cu (the slots,
// the table, acquire / release / prefetch) and cuda/expert_lru_readers.cu (events, the reader
// pool, the jobs). Not a public header. Threads: one caller thread drives the cache (every public
// call); reader threads only run jobs and hand their results back through Job's fields.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/expert_lru_policy.h"
#include "core/expert_source.h"
#include "cuda/device_buffers.cuh"
#include "cuda/expert_lru.h"

namespace moecheck::cuda {
namespace lru_detail {

// A CUDA event from a pool: taken fresh (never shared with a later record), given back when the
// last holder lets go. A wait enqueued on an event keeps the record it saw, so recycling is safe.
class EventPool;
struct Event {
  cudaEvent_t e = nullptr;
  EventPool* pool = nullptr;
  ~Event();
};
using EventRef = std::shared_ptr<Event>;

class EventPool {
 public:
  ~EventPool();
  EventRef take();
  void give(cudaEvent_t e);

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// Event recorded now on `stream`.
EventRef record(EventPool& pool, cudaStream_t stream);
// `stream` waits for `e` (nothing when null).
void wait(cudaStream_t stream, const EventRef& e);

// One read of an expert into its slot, done by a reader thread (or inline by the caller). The
// caller fills the inputs; the reader sets `ready` (the copies' completion on its copy stream) or
// `error`, then `done`; after that it runs the check hook and sets `checked` / `check_error`.
struct Job {
  ExpertKey key;
  int32_t slot = -1;
  uint8_t* dst[3] = {};  // device bases of gate, up, down in the slot
  EventRef after;        // the copy waits for it (the slot's old readers and its table clear)
  bool check = false;    // run the on_read hook (first read of this key by the cache)
  bool prefetch = false;
  // Results (guarded by Readers::mu).
  bool done = false, checked = false;
  EventRef ready;
  std::exception_ptr error, check_error;
};
using JobRef = std::shared_ptr<Job>;

// A reader's resources: its copy stream and two pinned staging buffers (one being copied from
// while the next read fills the other), each with the event of its last copy.
struct Worker {
  cudaStream_t copy = nullptr;
  PinnedBuf staging[2];
  cudaEvent_t copied[2] = {nullptr, nullptr};
  int next = 0;
};

// The reader pool (or, with no threads, the caller running each job itself).
class Readers {
 public:
  Readers(const ExpertSource& src, const ExpertLayout& layout, int threads, int device,
          const std::function<void(int, int64_t, Proj, const uint8_t*, size_t)>& on_read,
          EventPool& events);
  ~Readers();
  int threads() const { return static_cast<int>(threads_.size()); }
  // Queues the jobs (or, with no threads, runs them now on the caller).
  void submit(const std::vector<JobRef>& jobs);
  // Blocks until every job is done (read and copy enqueued, or failed).
  void wait_done(const std::vector<JobRef>& jobs);
  // Blocks until the job's check has run too.
  void wait_checked(const JobRef& job);
  bool is_done(const JobRef& job);
  bool is_checked(const JobRef& job);

 private:
  void run(Worker& w, const JobRef& job);
  void check(const JobRef& job, const uint8_t* const src[3]);
  void loop(int index);
  const uint8_t* pinned_view(const ExpertKey& k, Proj p) const;

  const ExpertSource& src_;
  ExpertLayout layout_;
  int device_ = 0;
  std::function<void(int, int64_t, Proj, const uint8_t*, size_t)> on_read_;
  EventPool& events_;
  std::vector<std::unique_ptr<Worker>> workers_;  // [threads] or [1] for the inline path
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<JobRef> queue_;
  bool stop_ = false;
  // Per layer: whether its source views are pinned host memory (copied from directly).
  mutable std::mutex pin_mu_;
  mutable std::map<int, bool> pinned_layers_;
};

}  // namespace lru_detail

struct ExpertLru::Impl {
  std::shared_ptr<const ExpertSource> source;
  ExpertLayout layout;
  int64_t n_routed = 0;
  CacheOptions o;
  int64_t n_slots = 0, slot_stride = 0;
  int64_t offset[3] = {};  // projection bases inside a slot
  ExpertLruPolicy policy{1};
  lru_detail::EventPool events;
  DevBuf pool, table, ptrs;
  std::vector<int32_t> mirror;             // the device slot table as enqueued so far
  cudaStream_t ts = nullptr;               // the table stream: every table update, in call order
  std::vector<lru_detail::EventRef> busy;  // per slot: after it no enqueued kernel reads the slot
  std::map<int32_t, lru_detail::JobRef> prefetching;  // slot -> its prefetch job
  std::vector<lru_detail::JobRef> checking;           // jobs whose check has not been collected
  std::set<int> layouts_ok;                           // layers whose source layout fits
  std::set<ExpertKey> checked_keys;                   // keys whose check has been started
  std::vector<std::pair<int32_t, ExpertKey>> bad;     // failed checks: slots to discard
  std::exception_ptr pending_error;                   // a check error not raised yet
  std::unique_ptr<lru_detail::Readers> readers;

  void setup();
  uint8_t* slot_base(int32_t s) const {
    return pool.as<uint8_t>() + static_cast<size_t>(s) * static_cast<size_t>(slot_stride);
  }
  lru_detail::JobRef make_job(const ExpertLruPolicy::Grant& g, const lru_detail::EventRef& after,
                              bool prefetch);
  // Enqueues on the table stream: waits for the victims' readers, sets their entries to -1.
  lru_detail::EventRef clear_victims(const std::vector<ExpertLruPolicy::Grant>& grants);
  // Table updates (flat index -> value) on the table stream, after `waits`.
  void table_update(const std::vector<std::pair<int64_t, int32_t>>& upd,
                    const std::vector<lru_detail::EventRef>& waits);
  int64_t table_index(ExpertKey k) const { return k.layer * n_routed + k.expert; }
  // Collects finished prefetches (loaded or failed, their table entries) and finished checks.
  void sweep();
  void collect_prefetch(int32_t slot, const lru_detail::JobRef& job);
  void raise_pending();
};

}  // namespace moecheck::cuda
