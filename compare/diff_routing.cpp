// Routing of two dumps compared as pick sets per token, each flip with its key (or logit)
// margin on both sides' own logits. Contract: docs/cli.md "diff" (routing).
#include <algorithm>
#include <iterator>
#include <limits>
#include <set>

#include "compare/diff_layer.h"
#include "core/error.h"
#include "core/routing.h"

namespace moecheck::diff_detail {
namespace {

std::set<int32_t> pick_set(const std::vector<int32_t>& ids, int64_t t, int64_t k) {
  return std::set<int32_t>(ids.begin() + t * k, ids.begin() + (t + 1) * k);
}

// k-th key minus (k+1)-th key of one token, keys sorted descending with ties to the lower id;
// rb: the side's biases with its own image mask (nullptr: raw logits).
double token_margin(const float* logits, int64_t t, const MoeConfig& c, const RouteBias* rb,
                    int layer) {
  const int64_t n = c.n_routed, k = c.topk;
  if (k >= n) return std::numeric_limits<double>::infinity();
  std::vector<float> keys(static_cast<size_t>(n));
  if (rb != nullptr) {
    try {
      const RouteBias one = rb->from(t);
      const float* bias = one.of(0);
      const Routing r = route_from_logits(logits + t * n, 1, one, c, layer);
      for (int64_t e = 0; e < n; ++e) keys[e] = r.scores[e] + bias[e];
    } catch (const InputError&) {
      return std::numeric_limits<double>::quiet_NaN();
    }
  } else {
    for (int64_t e = 0; e < n; ++e) keys[e] = logits[t * n + e];
  }
  std::sort(keys.begin(), keys.end(), [](float x, float y) { return x > y; });
  return static_cast<double>(keys[k - 1]) - static_cast<double>(keys[k]);
}

// The layer's biases with one side's image mask (none recorded: every token routes with bias).
RouteBias side_bias(const RouteBias& rb, const LayerTaps& t) {
  return RouteBias{rb.bias, rb.bias_vl, t.image_mask.empty() ? nullptr : t.image_mask.data()};
}

}  // namespace

RoutingDiff diff_routing(const LayerTaps& a, const LayerTaps& b, const MoeConfig& c,
                         const RouteBias* bias, std::vector<bool>& agree) {
  RoutingDiff r;
  r.margin_kind = bias != nullptr ? "key (score + bias)" : "logit";
  const int64_t T = a.tokens, k = c.topk;
  r.hist_a.assign(static_cast<size_t>(c.n_routed), 0);
  r.hist_b.assign(static_cast<size_t>(c.n_routed), 0);
  agree.assign(static_cast<size_t>(T), true);
  const RouteBias bias_a = bias ? side_bias(*bias, a) : RouteBias{};
  const RouteBias bias_b = bias ? side_bias(*bias, b) : RouteBias{};
  for (int64_t t = 0; t < T; ++t) {
    const auto sa = pick_set(a.topk_ids, t, k), sb = pick_set(b.topk_ids, t, k);
    for (int32_t e : sa) ++r.hist_a[e];
    for (int32_t e : sb) ++r.hist_b[e];
    if (sa == sb) continue;
    agree[t] = false;
    ++r.tokens_differ;
    RoutingFlip f;
    f.token = t;
    std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(f.only_a));
    std::set_difference(sb.begin(), sb.end(), sa.begin(), sa.end(), std::back_inserter(f.only_b));
    f.margin_a = token_margin(a.router_logits.data(), t, c, bias ? &bias_a : nullptr, a.layer);
    f.margin_b = token_margin(b.router_logits.data(), t, c, bias ? &bias_b : nullptr, b.layer);
    r.flips += static_cast<int64_t>(f.only_a.size());
    r.flip_list.push_back(std::move(f));
  }
  return r;
}

}  // namespace moecheck::diff_detail
