// Dump comparison (compare/dump_diff.h, docs/cli.md "diff") on synthetic dumps: ULP distances,
// every tolerance mode on a known perturbation, located mismatches (layer, stage, token,
// expert, column, q8_1 block / K-quant super-block and sub-block), NaN rules, routing flips
// with their margins, and the refusal of incomparable dumps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "compare/dump_diff.h"
#include "core/error.h"
#include "dump_test_util.h"

namespace moecheck {
namespace {

using testing::make_dump;
using testing::small_config;

const StageDiff& stage(const LayerDiff& l, Stage name) {
  if (const StageDiff* s = l.stage(name)) return *s;
  throw std::runtime_error(std::string("no stage ") + stage_name(name));
}

DiffOptions with(Tolerance t) {
  DiffOptions o;
  o.tolerance = t;
  return o;
}

TEST(UlpDistance, KnownPatterns) {
  EXPECT_EQ(ulp_distance_f32(f32_bits(1.0f), f32_bits(std::nextafter(1.0f, 2.0f))), 1u);
  EXPECT_EQ(ulp_distance_f32(0x00000000u, 0x80000000u), 0u);  // +0 and -0
  EXPECT_EQ(ulp_distance_f32(0x00000001u, 0x80000001u), 2u);  // across zero
  EXPECT_EQ(ulp_distance_f32(f32_bits(1.0f), f32_bits(-1.0f)), 2u * 0x3F800000u);
  EXPECT_EQ(ulp_distance_bf16(0x3F80, 0x3F81), 1u);
  EXPECT_EQ(ulp_distance_bf16(0x0000, 0x8000), 0u);
  EXPECT_EQ(ulp_distance_bf16(0x0001, 0x8001), 2u);
}

TEST(DumpDiff, IdenticalDumpsAreSameEveryStageCompared_T4_E8_K2_dim256) {
  const Dump a = make_dump(small_config(), 4, {0, 1}, 3, true);
  const DiffReport r = diff_dumps(a, a, DiffOptions{});
  EXPECT_TRUE(r.same);
  ASSERT_EQ(r.layers.size(), 2u);
  for (const StageDiff& s : r.layers[0].stages) {
    if (s.stage == Stage::kSharedHQ8) {
      EXPECT_EQ(s.status, "absent");  // the synthetic shared expert has no q8_1 blocks
      continue;
    }
    EXPECT_TRUE(s.status.empty()) << stage_name(s.stage);
    EXPECT_GT(s.compared, 0) << stage_name(s.stage);
    EXPECT_EQ(s.out_of_tol, 0) << stage_name(s.stage);
  }
}

TEST(DumpDiff, OneBitInOutputIsLocatedAndJudgedPerMode_T4_E8_K2_dim256) {
  const Dump a = make_dump(small_config(), 4, {0, 2}, 5, true);
  Dump b = a;
  const int64_t t = 1, col = 37;
  uint16_t& v = b.layers[1].output[static_cast<size_t>(t * 256 + col)];
  v = static_cast<uint16_t>(v ^ 1u);  // one bf16 ulp
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  EXPECT_FALSE(r.same);
  EXPECT_TRUE(r.layers[0].pass);
  const LayerDiff& l = r.layers[1];
  EXPECT_EQ(l.first_failing, Stage::kOutput);
  const StageDiff& s = stage(l, Stage::kOutput);
  EXPECT_EQ(s.out_of_tol, 1);
  ASSERT_EQ(s.first.size(), 1u);
  EXPECT_EQ(s.first[0].layer, 2);
  EXPECT_EQ(s.first[0].token, t);
  EXPECT_EQ(s.first[0].index, col);
  EXPECT_EQ(s.first[0].ulp, 1u);
  EXPECT_EQ(s.max_ulp, 1u);

  Tolerance ulp1;
  ulp1.mode = ToleranceMode::kUlp;
  ulp1.ulp = 1;
  EXPECT_TRUE(diff_dumps(a, b, with(ulp1)).same);
  // One bf16 ulp is at most 2^-7 relative (|value| in [2^e, 2^(e+1)) has ulp 2^(e-7)).
  Tolerance rel;
  rel.mode = ToleranceMode::kAbsRel;
  rel.rtol = 1.0 / 128.0;
  EXPECT_TRUE(diff_dumps(a, b, with(rel)).same);
  rel.rtol = 1.0 / 1024.0;  // below 2^-8, the smallest relative size of one bf16 ulp
  EXPECT_FALSE(diff_dumps(a, b, with(rel)).same);
}

TEST(DumpDiff, ExpertDownMismatchNamesExpertTokenAndWeightRow_T4_E8_K2_dim256) {
  const Dump a = make_dump(small_config(), 4, {0}, 7, true);
  Dump b = a;
  ExpertTaps& e = b.layers[0].experts[2];
  ASSERT_GE(e.tokens.size(), 2u);
  const int64_t row = 1, col = 100;
  e.down[static_cast<size_t>(row * 256 + col)] += 0.5f;
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  const LayerDiff& l = r.layers[0];
  EXPECT_EQ(l.first_failing, Stage::kExpertsDown);
  const StageDiff& s = stage(l, Stage::kExpertsDown);
  ASSERT_EQ(s.first.size(), 1u);
  EXPECT_EQ(s.first[0].expert, e.expert);
  EXPECT_EQ(s.first[0].token, e.tokens[row]);
  EXPECT_EQ(s.first[0].index, col);
  EXPECT_NE(s.first[0].where.find("weight row 100 of ffn_down_exps[" + std::to_string(e.expert) +
                                  "] (Q3_K blocks 0..0)"),
            std::string::npos)
      << s.first[0].where;
  // Later stages are still measured: the output is untouched in this synthetic dump.
  EXPECT_TRUE(stage(l, Stage::kOutput).pass);
}

TEST(DumpDiff, InputDimensionElementsNameQ8BlockSuperBlockAndSubBlock_T2_E8_K2_inter512) {
  MoeConfig c = small_config();
  c.inter = 512;
  const Dump a = make_dump(c, 2, {0}, 9, true);
  Dump b = a;
  ExpertTaps& e = b.layers[0].experts[0];
  const int64_t k = 300;  // q8_1 block 9, super-block 1, sub-block (300 % 256) / 16 = 2
  e.h[static_cast<size_t>(k)] = -e.h[static_cast<size_t>(k)] - 1.0f;
  reinterpret_cast<uint8_t*>(&e.h_q8[9])[7] ^= 0x10;  // block 9 of token row 0, byte 7 = qs[3]
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  const LayerDiff& l = r.layers[0];
  const StageDiff& h = stage(l, Stage::kExpertsH);
  ASSERT_EQ(h.first.size(), 1u);
  EXPECT_NE(h.first[0].where.find("h element 300: q8_1 block 9, super-block 1 sub-block 2"),
            std::string::npos)
      << h.first[0].where;
  const StageDiff& q = stage(l, Stage::kExpertsHQ8);
  ASSERT_EQ(q.first.size(), 1u);
  EXPECT_EQ(q.first[0].index, 9);
  EXPECT_NE(q.first[0].where.find("q8_1 block 9 (elements 288..319), super-block 1 sub-blocks 2-3"),
            std::string::npos)
      << q.first[0].where;
  EXPECT_NE(q.first[0].where.find("byte 7 (qs[3])"), std::string::npos) << q.first[0].where;
  EXPECT_EQ(l.first_failing, Stage::kExpertsH);
}

TEST(DumpDiff, ExactSeesSameBitNaNsAsSameOtherRulesOnlyWithNanEqual_T2_E8_K2_dim256) {
  Dump a = make_dump(small_config(), 2, {0}, 4, true);
  a.layers[0].acc[3] = std::numeric_limits<float>::quiet_NaN();
  Dump b = a;
  // Exact: the same bits, NaN or not (the contract's canonical NaN on both sides).
  EXPECT_TRUE(diff_dumps(a, b, DiffOptions{}).same);
  // Another NaN payload is a difference under exact, with or without nan_equal.
  b.layers[0].acc[3] = bits_f32(0x7FC00001u);
  DiffReport r = diff_dumps(a, b, DiffOptions{});
  EXPECT_FALSE(r.same);
  EXPECT_EQ(stage(r.layers[0], Stage::kAcc).nan_mismatch, 1);
  DiffOptions o;
  o.tolerance.nan_equal = true;
  EXPECT_FALSE(diff_dumps(a, b, o).same);
  // Other rules: NaN equals nothing, not even the same bits, unless nan_equal (any payload).
  Tolerance t;
  t.mode = ToleranceMode::kUlp;
  t.ulp = 4;
  r = diff_dumps(a, a, with(t));
  EXPECT_FALSE(r.same);
  EXPECT_EQ(stage(r.layers[0], Stage::kAcc).nan_mismatch, 1);
  t.nan_equal = true;
  EXPECT_TRUE(diff_dumps(a, b, with(t)).same);
  // A NaN never equals a number.
  b.layers[0].acc[3] = 1.0f;
  EXPECT_FALSE(diff_dumps(a, b, with(t)).same);
}

TEST(DumpDiff, NmseIsAgainstAsEnergy_T3_E8_K2_dim256) {
  const Dump a = make_dump(small_config(), 3, {0}, 6, true);
  Dump b = a;
  // b = a (1 + 1e-3) elementwise: NMSE = 1e-6 up to f32 rounding of the products (relative
  // 2^-24 on a difference of relative size 1e-3: a 1.7e-5 relative change of the NMSE).
  for (float& v : b.layers[0].acc) v = v * 1.001f;
  Tolerance t;
  t.mode = ToleranceMode::kNmse;
  t.nmse = 1.01e-6;
  const DiffReport r = diff_dumps(a, b, with(t));
  const StageDiff& s = stage(r.layers[0], Stage::kAcc);
  EXPECT_NEAR(s.nmse, 1e-6, 1e-8);
  EXPECT_TRUE(s.pass);
  t.nmse = 0.99e-6;
  EXPECT_FALSE(stage(diff_dumps(a, b, with(t)).layers[0], Stage::kAcc).pass);
}

TEST(DumpDiff, RoutingFlipCountedWithMarginsAndItsTokenLeftOut_T3_E8_K2_dim256) {
  const MoeConfig c = small_config();  // picks of token t: t, t+1; logits 2, 1 there, -10 elsewhere
  const Dump a = make_dump(c, 3, {0}, 8, true);
  Dump b = a;
  LayerTaps& lb = b.layers[0];
  // Token 0 picks {0, 5} in B instead of {0, 1}.
  lb.topk_ids[1] = 5;
  lb.router_logits[1] = -10.0f;
  lb.router_logits[5] = 1.0f;
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  const LayerDiff& l = r.layers[0];
  EXPECT_EQ(l.routing.tokens_differ, 1);
  EXPECT_EQ(l.routing.flips, 1);
  ASSERT_EQ(l.routing.flip_list.size(), 1u);
  const RoutingFlip& f = l.routing.flip_list[0];
  EXPECT_EQ(f.token, 0);
  EXPECT_EQ(f.only_a, std::vector<int32_t>{1});
  EXPECT_EQ(f.only_b, std::vector<int32_t>{5});
  EXPECT_EQ(l.routing.margin_kind, "logit");
  EXPECT_EQ(f.margin_a, 11.0);  // k-th logit 1 minus the (k+1)-th, -10: exact in f32
  EXPECT_EQ(f.margin_b, 11.0);
  EXPECT_EQ(l.first_failing, Stage::kRouterLogits);
  EXPECT_EQ(stage(l, Stage::kTopkIds).out_of_tol, 1);
  EXPECT_EQ(stage(l, Stage::kOutput).skipped_tokens, 1);
  EXPECT_TRUE(stage(l, Stage::kOutput).pass);  // the other tokens agree
  // The flipped token's own (expert, token) pairs do not depend on its other picks: token 0's
  // row of expert 0 (picked on both sides) is still compared, and a change there is seen.
  EXPECT_EQ(stage(l, Stage::kExpertsGate).skipped_tokens, 0);
  EXPECT_EQ(stage(l, Stage::kXQ8).skipped_tokens, 0);
  // Its routing weights are renormalised over its other picks: token 0's rows of experts 0 and 1
  // (the synthetic B still holds a row for expert 1) are left out.
  EXPECT_EQ(stage(l, Stage::kExpertsWeights).skipped_tokens, 2);
  EXPECT_EQ(stage(l, Stage::kTopkWeights).skipped_tokens, 1);
  {
    Dump b2 = b;
    for (ExpertTaps& e : b2.layers[0].experts)
      if (e.expert == 0) e.gate[0] += 1.0f;  // expert 0's row 0 is token 0's
    const DiffReport r2 = diff_dumps(a, b2, DiffOptions{});  // the report outlives its layer
    const LayerDiff& l2 = r2.layers[0];
    EXPECT_EQ(stage(l2, Stage::kExpertsGate).out_of_tol, 1);
  }

  // With the router bias (zero here) margins are keys: sqrtsoftplus(1) - sqrtsoftplus(-10).
  std::vector<float> bias(static_cast<size_t>(c.n_routed), 0.0f);
  DiffOptions o;
  o.bias = [&](int) { return RouteBias{bias.data()}; };
  const DiffReport k = diff_dumps(a, b, o);
  const double want = std::sqrt(std::log1p(std::exp(1.0))) - std::sqrt(std::log1p(std::exp(-10.0)));
  EXPECT_EQ(k.layers[0].routing.margin_kind, "key (score + bias)");
  EXPECT_NEAR(k.layers[0].routing.flip_list[0].margin_a, want,
              1e-6);  // f32 scores: ~2^-23 relative
}

// An image mask is an input (it chooses bias_vl for the masked tokens): two dumps whose masks
// differ ran on different inputs, so the input stage fails naming the first differing token, as
// differing input bits do. No mask equals an all-zero mask. With the model's biases, each side's
// key margins use its own mask.
TEST(DumpDiff, DifferingImageMasksFailTheInputStage_T3_E8_K2_dim256) {
  const MoeConfig c = small_config();
  Dump a = make_dump(c, 3, {0}, 9, false);
  Dump b = a;
  b.layers[0].image_mask = {0, 0, 0};
  EXPECT_TRUE(diff_dumps(a, b, DiffOptions{}).same) << "no mask vs all-zero mask";
  b.layers[0].image_mask = {0, 1, 1};
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  EXPECT_FALSE(r.same);
  const LayerDiff& l = r.layers[0];
  EXPECT_EQ(l.image_mask_differ, 2);
  EXPECT_EQ(l.first_failing, Stage::kInput);
  EXPECT_FALSE(stage(l, Stage::kInput).pass);
  EXPECT_EQ(stage(l, Stage::kInput).note, "image_mask differs on 2 token(s), first 1: A 0, B 1");
  EXPECT_TRUE(stage(l, Stage::kOutput).pass) << "only the mask differs";
  // Token 0 flips to {0, 5} in B, whose mask selects a bias_vl that lifts expert 5 by 1 (the
  // logits stay A's: 2, 1, -10 elsewhere): B's key margin is then measured with bias_vl, A's
  // with the zero bias.
  b.layers[0].image_mask = {1, 0, 0};
  b.layers[0].topk_ids[1] = 5;
  std::vector<float> bias(8, 0.0f), bias_vl(8, 0.0f);
  bias_vl[5] = 1.0f;
  DiffOptions o;
  o.bias = [&](int) { return RouteBias{bias.data(), bias_vl.data()}; };
  const DiffReport rf = diff_dumps(a, b, o);  // the report outlives the flip read from it
  const RoutingFlip& f = rf.layers[0].routing.flip_list.at(0);
  const double s1 = std::sqrt(std::log1p(std::exp(1.0))),
               s10 = std::sqrt(std::log1p(std::exp(-10.0)));
  EXPECT_NEAR(f.margin_a, s1 - s10, 1e-6);          // keys s(2), s(1) | s(-10)
  EXPECT_NEAR(f.margin_b, s1 - (s10 + 1.0), 1e-6);  // keys s(2), s(1) | s(-10) + 1 (expert 5)
}

TEST(DumpDiff, FlipsWithinTheLogitDifferenceAreExplained_T3_E8_K2_dim256) {
  const MoeConfig c = small_config();
  Dump a = make_dump(c, 3, {0}, 8, true);
  // Token 0: A has expert 1 at logit 1 and expert 5 one f32 ulp below; B has them swapped, so
  // B picks 5 instead of 1. Max |logit difference| = 1 - nextafter(1, 0) = 2^-24; both margins
  // are 2^-24 <= 2 * 2^-24: explained. A margin of 11 (the test above) is not.
  const float below = std::nextafter(1.0f, 0.0f);
  a.layers[0].router_logits[5] = below;
  Dump b = a;
  LayerTaps& lb = b.layers[0];
  lb.topk_ids[1] = 5;
  lb.router_logits[1] = below;
  lb.router_logits[5] = 1.0f;
  DiffReport r = diff_dumps(a, b, DiffOptions{});
  LayerDiff& l = r.layers[0];
  ASSERT_EQ(l.routing.flips, 1);
  EXPECT_EQ(l.routing.flip_list[0].margin_a, 1.0 - double(below));
  EXPECT_FALSE(l.pass);
  // router_logits differ too (by 2^-24); judge it by NMSE so only the flip is in question.
  DiffOptions o;
  o.stage_tolerance[Stage::kRouterLogits].mode = ToleranceMode::kNmse;
  o.stage_tolerance[Stage::kRouterLogits].nmse = 1e-12;
  r = diff_dumps(a, b, o);
  EXPECT_EQ(r.layers[0].first_failing, Stage::kTopkIds);
  EXPECT_EQ(explain_flips(r.layers[0], c.gate_temp), 1);
  EXPECT_TRUE(r.layers[0].pass) << stage_name(r.layers[0].first_failing);
  // Same logits on both sides but different picks (a routing bug, not rounding): max |logit
  // difference| 0, each side's margin is 2^-24 > 2 * 0: not explained.
  Dump b2 = a;
  b2.layers[0].topk_ids[1] = 5;
  DiffReport r2 = diff_dumps(a, b2, o);
  EXPECT_EQ(explain_flips(r2.layers[0], c.gate_temp), 0);
  EXPECT_FALSE(r2.layers[0].pass);
  EXPECT_EQ(r2.layers[0].first_failing, Stage::kTopkIds);
}

TEST(DumpDiff, ModelPyWeightedTapsCompareWithAccumulateWeightedOnes_T4_E8_K2_dim256) {
  const Dump b = make_dump(small_config(), 4, {0}, 12, true, "emu");
  Dump a = b;
  a.meta.implementation = "ref";
  a.meta.routing_weight_at = "h";
  for (ExpertTaps& e : a.layers[0].experts)
    for (size_t r = 0; r < e.tokens.size(); ++r) {
      for (size_t j = 0; j < 256; ++j) e.h[r * 256 + j] = e.weights[r] * e.h[r * 256 + j];
      for (size_t j = 0; j < 256; ++j) e.down[r * 256 + j] = e.weights[r] * e.down[r * 256 + j];
    }
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  EXPECT_TRUE(stage(r.layers[0], Stage::kExpertsH).pass);
  EXPECT_TRUE(stage(r.layers[0], Stage::kExpertsDown).pass);
  EXPECT_FALSE(stage(r.layers[0], Stage::kExpertsDown).note.empty());
}

TEST(DumpDiff, IncomparableDumpsAreRefusedWithTheField) {
  const Dump a = make_dump(small_config(), 2, {0}, 1, false);
  auto refused = [&](const Dump& b, const std::string& needle) {
    try {
      diff_dumps(a, b, DiffOptions{});
      ADD_FAILURE() << "expected InputError mentioning " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Dump b = a;
  b.meta.model_sha256 = std::string(64, 'b');
  refused(b, "different model files (attribute model_sha256)");
  b = a;
  b.meta.config.route_scale = 2.5f;
  refused(b, "config.route_scale is 1.5 vs 2.5");
  b = make_dump(small_config(), 3, {0}, 1, false);
  refused(b, "different token counts");
  b = make_dump(small_config(), 2, {0, 1}, 1, false);
  refused(b, "different layer lists (attribute layers): [0] vs [0,1]");
}

// Provenance (golden/provenance.h): slices both dumps read must agree; slices only one side read
// and files that differ elsewhere do not stop the comparison; the report says which it was.
TEST(DumpDiff, SliceProvenanceDecidesComparability) {
  Dump a = make_dump(small_config(), 2, {0}, 1, false);
  a.meta.model_sha256.clear();
  a.meta.model_header_sha256 = std::string(64, '1');
  const std::string h1(64, 'a'), h2(64, 'b'), h3(64, 'c');
  a.slices = {{{LayerTensor::kRouter, -1, h1}, {LayerTensor::kGateExps, 3, h2}}};
  Dump b = a;
  b.slices = {{{LayerTensor::kRouter, -1, h1}, {LayerTensor::kGateExps, 5, h3}}};
  b.meta.model_header_sha256 = std::string(64, '2');
  const DiffReport r = diff_dumps(a, b, DiffOptions{});
  EXPECT_TRUE(r.same);
  EXPECT_EQ(r.model.kind, "slices");
  EXPECT_EQ(r.model.common, 1);
  EXPECT_EQ(r.model.only_a, std::vector<std::string>{"blk.0.ffn_gate_exps.weight[expert 3]"});
  EXPECT_EQ(r.model.only_b, std::vector<std::string>{"blk.0.ffn_gate_exps.weight[expert 5]"});
  EXPECT_TRUE(r.model.header_differs);
  EXPECT_NE(r.model.note.find("the GGUF headers differ"), std::string::npos) << r.model.note;
  // The same slice with another digest: refused, naming the slice and both digests.
  b.slices[0][1] = {LayerTensor::kGateExps, 3, h3};
  try {
    diff_dumps(a, b, DiffOptions{});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "different weights: blk.0.ffn_gate_exps.weight[expert 3] has sha256 " + h2 +
                  " in A, " + h3 + " in B"),
              std::string::npos)
        << e.what();
  }
  // One side records only the whole file's digest (a version 1 dump): compared, reported
  // unverified.
  Dump v1 = make_dump(small_config(), 2, {0}, 1, false);
  v1.meta.model_sha256 = std::string(64, 'f');
  const DiffReport u = diff_dumps(v1, a, DiffOptions{});
  EXPECT_EQ(u.model.kind, "unverified");
  EXPECT_NE(u.model.note.find("A records the whole-file digest only, B slice digests"),
            std::string::npos)
      << u.model.note;
  // Equal whole-file digests settle it whatever else is recorded.
  Dump c = a, d = b;
  c.meta.model_sha256 = d.meta.model_sha256 = std::string(64, 'e');
  EXPECT_EQ(diff_dumps(c, d, DiffOptions{}).model.kind, "file");
}

}  // namespace
}  // namespace moecheck
