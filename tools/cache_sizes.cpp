// Cache size lists (tools/cache_sizes.h).
#include "tools/cache_sizes.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "core/cache_sim.h"
#include "core/error.h"

namespace moecheck::cli {
namespace {

[[noreturn]] void bad_piece(const std::string& list, const std::string& piece,
                            const std::string& why) {
  throw InputError("--sizes \"" + list + "\": piece \"" + piece + "\" " + why +
                   " (expected slot counts, byte sizes or percentages of the trace's distinct "
                   "keys, e.g. 64,128,1.5GB,25%)");
}

// The byte multiplier of a unit, 0 when unknown.
double unit_bytes(const std::string& u) {
  static const std::pair<const char*, double> kUnits[] = {
      {"B", 1},     {"kB", 1e3},     {"KB", 1e3},     {"MB", 1e6},     {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}};
  for (const auto& [name, bytes] : kUnits)
    if (u == name) return bytes;
  return 0;
}

}  // namespace

std::vector<SizeSpec> parse_size_list(const std::string& s) {
  std::vector<SizeSpec> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string piece = s.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t num_end = piece.find_first_not_of("0123456789.");
    const std::string num = piece.substr(0, num_end);
    const std::string unit = num_end == std::string::npos ? "" : piece.substr(num_end);
    if (num.empty() || num.find('.') != num.rfind('.') || num == ".")
      bad_piece(s, piece, "does not start with a number");
    SizeSpec z;
    z.text = piece;
    z.value = std::strtod(num.c_str(), nullptr);
    if (unit.empty()) {
      z.kind = SizeSpec::Kind::kSlots;
      if (num.find('.') != std::string::npos) bad_piece(s, piece, "is not a whole slot count");
    } else if (unit == "%") {
      z.kind = SizeSpec::Kind::kPercent;
      if (z.value > 100) bad_piece(s, piece, "is above 100%");
    } else {
      const double mult = unit_bytes(unit);
      if (mult == 0)
        bad_piece(
            s, piece,
            "has an unknown unit \"" + unit + "\" (B, kB, KB, MB, GB, TB, KiB, MiB, GiB, TiB, %)");
      z.kind = SizeSpec::Kind::kBytes;
      z.value *= mult;
    }
    if (!(z.value > 0) || !std::isfinite(z.value) || z.value > 0x1p62)
      bad_piece(s, piece, "is not a positive size");
    out.push_back(z);
  }
  return out;
}

std::vector<CacheSize> resolve_sizes(const std::vector<SizeSpec>& specs, int64_t expert_bytes,
                                     int64_t distinct_keys, const std::string& trace) {
  std::vector<CacheSize> out;
  for (const SizeSpec& z : specs) {
    CacheSize c{z.text, 0};
    switch (z.kind) {
      case SizeSpec::Kind::kSlots: c.slots = static_cast<int64_t>(z.value); break;
      case SizeSpec::Kind::kPercent:
        c.slots =
            static_cast<int64_t>(std::floor(z.value / 100 * static_cast<double>(distinct_keys)));
        break;
      case SizeSpec::Kind::kBytes:
        if (expert_bytes <= 0)
          throw InputError("--sizes " + z.text +
                           ": a size in bytes needs the bytes of one expert, "
                           "and " +
                           trace +
                           " has no expert_bytes (give slot counts or "
                           "percentages, or record the trace with run --trace)");
        c.slots = static_cast<int64_t>(std::floor(z.value / static_cast<double>(expert_bytes)));
        break;
    }
    out.push_back(c);
  }
  return out;
}

std::vector<CacheSize> default_sizes(int64_t min_slots, int64_t distinct_keys) {
  std::vector<CacheSize> out;
  for (int64_t s = std::max<int64_t>(min_slots, 1); s < distinct_keys; s *= 2)
    out.push_back(CacheSize{std::to_string(s), s});
  out.push_back(CacheSize{std::to_string(distinct_keys), distinct_keys});
  return out;
}

int64_t parse_prefetch_k(const std::string& s) {
  if (s == "all") return kPrefetchAll;
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    throw InputError("--prefetch-k " + s +
                     ": expected a whole number >= 0 (0: no prefetch) or \"all\"");
  return std::stoll(s);
}

}  // namespace moecheck::cli
