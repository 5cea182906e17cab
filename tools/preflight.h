// Checks a command makes before any work, so that a bad command line costs nothing and leaves
// nothing behind: the files it will write (a writable directory, not one of its own inputs), the
// knobs the chosen implementation would ignore, and the memory a run needs against what the
// machine has. Each failure is an InputError naming the flag and the value. Contract: docs/cli.md
// "Checks before any work".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace moecheck {
class ModelFile;
}

namespace moecheck::cli {

// One input file of a command and the flag (or argument) that named it, for messages.
struct NamedPath {
  std::string flag;
  std::string path;
};

// `path` (given by `flag`) is a file the command will write: its directory exists and is
// writable, it is not a directory, and it is not the same file as any input (st_dev and st_ino
// when both exist, so symlinks and hard links are seen through; else the canonical paths).
void require_output_file(const std::string& flag, const std::string& path,
                         const std::vector<NamedPath>& inputs);

// `dir` (given by `flag`) is a directory the command writes `files` (names inside it) into,
// created when missing: it is a writable directory, or the nearest existing directory above it
// is writable; no file it will write is the same file as an input.
void require_output_dir(const std::string& flag, const std::string& dir,
                        const std::vector<std::string>& files,
                        const std::vector<NamedPath>& inputs);

// A knob the chosen implementation does not have: `flag value: only the <owners> implementation(s)
// ha(s|ve) a <knob> knob; <chosen> would ignore it`.
[[noreturn]] void refuse_knob(const std::string& flag, const std::string& value,
                              const std::string& owners, const std::string& knob,
                              const std::string& chosen);

// Bytes of one token's taps in one layer: every stage an implementation fills (input, image mask,
// logits, top-k, x_q8, each of the top-k (expert, token) pairs' weight, gate, up, h, h_q8 and
// down, the shared expert's, acc, output). An upper bound: the reference has no q8_1 stages.
uint64_t tap_bytes_per_token(const MoeConfig& c);
// Bytes of one token's basic datasets (input, image mask, logits, top-k, output): a dump
// without --taps.
uint64_t basic_bytes_per_token(const MoeConfig& c);

// What a command will allocate at most, and how that was counted (one line, for the message).
struct MemoryNeed {
  uint64_t bytes = 0;
  std::string how;
};

// MemAvailable of /proc/meminfo in bytes ($MOECHECK_MEMINFO names another file in its format:
// the tests' stand-in for a small machine); 0 when it cannot be read (the check is then skipped).
uint64_t mem_available(std::string* source);

// InputError when `need` exceeds MemAvailable: `flag value: needs about X of memory (how), the
// machine has Y available (MemAvailable, source); ...`.
void require_memory(const std::string& flag, const std::string& value, const MemoryNeed& need);

// The memory a synthetic model's layer takes while it is in use (its tensors are made in anonymous
// memory, not mapped from a file: docs/streaming.md "Synthetic models"); 0 for a file.
uint64_t synthetic_layer_bytes(const ModelFile& m);

// "1.5 GB", "812 MB", "64 kB" (decimal units, 3 significant digits).
std::string bytes_text(uint64_t n);

}  // namespace moecheck::cli
