// check_finite_slice (golden/finite_check.h).
#include "golden/finite_check.h"

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "core/blocks.h"
#include "core/error.h"

namespace moecheck {
namespace {

std::string hex(uint32_t v, int digits) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%0*X", digits, v);
  return b;
}

// NaN / +Inf / -Inf of an IEEE value whose exponent field is all ones.
const char* kind(bool mantissa_nonzero, bool negative) {
  return mantissa_nonzero ? "NaN" : negative ? "-Inf" : "+Inf";
}

[[noreturn]] void fail(const std::string& file, const std::string& slice, const std::string& at,
                       const char* what, uint32_t bits, int digits) {
  throw InputError(file + ": tensor " + slice + ": " + at + " is " + what + " (bits " +
                   hex(bits, digits) + "); non-finite weights are refused (docs/reliability.md)");
}

void check_f16_scale(const std::string& file, const std::string& slice, uint16_t h,
                     const std::string& at) {
  if ((h & 0x7C00u) == 0x7C00u) fail(file, slice, at, kind((h & 0x3FFu) != 0, h >> 15), h, 4);
}

bool finite_f16(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

}  // namespace

void check_finite_slice(const std::string& file, const std::string& slice, uint32_t type,
                        int64_t cols, const uint8_t* p, uint64_t n) {
  const auto t = static_cast<GgmlType>(type);
  auto at_value = [&](uint64_t i) {
    return "row " + std::to_string(static_cast<int64_t>(i) / cols) + ", column " +
           std::to_string(static_cast<int64_t>(i) % cols);
  };
  if (t == GgmlType::kBF16 || t == GgmlType::kF16) {
    const uint16_t exp = t == GgmlType::kBF16 ? 0x7F80u : 0x7C00u;
    for (uint64_t i = 0; i < n / 2; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if ((h & exp) == exp)
        fail(file, slice, at_value(i), kind((h & ~exp & 0x7FFFu) != 0, h >> 15), h, 4);
    }
  } else if (t == GgmlType::kF32) {
    for (uint64_t i = 0; i < n / 4; ++i) {
      uint32_t u;
      std::memcpy(&u, p + 4 * i, 4);
      if ((u & 0x7F800000u) == 0x7F800000u)
        fail(file, slice, at_value(i), kind((u & 0x7FFFFFu) != 0, u >> 31), u, 8);
    }
  } else if (t == GgmlType::kQ2K || t == GgmlType::kQ3K) {
    const uint64_t bb = t == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K);
    const int64_t per_row = cols / kQK_K;
    // The location is spelled only for a failing block (a string per block would cost more
    // than the check).
    auto at = [&](uint64_t b, const char* field) {
      return "super-block " + std::to_string(static_cast<int64_t>(b) % per_row) + " of row " +
             std::to_string(static_cast<int64_t>(b) / per_row) + ": " + field;
    };
    const size_t d_at = t == GgmlType::kQ2K ? offsetof(BlockQ2K, d) : offsetof(BlockQ3K, d);
    for (uint64_t b = 0; b < n / bb; ++b) {
      uint16_t d, dmin = 0;
      std::memcpy(&d, p + b * bb + d_at, 2);
      if (t == GgmlType::kQ2K) std::memcpy(&dmin, p + b * bb + offsetof(BlockQ2K, dmin), 2);
      if (!finite_f16(d)) check_f16_scale(file, slice, d, at(b, "d"));
      if (!finite_f16(dmin)) check_f16_scale(file, slice, dmin, at(b, "dmin"));
    }
  }
}

}  // namespace moecheck
