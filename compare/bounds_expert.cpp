// One expert's stages against the reference's Exact Expert on the same tokens: gate and up
// ("MMVQ" or "bf16 GEMV" bound), h ("SwiGLU", propagated), down (its own bound plus the
// propagated h error). Contract: docs/numerics.md "Error bounds vs the reference's Exact mode".
#include <algorithm>
#include <cmath>
#include <string>

#include "compare/bounds_detail.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "reference/moe.h"

namespace moecheck::bounds_detail {
namespace {

// The checks of one expert, token row by token row.
class ExpertCheck {
 public:
  ExpertCheck(const LayerWeights& w, const MatView& w1, const MatView& w3, const MatView& w2,
              const ExpertTaps& e, const std::vector<BlockQ8_1>& x_q8, const std::vector<float>& xf,
              bool shared, Checker& ck, ExpertDiff& out, Checker* stat)
      : c_(w.config),
        w1_(w1),
        w3_(w3),
        w2_(w2),
        e_(e),
        x_q8_(x_q8),
        xf_(xf),
        shared_(shared),
        ck_(ck),
        out_(out),
        stat_(stat),
        dense_(w1.type == GgmlType::kBF16),
        who_(e.expert >= 0 ? "expert " + std::to_string(e.expert) + " " : ""),
        wrow_(static_cast<size_t>(std::max(c_.inter, c_.dim))),
        herr_(static_cast<size_t>(c_.inter)),
        hin_(static_cast<size_t>(c_.inter)) {}

  void run() {
    const int64_t dim = c_.dim, n = static_cast<int64_t>(e_.tokens.size());
    xe_.resize(static_cast<size_t>(n * dim));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < dim; ++k) xe_[j * dim + k] = xf_[e_.tokens[j] * dim + k];
    const ref::Expert rx(w1_, w3_, w2_, limit());
    out_.down_ref = rx.forward_exact(xe_.data(), n, nullptr, &rt_);
    out_.down_err.assign(static_cast<size_t>(n * dim), 0.0);
    out_.down_mag.assign(static_cast<size_t>(n * dim), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      gate_up(j, false);
      gate_up(j, true);
      swiglu(j);
      down(j);
    }
    if (stat_ != nullptr)
      check_expert_noise(c_, w1_, w3_, w2_, e_, rt_, x_q8_, xf_, shared_, *stat_, out_);
  }

 private:
  Stage stage(ExpertField f) const { return expert_stage(shared_, f); }
  // The clamp of this expert: the shared expert's may differ per layer (MoeConfig).
  float limit() const { return shared_ ? c_.shared_swiglu_limit() : c_.swiglu_limit; }
  auto at(int64_t j, const char* what, int64_t i) const {
    return [this, j, what, i] {
      return who_ + "token " + std::to_string(e_.tokens[j]) + " " + what + " " + std::to_string(i);
    };
  }

  // gate (up = false) or up of token row j: "MMVQ" for K-quant weights, "bf16 GEMV" for dense
  // ones (the lane's chain over K / 256 chunks of 8, then the butterfly: depth 8 K/256 + 5).
  void gate_up(int64_t j, bool up) {
    const int64_t dim = c_.dim, inter = c_.inter, tok = e_.tokens[j];
    const MatView& m = up ? w3_ : w1_;
    const std::vector<float>& ve = up ? e_.up : e_.gate;
    const std::vector<float>& vr = up ? rt_.up : rt_.gate;
    const BlockQ8_1* a = x_q8_.data() + tok * dim / kQK8_1;
    const float* xt = xf_.data() + tok * dim;
    std::vector<double> ex(static_cast<size_t>(dim / kQK8_1));
    for (int64_t g = 0; g < dim / kQK8_1; ++g) ex[g] = q8_block_bound(xt + g * kQK8_1);
    const int64_t depth = 8 * ((dim + 255) / 256) + 5;
    for (int64_t i = 0; i < inter; ++i) {
      double b;
      if (dense_) {  // sum |w_k x_k| of the row
        dequantize_row(m.type, m.row(i), wrow_.data(), dim);
        double mag = 0;
        for (int64_t k = 0; k < dim; ++k) mag += std::fabs(wrow_[k] * xe_[j * dim + k]);
        b = (gamma_f32(depth) + gamma_f64(dim)) * mag;
      } else {
        b = mmvq_exact_bound(m.type, m.row(i), a, xt, dim, ex.data()).bound;
      }
      const double r = vr[j * inter + i];
      ck_.see(stage(up ? ExpertField::kUp : ExpertField::kGate), ve[j * inter + i], r,
              b + kU32 * std::fabs(r), at(j, "row", i));
    }
  }

  // h of token row j, and the down projection's input as the implementation feeds it (bf16 for
  // the dense shared expert) with its error against the reference's h.
  void swiglu(int64_t j) {
    const int64_t inter = c_.inter;
    for (int64_t i = 0; i < inter; ++i) {
      const int64_t q = j * inter + i;
      ck_.see(stage(ExpertField::kH), e_.h[q], rt_.h[q],
              h_bound(e_.gate[q], e_.up[q], rt_.gate[q], rt_.up[q], rt_.h[q], limit()),
              at(j, "col", i));
      hin_[i] = dense_ ? static_cast<double>(round_bf16(e_.h[q])) : static_cast<double>(e_.h[q]);
      herr_[i] = std::fabs(hin_[i] - rt_.h[q]) + kU32 * std::fabs(rt_.h[q]);
    }
  }

  // down of token row j: its own bound plus sum |w2| * (h error).
  void down(int64_t j) {
    const int64_t dim = c_.dim, inter = c_.inter;
    std::vector<double> eh(static_cast<size_t>(inter / kQK8_1));
    for (int64_t g = 0; g < inter / kQK8_1; ++g)
      eh[g] = q8_block_bound(e_.h.data() + j * inter + g * kQK8_1);
    const int64_t depth = 8 * ((inter + 255) / 256) + 5;
    for (int64_t r = 0; r < dim; ++r) {
      dequantize_row(w2_.type, w2_.row(r), wrow_.data(), inter);
      double prop = 0, m2 = 0;
      for (int64_t k = 0; k < inter; ++k) {
        prop += std::fabs(wrow_[k]) * herr_[k];
        m2 += std::fabs(wrow_[k] * hin_[k]);
      }
      double b = prop;
      if (dense_) {
        b += (gamma_f32(depth) + gamma_f64(inter)) * m2;
      } else {
        b += mmvq_exact_bound(w2_.type, w2_.row(r), e_.h_q8.data() + j * inter / kQK8_1,
                              e_.h.data() + j * inter, inter, eh.data())
                 .bound;
      }
      const int64_t q = j * dim + r;
      ck_.see(stage(ExpertField::kDown), e_.down[q], out_.down_ref[q], b, at(j, "row", r));
      out_.down_err[q] = std::fabs(e_.down[q] - out_.down_ref[q]);
      out_.down_mag[q] = m2 + prop;
    }
  }

  const MoeConfig& c_;
  const MatView &w1_, &w3_, &w2_;
  const ExpertTaps& e_;
  const std::vector<BlockQ8_1>& x_q8_;
  const std::vector<float>& xf_;
  bool shared_;
  Checker& ck_;
  ExpertDiff& out_;
  Checker* stat_;
  bool dense_;
  std::string who_;
  ExpertTaps rt_;                   // the reference's taps on the same tokens
  std::vector<double> xe_;          // [n, dim] the expert's token rows
  std::vector<float> wrow_;         // one dequantised weight row
  std::vector<double> herr_, hin_;  // [inter] of the current token row
};

}  // namespace

void check_expert(const LayerWeights& w, const MatView& w1, const MatView& w3, const MatView& w2,
                  const ExpertTaps& e, const std::vector<BlockQ8_1>& x_q8,
                  const std::vector<float>& xf, bool shared, Checker& ck, ExpertDiff& out,
                  Checker* stat) {
  ExpertCheck(w, w1, w3, w2, e, x_q8, xf, shared, ck, out, stat).run();
}

}  // namespace moecheck::bounds_detail
