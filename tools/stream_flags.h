// The expert cache's flags, shared by `run` and `check` (docs/cli.md "Streaming"): registered on a
// subcommand, read into StreamKnobs with the environment overrides, refused when the command
// would not run cuda, and the cache's report after a run.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "tools/stream_run.h"

namespace moecheck::cli {

struct StreamArgs {
  int64_t cache_slots = 0;
  std::string cache_bytes;
  int reader_threads = 0;
  int prefetch_k = 0;
  bool pipeline = false;
  std::string checks = "readers";
  std::string source = "model";
  CLI::Option *slots_opt = nullptr, *bytes_opt = nullptr, *readers_opt = nullptr,
              *prefetch_opt = nullptr, *pipeline_opt = nullptr, *checks_opt = nullptr,
              *source_opt = nullptr;

  // Any of the flags on the command line.
  bool any_given() const;
  // The first flag given, "--cache-slots 64" style, for refusals.
  std::string first_given() const;
};

void add_stream_flags(CLI::App* s, StreamArgs& a);
// The knobs from the flags and the environment overrides (their "NAME=value" in *env).
StreamKnobs stream_knobs(const StreamArgs& a, std::vector<std::string>* env);

// The report's lines (text): the cache's size, hit rate, reads, prefetch, stall; per layer the
// fetch time when asked.
std::vector<std::string> stream_report_lines(const StreamReport& r);

}  // namespace moecheck::cli
