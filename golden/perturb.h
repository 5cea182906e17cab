// Planted perturbations of one expert's K-quant matrix, in place, for `moecheck sensitivity`
// (compare/sensitivity.h): each is a bug an engineer could write in a kernel's decode, made
// concrete as different bytes in what the implementation under test reads. The caller owns a
// writable copy of the bytes (a copy-on-write mapping, gguf::MapMode::kCopyOnWrite) and restores
// them with a BytePatch. Contract: docs/detection.md "Perturbation classes".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/blocks.h"

namespace moecheck {

// The bytes [p, p + n) saved at construction and written back at destruction (or restore()).
class BytePatch {
 public:
  BytePatch(uint8_t* p, size_t n) : p_(p), saved_(p, p + n) {}
  ~BytePatch() { restore(); }
  BytePatch(const BytePatch&) = delete;
  BytePatch& operator=(const BytePatch&) = delete;
  void restore();

 private:
  uint8_t* p_;
  std::vector<uint8_t> saved_;
};

// One expert's matrix [rows, cols] of Q2_K or Q3_K blocks at writable `data`.
struct KQuantMatrix {
  GgmlType type = GgmlType::kQ2K;
  int64_t rows = 0, cols = 0;
  uint8_t* data = nullptr;
  int64_t blocks_per_row() const { return cols / kQK_K; }
  int64_t row_bytes() const;
  size_t bytes() const { return static_cast<size_t>(rows * row_bytes()); }
};

// Every super-block's d (the scale of the sub-block scales; Q2_K's dmin is left alone) scaled by
// 1 + eps and rounded to f16. Returns the mean |relative change| of d actually made: below about
// one f16 ulp (2^-11 .. 2^-10 relative) the rounding makes nothing change.
double perturb_scale_d(const KQuantMatrix& m, double eps);

// Rows [0, n): Q2_K sub-block 0 of super-block 0 has its 4-bit scale and min swapped; Q3_K (no
// mins) has the 6-bit scales of sub-blocks 0 and 1 swapped. Returns the rows actually changed
// (equal fields swap to the same bytes).
int64_t perturb_swap_scale_min(const KQuantMatrix& m, int64_t n);

// Rows [0, n) read one super-block off (a row pointer advanced by one block): super-block i
// holds the row's super-block i + 1, the last one the next row's first (row 0's for the last
// row). Returns the rows changed.
int64_t perturb_row_offset(const KQuantMatrix& m, int64_t n);

// Rows [0, n): the 2-bit quant bytes (qs) of super-block 0 read one byte off (qs[i] = qs[i + 1],
// the last byte kept). Returns the rows changed.
int64_t perturb_shift_quants(const KQuantMatrix& m, int64_t n);

}  // namespace moecheck
