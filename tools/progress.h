// A one-line progress bar on stderr, drawn only when stderr is a terminal (isatty), so logs and
// pipes stay clean; cleared when done. Used by run, check and golden for per-layer work, and by
// gen for the bytes written.
#pragma once

#include <cstdint>
#include <string>

namespace moecheck::cli {

class Progress {
 public:
  // `enabled` false (e.g. --json or --quiet) draws nothing even on a terminal.
  Progress(std::string label, int64_t total, bool enabled = true);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Marks one more unit done; `what` names the unit just finished ("layer 3 emu").
  void step(const std::string& what);
  // Sets how many units are done (a byte count, say); redraws only when it changed.
  void update(int64_t done, const std::string& what);
  void set_total(int64_t total) { total_ = total; }

 private:
  void draw(const std::string& what);
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool on_;
};

}  // namespace moecheck::cli
