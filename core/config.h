// The MoE layer's configuration: model.py's ModelArgs fields that Gate, Expert and MoE read,
// with the seeds' defaults. Numerics flags are enums (house style).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moecheck {

enum class ScoreFunc { kSqrtSoftplus, kSigmoid, kSoftmax };

// "sqrtsoftplus", "sigmoid", "softmax" (model.py's score_func strings).
std::string to_string(ScoreFunc f);
// Throws InputError naming `where` for an unknown name.
ScoreFunc parse_score_func(const std::string& name, const std::string& where);

struct MoeConfig {
  int64_t dim = 0;       // model.py dim
  int64_t inter = 0;     // moe_inter_dim
  int64_t n_routed = 0;  // n_routed_experts
  int64_t topk = 0;      // n_activated_experts
  int64_t n_shared = 1;  // n_shared_experts (model.py asserts 1)
  ScoreFunc score_func = ScoreFunc::kSqrtSoftplus;
  float route_scale = 1.0f;   // route_scale
  float swiglu_limit = 0.0f;  // swiglu_limit; no clamp when <= 0
  // The shared expert's clamp when it differs from the routed experts' (model.py builds both
  // Experts with swiglu_limit; files of the deepseek4 / deepseek41 conventions carry one per layer
  // for each, docs/gguf.md "Conventions"). Absent: the shared expert uses swiglu_limit.
  std::optional<float> swiglu_limit_shared;
  float gate_temp = 1.0f;  // gate_temp (1 when absent)
  bool norm_topk_prob = true;

  // Throws InputError naming `where` (a file, a preset) and the field when the config cannot
  // work: sizes not positive, dim or inter not a multiple of 256, topk > n_routed,
  // n_shared != 1, gate_temp not finite and positive, route_scale or a swiglu limit not finite.
  void validate(const std::string& where) const;

  // The shared expert's clamp: swiglu_limit_shared when set, else swiglu_limit.
  float shared_swiglu_limit() const { return swiglu_limit_shared.value_or(swiglu_limit); }

  bool operator==(const MoeConfig&) const = default;
};

// The seeds' config.json: dim 5120, inter 2304, 384 experts, top 6, route_scale 1.5,
// swiglu_limit 10, sqrtsoftplus.
MoeConfig ds41_config();

}  // namespace moecheck
