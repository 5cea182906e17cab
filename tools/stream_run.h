// The command line's streamed CUDA runs: the expert cache's knobs (run and check: --cache-slots,
// --cache-bytes, --reader-threads, --prefetch-k, --pipeline, --stream-checks, --expert-source),
// their environment overrides, and the driver run_layers uses when a cache is asked for: one
// cuda::ExpertLru over the model's expert source, a streamed cuda::MoeLayer per layer (the next
// run layer as its prefetch target), the provenance hashes and finite checks of the streamed
// bytes taken in the reader pool. Contract: docs/cli.md "Streaming", docs/streaming.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/expert_lru_policy.h"
#include "core/taps.h"

namespace moecheck::cli {

struct LoadedModel;
struct RunSpec;

// Where a streamed run's misses come from: the model's own source (a GGUF file read by pread,
// a synthetic model's generator), or the model's bytes in memory (a file's mapping).
enum class ExpertSourceKind { kModel, kMemory };

struct StreamKnobs {
  int64_t cache_slots = 0;   // > 0: stream through a cache of this many slots
  uint64_t cache_bytes = 0;  // > 0: ... of as many slots as this holds
  int reader_threads = 0;
  int prefetch_k = 0;
  bool pipeline = false;          // stage / launch / finish overlapped over the run's layers
  bool checks_in_readers = true;  // provenance hashes and finite checks in the reader pool
  ExpertSourceKind source = ExpertSourceKind::kModel;

  bool streamed() const { return cache_slots > 0 || cache_bytes > 0; }
};

// "8GB", "1.5GiB", "4096MB" (decimal and binary units as `moecheck cache --sizes`): bytes, or an
// InputError naming `flag`.
uint64_t parse_byte_size(const std::string& s, const std::string& flag);
ExpertSourceKind parse_expert_source(const std::string& s, const std::string& flag);
const char* expert_source_name(ExpertSourceKind k);

// The environment overrides of knobs no flag set (MOECHECK_CACHE_SLOTS, MOECHECK_CACHE_BYTES,
// MOECHECK_READER_THREADS, MOECHECK_PREFETCH_K): `given` says which flags were on the command
// line. A value that does not parse is an InputError naming the variable. Returns the
// "NAME=value" pairs applied (for the report).
struct StreamGiven {
  bool slots = false, bytes = false, readers = false, prefetch = false;
};
std::vector<std::string> apply_stream_env(StreamKnobs& k, const StreamGiven& given);

// The knobs' own refusals (InputError naming the flag): both sizes, prefetch without readers or
// without a cache, a pipeline with chained inputs or the device route, readers or prefetch
// without a cache.
void validate_stream_knobs(const StreamKnobs& k, bool chained, bool device_route);

// What a streamed run did, for the report: the cache's size and counters, per layer its timing.
struct StreamReport {
  bool streamed = false;
  int64_t slots = 0;
  int64_t slot_bytes = 0, expert_bytes = 0;
  CacheCounters counters;
  int64_t serialised = 0;  // pipelined stages that waited for the layer before
  std::vector<int> layers;
  std::vector<LayerTiming> timing;  // per layer run
  std::vector<std::string> env;     // environment overrides applied
};

// The streamed CUDA layers of one run (CUDA builds only; elsewhere constructing it is the
// implementation's "not built" InputError).
class StreamedRun {
 public:
  StreamedRun(const LoadedModel& m, const RunSpec& spec, const std::vector<int>& layers);
  ~StreamedRun();
  // Layer layers[i] on x (bf16 [T, dim]); taps filled.
  std::vector<uint16_t> forward(size_t i, const std::vector<uint16_t>& x, int64_t T,
                                LayerTaps* taps, const uint8_t* mask);
  // Every layer on its input, pipelined (the inputs are known up front).
  std::vector<std::vector<uint16_t>> forward_all(const std::vector<std::vector<uint16_t>>& x,
                                                 int64_t T, std::vector<LayerTaps>* taps,
                                                 const std::vector<const uint8_t*>& masks);
  // Waits for the reads and checks in flight and raises the first check error.
  void drain();
  StreamReport report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecheck::cli
