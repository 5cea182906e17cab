// Host routing from f32 router logits: the seeds' route_from_logits (seed 001) and model.py
// Gate.forward, in f32 with the project's score functions (core/score_math.h: no libm call).
// Contract: core/routing.h, docs/reference.md "Routing" and docs/numerics.md "Score functions".
// Every host implementation routes through this one function, so they never disagree on a pick
// for the same logits; the device's route_select (cuda/route_select.cu) computes the same bits.
#include "core/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/fp_ops.h"
#include "core/portable_math.h"
#include "core/score_math.h"

namespace moecheck {
namespace {

std::string fmt_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// scores[e] = score_func(logits[e] / gate_temp) for one token (model.py Gate.forward lines
// `scores = linear(...) / self.gate_temp` and the score_func branch).
void score_token(const float* logits, int64_t n, const MoeConfig& c, float* scores) {
  if (c.score_func == ScoreFunc::kSoftmax) {
    for (int64_t e = 0; e < n; ++e) scores[e] = div_rn(logits[e], c.gate_temp);
    softmax_scores(scores, n);
    return;
  }
  for (int64_t e = 0; e < n; ++e) scores[e] = score_one(logits[e], c);
}

}  // namespace

const char* route_place_name(RoutePlace r) { return r == RoutePlace::kDevice ? "device" : "host"; }

RoutePlace parse_route_place(const std::string& s, const std::string& where) {
  if (s == "host") return RoutePlace::kHost;
  if (s == "device") return RoutePlace::kDevice;
  throw InputError(where + ": route must be host or device, found \"" + s + "\"");
}

float score_one(float logit, const MoeConfig& c) {
  const float z = div_rn(logit, c.gate_temp);
  return c.score_func == ScoreFunc::kSigmoid ? psigmoid(z) : psqrt_softplus(z);
}

// scores.softmax(dim=-1): the row maximum (a NaN element is skipped by the comparison, as
// before), pexp(s - m), the sum in id order, each divided by the sum.
void softmax_scores(float* scores, int64_t n) {
  float m = scores[0];
  for (int64_t e = 1; e < n; ++e) m = scores[e] > m ? scores[e] : m;
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    scores[e] = pexp(sub_rn(scores[e], m));
    sum = add_rn(sum, scores[e]);
  }
  for (int64_t e = 0; e < n; ++e) scores[e] = div_rn(scores[e], sum);
}

int64_t route_token(const float* z, const float* bias, const MoeConfig& c, float* s, int32_t* ids,
                    float* w) {
  const int64_t n = c.n_routed, k = c.topk;
  score_token(z, n, c, s);
  // (scores + bias): the seeds' sort panics on any NaN comparison, so a NaN key anywhere is an
  // error, picked or not. Name the expert whose own logit or bias is NaN first (under softmax
  // one NaN logit spreads to every score), else the first NaN key (e.g. Inf + -Inf).
  std::vector<float> keys(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) keys[e] = add_rn(s[e], bias[e]);
  for (int64_t e = 0; e < n; ++e)
    if (std::isnan(z[e]) || std::isnan(bias[e])) return e;
  for (int64_t e = 0; e < n; ++e)
    if (std::isnan(keys[e])) return e;
  // .topk(self.topk): the k largest keys, descending; the seeds' stable sort sends exact ties
  // (+0 and -0 included) to the lower expert id.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
  });
  // weights = scores.gather(1, indices): the unbiased scores.
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    w[j] = s[order[j]];
  }
  // weights /= weights.sum(dim=-1, keepdim=True) + 1e-20, the sum in pick order.
  if (c.norm_topk_prob && k > 1) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = add_rn(sum, w[j]);
    sum = add_rn(sum, 1e-20f);
    for (int64_t j = 0; j < k; ++j) w[j] = div_rn(w[j], sum);
  }
  // weights *= self.route_scale
  for (int64_t j = 0; j < k; ++j) w[j] = mul_rn(w[j], c.route_scale);
  return -1;
}

Routing route_from_logits(const float* logits, int64_t tokens, const RouteBias& rb,
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
  for (int64_t t = 0; t < tokens; ++t) {
    const float* z = logits + t * n;
    const float* bias = rb.of(t);
    float* s = r.scores.data() + t * n;
    const int64_t bad =
        route_token(z, bias, c, s, r.ids.data() + t * k, r.weights.data() + t * k);
    if (bad >= 0)
      throw InputError(where + " token " + std::to_string(t) + " expert " + std::to_string(bad) +
                       ": routing key is NaN (logit " + fmt_float(z[bad]) + ", score " +
                       fmt_float(s[bad]) + ", bias " + fmt_float(bias[bad]) + ")");
  }
  return r;
}

}  // namespace moecheck
