// The synthetic skewed routing trace (golden/synthetic_trace.h); docs/streaming.md "Cache
// simulation" spells out the same algorithm.
#include "golden/synthetic_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <utility>

#include "core/blocks.h"
#include "core/config.h"
#include "core/error.h"
#include "golden/generator.h"

namespace moecheck {
namespace {

// Stream tags (ASCII "perm", "pick", "pred"): stream_key(seed, layer, tag, token).
constexpr uint64_t kTagPerm = 0x7065726d, kTagPick = 0x7069636b, kTagPredict = 0x70726564;

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kSqrtHalf = 0.70710678118654752440;

// ln(x) for x >= 1: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (exact), ln m = 2 atanh(z) with
// z = (m - 1) / (m + 1), |z| <= 0.1716, by 14 terms of its series (the next below 1e-23).
double portable_ln(double x) {
  int e = 0;
  double m = std::frexp(x, &e);
  if (m < kSqrtHalf) {
    m *= 2;
    --e;
  }
  const double z = (m - 1) / (m + 1), z2 = z * z;
  double sum = 0, term = z;
  for (int k = 0; k < 14; ++k) {
    sum += term / (2 * k + 1);
    term *= z2;
  }
  return e * kLn2 + 2 * sum;
}

// exp(y) for y <= 0: y = k ln2 + r with k = floor(y / ln2 + 1/2), |r| <= ln2 / 2 (+ rounding),
// exp(r) by the degree-18 Taylor polynomial in Horner form, times 2^k (exact, ldexp).
double portable_exp(double y) {
  const double k = std::floor(y / kLn2 + 0.5);
  if (k < -1100) return 0.0;
  const double r = y - k * kLn2;
  double p = 1.0;
  for (int n = 18; n >= 1; --n) p = 1.0 + r / n * p;
  return std::ldexp(p, static_cast<int>(k));
}

// Uniform in [0, n) without bias: 64-bit draws at or above the largest multiple of n are redrawn.
uint64_t uniform_below(Rng& rng, uint64_t n) {
  const uint64_t rest = (~uint64_t{0} % n + 1) % n;  // 2^64 mod n
  for (;;) {
    const uint64_t x = rng.next();
    if (rest == 0 || x < 0 - rest) return x % n;
  }
}

// A rank drawn by weight among those not excluded: u = uniform() * (the remaining weights summed
// in rank order); the first remaining rank whose running sum (rank order) exceeds u, else the
// last remaining rank.
int64_t draw_rank(Rng& rng, const std::vector<double>& w, const std::vector<bool>& excluded) {
  double total = 0;
  for (size_t r = 0; r < w.size(); ++r)
    if (!excluded[r]) total += w[r];
  const double u = rng.uniform() * total;
  double acc = 0;
  int64_t last = -1;
  for (size_t r = 0; r < w.size(); ++r) {
    if (excluded[r]) continue;
    last = static_cast<int64_t>(r);
    acc += w[r];
    if (u < acc) return last;
  }
  return last;
}

}  // namespace

int64_t ds41_expert_bytes() {
  const MoeConfig c = ds41_config();
  return 2 * c.inter * row_bytes(GgmlType::kQ2K, c.dim) +
         c.dim * row_bytes(GgmlType::kQ3K, c.inter);
}

std::vector<double> zipf_weights(int64_t n, double s) {
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    w[static_cast<size_t>(r)] = portable_exp(-s * portable_ln(static_cast<double>(r + 1)));
  return w;
}

std::vector<int32_t> synthetic_ranking(uint64_t seed, int64_t layer, int64_t experts) {
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  Rng rng(stream_key(seed, static_cast<uint64_t>(layer), kTagPerm, 0));
  for (int64_t i = experts - 1; i > 0; --i)  // Fisher-Yates
    std::swap(perm[static_cast<size_t>(i)], perm[uniform_below(rng, static_cast<uint64_t>(i + 1))]);
  return perm;
}

TraceFile synthetic_trace(const SyntheticTraceSpec& s) {
  TraceFile f;
  RoutingTrace& t = f.trace;
  t.n_routed = s.experts;
  t.topk = s.topk;
  t.tokens = s.tokens;
  t.origin = "synthetic " + synthetic_spec_text(s);
  f.expert_bytes = s.expert_bytes < 0 ? ds41_expert_bytes() : s.expert_bytes;
  const std::vector<double> w = zipf_weights(s.experts, s.zipf);
  const size_t K = static_cast<size_t>(s.topk);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::vector<int32_t> perm = synthetic_ranking(s.seed, l, s.experts);
    TraceLayer tl;
    tl.layer = static_cast<int32_t>(l);
    for (int64_t tok = 0; tok < s.tokens; ++tok) {
      const uint64_t L = static_cast<uint64_t>(l), T = static_cast<uint64_t>(tok);
      Rng pick(stream_key(s.seed, L, kTagPick, T));
      std::vector<bool> excluded(w.size(), false);
      std::vector<int64_t> ranks;
      for (size_t j = 0; j < K; ++j) {
        ranks.push_back(draw_rank(pick, w, excluded));
        excluded[static_cast<size_t>(ranks.back())] = true;
        tl.picks.push_back(perm[static_cast<size_t>(ranks.back())]);
      }
      if (l == 0) continue;
      Rng pred(stream_key(s.seed, L, kTagPredict, T));
      for (size_t j = 0; j < K; ++j) {  // excluded: the token's picks, then each replacement
        if (pred.uniform() < s.predict) {
          tl.predicted.push_back(perm[static_cast<size_t>(ranks[j])]);
          continue;
        }
        const int64_t r = draw_rank(pred, w, excluded);
        excluded[static_cast<size_t>(r)] = true;
        tl.predicted.push_back(perm[static_cast<size_t>(r)]);
      }
    }
    t.layers.push_back(std::move(tl));
  }
  t.validate("--synthetic " + synthetic_spec_text(s));
  return f;
}

namespace {

[[noreturn]] void bad_spec(const std::string& where, const std::string& what) {
  throw InputError(where + ": " + what +
                   " (expected key=value pieces, e.g. "
                   "layers=40,tokens=64,experts=384,topk=6,zipf=1.0,predict=0.7,seed=1)");
}

uint64_t spec_uint(const std::string& where, const std::string& key, const std::string& v,
                   uint64_t lo, uint64_t hi) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE ||
      *end != '\0')
    bad_spec(where, key + "=" + v + ": not a whole number");
  if (x < lo || x > hi)
    bad_spec(where,
             key + "=" + v + ": expected " + std::to_string(lo) + " to " + std::to_string(hi));
  return x;
}

double spec_real(const std::string& where, const std::string& key, const std::string& v, double lo,
                 double hi) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) ||
      v.find_first_not_of("0123456789.eE+-") != std::string::npos)
    bad_spec(where, key + "=" + v + ": not a finite number");
  if (x < lo || x > hi)
    bad_spec(where, key + "=" + v + ": expected a number in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return x;
}

// The product of the sizes, saturating at 2^62.
uint64_t product(std::initializer_list<int64_t> v) {
  uint64_t p = 1;
  for (int64_t x : v) {
    const uint64_t u = static_cast<uint64_t>(x);
    p = p > (uint64_t{1} << 62) / u ? uint64_t{1} << 62 : p * u;
  }
  return p;
}

void check_spec(const SyntheticTraceSpec& s, const std::string& where) {
  if (s.topk > s.experts)
    bad_spec(where,
             "topk=" + std::to_string(s.topk) + ": more than experts=" + std::to_string(s.experts));
  if (s.predict < 1 && s.experts < 2 * s.topk)
    bad_spec(where, "predict=" + std::to_string(s.predict) +
                        " below 1 needs experts >= 2 x topk (" + std::to_string(2 * s.topk) +
                        ") to draw a wrong prediction, found experts=" + std::to_string(s.experts));
  if (product({s.layers, s.tokens, s.topk}) > (uint64_t{1} << 26))
    bad_spec(where,
             "layers x tokens x topk = " + std::to_string(product({s.layers, s.tokens, s.topk})) +
                 " picks, more than 2^26");
  if (product({s.layers, s.tokens, s.topk, s.experts}) > (uint64_t{1} << 33))
    bad_spec(where, "layers x tokens x topk x experts = " +
                        std::to_string(product({s.layers, s.tokens, s.topk, s.experts})) +
                        ", more than 2^33 (each draw scans every expert)");
}

}  // namespace

SyntheticTraceSpec parse_synthetic_spec(const std::string& text, const std::string& where) {
  SyntheticTraceSpec s;
  std::vector<std::string> seen;
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string piece = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = piece.find('=');
    if (eq == std::string::npos) bad_spec(where, "piece \"" + piece + "\" has no '='");
    const std::string key = piece.substr(0, eq), v = piece.substr(eq + 1);
    for (const std::string& k : seen)
      if (k == key) bad_spec(where, "key " + key + " given twice");
    seen.push_back(key);
    const uint64_t i64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (key == "layers") s.layers = static_cast<int64_t>(spec_uint(where, key, v, 1, 4096));
    else if (key == "tokens") s.tokens = static_cast<int64_t>(spec_uint(where, key, v, 1, 1 << 24));
    else if (key == "experts")
      s.experts = static_cast<int64_t>(spec_uint(where, key, v, 1, 1 << 20));
    else if (key == "topk") s.topk = static_cast<int64_t>(spec_uint(where, key, v, 1, 1 << 20));
    else if (key == "zipf") s.zipf = spec_real(where, key, v, 0, 16);
    else if (key == "predict") s.predict = spec_real(where, key, v, 0, 1);
    else if (key == "seed") s.seed = spec_uint(where, key, v, 0, ~uint64_t{0});
    else if (key == "expert_bytes")
      s.expert_bytes = static_cast<int64_t>(spec_uint(where, key, v, 0, i64));
    else
      bad_spec(where, "unknown key \"" + key +
                          "\" (keys: layers, tokens, experts, topk, zipf, predict, seed, "
                          "expert_bytes)");
  }
  check_spec(s, where);
  return s;
}

std::string synthetic_spec_text(const SyntheticTraceSpec& s) {
  auto real = [](double x) {  // the shortest text that reads back as x
    char b[32];
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(b, sizeof b, "%.*g", digits, x);
      if (std::strtod(b, nullptr) == x) break;
    }
    return std::string(b);
  };
  return "layers=" + std::to_string(s.layers) + ",tokens=" + std::to_string(s.tokens) +
         ",experts=" + std::to_string(s.experts) + ",topk=" + std::to_string(s.topk) +
         ",zipf=" + real(s.zipf) + ",predict=" + real(s.predict) +
         ",seed=" + std::to_string(s.seed) + ",expert_bytes=" +
         std::to_string(s.expert_bytes < 0 ? ds41_expert_bytes() : s.expert_bytes);
}

}  // namespace moecheck
