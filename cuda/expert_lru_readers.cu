// The expert cache's events and reader pool (cuda/expert_lru_impl.cuh): a job reads one expert's
// three projections from the source into a pinned staging buffer (or copies straight from the
// source's pinned host view), enqueues the copies to its slot on the reader's copy stream after
// the slot's clear, records `ready`, and then runs the check hook on the bytes it read.
// Contract: docs/streaming.md "The device cache".
#include <cuda_runtime.h>

#include <cstring>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/expert_lru_impl.cuh"

namespace moecheck::cuda::lru_detail {

Event::~Event() {
  if (e != nullptr && pool != nullptr) pool->give(e);
}

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

EventRef EventPool::take() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    }
  }
  if (e == nullptr) MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto ref = std::make_shared<Event>();
  ref->e = e;
  ref->pool = this;
  return ref;
}

void EventPool::give(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(e);
}

EventRef record(EventPool& pool, cudaStream_t stream) {
  EventRef ev = pool.take();
  MOECHECK_CUDA_CHECK(cudaEventRecord(ev->e, stream));
  return ev;
}

void wait(cudaStream_t stream, const EventRef& e) {
  if (e) MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(stream, e->e, 0));
}

Readers::Readers(const ExpertSource& src, const ExpertLayout& layout, int threads, int device,
                 const std::function<void(int, int64_t, Proj, const uint8_t*, size_t)>& on_read,
                 EventPool& events)
    : src_(src), layout_(layout), device_(device), on_read_(on_read), events_(events) {
  const int n = threads > 0 ? threads : 1;
  for (int i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>();
    MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&w->copy, cudaStreamNonBlocking));
    for (int b = 0; b < 2; ++b) {
      w->staging[b].reserve(static_cast<size_t>(layout.expert_bytes()));
      MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&w->copied[b], cudaEventDisableTiming));
    }
    workers_.push_back(std::move(w));
  }
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { loop(i); });
}

Readers::~Readers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (auto& w : workers_) {
    (void)cudaStreamSynchronize(w->copy);
    for (cudaEvent_t e : w->copied) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(w->copy);
  }
}

void Readers::submit(const std::vector<JobRef>& jobs) {
  if (threads_.empty()) {
    for (const JobRef& j : jobs) run(*workers_[0], j);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const JobRef& j : jobs) queue_.push_back(j);
  }
  cv_work_.notify_all();
}

void Readers::loop(int index) {
  MOECHECK_CUDA_CHECK(cudaSetDevice(device_));
  Worker& w = *workers_[static_cast<size_t>(index)];
  for (;;) {
    JobRef job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    run(w, job);
  }
}

const uint8_t* Readers::pinned_view(const ExpertKey& k, Proj p) const {
  const uint8_t* v = src_.view(k.layer, k.expert, p);
  if (v == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(pin_mu_);
  auto it = pinned_layers_.find(k.layer);
  if (it == pinned_layers_.end()) {
    cudaPointerAttributes a{};
    const bool pinned =
        cudaPointerGetAttributes(&a, v) == cudaSuccess && a.type == cudaMemoryTypeHost;
    (void)cudaGetLastError();
    it = pinned_layers_.emplace(k.layer, pinned).first;
  }
  return it->second ? v : nullptr;
}

// Read, copy, signal, then check: the forward waits only for the copies to be enqueued.
void Readers::run(Worker& w, const JobRef& job) {
  const uint8_t* src[3] = {};
  try {
    const int b = w.next;
    w.next ^= 1;
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(w.copied[b]));  // its last copy has finished
    uint8_t* staged = w.staging[b].as<uint8_t>();
    int64_t off = 0;
    for (int i = 0; i < 3; ++i) {
      const Proj p = kAllProjs[i];
      const int64_t n = layout_.bytes(p);
      src[i] = pinned_view(job->key, p);
      if (src[i] == nullptr) {
        src_.read(job->key.layer, job->key.expert, p, staged + off);
        src[i] = staged + off;
      }
      off += n;
    }
    wait(w.copy, job->after);
    for (int i = 0; i < 3; ++i)
      MOECHECK_CUDA_CHECK(cudaMemcpyAsync(job->dst[i], src[i],
                                          static_cast<size_t>(layout_.bytes(kAllProjs[i])),
                                          cudaMemcpyHostToDevice, w.copy));
    MOECHECK_CUDA_CHECK(cudaEventRecord(w.copied[b], w.copy));
    EventRef ready = record(events_, w.copy);
    std::lock_guard<std::mutex> lock(mu_);
    job->ready = std::move(ready);
    job->done = true;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    job->error = std::current_exception();
    job->done = true;
    job->checked = true;
  }
  cv_done_.notify_all();
  if (job->error == nullptr) check(job, src);
}

void Readers::check(const JobRef& job, const uint8_t* const src[3]) {
  std::exception_ptr err;
  if (job->check && on_read_) {
    try {
      for (int i = 0; i < 3; ++i)
        on_read_(job->key.layer, job->key.expert, kAllProjs[i], src[i],
                 static_cast<size_t>(layout_.bytes(kAllProjs[i])));
    } catch (...) {
      err = std::current_exception();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->check_error = err;
    job->checked = true;
  }
  cv_done_.notify_all();
}

void Readers::wait_done(const std::vector<JobRef>& jobs) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] {
    for (const JobRef& j : jobs)
      if (!j->done) return false;
    return true;
  });
}

void Readers::wait_checked(const JobRef& job) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return job->checked; });
}

bool Readers::is_done(const JobRef& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return job->done;
}

bool Readers::is_checked(const JobRef& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return job->checked;
}

}  // namespace moecheck::cuda::lru_detail
