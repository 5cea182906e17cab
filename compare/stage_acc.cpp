// The element accumulator of one stage comparison. Contract: docs/cli.md "diff" (the rules and
// the statistics' definitions).
#include "compare/stage_acc.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compare/dump_diff_where.h"
#include "core/numfmt.h"

namespace moecheck::diff_detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Whether a non-NaN pair is within the tolerance's per-element rule (kNmse: bit-equal counts).
bool within(const Tolerance& t, const Elem& e, double d, double a) {
  switch (t.mode) {
    case ToleranceMode::kExact:
    case ToleranceMode::kNmse: return e.a_bits == e.b_bits;
    case ToleranceMode::kUlp: return e.ulp <= t.ulp;
    case ToleranceMode::kAbsRel: return d <= t.atol + t.rtol * std::fabs(a);
  }
  return false;
}

}  // namespace

Elem f32_pair(float a, float b) {
  const uint32_t x = f32_bits(a), y = f32_bits(b);
  return Elem{a, b, x, y, ulp_distance_f32(x, y)};
}

Elem bf16_pair(uint16_t a, uint16_t b) {
  return Elem{bf16_to_f32(a), bf16_to_f32(b), a, b, ulp_distance_bf16(a, b)};
}

void StageAcc::record(Mismatch m) {
  ++s_.out_of_tol;
  if (s_.first.size() < kMaxMismatches) s_.first.push_back(std::move(m));
}

void StageAcc::add(const Elem& e, const Mismatch& loc, const std::function<std::string()>& where) {
  ++s_.compared;
  const bool na = std::isnan(e.a), nb = std::isnan(e.b);
  bool ok = false;
  if (na || nb) {
    // Exact: same bits, NaN or not (docs/numerics.md: NaN results are canonical on both sides,
    // so bit-identical NaNs are the contract). Otherwise a NaN equals a NaN only with nan_equal.
    ok = tol_.mode == ToleranceMode::kExact ? e.a_bits == e.b_bits : na && nb && tol_.nan_equal;
    if (!ok) ++s_.nan_mismatch;
  } else {
    const double a = e.a, b = e.b;
    const double d = a == b ? 0.0 : std::fabs(a - b);
    const double rel = d == 0.0 ? 0.0 : (a == 0.0 ? kInf : d / std::fabs(a));
    s_.max_abs = std::max(s_.max_abs, d);
    s_.max_rel = std::max(s_.max_rel, rel);
    s_.max_ulp = std::max(s_.max_ulp, e.ulp);
    s_.sum_sq_a += a * a;
    s_.sum_sq_diff += d * d;
    ok = within(tol_, e, d, a);
  }
  if (ok) return;
  Mismatch m = loc;
  m.a = e.a;
  m.b = e.b;
  m.a_bits = e.a_bits;
  m.b_bits = e.b_bits;
  m.ulp = e.ulp;
  if (s_.first.size() < kMaxMismatches) m.where = where();
  record(std::move(m));
}

void StageAcc::add_q8(const BlockQ8_1& a, const BlockQ8_1& b, const Mismatch& loc,
                      const std::function<std::string()>& where) {
  const auto* pa = reinterpret_cast<const uint8_t*>(&a);
  const auto* pb = reinterpret_cast<const uint8_t*>(&b);
  s_.compared += static_cast<int64_t>(sizeof(BlockQ8_1));
  for (size_t i = 0; i < sizeof(BlockQ8_1); ++i) {
    if (pa[i] == pb[i]) continue;
    s_.max_abs = std::max(s_.max_abs, std::fabs(double(pa[i]) - double(pb[i])));
    Mismatch m = loc;
    m.a = pa[i];
    m.b = pb[i];
    m.a_bits = pa[i];
    m.b_bits = pb[i];
    if (s_.first.size() < kMaxMismatches)
      m.where =
          where() + ", byte " + std::to_string(i) + " (" + q8_field_name(static_cast<int>(i)) + ")";
    record(std::move(m));
  }
}

void StageAcc::finish(bool q8) {
  if (s_.sum_sq_a > 0) s_.nmse = s_.sum_sq_diff / s_.sum_sq_a;
  else s_.nmse = s_.sum_sq_diff > 0 ? kInf : 0.0;
  if (tol_.mode == ToleranceMode::kNmse && !q8)
    s_.pass = s_.nmse <= tol_.nmse && s_.nan_mismatch == 0;
  else s_.pass = s_.out_of_tol == 0;
}

}  // namespace moecheck::diff_detail
