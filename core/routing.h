// Routing from f32 router logits, used by every implementation: the seeds' route_from_logits.
// Scores score_func(logit / gate_temp) with the project's own score functions (core/score_math.h:
// the same bits on every libm and on the device), picks in descending score + bias order (stable:
// ties to the lower expert id; the bias is bias_vl for image-span tokens), weights the unbiased
// scores, renormalised (+1e-20) when norm_topk_prob and topk > 1, times route_scale. A NaN key is
// an InputError naming the layer, token and expert. Contract: docs/numerics.md "Score functions"
// and "route_select".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace moecheck {

// Where an implementation runs the top-k selection: on the host from downloaded logits
// (route_from_logits), or on the device (the CUDA layer's route_select). A typed option of
// cuda::LayerOptions and the `--route host|device` flag of `run` and `check`.
enum class RoutePlace { kHost, kDevice };
// "host" / "device"; the inverse throws InputError naming `where` and the accepted values.
const char* route_place_name(RoutePlace r);
RoutePlace parse_route_place(const std::string& s, const std::string& where);

struct Routing {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int32_t> ids;    // [tokens, topk], each token's picks in descending key order
  std::vector<float> weights;  // [tokens, topk], matching ids
  std::vector<float> scores;   // [tokens, n_routed], score_func(logits) (f32)
};

// The selection bias of each token (model.py Gate.forward: `torch.where(image_mask, bias_vl,
// bias)` when both an image mask and bias_vl exist, else bias for every token).
struct RouteBias {
  const float* bias = nullptr;          // f32 [n_routed]
  const float* bias_vl = nullptr;       // f32 [n_routed], or nullptr (no vision bias)
  const uint8_t* image_mask = nullptr;  // [tokens] nonzero = inside an image span, or nullptr

  // The bias token t selects with.
  const float* of(int64_t t) const {
    return bias_vl != nullptr && image_mask != nullptr && image_mask[t] != 0 ? bias_vl : bias;
  }
  // The same biases for tokens first, first + 1, ... (a slice of the mask).
  RouteBias from(int64_t first) const {
    return {bias, bias_vl, image_mask != nullptr ? image_mask + first : nullptr};
  }
};

// score_func(logit / gate_temp) of one f32 logit (kSqrtSoftplus, kSigmoid) as route_from_logits
// computes it; softmax scores need the whole row (softmax_scores).
float score_one(float logit, const MoeConfig& c);
// Softmax scores of one token's row, in place: max-subtracted pexp, summed in id order.
void softmax_scores(float* scores, int64_t n);

// One token's selection from its logits z [n_routed] with its bias: scores s [n_routed], picks
// ids [topk] and weights w [topk]. Returns -1, or the expert the NaN rule names (the first whose
// logit or bias is NaN, else the first NaN key; ids and w are then unset). The one rule that
// route_from_logits, emu::route_select and the device's route_select implement.
int64_t route_token(const float* z, const float* bias, const MoeConfig& c, float* s, int32_t* ids,
                    float* w);

// logits [tokens, n_routed] f32, the router's raw dot products.
Routing route_from_logits(const float* logits, int64_t tokens, const RouteBias& bias,
                          const MoeConfig& c, int layer);
// Every token with `bias` (no image mask).
inline Routing route_from_logits(const float* logits, int64_t tokens, const float* bias,
                                 const MoeConfig& c, int layer) {
  return route_from_logits(logits, tokens, RouteBias{bias}, c, layer);
}

}  // namespace moecheck
