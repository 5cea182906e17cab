// MoeConfig validation and the named score functions.
#include "core/config.h"

#include <cmath>

#include "core/error.h"

namespace moecheck {

std::string to_string(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::kSqrtSoftplus: return "sqrtsoftplus";
    case ScoreFunc::kSigmoid: return "sigmoid";
    case ScoreFunc::kSoftmax: return "softmax";
  }
  return "?";
}

ScoreFunc parse_score_func(const std::string& name, const std::string& where) {
  if (name == "sqrtsoftplus") return ScoreFunc::kSqrtSoftplus;
  if (name == "sigmoid") return ScoreFunc::kSigmoid;
  if (name == "softmax") return ScoreFunc::kSoftmax;
  throw InputError(where +
                   ": score_func must be \"sqrtsoftplus\", \"sigmoid\" or \"softmax\", found \"" +
                   name + "\"");
}

void MoeConfig::validate(const std::string& where) const {
  auto fail = [&](const std::string& field, const std::string& msg) {
    throw InputError(where + ": config field " + field + ": " + msg);
  };
  if (dim <= 0 || dim % 256 != 0)
    fail("dim",
         "must be a positive multiple of 256 (K-quant super-blocks), found " + std::to_string(dim));
  if (inter <= 0 || inter % 256 != 0)
    fail("inter", "must be a positive multiple of 256 (K-quant super-blocks), found " +
                      std::to_string(inter));
  if (n_routed <= 0) fail("n_routed", "must be positive, found " + std::to_string(n_routed));
  if (topk <= 0 || topk > n_routed)
    fail("topk", "must be in [1, n_routed=" + std::to_string(n_routed) + "], found " +
                     std::to_string(topk));
  if (n_shared != 1)
    fail("n_shared",
         "model.py asserts exactly one shared expert, found " + std::to_string(n_shared));
  if (!std::isfinite(gate_temp) || gate_temp <= 0.0f)
    fail("gate_temp", "must be finite and positive");
  if (!std::isfinite(route_scale)) fail("route_scale", "must be finite");
  if (!std::isfinite(swiglu_limit)) fail("swiglu_limit", "must be finite");
  if (swiglu_limit_shared && !std::isfinite(*swiglu_limit_shared))
    fail("swiglu_limit_shared", "must be finite");
}

MoeConfig ds41_config() {
  MoeConfig c;
  c.dim = 5120;
  c.inter = 2304;
  c.n_routed = 384;
  c.topk = 6;
  c.n_shared = 1;
  c.score_func = ScoreFunc::kSqrtSoftplus;
  c.route_scale = 1.5f;
  c.swiglu_limit = 10.0f;
  c.gate_temp = 1.0f;
  c.norm_topk_prob = true;
  return c;
}

}  // namespace moecheck
