// Routing from f32 router logits, used by every implementation: the seeds' route_from_logits.
// Scores score_func(logit / gate_temp) as the seeds compute them, picks in descending score + bias
// order (stable: ties to the lower expert id), weights the unbiased scores, renormalised (+1e-20)
// when norm_topk_prob and topk > 1, times route_scale. A NaN key is an InputError naming the layer,
// token and expert.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"

namespace moecheck {

struct Routing {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int32_t> ids;    // [tokens, topk], each token's picks in descending key order
  std::vector<float> weights;  // [tokens, topk], matching ids
  std::vector<float> scores;   // [tokens, n_routed], score_func(logits) (f32)
};

// logits [tokens, n_routed] f32, the router's raw dot products; bias [n_routed] f32.
Routing route_from_logits(const float* logits, int64_t tokens, const float* bias,
                          const MoeConfig& c, int layer);

}  // namespace moecheck
