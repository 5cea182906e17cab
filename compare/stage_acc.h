// The element accumulator of one stage comparison (internal to compare/): statistics, the
// tolerance's per-element rule, the first located mismatches. Contract: docs/cli.md "diff".
#pragma once

#include <functional>
#include <string>

#include "compare/dump_diff.h"

namespace moecheck::diff_detail {

// One element pair, already in f32 / bf16 bit form.
struct Elem {
  float a, b;
  uint32_t a_bits, b_bits;
  uint64_t ulp;
};

Elem f32_pair(float a, float b);
Elem bf16_pair(uint16_t a, uint16_t b);

class StageAcc {
 public:
  StageAcc(StageDiff& s, const Tolerance& tol) : s_(s), tol_(tol) {}

  // Counts the pair against the tolerance's per-element rule; records it when it fails.
  void add(const Elem& e, const Mismatch& loc, const std::function<std::string()>& where);
  // q8_1 blocks: bytes compared exactly in every mode (ref has none; emu and cuda must agree).
  void add_q8(const BlockQ8_1& a, const BlockQ8_1& b, const Mismatch& loc,
              const std::function<std::string()>& where);
  // NMSE, the stage's pass (q8: byte equality whatever the mode), the worst list in order.
  void finish(bool q8);

 private:
  // Counts an out-of-tolerance element; keeps it among the first and the worst by |a - b|
  // (`where` is asked only for an element that is kept).
  void record(Mismatch m, const std::function<std::string()>& where);
  // The statistics of a non-NaN pair with |a - b| = d; true when it is the new worst_abs.
  bool stats(const Elem& e, double d, const Mismatch& loc,
             const std::function<std::string()>& where);

  StageDiff& s_;
  const Tolerance& tol_;
};

}  // namespace moecheck::diff_detail
