// Test helpers for the reference's tests: one MoE layer built in memory from seeded f32 matrices
// (Q2_K / Q3_K through the reference quantisers, bf16 router and shared expert), owned buffers
// plus a LayerWeights view, and the error-analysis constants. Header-only, test code only; the
// layers are small (dim 512) and controlled (gate/up scale to reach the clamps), which the
// synthetic-model generator (golden/generator.h) does not offer.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/config.h"
#include "core/kquant.h"
#include "core/layer_weights.h"
#include "core/numfmt.h"
#include "reference/moe.h"

namespace moecheck::reftest {

constexpr double kU = 0x1p-24;      // f32 unit roundoff
constexpr double kB = 0x1p-8;       // bf16 unit roundoff (8-bit significand)
constexpr double kEtaB = 0x1p-134;  // half the smallest bf16 subnormal
constexpr double kEtaF = 0x1p-150;  // half the smallest f32 subnormal
inline double gam(double n) { return n * kU / (1 - n * kU); }

// ---- A layer built in memory from seeded f32 matrices (owned buffers + a LayerWeights view).
inline std::vector<uint8_t> encode(GgmlType t, const std::vector<float>& m, int64_t rows,
                                   int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes(t, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = m.data() + r * cols;
    uint8_t* dst = out.data() + r * row_bytes(t, cols);
    if (t == GgmlType::kQ2K) quantize_row_q2_K_ref(src, reinterpret_cast<BlockQ2K*>(dst), cols);
    else if (t == GgmlType::kQ3K)
      quantize_row_q3_K_ref(src, reinterpret_cast<BlockQ3K*>(dst), cols);
    else if (t == GgmlType::kF32) std::memcpy(dst, src, sizeof(float) * cols);
    else
      for (int64_t k = 0; k < cols; ++k) {
        const uint16_t h = f32_to_bf16(src[k]);
        std::memcpy(dst + 2 * k, &h, 2);
      }
  }
  return out;
}

struct OwnedLayer {
  MoeConfig c;
  int layer = 1;
  GgmlType exp_gu = GgmlType::kQ2K, exp_down = GgmlType::kQ3K;
  GgmlType shared = GgmlType::kBF16, shared_down = GgmlType::kBF16;
  std::vector<uint16_t> router;
  std::vector<float> bias;
  std::vector<uint8_t> gate, up, down, sgate, sup, sdown;

  LayerWeights view() const {
    LayerWeights w;
    w.layer = layer;
    w.config = c;
    w.router = router.data();
    w.bias = bias.data();
    w.gate_exps = ExpertStackView{exp_gu, c.inter, c.dim, c.n_routed, gate.data()};
    w.up_exps = ExpertStackView{exp_gu, c.inter, c.dim, c.n_routed, up.data()};
    w.down_exps = ExpertStackView{exp_down, c.dim, c.inter, c.n_routed, down.data()};
    w.shared_gate = MatView{shared, c.inter, c.dim, sgate.data()};
    w.shared_up = MatView{shared, c.inter, c.dim, sup.data()};
    w.shared_down = MatView{shared_down, c.dim, c.inter, sdown.data()};
    return w;
  }
};

// N(0, sigma) matrices: router sigma 1/sqrt(dim) (logits ~ N(0, 1) for x ~ N(0, 1)), gate/up
// gu_scale/sqrt(dim) (large enough that swiglu_limit clamps some values), down 1/sqrt(inter).
inline OwnedLayer random_layer(const MoeConfig& c, uint32_t seed, float gu_scale, GgmlType shared) {
  std::mt19937 rng(seed);
  auto mat = [&](int64_t n, double sigma) {
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sigma));
    std::vector<float> m(static_cast<size_t>(n));
    for (float& v : m) v = nd(rng);
    return m;
  };
  OwnedLayer L;
  L.c = c;
  const int64_t D = c.dim, I = c.inter, E = c.n_routed;
  const auto r = mat(E * D, 1.0 / std::sqrt(double(D)));
  for (float v : r) L.router.push_back(f32_to_bf16(v));
  L.bias = mat(E, 0.05);
  const double sgu = gu_scale / std::sqrt(double(D)), sd = 1.0 / std::sqrt(double(I));
  L.gate = encode(L.exp_gu, mat(E * I * D, sgu), E * I, D);
  L.up = encode(L.exp_gu, mat(E * I * D, sgu), E * I, D);
  L.down = encode(L.exp_down, mat(E * D * I, sd), E * D, I);
  const GgmlType sgt = shared == GgmlType::kBF16 ? shared : GgmlType::kQ2K;
  const GgmlType sdt = shared == GgmlType::kBF16 ? shared : GgmlType::kQ3K;
  L.shared = sgt;
  L.shared_down = sdt;
  L.sgate = encode(sgt, mat(I * D, sgu), I, D);
  L.sup = encode(sgt, mat(I * D, sgu), I, D);
  L.sdown = encode(sdt, mat(D * I, sd), D, I);
  return L;
}

inline std::vector<uint16_t> random_x(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  return x;
}

inline MoeConfig small_config(ScoreFunc f) {
  MoeConfig c;
  c.dim = 512;
  c.inter = 256;
  c.n_routed = 16;
  c.topk = 4;
  c.score_func = f;
  c.route_scale = 1.5f;
  c.swiglu_limit = 4.0f;
  return c;
}

}  // namespace moecheck::reftest
