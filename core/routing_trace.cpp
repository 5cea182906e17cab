// Routing traces and the prefetch ranking (core/routing_trace.h).
#include "core/routing_trace.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace moecheck {

void RoutingTrace::validate(const std::string& where) const {
  auto bad = [&](const std::string& what) { throw InputError(where + ": " + what); };
  if (n_routed < 1 || n_routed > (int64_t{1} << 20))
    bad("n_routed must be in [1, 2^20], found " + std::to_string(n_routed));
  if (topk < 1 || topk > n_routed)
    bad("topk must be in [1, n_routed = " + std::to_string(n_routed) + "], found " +
        std::to_string(topk));
  if (tokens < 1 || tokens > (int64_t{1} << 24))
    bad("tokens must be in [1, 2^24], found " + std::to_string(tokens));
  const size_t P = static_cast<size_t>(tokens * topk);
  for (size_t i = 0; i < layers.size(); ++i) {
    const TraceLayer& l = layers[i];
    const std::string at =
        "layers[" + std::to_string(i) + "] (layer " + std::to_string(l.layer) + ")";
    if (l.layer < 0) bad(at + ": negative layer id");
    auto ids = [&](const std::vector<int32_t>& v, const char* field) {
      if (v.size() != P)
        bad(at + " " + field + ": expected tokens x topk = " + std::to_string(P) + " ids, found " +
            std::to_string(v.size()));
      for (int64_t t = 0; t < tokens; ++t) {
        std::set<int32_t> seen;
        for (int64_t j = 0; j < topk; ++j) {
          const int32_t e = v[static_cast<size_t>(t * topk + j)];
          if (e < 0 || e >= n_routed)
            bad(at + " " + field + " token " + std::to_string(t) + ": expert " + std::to_string(e) +
                " outside [0, " + std::to_string(n_routed) + ")");
          if (!seen.insert(e).second)
            bad(at + " " + field + " token " + std::to_string(t) + ": expert " + std::to_string(e) +
                " picked twice");
        }
      }
    };
    ids(l.picks, "picks");
    if (!l.predicted.empty()) ids(l.predicted, "predicted");
  }
}

const char* replay_order_name(ReplayOrder o) {
  return o == ReplayOrder::kBatch ? "batch" : "decode";
}

ReplayOrder parse_replay_order(const std::string& s, const std::string& where) {
  if (s == "batch") return ReplayOrder::kBatch;
  if (s == "decode") return ReplayOrder::kDecode;
  throw InputError(where + ": expected \"batch\" or \"decode\", found \"" + s + "\"");
}

std::vector<int32_t> prefetch_order(const std::vector<int32_t>& predicted, int64_t tokens,
                                    int64_t topk) {
  struct Rank {
    int64_t count = 0;
    int64_t best = 0;
  };
  std::map<int32_t, Rank> r;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t e = predicted[static_cast<size_t>(t * topk + j)];
      auto [it, fresh] = r.try_emplace(e, Rank{0, j});
      ++it->second.count;
      it->second.best = std::min(it->second.best, j);
    }
  std::vector<int32_t> out;
  out.reserve(r.size());
  for (const auto& kv : r) out.push_back(kv.first);
  std::stable_sort(out.begin(), out.end(), [&r](int32_t a, int32_t b) {
    const Rank &x = r.at(a), &y = r.at(b);
    if (x.count != y.count) return x.count > y.count;
    if (x.best != y.best) return x.best < y.best;
    return a < b;
  });
  return out;
}

namespace {

std::vector<ExpertKey> distinct_keys(int32_t layer, const int32_t* picks, int64_t n) {
  std::vector<int32_t> e(picks, picks + n);
  std::sort(e.begin(), e.end());
  e.erase(std::unique(e.begin(), e.end()), e.end());
  std::vector<ExpertKey> k;
  k.reserve(e.size());
  for (int32_t x : e) k.push_back(ExpertKey{layer, x});
  return k;
}

}  // namespace

std::vector<TraceForward> trace_forwards(const RoutingTrace& t, ReplayOrder order) {
  std::vector<TraceForward> out;
  const int64_t K = t.topk, T = t.tokens;
  // (layer index, token or -1 for the whole batch) of each forward, in replay order.
  std::vector<std::pair<size_t, int64_t>> seq;
  if (order == ReplayOrder::kBatch) {
    for (size_t i = 0; i < t.layers.size(); ++i) seq.emplace_back(i, -1);
  } else {
    for (int64_t tok = 0; tok < T; ++tok)
      for (size_t i = 0; i < t.layers.size(); ++i) seq.emplace_back(i, tok);
  }
  for (size_t f = 0; f < seq.size(); ++f) {
    const auto [i, tok] = seq[f];
    const TraceLayer& l = t.layers[i];
    TraceForward fw;
    fw.keys = tok < 0 ? distinct_keys(l.layer, l.picks.data(), T * K)
                      : distinct_keys(l.layer, l.picks.data() + tok * K, K);
    if (f + 1 < seq.size()) {
      const auto [ni, ntok] = seq[f + 1];
      const TraceLayer& nl = t.layers[ni];
      // A prediction is made from the previous layer's input of the same tokens: the next
      // forward's layer must follow this one in the run (not the wrap to the next token).
      if (!nl.predicted.empty() && ni == i + 1) {
        fw.next_layer = nl.layer;
        if (ntok < 0) {
          fw.predicted_next = prefetch_order(nl.predicted, T, K);
        } else {
          const std::vector<int32_t> one(nl.predicted.begin() + ntok * K,
                                         nl.predicted.begin() + (ntok + 1) * K);
          fw.predicted_next = prefetch_order(one, 1, K);
        }
      }
    }
    out.push_back(std::move(fw));
  }
  return out;
}

}  // namespace moecheck
