// The cache sizes of `moecheck cache --sizes`: slot counts, byte sizes and percentages of the
// trace's distinct keys, and the default sweep. Contract: docs/cli.md "cache".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck::cli {

// One piece of --sizes as written: "64" (slots), "1.5GB" / "512MiB" (bytes: B, kB or KB, MB, GB,
// TB decimal; KiB, MiB, GiB, TiB binary), "25%" (of the trace's distinct keys).
struct SizeSpec {
  enum class Kind { kSlots, kBytes, kPercent };
  std::string text;
  Kind kind = Kind::kSlots;
  double value = 0;  // slots, bytes or percent
};

// InputError naming --sizes and the piece (empty piece, not a number, unknown unit, a
// fractional slot count, zero or negative, a percentage above 100).
std::vector<SizeSpec> parse_size_list(const std::string& s);

struct CacheSize {
  std::string label;  // the piece as written, or the slot count (default sweep)
  int64_t slots = 0;
};

// Slots of each piece: as given; floor(bytes / expert_bytes); floor(percent / 100 x distinct).
// A byte size with expert_bytes 0 (unknown) is an InputError naming the piece and `trace`.
std::vector<CacheSize> resolve_sizes(const std::vector<SizeSpec>& specs, int64_t expert_bytes,
                                     int64_t distinct_keys, const std::string& trace);

// The default sweep: min_slots, then doubling while below distinct_keys, then distinct_keys.
std::vector<CacheSize> default_sizes(int64_t min_slots, int64_t distinct_keys);

// "all" -> kPrefetchAll (core/cache_sim.h), "0", "4", ... -> the count; InputError naming
// --prefetch-k otherwise.
int64_t parse_prefetch_k(const std::string& s);

}  // namespace moecheck::cli
