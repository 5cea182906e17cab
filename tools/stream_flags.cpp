// The expert cache's flags (tools/stream_flags.h).
#include "tools/stream_flags.h"

#include <cstdio>

#include "core/error.h"

namespace moecheck::cli {

bool StreamArgs::any_given() const { return !first_given().empty(); }

std::string StreamArgs::first_given() const {
  const std::pair<CLI::Option*, std::string> flags[] = {
      {slots_opt, "--cache-slots " + std::to_string(cache_slots)},
      {bytes_opt, "--cache-bytes " + cache_bytes},
      {readers_opt, "--reader-threads " + std::to_string(reader_threads)},
      {prefetch_opt, "--prefetch-k " + std::to_string(prefetch_k)},
      {pipeline_opt, "--pipeline"},
      {checks_opt, "--stream-checks " + checks},
      {source_opt, "--expert-source " + source}};
  for (const auto& [o, text] : flags)
    if (o != nullptr && o->count() > 0) return text;
  return "";
}

void add_stream_flags(CLI::App* s, StreamArgs& a) {
  const char* group = "Streaming (cuda)";
  a.slots_opt = s->add_option("--cache-slots", a.cache_slots,
                              "stream the routed experts through a device cache of N slots (one "
                              "expert each); without it every expert is resident")
                    ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
                    ->group(group);
  a.bytes_opt = s->add_option("--cache-bytes", a.cache_bytes,
                              "... or of as many slots as SIZE holds (e.g. 64GB, 1.5GiB)")
                    ->group(group);
  a.readers_opt = s->add_option("--reader-threads", a.reader_threads,
                                "threads reading misses and prefetches in parallel (0: the "
                                "forward reads its misses itself)")
                      ->check(CLI::Range(0, 64))
                      ->capture_default_str()
                      ->group(group);
  a.prefetch_opt = s->add_option("--prefetch-k", a.prefetch_k,
                                 "start reading the first K experts the next layer's router "
                                 "predicts from this layer's input (needs --reader-threads)")
                       ->check(CLI::Range(0, 4096))
                       ->capture_default_str()
                       ->group(group);
  a.pipeline_opt = s->add_flag("--pipeline", a.pipeline,
                               "stage layer L+1 (router, routing, reads) while layer L computes "
                               "(independent inputs, host route)")
                       ->group(group);
  a.checks_opt = s->add_option("--stream-checks", a.checks,
                               "where the provenance hash and finite check of streamed experts "
                               "run: readers (in the reader pool, beside the forward) | after (on "
                               "the main thread, after the run)")
                     ->check(CLI::IsMember({"readers", "after"}))
                     ->capture_default_str()
                     ->group(group);
  a.source_opt = s->add_option("--expert-source", a.source,
                               "where misses are read: model (the file by pread, a synthetic "
                               "model's generator) | memory (the file's mapping)")
                     ->check(CLI::IsMember({"model", "memory"}))
                     ->capture_default_str()
                     ->group(group);
}

StreamKnobs stream_knobs(const StreamArgs& a, std::vector<std::string>* env) {
  StreamKnobs k;
  k.cache_slots = a.cache_slots;
  if (!a.cache_bytes.empty()) k.cache_bytes = parse_byte_size(a.cache_bytes, "--cache-bytes");
  k.reader_threads = a.reader_threads;
  k.prefetch_k = a.prefetch_k;
  k.pipeline = a.pipeline;
  k.checks_in_readers = a.checks == "readers";
  k.source = parse_expert_source(a.source, "--expert-source");
  StreamGiven g;
  g.slots = a.slots_opt->count() > 0;
  g.bytes = a.bytes_opt->count() > 0;
  g.readers = a.readers_opt->count() > 0;
  g.prefetch = a.prefetch_opt->count() > 0;
  // A size on the command line is the size: no environment size on top of it.
  if (g.slots || g.bytes) g.slots = g.bytes = true;
  const std::vector<std::string> applied = apply_stream_env(k, g);
  if (env != nullptr) *env = applied;
  return k;
}

std::vector<std::string> stream_report_lines(const StreamReport& r) {
  std::vector<std::string> out;
  if (!r.streamed) return out;
  const CacheCounters& k = r.counters;
  char b[512];
  const double asked = static_cast<double>(k.hits + k.misses);
  std::snprintf(b, sizeof b,
                "expert cache: %lld slots of %.2f MB (%.2f GB); %llu hits, %llu misses (hit rate "
                "%.3f), %llu evictions; read %.2f GB, %llu failed reads; waited %.1f ms",
                static_cast<long long>(r.slots), static_cast<double>(r.slot_bytes) / 1e6,
                static_cast<double>(r.slots) * static_cast<double>(r.slot_bytes) / 1e9,
                static_cast<unsigned long long>(k.hits), static_cast<unsigned long long>(k.misses),
                asked > 0 ? static_cast<double>(k.hits) / asked : 0.0,
                static_cast<unsigned long long>(k.evictions),
                static_cast<double>(k.bytes_read) / 1e9,
                static_cast<unsigned long long>(k.failed_reads), k.stall_ms);
  out.emplace_back(b);
  if (k.prefetch_issued + k.prefetch_dropped > 0) {
    std::snprintf(b, sizeof b,
                  "  prefetch: %llu issued, %llu used (%llu late), %llu wasted, %llu dropped",
                  static_cast<unsigned long long>(k.prefetch_issued),
                  static_cast<unsigned long long>(k.prefetch_used),
                  static_cast<unsigned long long>(k.prefetch_late),
                  static_cast<unsigned long long>(k.prefetch_wasted),
                  static_cast<unsigned long long>(k.prefetch_dropped));
    out.emplace_back(b);
  }
  if (r.serialised > 0)
    out.push_back("  pipeline: " + std::to_string(r.serialised) +
                  " stage(s) waited for the layer before (the cache could not hold both)");
  for (const std::string& e : r.env) out.push_back("  from the environment: " + e);
  return out;
}

}  // namespace moecheck::cli
