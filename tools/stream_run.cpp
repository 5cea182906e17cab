// Streamed CUDA runs of the command line (tools/stream_run.h).
#include "tools/stream_run.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "golden/finite_check.h"
#include "golden/provenance.h"
#include "golden/sha256.h"
#include "tools/cache_sizes.h"
#include "tools/runner.h"

#if defined(MOECHECK_HAVE_CUDA)
#include "cuda/expert_lru.h"
#include "cuda/moe_layer.h"
#include "cuda/pipeline.h"
#endif

namespace moecheck::cli {

uint64_t parse_byte_size(const std::string& s, const std::string& flag) {
  std::vector<SizeSpec> v;
  try {
    v = parse_size_list(s);
  } catch (const InputError& e) {
    throw InputError(flag + " " + s + ": expected a size such as 8GB or 1.5GiB (" + e.what() + ")");
  }
  if (v.size() != 1 || v[0].kind != SizeSpec::Kind::kBytes)
    throw InputError(flag + " " + s + ": expected one size with a unit, such as 8GB or 1.5GiB");
  return static_cast<uint64_t>(std::floor(v[0].value));
}

ExpertSourceKind parse_expert_source(const std::string& s, const std::string& flag) {
  if (s == "model") return ExpertSourceKind::kModel;
  if (s == "memory") return ExpertSourceKind::kMemory;
  throw InputError(flag + ": expected \"model\" or \"memory\", found \"" + s + "\"");
}

const char* expert_source_name(ExpertSourceKind k) {
  return k == ExpertSourceKind::kModel ? "model" : "memory";
}

namespace {

// A non-negative integer environment variable (nullopt when unset).
bool env_int(const char* name, int64_t max, int64_t* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s(v);
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos ||
      std::stoll(s) > max)
    throw InputError(std::string("environment variable ") + name + "=\"" + s +
                     "\": expected an integer in [0, " + std::to_string(max) + "]");
  *out = std::stoll(s);
  return true;
}

}  // namespace

std::vector<std::string> apply_stream_env(StreamKnobs& k, const StreamGiven& given) {
  std::vector<std::string> applied;
  int64_t v = 0;
  if (!given.slots && env_int("MOECHECK_CACHE_SLOTS", int64_t{1} << 30, &v)) {
    k.cache_slots = v;
    applied.push_back("MOECHECK_CACHE_SLOTS=" + std::to_string(v));
  }
  if (!given.bytes && std::getenv("MOECHECK_CACHE_BYTES") != nullptr) {
    const std::string s = std::getenv("MOECHECK_CACHE_BYTES");
    k.cache_bytes = parse_byte_size(s, "environment variable MOECHECK_CACHE_BYTES");
    applied.push_back("MOECHECK_CACHE_BYTES=" + s);
  }
  if (!given.readers && env_int("MOECHECK_READER_THREADS", 64, &v)) {
    k.reader_threads = static_cast<int>(v);
    applied.push_back("MOECHECK_READER_THREADS=" + std::to_string(v));
  }
  if (!given.prefetch && env_int("MOECHECK_PREFETCH_K", 4096, &v)) {
    k.prefetch_k = static_cast<int>(v);
    applied.push_back("MOECHECK_PREFETCH_K=" + std::to_string(v));
  }
  return applied;
}

void validate_stream_knobs(const StreamKnobs& k, bool chained, bool device_route) {
  if (k.cache_slots > 0 && k.cache_bytes > 0)
    throw InputError("--cache-slots " + std::to_string(k.cache_slots) + " and --cache-bytes " +
                     std::to_string(k.cache_bytes) + ": give one size of the expert cache");
  const bool any = k.reader_threads > 0 || k.prefetch_k > 0 || k.source != ExpertSourceKind::kModel;
  if (!k.streamed() && any)
    throw InputError(
        "--reader-threads / --prefetch-k / --expert-source: they configure the expert cache, which "
        "runs only with --cache-slots or --cache-bytes (without them every expert is resident)");
  if (k.prefetch_k > 0 && k.reader_threads == 0)
    throw InputError("--prefetch-k " + std::to_string(k.prefetch_k) +
                     ": prefetch reads in the reader pool; give --reader-threads N (N > 0)");
  if (k.pipeline && chained)
    throw InputError(
        "--pipeline: it stages layer L+1 while layer L computes, so each layer's input must be "
        "known before the run; --chain feeds layer L's output to layer L+1");
  if (k.pipeline && device_route)
    throw InputError(
        "--pipeline: the stage / launch / finish split is the host route's; "
        "--route device runs each layer as one enqueued forward");
}

#if defined(MOECHECK_HAVE_CUDA)

struct StreamedRun::Impl {
  std::vector<int> layers;
  std::shared_ptr<moecheck::cuda::ExpertLru> cache;
  std::vector<std::unique_ptr<moecheck::cuda::MoeLayer>> ls;
  std::vector<LayerTiming> timing;
  int64_t serialised = 0;
};

StreamedRun::StreamedRun(const LoadedModel& m, const RunSpec& spec, const std::vector<int>& layers)
    : impl_(new Impl) {
  Impl& s = *impl_;
  const StreamKnobs& k = spec.knobs.stream;
  s.layers = layers;
  std::shared_ptr<const ExpertSource> src;
  if (k.source == ExpertSourceKind::kMemory) {
    if (is_synthetic_spec(m.path))
      throw InputError("--expert-source memory: " + m.path +
                       " is a synthetic model; its experts are made by its generator "
                       "(--expert-source model)");
    std::vector<LayerWeights> ws;
    for (int L : layers) ws.push_back(m.file.layer(L));
    src = std::make_shared<HostExpertSource>(ws, "memory " + m.path);
  } else {
    src = m.file.expert_source();
  }
  const LayerWeights first = m.file.resident_layer(layers.at(0));
  moecheck::cuda::CacheOptions co;
  co.slots = k.cache_slots;
  co.bytes = k.cache_bytes;
  co.reader_threads = k.reader_threads;
  if (k.checks_in_readers) {
    SliceHasher* hasher = m.hasher.get();
    const std::string file = m.path;
    const ExpertLayout lay = expert_layout(first);  // every layer's (the cache checks it)
    co.on_read = [hasher, file, lay](int layer, int64_t e, Proj p, const uint8_t* bytes, size_t n) {
      const LayerTensor t = stack_tensor(p);
      const ExpertStackView& st = lay.stack(p);
      check_finite_slice(file, slice_name(layer, t, static_cast<int32_t>(e)),
                         static_cast<uint32_t>(st.type), st.cols, bytes, n);
      hasher->record(layer, t, static_cast<int32_t>(e), sha256_hex(bytes, n));
    };
  }
  s.cache = std::make_shared<moecheck::cuda::ExpertLru>(src, expert_layout(first),
                                                        first.config.n_routed, co);
  const moecheck::cuda::LayerOptions lo = cuda_layer_options(spec.knobs);
  for (int L : layers)
    s.ls.push_back(
        std::make_unique<moecheck::cuda::MoeLayer>(m.file.resident_layer(L), s.cache, lo));
  if (k.prefetch_k > 0)  // each layer prefetches for the layer run after it
    for (size_t i = 0; i + 1 < s.ls.size(); ++i) s.ls[i]->set_next(s.ls[i + 1].get());
  s.timing.resize(layers.size());
}

StreamedRun::~StreamedRun() = default;

std::vector<uint16_t> StreamedRun::forward(size_t i, const std::vector<uint16_t>& x, int64_t T,
                                           LayerTaps* taps, const uint8_t* mask) {
  return impl_->ls.at(i)->forward(x.data(), T, taps, &impl_->timing[i], mask);
}

std::vector<std::vector<uint16_t>> StreamedRun::forward_all(
    const std::vector<std::vector<uint16_t>>& x, int64_t T, std::vector<LayerTaps>* taps,
    const std::vector<const uint8_t*>& masks) {
  Impl& s = *impl_;
  std::vector<moecheck::cuda::MoeLayer*> lp;
  std::vector<const uint16_t*> xp;
  for (size_t i = 0; i < s.ls.size(); ++i) {
    lp.push_back(s.ls[i].get());
    xp.push_back(x.at(i).data());
  }
  moecheck::cuda::PipelineStats st;
  auto y = moecheck::cuda::forward_pipelined(lp, xp, T, masks, taps, &s.timing, &st);
  s.serialised += st.serialised;
  return y;
}

void StreamedRun::drain() { impl_->cache->drain(); }

StreamReport StreamedRun::report() const {
  const Impl& s = *impl_;
  StreamReport r;
  r.streamed = true;
  r.slots = s.cache->n_slots();
  r.slot_bytes = s.cache->slot_bytes();
  r.expert_bytes = s.cache->expert_bytes();
  r.counters = s.cache->counters();
  r.serialised = s.serialised;
  r.layers = s.layers;
  r.timing = s.timing;
  return r;
}

#else

struct StreamedRun::Impl {};

StreamedRun::StreamedRun(const LoadedModel&, const RunSpec&, const std::vector<int>&) {
  std::string why;
  impl_available(cli::Impl::kCuda, &why);
  throw InputError("--cache-slots / --cache-bytes: " + why);
}
StreamedRun::~StreamedRun() = default;
std::vector<uint16_t> StreamedRun::forward(size_t, const std::vector<uint16_t>&, int64_t,
                                           LayerTaps*, const uint8_t*) {
  return {};
}
std::vector<std::vector<uint16_t>> StreamedRun::forward_all(
    const std::vector<std::vector<uint16_t>>&, int64_t, std::vector<LayerTaps>*,
    const std::vector<const uint8_t*>&) {
  return {};
}
void StreamedRun::drain() {}
StreamReport StreamedRun::report() const { return {}; }

#endif

}  // namespace moecheck::cli
