// The statistical leg on one expert (compare/bounds_detail.h check_expert_noise): per token row,
// gate, up, h and down of the implementation against the Exact reference on the same tokens, as
// z-scores against the noise predicted by compare/stat_noise.h, propagated through SwiGLU by its
// derivatives and through the down projection by the squared weights (the h errors of different
// columns taken as independent). Derivation: docs/numerics.md "Statistical leg".
#include <algorithm>
#include <cmath>
#include <string>

#include "compare/bounds_detail.h"
#include "compare/stat_noise.h"
#include "core/kquant.h"
#include "core/numfmt.h"

namespace moecheck::bounds_detail {
namespace {

double logistic(double g) { return 1.0 / (1.0 + std::exp(-g)); }

class ExpertNoise {
 public:
  ExpertNoise(const MoeConfig& c, const MatView& w1, const MatView& w3, const MatView& w2,
              const ExpertTaps& e, const ExpertTaps& rt, const std::vector<BlockQ8_1>& x_q8,
              const std::vector<float>& xf, bool shared, Checker& stat, ExpertDiff& out)
      : c_(c),
        w1_(w1),
        w3_(w3),
        w2_(w2),
        e_(e),
        rt_(rt),
        x_q8_(x_q8),
        xf_(xf),
        shared_(shared),
        stat_(stat),
        out_(out),
        dense_(w1.type == GgmlType::kBF16),
        who_(e.expert >= 0 ? "expert " + std::to_string(e.expert) + " " : "") {}

  void run() {
    const int64_t n = static_cast<int64_t>(e_.tokens.size());
    out_.down_var.assign(static_cast<size_t>(n * c_.dim), 0.0);
    r1_.resize(static_cast<size_t>(std::max(c_.dim, c_.inter)));
    r3_.resize(r1_.size());
    var_h_.resize(static_cast<size_t>(c_.inter));
    for (int64_t j = 0; j < n; ++j) token_row(j);
  }

 private:
  Stage stage(ExpertField f) const { return expert_stage(shared_, f); }
  auto at(int64_t j, const char* what, int64_t i) const {
    return [this, j, what, i] {
      return who_ + "token " + std::to_string(e_.tokens[j]) + " " + what + " " + std::to_string(i);
    };
  }

  void token_row(int64_t j) {
    const int64_t dim = c_.dim, inter = c_.inter, tok = e_.tokens[j];
    const BlockQ8_1* a = x_q8_.data() + tok * dim / kQK8_1;
    const float* xt = xf_.data() + tok * dim;
    const int64_t depth = dense_ ? 8 * ((dim + 255) / 256) + 5 : mmvq_depth(dim / kQK8_1);
    for (int64_t i = 0; i < inter; ++i) {
      dequantize_row(w1_.type, w1_.row(i), r1_.data(), dim);
      dequantize_row(w3_.type, w3_.row(i), r3_.data(), dim);
      double var_g = 0, var_u = 0, cov = 0, m1 = 0, m3 = 0;
      if (!dense_) {  // a dense projection reads the same bf16 x on both sides: no predicted noise
        var_g = stat_noise::q8_dot_variance(r1_.data(), a, xt, dim) +
                stat_noise::dequant_variance(w1_.type, r1_.data(), xt, dim);
        var_u = stat_noise::q8_dot_variance(r3_.data(), a, xt, dim) +
                stat_noise::dequant_variance(w3_.type, r3_.data(), xt, dim);
        cov = stat_noise::q8_dot_covariance(r1_.data(), r3_.data(), a, xt, dim);
      }
      for (int64_t k = 0; k < dim; ++k) {
        m1 += std::fabs(static_cast<double>(r1_[k]) * xt[k]);
        m3 += std::fabs(static_cast<double>(r3_[k]) * xt[k]);
      }
      const int64_t q = j * inter + i;
      stat_.see_z(stage(ExpertField::kGate), e_.gate[q], rt_.gate[q], std::sqrt(var_g),
                  (gamma_f32(depth) + gamma_f64(dim)) * m1, at(j, "row", i));
      stat_.see_z(stage(ExpertField::kUp), e_.up[q], rt_.up[q], std::sqrt(var_u),
                  (gamma_f32(depth) + gamma_f64(dim)) * m3, at(j, "row", i));
      var_h_[i] = swiglu_noise(j, i, var_g, var_u, cov);
    }
    down_row(j);
  }

  // h = silu(clamp g) clamp u to second order in (dg, du) at the reference's g, u (docs/numerics.md
  // "Statistical leg"): the linear part a dg + b du, a = silu'(g) u', b = silu(g'); the quadratic
  // part s1 dg du + s2 dg^2, s1 = silu'(g), s2 = silu''(g) u' / 2 (near g, u ~ 0 it is as large as
  // the linear part). With (dg, du) Gaussian: E[dh^2] = var(linear) + var(quadratic) +
  // E[quadratic]^2. A clamped side contributes nothing, unless its value lies within 6 sigma of the
  // limit: then the unclamped derivatives (the larger) are used. The quadratic part is not Gaussian
  // (a product of two Gaussians has exponential tails), so the per-value limit is the linear part's
  // 6 sigma plus the quadratic part at 6 sigma of each of dg and du: 36 (|s1| sg su + |s2| sg^2).
  double swiglu_noise(int64_t j, int64_t i, double var_g, double var_u, double cov) {
    const int64_t q = j * c_.inter + i;
    const double L = shared_ ? c_.shared_swiglu_limit() : c_.swiglu_limit;
    const double g = rt_.gate[q], u = rt_.up[q];
    const bool g_clamped = L > 0 && g > L + 6.0 * std::sqrt(var_g);
    const bool u_clamped = L > 0 && std::fabs(u) > L + 6.0 * std::sqrt(var_u);
    const double gc = L > 0 ? std::min(g, L) : g, uc = L > 0 ? std::clamp(u, -L, L) : u;
    const double sg = logistic(gc);
    const double d1 = sg * (1.0 + gc * (1.0 - sg));                     // silu'
    const double d2 = sg * (1.0 - sg) * (2.0 + gc * (1.0 - 2.0 * sg));  // silu''
    const double a = g_clamped ? 0.0 : d1 * uc, b = u_clamped ? 0.0 : gc * sg;
    const double s1 = g_clamped || u_clamped ? 0.0 : d1, s2 = g_clamped ? 0.0 : 0.5 * d2 * uc;
    const double lin = a * a * var_g + b * b * var_u + 2.0 * a * b * cov;
    const double quad = s1 * s1 * (var_g * var_u + cov * cov) + 2.0 * s2 * s2 * var_g * var_g +
                        4.0 * s1 * s2 * var_g * cov;
    const double mean = s1 * cov + s2 * var_g;
    const double var = std::max(0.0, lin + quad + mean * mean);
    const double sdg = std::sqrt(var_g), sdu = std::sqrt(var_u);
    const double limit = 6.0 * std::sqrt(std::max(0.0, lin)) +
                         36.0 * (std::fabs(s1) * sdg * sdu + std::fabs(s2) * var_g);
    const double h = rt_.h[q];
    stat_.see_z(stage(ExpertField::kH), e_.h[q], h, std::sqrt(var),
                bounds_detail::swiglu_own_bound(h, uc), at(j, "col", i), limit);
    return var;
  }

  // down = w2 . h': the propagated h noise through the squared weights, plus the noise of the
  // implementation's own quantisation of h (q8_1, or bf16 for the dense shared expert).
  void down_row(int64_t j) {
    const int64_t dim = c_.dim, inter = c_.inter;
    const float* h = e_.h.data() + j * inter;
    const BlockQ8_1* hq = dense_ ? nullptr : e_.h_q8.data() + j * inter / kQK8_1;
    const int64_t depth = dense_ ? 8 * ((inter + 255) / 256) + 5 : mmvq_depth(inter / kQK8_1);
    for (int64_t r = 0; r < dim; ++r) {
      dequantize_row(w2_.type, w2_.row(r), r1_.data(), inter);
      double var = 0, mag = 0;
      for (int64_t k = 0; k < inter; ++k) {
        const double wk = r1_[k];
        const double hin = dense_ ? round_bf16(h[k]) : h[k];
        var += wk * wk * (var_h_[k] + (dense_ ? stat_noise::bf16_round_variance(h[k]) : 0.0));
        mag += std::fabs(wk * hin);
      }
      if (!dense_) var += stat_noise::q8_dot_variance(r1_.data(), hq, h, inter);
      const int64_t q = j * dim + r;
      out_.down_var[q] = var;
      stat_.see_z(stage(ExpertField::kDown), e_.down[q], out_.down_ref[q], std::sqrt(var),
                  (gamma_f32(depth) + gamma_f64(inter)) * mag, at(j, "row", r));
    }
  }

  const MoeConfig& c_;
  const MatView &w1_, &w3_, &w2_;
  const ExpertTaps& e_;
  const ExpertTaps& rt_;
  const std::vector<BlockQ8_1>& x_q8_;
  const std::vector<float>& xf_;
  bool shared_;
  Checker& stat_;
  ExpertDiff& out_;
  bool dense_;
  std::string who_;
  std::vector<float> r1_, r3_;  // dequantised rows
  std::vector<double> var_h_;   // [inter] the current token row's predicted h variance
};

}  // namespace

void check_expert_noise(const MoeConfig& c, const MatView& w1, const MatView& w3, const MatView& w2,
                        const ExpertTaps& e, const ExpertTaps& rt,
                        const std::vector<BlockQ8_1>& x_q8, const std::vector<float>& xf,
                        bool shared, Checker& stat, ExpertDiff& out) {
  ExpertNoise(c, w1, w3, w2, e, rt, x_q8, xf, shared, stat, out).run();
}

}  // namespace moecheck::bounds_detail
