// The planted perturbations of golden/perturb.h, on the block layouts of core/blocks.h.
#include "golden/perturb.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/numfmt.h"

namespace moecheck {
namespace {

// Q3_K's 6-bit scale field of sub-block `sub` (raw, the value + 32), packed as q3k_scale reads
// it: low nibble in scales[sub % 8] (high nibble for sub >= 8), top two bits in
// scales[8 + sub % 4] at bit 2 (sub / 4).
int q3k_raw_scale(const BlockQ3K& b, int sub) { return q3k_scale(b, sub) + 32; }

void set_q3k_raw_scale(BlockQ3K& b, int sub, int raw) {
  const int lo_shift = 4 * (sub >> 3), hi_shift = 2 * (sub >> 2);
  uint8_t& lo = b.scales[sub & 7];
  uint8_t& hi = b.scales[8 + (sub & 3)];
  lo = static_cast<uint8_t>((lo & ~(0xF << lo_shift)) | ((raw & 0xF) << lo_shift));
  hi = static_cast<uint8_t>((hi & ~(0x3 << hi_shift)) | (((raw >> 4) & 0x3) << hi_shift));
}

template <class Block>
Block load(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

template <class Block>
void store(uint8_t* p, const Block& b) {
  std::memcpy(p, &b, sizeof b);
}

size_t block_bytes(GgmlType t) { return t == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K); }

// The byte offset of d inside a block of type t.
size_t d_offset(GgmlType t) {
  return t == GgmlType::kQ2K ? offsetof(BlockQ2K, d) : offsetof(BlockQ3K, d);
}
size_t qs_offset(GgmlType t) {
  return t == GgmlType::kQ2K ? offsetof(BlockQ2K, qs) : offsetof(BlockQ3K, qs);
}

}  // namespace

void BytePatch::restore() {
  if (!saved_.empty()) std::memcpy(p_, saved_.data(), saved_.size());
}

int64_t KQuantMatrix::row_bytes() const { return moecheck::row_bytes(type, cols); }

double perturb_scale_d(const KQuantMatrix& m, double eps) {
  const size_t bb = block_bytes(m.type), off = d_offset(m.type);
  const int64_t n = m.rows * m.blocks_per_row();
  double sum = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* p = m.data + static_cast<size_t>(i) * bb + off;
    uint16_t d = 0;
    std::memcpy(&d, p, 2);
    const double v = f16_to_f32(d);
    if (!std::isfinite(v) || v == 0) continue;
    const uint16_t nd = f32_to_f16(static_cast<float>(v * (1.0 + eps)));
    std::memcpy(p, &nd, 2);
    sum += std::fabs(f16_to_f32(nd) / v - 1.0);
    ++counted;
  }
  return counted > 0 ? sum / static_cast<double>(counted) : 0.0;
}

int64_t perturb_swap_scale_min(const KQuantMatrix& m, int64_t n) {
  int64_t changed = 0;
  for (int64_t r = 0; r < n && r < m.rows; ++r) {
    uint8_t* p = m.data + r * m.row_bytes();
    if (m.type == GgmlType::kQ2K) {
      BlockQ2K b = load<BlockQ2K>(p);
      const uint8_t s = b.scales[0];
      b.scales[0] = static_cast<uint8_t>((s >> 4) | (s << 4));
      changed += b.scales[0] != s;
      store(p, b);
    } else {
      BlockQ3K b = load<BlockQ3K>(p);
      const int s0 = q3k_raw_scale(b, 0), s1 = q3k_raw_scale(b, 1);
      set_q3k_raw_scale(b, 0, s1);
      set_q3k_raw_scale(b, 1, s0);
      changed += s0 != s1;
      store(p, b);
    }
  }
  return changed;
}

int64_t perturb_row_offset(const KQuantMatrix& m, int64_t n) {
  const size_t bb = block_bytes(m.type), rb = static_cast<size_t>(m.row_bytes());
  n = std::min(n, m.rows);
  // The original rows [0, n] (row n wraps to row 0 at the matrix's end): row r then reads the
  // rb bytes from one block past its start, its last block being row r + 1's first.
  std::vector<uint8_t> orig(static_cast<size_t>(n + 1) * rb);
  std::memcpy(orig.data(), m.data, static_cast<size_t>(n) * rb);
  std::memcpy(orig.data() + static_cast<size_t>(n) * rb,
              m.data + static_cast<size_t>(n % m.rows) * rb, rb);
  int64_t changed = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* p = m.data + static_cast<size_t>(r) * rb;
    std::memcpy(p, orig.data() + static_cast<size_t>(r) * rb + bb, rb);
    changed += std::memcmp(orig.data() + static_cast<size_t>(r) * rb, p, rb) != 0;
  }
  return changed;
}

int64_t perturb_shift_quants(const KQuantMatrix& m, int64_t n) {
  const size_t off = qs_offset(m.type), len = kQK_K / 4;
  int64_t changed = 0;
  for (int64_t r = 0; r < n && r < m.rows; ++r) {
    uint8_t* qs = m.data + r * m.row_bytes() + off;
    bool diff = false;
    for (size_t i = 0; i + 1 < len; ++i) {
      diff = diff || qs[i] != qs[i + 1];
      qs[i] = qs[i + 1];
    }
    changed += diff;
  }
  return changed;
}

}  // namespace moecheck
