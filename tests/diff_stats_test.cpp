// The dump differ's statistics (compare/dump_diff.h, docs/cli.md "diff"): max_rel and max_ulp
// over pairs of the same sign and both nonzero, the pairs across zero counted apart; the
// elements of max_abs and max_ulp located; the worst mismatches by |a - b| besides the first;
// and same_golden_content (compare/golden_verify.h), which `golden update` keeps files by.
// Each test names its shape; a failure prints the stage and the values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compare/dump_diff.h"
#include "compare/golden_verify.h"
#include "dump_test_util.h"

namespace moecheck {
namespace {

using testing::make_dump;
using testing::small_config;

const StageDiff& output_of(const DiffReport& r, size_t li) {
  const StageDiff* s = r.layers[li].stage(Stage::kOutput);
  if (s == nullptr) throw std::runtime_error("no output stage");
  return *s;
}

uint16_t& out_at(Dump& d, int64_t t, int64_t col) {
  return d.layers[0].output[static_cast<size_t>(t * d.meta.config.dim + col)];
}
float out_value(const Dump& d, int64_t t, int64_t col) {
  return bf16_to_f32(d.layers[0].output[static_cast<size_t>(t * d.meta.config.dim + col)]);
}

// Before: a sign flip of one bf16 value made max_ulp about 2 x 16,000 (every bf16 between -x and
// x) and a zero against a nonzero made max_rel inf, hiding a 1-ulp difference elsewhere.
TEST(DiffStats, UlpAndRelLeaveOutSignCrossingsAndCountThem_T4_dim256) {
  const Dump a = make_dump(small_config(), 4, {0}, 3, false);
  Dump b = a;
  out_at(b, 1, 10) = static_cast<uint16_t>(out_at(b, 1, 10) ^ 0x8000u);  // sign flip
  out_at(b, 2, 20) = static_cast<uint16_t>(out_at(b, 2, 20) + 1);        // one bf16 ulp
  out_at(b, 3, 30) = 0;                                                  // a zero
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  const StageDiff& s = output_of(r, 0);
  EXPECT_EQ(s.out_of_tol, 3);
  EXPECT_EQ(s.cross_zero, 2) << "the sign flip and the zero";
  EXPECT_EQ(s.max_ulp, 1u);
  EXPECT_TRUE(std::isfinite(s.max_rel)) << s.max_rel;
  ASSERT_TRUE(s.has_worst_ulp);
  EXPECT_EQ(s.worst_ulp.token, 2);
  EXPECT_EQ(s.worst_ulp.index, 20);
  ASSERT_TRUE(s.has_worst_abs);
  const double flip = 2.0 * std::fabs(out_value(a, 1, 10));
  const double zero = std::fabs(out_value(a, 3, 30));
  EXPECT_EQ(s.worst_abs.token, flip >= zero ? 1 : 3) << "flip " << flip << ", zero " << zero;
  EXPECT_DOUBLE_EQ(s.max_abs, std::max(flip, zero));
  EXPECT_NE(s.worst_abs.where.find("column"), std::string::npos) << s.worst_abs.where;
}

TEST(DiffStats, IdenticalStagesHaveNoWorstElement_T2_dim256) {
  const Dump a = make_dump(small_config(), 2, {0}, 5, true);
  const DiffReport r = diff_dumps(a, a, DiffOptions{});
  for (const StageDiff& s : r.layers[0].stages) {
    EXPECT_FALSE(s.has_worst_abs) << stage_name(s.stage);
    EXPECT_FALSE(s.has_worst_ulp) << stage_name(s.stage);
    EXPECT_EQ(s.cross_zero, 0) << stage_name(s.stage);
    EXPECT_TRUE(s.worst.empty()) << stage_name(s.stage);
  }
}

// 30 perturbed elements of growing size in storage order: `first` keeps the first 10, `worst`
// the 10 largest |a - b|, largest first.
TEST(DiffStats, WorstMismatchesAreTheLargestByAbsDiff_T4_dim256_30elements) {
  const Dump a = make_dump(small_config(), 4, {0}, 9, false);
  Dump b = a;
  const int64_t n = 30, dim = a.meta.config.dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = (i * 37) % (4 * dim);
    float v = bf16_to_f32(b.layers[0].output[static_cast<size_t>(at)]);
    v += static_cast<float>(i + 1) * 0.125f * (v < 0 ? -1.0f : 1.0f);  // away from zero
    b.layers[0].output[static_cast<size_t>(at)] = f32_to_bf16(v);
  }
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  const StageDiff& s = output_of(r, 0);
  ASSERT_EQ(s.out_of_tol, n);
  ASSERT_EQ(s.first.size(), kMaxMismatches);
  ASSERT_EQ(s.worst.size(), kMaxMismatches);
  for (size_t i = 1; i < s.first.size(); ++i)
    EXPECT_LT(s.first[i - 1].token * dim + s.first[i - 1].index,
              s.first[i].token * dim + s.first[i].index);
  for (size_t i = 1; i < s.worst.size(); ++i)
    EXPECT_GE(std::fabs(s.worst[i - 1].a - s.worst[i - 1].b),
              std::fabs(s.worst[i].a - s.worst[i].b));
  EXPECT_DOUBLE_EQ(std::fabs(s.worst[0].a - s.worst[0].b), s.max_abs);
  // Every kept worst is at least every left-out mismatch: the 10th largest of the 30 bounds them.
  EXPECT_GE(std::fabs(s.worst.back().a - s.worst.back().b), 20 * 0.125 - 0.1);
  for (const Mismatch& m : s.worst) EXPECT_FALSE(m.where.empty());
}

// golden update keeps a file whose content is the fresh run's: the build's commit and version
// are provenance, not content; one bit, a knob or a slice digest is content.
TEST(GoldenContent, SameContentIgnoresProvenanceButNotBitsKnobsOrDigests_T2_dim256) {
  const Dump a = make_dump(small_config(), 2, {0, 1}, 4, true);
  Dump fresh = a;
  fresh.meta.git_commit = "0123456789ab-dirty";
  fresh.meta.tool_version = "9.9.9";
  EXPECT_TRUE(same_golden_content(a, fresh));
  Dump order = fresh;  // a dump read back lists its knob attributes in the file's order
  std::reverse(order.meta.knobs.begin(), order.meta.knobs.end());
  EXPECT_TRUE(same_golden_content(a, order));
  Dump bit = fresh;
  bit.layers[1].acc[7] = std::nextafter(bit.layers[1].acc[7], 2.0f);
  EXPECT_FALSE(same_golden_content(a, bit)) << "one f32 ulp in acc";
  Dump knob = fresh;
  knob.meta.knobs[1].second = "4";
  EXPECT_FALSE(same_golden_content(a, knob)) << "expert_warps";
  Dump digest = fresh;
  digest.meta.model_header_sha256 = std::string(64, 'b');
  EXPECT_FALSE(same_golden_content(a, digest));
  Dump tokens = make_dump(small_config(), 3, {0, 1}, 4, true);
  EXPECT_FALSE(same_golden_content(a, tokens)) << "not comparable: not the same";
}

}  // namespace
}  // namespace moecheck
