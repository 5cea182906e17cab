// model.py Linear on dequantised weights, in f32 (Model mode) and f64 (Exact mode). Contract:
// reference/linear.h and docs/reference.md.
#include "reference/linear.h"

#include <Eigen/Dense>
#include <algorithm>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/kquant.h"

namespace moecheck::ref {
namespace {

// Rows dequantised per step: a multiple of Eigen's row-major GEMV row blocking, and small enough
// (64 x 5120 x 4 bytes = 1.3 MB) to stay in cache while every token reuses it.
constexpr int64_t kRowChunk = 64;

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows [r0, r0 + nr) of w dequantised into `chunk` (resized to nr x cols).
void dequantize_chunk(const MatView& w, int64_t r0, int64_t nr, RowMatF& chunk) {
  chunk.resize(nr, w.cols);
  for (int64_t r = 0; r < nr; ++r)
    dequantize_row(w.type, w.row(r0 + r), chunk.data() + r * w.cols, w.cols);
}

// The chunks [c0, c1) of the rows: each chunk dequantised once, then one GEMV per token. A
// chunk's result depends on nothing but its rows and the token, so the chunks may be split
// between threads.
template <typename Scalar>
void linear_chunks(const MatView& w, const Scalar* x, int64_t n, Scalar* y, int64_t c0,
                   int64_t c1) {
  using RowMat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vec = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  const int64_t rows = w.rows;
  const int64_t cols = w.cols;
  RowMatF deq;
  RowMat widened;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t r0 = c * kRowChunk, nr = std::min(kRowChunk, rows - r0);
    dequantize_chunk(w, r0, nr, deq);
    const RowMat* chunk = nullptr;
    if constexpr (std::is_same_v<Scalar, float>) {
      chunk = &deq;
    } else {
      widened = deq.template cast<Scalar>();  // f32 to f64: exact
      chunk = &widened;
    }
    for (int64_t t = 0; t < n; ++t) {
      Eigen::Map<const Vec> xv(x + t * cols, cols);
      Eigen::Map<Vec> yv(y + t * rows + r0, nr);
      yv.noalias() = *chunk * xv;
    }
  }
}

// Host threads over the row chunks (hardware concurrency, at most 8; one when there is a single
// chunk). No bit depends on the split.
template <typename Scalar>
void linear_impl(const MatView& w, const Scalar* x, int64_t n, Scalar* y) {
  const int64_t chunks = (w.rows + kRowChunk - 1) / kRowChunk;
  const int64_t hw = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 8);
  const int64_t nt = std::min(hw, chunks);
  if (nt <= 1 || n == 0) {
    linear_chunks(w, x, n, y, 0, chunks);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(nt));
  std::vector<std::thread> pool;
  auto part = [&](int64_t i) {
    try {
      linear_chunks(w, x, n, y, chunks * i / nt, chunks * (i + 1) / nt);
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  for (int64_t i = 1; i < nt; ++i) pool.emplace_back(part, i);
  part(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

void linear_f32(const MatView& w, const float* x, int64_t n, float* y) {
  linear_impl<float>(w, x, n, y);
}
void linear_f64(const MatView& w, const double* x, int64_t n, double* y) {
  linear_impl<double>(w, x, n, y);
}

}  // namespace moecheck::ref
