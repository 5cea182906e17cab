// model.py Linear on dequantised weights, in f32 (Model mode) and f64 (Exact mode). Contract:
// reference/linear.h and docs/reference.md.
#include "reference/linear.h"

#include <Eigen/Dense>
#include <algorithm>
#include <vector>

#include "core/kquant.h"

namespace moecheck::ref {
namespace {

// Rows dequantised per step: a multiple of Eigen's row-major GEMV row blocking, and small enough
// (64 x 5120 x 4 bytes = 1.3 MB) to stay in cache while every token reuses it.
constexpr int64_t kRowChunk = 64;

template <typename Scalar>
void linear_impl(const MatView& w, const Scalar* x, int64_t n, Scalar* y) {
  using RowMat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vec = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  const int64_t rows = w.rows;
  const int64_t cols = w.cols;
  std::vector<float> deq(static_cast<size_t>(std::min(rows, kRowChunk) * cols));
  RowMat chunk;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t nr = std::min(kRowChunk, rows - r0);
    for (int64_t r = 0; r < nr; ++r)
      dequantize_row(w.type, w.row(r0 + r), deq.data() + r * cols, cols);
    // The dequantised values are f32; widening them to f64 is exact.
    chunk = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                deq.data(), nr, cols)
                .template cast<Scalar>();
    for (int64_t t = 0; t < n; ++t) {
      Eigen::Map<const Vec> xv(x + t * cols, cols);
      Eigen::Map<Vec> yv(y + t * rows + r0, nr);
      yv.noalias() = chunk * xv;
    }
  }
}

}  // namespace

void linear_f32(const MatView& w, const float* x, int64_t n, float* y) {
  linear_impl<float>(w, x, n, y);
}
void linear_f64(const MatView& w, const double* x, int64_t n, double* y) {
  linear_impl<double>(w, x, n, y);
}

}  // namespace moecheck::ref
