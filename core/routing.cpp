// Host routing from f32 router logits: the seeds' route_from_logits (seed 001) and model.py
// Gate.forward, in f32 with the host's libm (expf, log1pf, sqrtf). Contract: core/routing.h
// and docs/reference.md "Routing". Every implementation routes through this one function, so
// the three never disagree on a pick for the same logits.
#include "core/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "core/error.h"

namespace moecheck {
namespace {

// torch.nn.functional.softplus with beta 1 and its default threshold 20: above it the input is
// returned as is (log1p(exp(z)) - z < 2.1e-9 there, below half an f32 ulp of z).
float softplus_f32(float z) { return z > 20.0f ? z : std::log1p(std::exp(z)); }

std::string fmt_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// scores[e] = score_func(logits[e] / gate_temp) for one token (model.py Gate.forward lines
// `scores = linear(...) / self.gate_temp` and the score_func branch).
void score_token(const float* logits, int64_t n, const MoeConfig& c, float* scores) {
  for (int64_t e = 0; e < n; ++e) scores[e] = logits[e] / c.gate_temp;
  switch (c.score_func) {
    case ScoreFunc::kSqrtSoftplus:  // F.softplus(scores).sqrt()
      for (int64_t e = 0; e < n; ++e) scores[e] = std::sqrt(softplus_f32(scores[e]));
      break;
    case ScoreFunc::kSigmoid:  // scores.sigmoid()
      for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-scores[e]));
      break;
    case ScoreFunc::kSoftmax: {  // scores.softmax(dim=-1): max-subtracted, summed in id order
      float m = scores[0];
      for (int64_t e = 1; e < n; ++e) m = std::max(m, scores[e]);
      float sum = 0.0f;
      for (int64_t e = 0; e < n; ++e) {
        scores[e] = std::exp(scores[e] - m);
        sum += scores[e];
      }
      for (int64_t e = 0; e < n; ++e) scores[e] /= sum;
      break;
    }
  }
}

}  // namespace

Routing route_from_logits(const float* logits, int64_t tokens, const float* bias,
                          const MoeConfig& c, int layer) {
  const int64_t n = c.n_routed;
  const int64_t k = c.topk;
  const std::string where = "layer " + std::to_string(layer);
  if (n <= 0) throw InputError(where + ": routing needs n_routed > 0, found " + std::to_string(n));
  if (k <= 0 || k > n)
    throw InputError(where + ": routing needs topk in [1, n_routed=" + std::to_string(n) +
                     "], found " + std::to_string(k));
  if (tokens < 0)
    throw InputError(where + ": routing token count is negative: " + std::to_string(tokens));

  Routing r;
  r.tokens = tokens;
  r.topk = k;
  r.ids.resize(static_cast<size_t>(tokens * k));
  r.weights.resize(static_cast<size_t>(tokens * k));
  r.scores.resize(static_cast<size_t>(tokens * n));
  std::vector<float> keys(static_cast<size_t>(n));
  std::vector<int32_t> order(static_cast<size_t>(n));

  for (int64_t t = 0; t < tokens; ++t) {
    const float* z = logits + t * n;
    float* s = r.scores.data() + t * n;
    score_token(z, n, c, s);
    // (scores + bias): the seeds' sort panics on any NaN comparison, so a NaN key anywhere is an
    // error, picked or not. Name the expert whose own logit or bias is NaN first (under softmax
    // one NaN logit spreads to every score), else the first NaN key (e.g. Inf + -Inf).
    for (int64_t e = 0; e < n; ++e) keys[e] = s[e] + bias[e];
    int64_t bad = -1;
    for (int64_t e = 0; e < n && bad < 0; ++e)
      if (std::isnan(z[e]) || std::isnan(bias[e])) bad = e;
    for (int64_t e = 0; e < n && bad < 0; ++e)
      if (std::isnan(keys[e])) bad = e;
    if (bad >= 0)
      throw InputError(where + " token " + std::to_string(t) + " expert " + std::to_string(bad) +
                       ": routing key is NaN (logit " + fmt_float(z[bad]) + ", score " +
                       fmt_float(s[bad]) + ", bias " + fmt_float(bias[bad]) + ")");

    // .topk(self.topk): the k largest keys, descending; the seeds' stable sort sends exact ties
    // (+0 and -0 included) to the lower expert id.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
    });
    int32_t* ids = r.ids.data() + t * k;
    float* w = r.weights.data() + t * k;
    // weights = scores.gather(1, indices): the unbiased scores.
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      w[j] = s[order[j]];
    }
    // weights /= weights.sum(dim=-1, keepdim=True) + 1e-20, the sum in pick order.
    if (c.norm_topk_prob && k > 1) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += w[j];
      sum += 1e-20f;
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
    }
    // weights *= self.route_scale
    for (int64_t j = 0; j < k; ++j) w[j] *= c.route_scale;
  }
  return r;
}

}  // namespace moecheck
