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

namespace {

// |a - b| of a recorded element (NaN when either side is NaN).
double gap(const Mismatch& m) { return std::fabs(m.a - m.b); }

// The worst list is a min-heap on |a - b| while filling (its root is the one to drop).
bool wider(const Mismatch& x, const Mismatch& y) { return gap(x) > gap(y); }

// The element's values and bits at its location (no `where` text yet).
Mismatch with_values(const Elem& e, const Mismatch& loc) {
  Mismatch m = loc;
  m.a = e.a;
  m.b = e.b;
  m.a_bits = e.a_bits;
  m.b_bits = e.b_bits;
  m.ulp = e.ulp;
  return m;
}

Mismatch located(const Elem& e, const Mismatch& loc, const std::function<std::string()>& where) {
  Mismatch m = with_values(e, loc);
  m.where = where();
  return m;
}

}  // namespace

void StageAcc::record(Mismatch m, const std::function<std::string()>& where) {
  ++s_.out_of_tol;
  const double g = gap(m);
  const bool first = s_.first.size() < kMaxMismatches;
  const bool worst =
      !std::isnan(g) && (s_.worst.size() < kMaxMismatches || g > gap(s_.worst.front()));
  if (!first && !worst) return;
  if (m.where.empty()) m.where = where();
  if (worst) {
    if (s_.worst.size() == kMaxMismatches) {
      std::pop_heap(s_.worst.begin(), s_.worst.end(), wider);
      s_.worst.pop_back();
    }
    s_.worst.push_back(m);
    std::push_heap(s_.worst.begin(), s_.worst.end(), wider);
  }
  if (first) s_.first.push_back(std::move(m));
}

// max_abs over every non-NaN pair; max_rel and max_ulp only where both sides are nonzero and of
// the same sign (docs/cli.md "diff"), the others counted in cross_zero. Returns whether the pair
// is the new worst_abs.
bool StageAcc::stats(const Elem& e, double d, const Mismatch& loc,
                     const std::function<std::string()>& where) {
  const double a = e.a, b = e.b;
  const bool widest = d > s_.max_abs;
  if (widest) {
    s_.max_abs = d;
    s_.worst_abs = located(e, loc, where);
    s_.has_worst_abs = true;
  }
  if (a != 0.0 && b != 0.0 && std::signbit(a) == std::signbit(b)) {
    s_.max_rel = std::max(s_.max_rel, d / std::fabs(a));
    if (e.ulp > s_.max_ulp) {
      s_.max_ulp = e.ulp;
      s_.worst_ulp = located(e, loc, where);
      s_.has_worst_ulp = true;
    }
  } else if (d != 0.0) {
    ++s_.cross_zero;
  }
  s_.sum_sq_a += a * a;
  s_.sum_sq_diff += d * d;
  return widest;
}

void StageAcc::add(const Elem& e, const Mismatch& loc, const std::function<std::string()>& where) {
  ++s_.compared;
  const bool na = std::isnan(e.a), nb = std::isnan(e.b);
  bool ok = false, widest = false;
  if (na || nb) {
    // Exact: same bits, NaN or not (docs/numerics.md: NaN results are canonical on both sides,
    // so bit-identical NaNs are the contract). Otherwise a NaN equals a NaN only with nan_equal.
    ok = tol_.mode == ToleranceMode::kExact ? e.a_bits == e.b_bits : na && nb && tol_.nan_equal;
    if (!ok) ++s_.nan_mismatch;
  } else {
    const double a = e.a, b = e.b;
    const double d = a == b ? 0.0 : std::fabs(a - b);
    widest = stats(e, d, loc, where);
    ok = within(tol_, e, d, a);
  }
  if (ok) return;
  Mismatch m = with_values(e, loc);
  if (widest) m.where = s_.worst_abs.where;  // just located: no second string
  record(std::move(m), where);
}

void StageAcc::add_q8(const BlockQ8_1& a, const BlockQ8_1& b, const Mismatch& loc,
                      const std::function<std::string()>& where) {
  const auto* pa = reinterpret_cast<const uint8_t*>(&a);
  const auto* pb = reinterpret_cast<const uint8_t*>(&b);
  s_.compared += static_cast<int64_t>(sizeof(BlockQ8_1));
  for (size_t i = 0; i < sizeof(BlockQ8_1); ++i) {
    if (pa[i] == pb[i]) continue;
    Mismatch m = loc;
    m.a = pa[i];
    m.b = pb[i];
    m.a_bits = pa[i];
    m.b_bits = pb[i];
    auto byte_where = [&] {
      return where() + ", byte " + std::to_string(i) + " (" + q8_field_name(static_cast<int>(i)) +
             ")";
    };
    if (std::fabs(double(pa[i]) - double(pb[i])) > s_.max_abs) {
      s_.max_abs = std::fabs(double(pa[i]) - double(pb[i]));
      s_.worst_abs = m;
      s_.worst_abs.where = byte_where();
      s_.has_worst_abs = true;
      m.where = s_.worst_abs.where;
    }
    record(std::move(m), byte_where);
  }
}

void StageAcc::finish(bool q8) {
  std::sort_heap(s_.worst.begin(), s_.worst.end(), wider);  // ascending in `wider`: largest first
  if (s_.sum_sq_a > 0) s_.nmse = s_.sum_sq_diff / s_.sum_sq_a;
  else s_.nmse = s_.sum_sq_diff > 0 ? kInf : 0.0;
  if (tol_.mode == ToleranceMode::kNmse && !q8)
    s_.pass = s_.nmse <= tol_.nmse && s_.nan_mismatch == 0;
  else s_.pass = s_.out_of_tol == 0;
}

}  // namespace moecheck::diff_detail
