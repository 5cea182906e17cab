// The Eigen reference of one MoE layer (moecheck::ref): model.py's Gate, Expert and MoE, step by
// step, on the exactly dequantised GGUF weights. Two precisions: kModel keeps model.py's dtypes
// and rounding points (bf16 Linear outputs, f32 routing and accumulation); kExact computes the
// same formula in f64 with no intermediate rounding. Contract: docs/reference.md (every rounding
// point with the model.py line it mirrors, and the derived Model-vs-Exact bound).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/layer_weights.h"
#include "core/routing.h"
#include "core/taps.h"

namespace moecheck::ref {

enum class Precision { kModel, kExact };

// route_from_logits (core/routing.h) with f64 scores: the same rule (scores from
// logit / gate_temp, keys score + the token's bias (bias_vl for image-span tokens, RouteBias),
// stable ties to the lower id, NaN key an InputError, +1e-20, route_scale), every operation in
// double. softplus is log1p(exp(z)) with no threshold.
struct ExactRouting {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int32_t> ids;     // [tokens, topk] descending key order
  std::vector<double> weights;  // [tokens, topk]
  std::vector<double> scores;   // [tokens, n_routed]
};
ExactRouting route_from_logits_exact(const double* logits, int64_t tokens, const RouteBias& bias,
                                     const MoeConfig& c, int layer);
// Every token with `bias` (no image mask).
inline ExactRouting route_from_logits_exact(const double* logits, int64_t tokens, const float* bias,
                                            const MoeConfig& c, int layer) {
  return route_from_logits_exact(logits, tokens, RouteBias{bias}, c, layer);
}

// f64 to bf16 with one rounding (nearest, ties to even; NaN quieted, overflow to Inf): the
// final `type_as(x)` of an exact result, without the double rounding of f64 -> f32 -> bf16.
uint16_t f64_to_bf16(double v);

// model.py Gate: router logits `linear(x.float(), self.weight.float())` and the selection, with
// `torch.where(image_mask, bias_vl, bias)` as the bias when a mask and bias_vl are given.
class Gate {
 public:
  explicit Gate(const LayerWeights& w) : w_(w) {}
  // [T, n_routed] raw dot products (before / gate_temp). f32 in Eigen's GEMV order; f64.
  std::vector<float> logits(const uint16_t* x_bf16, int64_t T) const;
  std::vector<double> logits_exact(const uint16_t* x_bf16, int64_t T) const;
  // image_mask [T] (nullable): nonzero tokens select with w.bias_vl when the layer has one.
  Routing forward(const uint16_t* x_bf16, int64_t T, const uint8_t* image_mask = nullptr) const;
  ExactRouting forward_exact(const uint16_t* x_bf16, int64_t T,
                             const uint8_t* image_mask = nullptr) const;

 private:
  const LayerWeights& w_;
};

// model.py Expert: w2(silu(clamp(w1 x)) * clamp(w3 x) [* weights]). The weights of a view are
// dequantised (exactly, core/kquant.h) a few rows at a time while the Linear runs, so an
// expert never exists as a whole f32 matrix.
class Expert {
 public:
  Expert(MatView w1, MatView w3, MatView w2, float swiglu_limit)
      : w1_(w1), w3_(w3), w2_(w2), limit_(swiglu_limit) {}
  // x: [n, dim] bf16 values as f32; weights: [n] or nullptr (shared expert). Returns [n, dim], each
  // value bf16-representable (model.py Linear's bf16 output). Fills taps' gate/up/h/down if asked.
  std::vector<float> forward(const float* x, int64_t n, const float* weights,
                             ExpertTaps* taps) const;
  // The same formula in f64, no rounding; taps get the values rounded to f32.
  std::vector<double> forward_exact(const double* x, int64_t n, const double* weights,
                                    ExpertTaps* taps) const;

 private:
  MatView w1_, w3_, w2_;
  float limit_;
};

// model.py MoE. Checks the weights' shapes against the config at construction (InputError naming
// the layer and tensor). `w` must outlive the MoE.
class MoE {
 public:
  MoE(const LayerWeights& w, Precision p);
  Precision precision() const { return p_; }
  // x [T, dim] bf16 -> y [T, dim] bf16. kExact rounds the exact result to bf16 once.
  // image_mask [T] (nullable; model.py MoE.forward's image_mask): nonzero tokens select their
  // experts with bias_vl when the layer has one (model.py ignores the mask otherwise); the taps
  // record a copy of it.
  std::vector<uint16_t> forward(const uint16_t* x_bf16, int64_t T, LayerTaps* taps = nullptr,
                                const uint8_t* image_mask = nullptr) const;
  // The result before `type_as(x)`: kExact the unrounded f64 sum; kModel the f32 accumulator.
  std::vector<double> forward_exact(const uint16_t* x_bf16, int64_t T, LayerTaps* taps = nullptr,
                                    const uint8_t* image_mask = nullptr) const;

 private:
  std::vector<double> forward_model(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                    const uint8_t* image_mask) const;
  std::vector<double> forward_f64(const uint16_t* x_bf16, int64_t T, LayerTaps* taps,
                                  const uint8_t* image_mask) const;
  // y.type_as(x): the layer's output rounded to bf16 (once, in Exact mode).
  std::vector<uint16_t> to_bf16(const std::vector<double>& y) const;
  Expert routed(int64_t e) const;
  Expert shared() const;

  const LayerWeights& w_;
  Precision p_;
};

}  // namespace moecheck::ref
