// The synthetic skewed trace (golden/synthetic_trace.h, docs/streaming.md "Cache simulation"):
// the weights against std::pow, the seeded permutation, the pick frequencies against the Zipf
// law within 5 binomial standard deviations (fixed seeds: deterministic), predictions kept with
// probability `predict` and otherwise wrong, determinism, and the spec parser's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden/synthetic_trace.h"
#include "tests/expect_error.h"

namespace moecheck {
namespace {

SyntheticTraceSpec spec(const std::string& s) { return parse_synthetic_spec(s, "--synthetic"); }

TEST(SyntheticTrace, ZipfWeightsMatchStdPow) {
  for (double s : {0.0, 0.5, 1.0, 1.3, 2.0, 7.25, 16.0}) {
    const std::vector<double> w = zipf_weights(1 << 12, s);
    for (size_t r = 0; r < w.size(); ++r) {
      // exp turns an absolute error in y = -s ln(r + 1) into a relative one: a few ulp of |y|
      // (ln, the product, the reduction by k ln2) plus a few ulp of the polynomial and scaling.
      const double want = std::pow(static_cast<double>(r + 1), -s);
      const double y = s * std::log(static_cast<double>(r + 1));
      ASSERT_NEAR(w[r], want, (4 * y + 8) * 0x1p-53 * want) << "s " << s << " rank " << r;
    }
  }
  EXPECT_EQ(zipf_weights(3, 0.0), (std::vector<double>{1.0, 1.0, 1.0}));
}

TEST(SyntheticTrace, RankingIsASeededPermutation) {
  const std::vector<int32_t> a = synthetic_ranking(1, 0, 384);
  std::vector<int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> iota(384);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(a, synthetic_ranking(1, 0, 384));
  EXPECT_NE(a, synthetic_ranking(1, 1, 384));  // another layer
  EXPECT_NE(a, synthetic_ranking(2, 0, 384));  // another seed
  EXPECT_NE(a, iota);
}

// One layer, topk = 1: expert perm[r] is picked with probability w_r / sum(w).
void expect_zipf_frequencies(double s, uint64_t seed) {
  const int64_t E = 16, N = 20000;
  const TraceFile f = synthetic_trace(spec(
      "layers=1,tokens=" + std::to_string(N) +
      ",experts=16,topk=1,predict=1,zipf=" + std::to_string(s) + ",seed=" + std::to_string(seed)));
  std::vector<int64_t> count(E, 0);
  for (int32_t e : f.trace.layers[0].picks) ++count[static_cast<size_t>(e)];
  const std::vector<int32_t> perm = synthetic_ranking(seed, 0, E);
  double W = 0;
  for (int64_t r = 0; r < E; ++r) W += std::pow(static_cast<double>(r + 1), -s);
  for (int64_t r = 0; r < E; ++r) {
    const double p = std::pow(static_cast<double>(r + 1), -s) / W;
    const double mean = N * p, sd = std::sqrt(N * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(count[static_cast<size_t>(perm[static_cast<size_t>(r)])]), mean,
                5 * sd)
        << "zipf " << s << " seed " << seed << " rank " << r << " expert " << perm[r];
  }
}

TEST(SyntheticTrace, PickFrequenciesFollowTheZipfLawOverThePermutation) {
  expect_zipf_frequencies(0.0, 1);
  expect_zipf_frequencies(1.0, 1);
  expect_zipf_frequencies(1.0, 7);
  expect_zipf_frequencies(2.5, 3);
}

TEST(SyntheticTrace, PicksAreDistinctAndPredictionsKeptWithProbabilityPredict) {
  const TraceFile f = synthetic_trace(spec("layers=3,tokens=2000,experts=64,topk=6,predict=0.7"));
  const RoutingTrace& t = f.trace;
  ASSERT_EQ(t.layers.size(), 3u);
  EXPECT_TRUE(t.layers[0].predicted.empty());
  int64_t kept = 0, total = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.layers[i].layer, static_cast<int32_t>(i));
    if (i == 0) continue;
    for (int64_t tok = 0; tok < t.tokens; ++tok) {
      const auto* pk = t.layers[i].picks.data() + tok * 6;
      const auto* pr = t.layers[i].predicted.data() + tok * 6;
      const std::set<int32_t> picks(pk, pk + 6);
      for (int j = 0; j < 6; ++j) {
        ++total;
        if (pr[j] == pk[j]) ++kept;
        else EXPECT_EQ(picks.count(pr[j]), 0u) << "a replacement is never an actual pick";
      }
    }
  }
  const double p = 0.7, sd = std::sqrt(total * p * (1 - p));
  EXPECT_NEAR(static_cast<double>(kept), total * p, 5 * sd);
  t.validate("synthetic");  // every token's picks and predictions distinct, in range
  EXPECT_EQ(f.expert_bytes, 12810240);
  EXPECT_EQ(t.origin,
            "synthetic layers=3,tokens=2000,experts=64,topk=6,zipf=1,predict=0.7,seed=1,"
            "expert_bytes=12810240");
}

TEST(SyntheticTrace, PredictOneCopiesThePicksAndZeroMissesThemAll) {
  const RoutingTrace one = synthetic_trace(spec("layers=2,tokens=50,experts=32,predict=1")).trace;
  EXPECT_EQ(one.layers[1].predicted, one.layers[1].picks);
  const RoutingTrace zero = synthetic_trace(spec("layers=2,tokens=50,experts=32,predict=0")).trace;
  for (int64_t tok = 0; tok < 50; ++tok) {
    const auto b = zero.layers[1].picks.begin() + tok * 6;
    for (int j = 0; j < 6; ++j)
      EXPECT_EQ(std::count(b, b + 6, zero.layers[1].predicted[static_cast<size_t>(tok * 6 + j)]),
                0);
  }
}

TEST(SyntheticTrace, SameSpecSameTraceOtherSeedOtherTrace) {
  const RoutingTrace a = synthetic_trace(spec("layers=4,tokens=16,seed=5")).trace;
  const RoutingTrace b = synthetic_trace(spec("seed=5,tokens=16,layers=4")).trace;
  const RoutingTrace c = synthetic_trace(spec("layers=4,tokens=16,seed=6")).trace;
  ASSERT_EQ(a.layers.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.layers[i].picks, b.layers[i].picks);
    EXPECT_EQ(a.layers[i].predicted, b.layers[i].predicted);
  }
  EXPECT_NE(a.layers[0].picks, c.layers[0].picks);
}

TEST(SyntheticTrace, SpecDefaultsAndRefusals) {
  const SyntheticTraceSpec d = spec("");
  EXPECT_EQ(d.layers, 40);
  EXPECT_EQ(d.tokens, 64);
  EXPECT_EQ(d.experts, 384);
  EXPECT_EQ(d.topk, 6);
  EXPECT_EQ(d.zipf, 1.0);
  EXPECT_EQ(d.predict, 0.7);
  EXPECT_EQ(d.seed, 1u);
  EXPECT_EQ(spec("expert_bytes=0").expert_bytes, 0);
  EXPECT_EQ(spec("zipf=1.25,seed=18446744073709551615").seed, 18446744073709551615ull);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"layers=0", "layers=0: expected 1 to 4096"},
      {"layers=x", "layers=x: not a whole number"},
      {"layers=-2", "layers=-2: not a whole number"},
      {"tokens=1.5", "tokens=1.5: not a whole number"},
      {"experts=2000000", "experts=2000000: expected 1 to 1048576"},
      {"topk=7,experts=6", "topk=7: more than experts=6"},
      {"zipf=-1", "zipf=-1: expected a number in [0"},
      {"zipf=nan", "zipf=nan: not a finite number"},
      {"zipf=inf", "zipf=inf: not a finite number"},
      {"predict=1.5", "predict=1.5: expected a number in [0"},
      {"experts=10,topk=6", "needs experts >= 2 x topk (12)"},
      {"seed=18446744073709551616", "seed=18446744073709551616: not a whole number"},
      {"layers=40,layers=2", "key layers given twice"},
      {"layers", "piece \"layers\" has no '='"},
      {"layers=2,", "piece \"\" has no '='"},
      {"colour=red", "unknown key \"colour\""},
      {"layers=4096,tokens=65536", "more than 2^26"},
      {"layers=4096,tokens=4096,topk=2,experts=1048576", "more than 2^33"},
  };
  for (const auto& [s, want] : bad)
    testutil::expect_error([&] { spec(s); }, {"--synthetic", want}, s);
}

}  // namespace
}  // namespace moecheck
