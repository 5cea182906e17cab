// cuda::ExpertLru (cuda/expert_lru.h): the slot pool, the slot table and its stream, and the
// acquire / release / prefetch protocol around core/expert_lru_policy.h. Ordering rules
// (docs/streaming.md "The device cache"): a slot's new bytes are copied only after every kernel
// enqueued against its old key (busy) and after its old key's table entry is cleared; a key's
// entry is set only after its copy (ready); a forward's stream waits for the table stream, so
// it sees every update enqueued before it.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/route_header.h"
#include "cuda/check.h"
#include "cuda/expert_lru_impl.cuh"

namespace moecheck::cuda {

using lru_detail::EventRef;
using lru_detail::JobRef;
using Grant = ExpertLruPolicy::Grant;
using Kind = ExpertLruPolicy::GrantKind;

namespace {

// Table updates per launch, passed by value (the kernel-parameter space holds 4 KB).
constexpr int kUpdatesPerLaunch = 480;
struct TableUpdates {
  int32_t n = 0;
  int32_t index[kUpdatesPerLaunch];
  int32_t value[kUpdatesPerLaunch];
};

__global__ void table_update_kernel(int32_t* table, TableUpdates u) {
  for (int i = static_cast<int>(threadIdx.x); i < u.n; i += static_cast<int>(blockDim.x))
    table[u.index[i]] = u.value[i];
}

// Each projection's region holds its bytes and at least 16 zeroed bytes after them (MMQ reads a
// row's last 16-byte chunk whole), padded to 256 bytes.
int64_t region_bytes(int64_t n) { return (n + 16 + 255) / 256 * 256; }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ExpertLru::ExpertLru(std::shared_ptr<const ExpertSource> source, const ExpertLayout& layout,
                     int64_t n_routed, CacheOptions o)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.source = std::move(source);
  m.layout = layout;
  m.n_routed = n_routed;
  m.o = std::move(o);
  m.setup();
}

ExpertLru::~ExpertLru() {
  Impl& m = *impl_;
  m.readers.reset();  // joins the reader threads; their copies have been synchronised
  if (m.ts != nullptr) {
    (void)cudaStreamSynchronize(m.ts);
    (void)cudaStreamDestroy(m.ts);
  }
}

void ExpertLru::Impl::setup() {
  const std::string where = "expert cache: ";
  if (!source) throw InputError(where + "no expert source");
  if (n_routed < 1 || layout.n_experts() < n_routed)
    throw InputError(where + "n_routed " + std::to_string(n_routed) + " must be in [1, " +
                     std::to_string(layout.n_experts()) + "] (the source's experts per layer)");
  if (o.reader_threads < 0 || o.reader_threads > 64)
    throw InputError(where + "options: reader_threads must be in [0, 64], found " +
                     std::to_string(o.reader_threads));
  int64_t off = 0;
  for (int i = 0; i < 3; ++i) {
    offset[i] = off;
    off += region_bytes(layout.bytes(kAllProjs[i]));
  }
  slot_stride = off;
  if ((o.slots > 0) == (o.bytes > 0))
    throw InputError(where + "options: give exactly one of slots and bytes (found slots " +
                     std::to_string(o.slots) + ", bytes " + std::to_string(o.bytes) + ")");
  n_slots =
      o.slots > 0 ? o.slots : static_cast<int64_t>(o.bytes / static_cast<uint64_t>(slot_stride));
  if (n_slots < 1)
    throw InputError(where + "options: bytes " + std::to_string(o.bytes) + " hold no slot of " +
                     std::to_string(slot_stride) + " bytes (" + layout.describe() + ")");
  MOECHECK_CUDA_CHECK(cudaSetDevice(o.device));
  size_t free_b = 0, total_b = 0;
  MOECHECK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t need = static_cast<uint64_t>(n_slots) * static_cast<uint64_t>(slot_stride);
  if (need > free_b)
    throw InputError(where + "options: " + std::to_string(n_slots) + " slots of " +
                     std::to_string(slot_stride) + " bytes need " + std::to_string(need) +
                     " bytes, the device has " + std::to_string(free_b) + " free");
  policy = ExpertLruPolicy(n_slots);
  pool.reserve(static_cast<size_t>(need));
  MOECHECK_CUDA_CHECK(cudaMemset(pool.p, 0, static_cast<size_t>(need)));  // the zeroed slack
  mirror.assign(static_cast<size_t>(kSlotTableLayers * n_routed), -1);
  table.reserve(mirror.size() * 4);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(table.p, mirror.data(), mirror.size() * 4, cudaMemcpyHostToDevice));
  std::vector<const uint8_t*> p(static_cast<size_t>(3 * n_slots));
  for (int64_t s = 0; s < n_slots; ++s)
    for (int i = 0; i < 3; ++i) p[i * n_slots + s] = slot_base(static_cast<int32_t>(s)) + offset[i];
  ptrs.reserve(p.size() * sizeof(void*));
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(ptrs.p, p.data(), p.size() * sizeof(void*), cudaMemcpyHostToDevice));
  busy.resize(static_cast<size_t>(n_slots));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking));
  readers = std::make_unique<lru_detail::Readers>(*source, layout, o.reader_threads, o.device,
                                                  o.on_read, events);
}

int64_t ExpertLru::n_slots() const { return impl_->n_slots; }
int64_t ExpertLru::n_routed() const { return impl_->n_routed; }
int64_t ExpertLru::slot_bytes() const { return impl_->slot_stride; }
int64_t ExpertLru::expert_bytes() const { return impl_->layout.expert_bytes(); }
const ExpertLayout& ExpertLru::layout() const { return impl_->layout; }
const ExpertSource& ExpertLru::source() const { return *impl_->source; }
const CacheOptions& ExpertLru::options() const { return impl_->o; }
const int32_t* ExpertLru::slot_table() const { return impl_->table.as<int32_t>(); }
const uint8_t* const* ExpertLru::slot_ptrs() const { return impl_->ptrs.as<const uint8_t*>(); }

const uint8_t* ExpertLru::slot_data(int32_t slot, Proj p) const {
  return impl_->slot_base(slot) + impl_->offset[static_cast<int>(p)];
}

JobRef ExpertLru::Impl::make_job(const Grant& g, const EventRef& after, bool prefetch) {
  auto j = std::make_shared<lru_detail::Job>();
  j->key = g.key;
  j->slot = g.slot;
  for (int i = 0; i < 3; ++i) j->dst[i] = slot_base(g.slot) + offset[i];
  j->after = after;
  j->prefetch = prefetch;
  j->check = checked_keys.insert(g.key).second;
  return j;
}

void ExpertLru::Impl::table_update(const std::vector<std::pair<int64_t, int32_t>>& upd,
                                   const std::vector<EventRef>& waits) {
  for (const EventRef& e : waits) lru_detail::wait(ts, e);
  for (size_t i = 0; i < upd.size(); i += kUpdatesPerLaunch) {
    TableUpdates u;
    u.n = static_cast<int32_t>(std::min<size_t>(kUpdatesPerLaunch, upd.size() - i));
    for (int j = 0; j < u.n; ++j) {
      u.index[j] = static_cast<int32_t>(upd[i + j].first);
      u.value[j] = upd[i + j].second;
      mirror[static_cast<size_t>(upd[i + j].first)] = upd[i + j].second;
    }
    table_update_kernel<<<1, 256, 0, ts>>>(table.as<int32_t>(), u);
    MOECHECK_CUDA_CHECK(cudaGetLastError());
  }
}

EventRef ExpertLru::Impl::clear_victims(const std::vector<Grant>& grants) {
  std::vector<std::pair<int64_t, int32_t>> upd;
  std::vector<EventRef> waits;
  for (const Grant& g : grants) {
    if (g.kind != Kind::kMiss) continue;
    waits.push_back(busy[static_cast<size_t>(g.slot)]);
    if (g.evicted && mirror[static_cast<size_t>(table_index(g.victim))] == g.slot)
      upd.emplace_back(table_index(g.victim), -1);
  }
  if (waits.empty()) return nullptr;
  table_update(upd, waits);
  return lru_detail::record(events, ts);
}

void ExpertLru::Impl::collect_prefetch(int32_t slot, const JobRef& job) {
  if (job->error) {
    policy.failed(slot);  // counted (failed read, wasted prefetch); a forward asking reads again
    return;
  }
  policy.loaded(slot);
  policy.counters().bytes_read += static_cast<uint64_t>(layout.expert_bytes());
  table_update({{table_index(job->key), slot}}, {job->ready});
}

void ExpertLru::Impl::sweep() {
  for (auto it = prefetching.begin(); it != prefetching.end();) {
    if (!readers->is_done(it->second)) {
      ++it;
      continue;
    }
    collect_prefetch(it->first, it->second);
    checking.push_back(it->second);
    it = prefetching.erase(it);
  }
  for (auto it = checking.begin(); it != checking.end();) {
    const JobRef& j = *it;
    if (!readers->is_checked(j)) {
      ++it;
      continue;
    }
    if (j->check_error) {
      if (!pending_error) pending_error = j->check_error;
      checked_keys.erase(j->key);  // a later read checks again
      bad.emplace_back(j->slot, j->key);
    }
    it = checking.erase(it);
  }
  // Bad bytes leave the cache once no open forward pins their slot (a pinned slot is being read:
  // it must not be refilled under it; its forward fails through the pending error).
  for (auto it = bad.begin(); it != bad.end();) {
    const auto [slot, key] = *it;
    if (policy.slot_of(key) != slot) {
      it = bad.erase(it);
      continue;
    }
    if (policy.pinned(slot)) {
      ++it;
      continue;
    }
    policy.discard(slot);
    table_update({{table_index(key), -1}}, {busy[static_cast<size_t>(slot)]});
    it = bad.erase(it);
  }
}

void ExpertLru::Impl::raise_pending() {
  if (!pending_error) return;
  std::exception_ptr e = pending_error;
  pending_error = nullptr;
  std::rethrow_exception(e);
}

CacheLease ExpertLru::acquire(int layer, const std::vector<int32_t>& experts, void* stream) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  auto s = static_cast<cudaStream_t>(stream);
  if (layer < 0 || layer >= kSlotTableLayers)
    throw InputError("expert cache: layer " + std::to_string(layer) +
                     " outside the slot table's [0, " + std::to_string(kSlotTableLayers) + ")");
  if (m.layouts_ok.count(layer) == 0) {
    const ExpertLayout l = m.source->layout(layer);
    if (!m.layout.same_shape(l) || l.n_experts() < m.n_routed)
      throw InputError("expert cache: " + m.source->name() + " layer " + std::to_string(layer) +
                       " has " + std::to_string(l.n_experts()) + " experts " + l.describe() +
                       ", the cache's slots hold " + m.layout.describe() + " of " +
                       std::to_string(m.n_routed));
    m.layouts_ok.insert(layer);
  }
  m.sweep();
  m.raise_pending();
  std::vector<ExpertKey> keys;
  for (int32_t e : experts) {
    if (e < 0 || e >= m.n_routed)
      throw InputError("expert cache: layer " + std::to_string(layer) + " expert " +
                       std::to_string(e) + " outside [0, " + std::to_string(m.n_routed) + ")");
    keys.push_back(ExpertKey{layer, e});
  }
  std::vector<Grant> grants;
  CacheLease lease;
  try {
    lease.id = m.policy.acquire(keys, &grants);
  } catch (const CacheFullError&) {
    // Prefetches still arriving hold slots no forward may take: let them land (they become
    // evictable), then try once more. Pins of open forwards stay in the way.
    if (m.prefetching.empty()) throw;
    for (auto& kv : m.prefetching) m.readers->wait_done({kv.second});
    m.sweep();
    lease.id = m.policy.acquire(keys, &grants);
  }
  lease.layer = layer;
  lease.experts = experts;
  // Prefetches this forward waits for (late), then the misses.
  for (const Grant& g : grants) {
    if (g.kind != Kind::kInFlight) continue;
    auto it = m.prefetching.find(g.slot);
    if (it == m.prefetching.end()) continue;  // another forward's miss: its table entry is set
    m.readers->wait_done({it->second});
    ++lease.late;
  }
  m.sweep();
  for (const Grant& g : grants)
    if (g.kind == Kind::kInFlight && m.policy.slot_of(g.key) != g.slot) {
      // Its prefetch failed and the slot was freed: start again, reading it as a miss.
      m.policy.release(lease.id);
      return acquire(layer, experts, stream);
    }
  const EventRef cleared = m.clear_victims(grants);
  std::vector<JobRef> jobs;
  for (const Grant& g : grants)
    if (g.kind == Kind::kMiss) jobs.push_back(m.make_job(g, cleared, false));
  m.readers->submit(jobs);
  m.readers->wait_done(jobs);
  std::vector<std::pair<int64_t, int32_t>> sets;
  std::vector<EventRef> readies;
  std::exception_ptr first;
  for (const JobRef& j : jobs) {
    if (j->error) {
      m.policy.failed(j->slot);
      m.checked_keys.erase(j->key);
      if (!first) first = j->error;
      continue;
    }
    m.policy.loaded(j->slot);
    sets.emplace_back(m.table_index(j->key), j->slot);
    readies.push_back(j->ready);
    lease.bytes_read += static_cast<uint64_t>(m.layout.expert_bytes());
    m.checking.push_back(j);
  }
  m.table_update(sets, readies);
  m.policy.counters().bytes_read += lease.bytes_read;
  for (const Grant& g : grants) {
    lease.slots.push_back(g.slot);
    lease.hits += g.kind != Kind::kMiss;
    lease.misses += g.kind == Kind::kMiss;
  }
  lease.fetch_ms = ms_since(t0);
  m.policy.counters().stall_ms += lease.fetch_ms;
  if (first) {
    m.policy.release(lease.id);
    std::rethrow_exception(first);
  }
  lru_detail::wait(s, lru_detail::record(m.events, m.ts));
  return lease;
}

void ExpertLru::release(const CacheLease& lease, void* stream) {
  Impl& m = *impl_;
  const EventRef done = lru_detail::record(m.events, static_cast<cudaStream_t>(stream));
  for (int32_t s : lease.slots) m.busy[static_cast<size_t>(s)] = done;
  m.policy.release(lease.id);
  m.sweep();
  m.raise_pending();
}

void ExpertLru::prefetch(int layer, const std::vector<int32_t>& experts) {
  Impl& m = *impl_;
  if (m.readers->threads() == 0)
    throw InputError(
        "expert cache: prefetch needs the reader pool (CacheOptions::reader_threads > 0)");
  m.sweep();
  m.raise_pending();
  std::vector<Grant> grants;
  for (int32_t e : experts) {
    if (e < 0 || e >= m.n_routed) continue;
    if (auto g = m.policy.prefetch(ExpertKey{layer, e})) grants.push_back(*g);
  }
  if (grants.empty()) return;
  const EventRef cleared = m.clear_victims(grants);
  std::vector<JobRef> jobs;
  for (const Grant& g : grants) {
    JobRef j = m.make_job(g, cleared, true);
    m.prefetching[g.slot] = j;
    jobs.push_back(j);
  }
  m.readers->submit(jobs);
}

void ExpertLru::fence(void* stream) {
  Impl& m = *impl_;
  m.sweep();
  lru_detail::wait(static_cast<cudaStream_t>(stream), lru_detail::record(m.events, m.ts));
}

void ExpertLru::layer_used(int layer, void* stream) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= kSlotTableLayers) return;
  const EventRef done = lru_detail::record(m.events, static_cast<cudaStream_t>(stream));
  const int32_t* row =
      m.mirror.data() + static_cast<size_t>(layer) * static_cast<size_t>(m.n_routed);
  for (int64_t e = 0; e < m.n_routed; ++e)
    if (row[e] >= 0) m.busy[static_cast<size_t>(row[e])] = done;
}

void ExpertLru::drain() {
  Impl& m = *impl_;
  for (auto& kv : m.prefetching) m.readers->wait_done({kv.second});
  m.sweep();
  for (const JobRef& j : m.checking) m.readers->wait_checked(j);
  m.sweep();
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(m.ts));
  m.raise_pending();
}

void ExpertLru::evict_all() {
  Impl& m = *impl_;
  drain();
  std::vector<std::pair<int64_t, int32_t>> upd;
  std::vector<EventRef> waits;
  for (int64_t s = 0; s < m.n_slots; ++s) {
    const auto k = m.policy.key_of(static_cast<int32_t>(s));
    if (!k || m.policy.pinned(static_cast<int32_t>(s)) || !m.policy.valid(static_cast<int32_t>(s)))
      continue;
    upd.emplace_back(m.table_index(*k), -1);
    waits.push_back(m.busy[static_cast<size_t>(s)]);
  }
  m.policy.evict_all();
  m.table_update(upd, waits);
}

CacheCounters ExpertLru::counters() const { return impl_->policy.counters(); }

std::optional<ExpertKey> ExpertLru::slot_key(int32_t slot) const {
  return impl_->policy.key_of(slot);
}
bool ExpertLru::slot_valid(int32_t slot) const { return impl_->policy.valid(slot); }

}  // namespace moecheck::cuda
