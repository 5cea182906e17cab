// emu::MoeLayer (docs/numerics.md, every section): determinism (twice, bitwise), independence
// from token grouping (one token alone vs in groups of up to 8, vs 40 tokens), expert_warps and
// host threads; and every stage against the reference in Exact mode within the derived bounds
// (tests/emu_layer_check.h), routing flips printed and explained. Configs: tiny / small presets
// (golden/generator.h), bf16 or K-quant shared expert, and ds41 at one and eight tokens with
// lazily generated expert stacks. Repro: --gtest_filter=EmuMoeLayer.<config>.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/routing.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "reference/moe.h"
#include "tests/emu_layer_check.h"
#include "tests/emu_lazy_layer.h"

namespace moecheck {
namespace {

GenOptions preset(const std::string& name, SharedExpertType shared) {
  GenOptions o = preset_options(name);
  o.shared = shared;
  return o;
}

emu::LayerOptions opts(RouterVariant v, int warps = 8, int threads = 0) {
  emu::LayerOptions o;
  o.router = v;
  o.expert_warps = warps;
  o.threads = threads;
  return o;
}

TEST(EmuMoeLayer, tiny_T8_bf16shared_staged_vs_reference) {
  const LayerWeights w = generate_layer(preset("tiny", SharedExpertType::kBF16), 0);
  emutest::check_against_reference(w, generate_input(3, 8, w.config.dim), 8,
                                   opts(RouterVariant::kStaged),
                                   "tiny_T8_bf16shared_staged seed 3");
}

TEST(EmuMoeLayer, tiny_T8_kquantshared_plain_vs_reference) {
  const LayerWeights w = generate_layer(preset("tiny", SharedExpertType::kKQuant), 1);
  emutest::check_against_reference(w, generate_input(4, 8, w.config.dim), 8,
                                   opts(RouterVariant::kPlain),
                                   "tiny_T8_kquantshared_plain layer 1 seed 4");
}

TEST(EmuMoeLayer, small_T5_bf16shared_staged_randomblocks_vs_reference) {
  GenOptions o = preset("small", SharedExpertType::kBF16);
  o.blocks = ExpertBlocks::kRandomValid;  // the quantised path is covered by tiny; this is faster
  const LayerWeights w = generate_layer(o, 0);
  emutest::check_against_reference(w, generate_input(5, 5, w.config.dim), 5,
                                   opts(RouterVariant::kStaged),
                                   "small_T5_bf16shared_staged_randomblocks seed 5");
}

// A deepseek4-convention layer: F16 router, per-layer clamps small enough to bite, the shared
// expert's differing from the routed experts'. Every stage within its bound of the reference (which
// reads the same per-layer config); and the shared clamp is used: dropping it moves the output.
TEST(EmuMoeLayer, tiny_T8_deepseek4_f16router_perlayer_clamps_vs_reference) {
  GenOptions o = preset("tiny", SharedExpertType::kBF16);
  o.convention = Convention::kDeepseek4;
  o.router_type = GgmlType::kF16;
  o.swiglu_limits = {10.0f, 0.75f};
  o.swiglu_limits_shared = {10.0f, 0.25f};
  const LayerWeights w = generate_layer(o, 1);
  ASSERT_EQ(w.router_type, GgmlType::kF16);
  ASSERT_EQ(w.config.shared_swiglu_limit(), 0.25f);
  const std::vector<uint16_t> x = generate_input(9, 8, w.config.dim);
  emutest::check_against_reference(w, x, 8, opts(RouterVariant::kStaged),
                                   "tiny_T8_deepseek4_f16router layer 1 seed 9");
  LayerWeights same = w;
  same.config.swiglu_limit_shared.reset();  // the shared expert clamped at 0.75 instead
  const emu::MoeLayer a(w, opts(RouterVariant::kStaged)), b(same, opts(RouterVariant::kStaged));
  const std::vector<uint16_t> ya = a.forward(x.data(), 8), yb = b.forward(x.data(), 8);
  EXPECT_NE(std::memcmp(ya.data(), yb.data(), ya.size() * 2), 0)
      << "the shared expert's clamp changed nothing";
  const ref::MoE ra(w, ref::Precision::kModel), rb(same, ref::Precision::kModel);
  EXPECT_NE(ra.forward(x.data(), 8), rb.forward(x.data(), 8))
      << "the reference ignores the shared expert's clamp";
}

// The other score functions, with a gate temperature and without renormalisation (softmax's
// scores come from the whole row: its bounds are compare/score_band.cpp's softmax band).
TEST(EmuMoeLayer, tiny_T8_softmax_temp0p7_nonorm_and_sigmoid_vs_reference) {
  for (const ScoreFunc f : {ScoreFunc::kSoftmax, ScoreFunc::kSigmoid}) {
    GenOptions o = preset("tiny", SharedExpertType::kKQuant);
    o.config.score_func = f;
    o.config.gate_temp = 0.7f;
    o.config.norm_topk_prob = f == ScoreFunc::kSigmoid;
    const LayerWeights w = generate_layer(o, 0);
    emutest::check_against_reference(w, generate_input(6, 8, w.config.dim), 8,
                                     opts(RouterVariant::kStaged),
                                     "tiny_T8_" + to_string(f) + "_temp0.7 seed 6");
  }
}

// Routing flips on purpose: x repeats with period dim / 2 and router row 11 is row 3 rotated by
// dim / 2, so both rows sum the same products (equal exact logits) while each plain-schedule lane
// takes them in the other order (the f32 sums differ in their last bits); biases make 0, 1, 2
// certain picks and leave the last slot to 3 or 11, and bias[11] - bias[3] is the smallest multiple
// of 2^-26 for which the two routings disagree on some token (searched deterministically). Every
// flip must be explained by the logit bound.
TEST(EmuMoeLayer, tiny_T16_forced_near_ties_flips_explained) {
  LayerWeights w = generate_layer(preset("tiny", SharedExpertType::kBF16), 0);
  const MoeConfig& c = w.config;
  ASSERT_EQ(c.topk, 4);
  const int64_t T = 16;
  std::vector<uint16_t> router(w.router, w.router + c.n_routed * c.dim);
  const int64_t half = c.dim / 2;  // 256: chunks c and c + 32 share their x values
  for (int64_t k = 0; k < c.dim; ++k)
    router[11 * c.dim + k] = w.router[3 * c.dim + (k + half) % c.dim];
  std::vector<float> bias(static_cast<size_t>(c.n_routed), -100.0f);
  bias[0] = bias[1] = bias[2] = 100.0f;
  bias[3] = 0.0f;
  w.router = router.data();
  w.bias = bias.data();
  const std::vector<uint16_t> xh = generate_input(17, T, half);
  std::vector<uint16_t> x(static_cast<size_t>(T * c.dim));
  for (int64_t i = 0; i < T * c.dim; ++i) x[i] = xh[(i / c.dim) * half + (i % c.dim) % half];
  std::vector<float> logits(static_cast<size_t>(T * c.n_routed));
  emu::router_gemv(RouterVariant::kPlain, w.router, x.data(), logits.data(), c.n_routed, c.dim, T);
  int k = 1;
  for (; k < 256; ++k) {
    bias[11] = static_cast<float>(k) * 0x1p-26f;
    const Routing re = route_from_logits(logits.data(), T, w.bias, c, 0);
    const ref::ExactRouting rr = ref::Gate(w).forward_exact(x.data(), T);
    bool differ = false;
    for (int64_t i = 0; i < T * c.topk; ++i) differ = differ || re.ids[i] != rr.ids[i];
    if (differ) break;
  }
  ASSERT_LT(k, 256) << "no bias offset up to 256 * 2^-26 produced a routing flip";
  int flips = 0;
  emutest::check_against_reference(
      w, x, T, opts(RouterVariant::kPlain),
      "tiny_T16_forced_near_ties_plain seed 17 bias11 " + std::to_string(k) + "*2^-26", &flips);
  EXPECT_GT(flips, 0);
}

// One token alone, the same token inside groups (T = 8) and with experts needing several groups
// of 8 rows (T = 40): equal bits per token, for every expert_warps and thread count.
TEST(EmuMoeLayer, tiny_T40_grouping_warps_threads_determinism) {
  for (SharedExpertType sh : {SharedExpertType::kBF16, SharedExpertType::kKQuant}) {
    const LayerWeights w = generate_layer(preset("tiny", sh), 0);
    const int64_t dim = w.config.dim, T = 40;
    const std::vector<uint16_t> x = generate_input(9, T, dim);
    const std::string cfg =
        std::string("tiny_T40_") + (sh == SharedExpertType::kBF16 ? "bf16" : "kquant");
    LayerTaps taps;
    const std::vector<uint16_t> all =
        emu::MoeLayer(w, opts(RouterVariant::kStaged)).forward(x.data(), T, &taps);
    size_t max_rows = 0;
    for (const ExpertTaps& e : taps.experts) max_rows = std::max(max_rows, e.tokens.size());
    EXPECT_GT(max_rows, static_cast<size_t>(kMaxGroupRows))
        << cfg << ": no expert needed two groups";
    for (int warps : {2, 4, 8}) {
      for (int threads : {1, 2, 3}) {
        const emu::MoeLayer layer(w, opts(RouterVariant::kStaged, warps, threads));
        const std::vector<uint16_t> again = layer.forward(x.data(), T);
        ASSERT_EQ(again, all) << cfg << " warps " << warps << " threads " << threads;
      }
    }
    const emu::MoeLayer layer(w, opts(RouterVariant::kStaged, 8, 1));
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<uint16_t> one = layer.forward(x.data() + t * dim, 1);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + t * dim, 2 * dim), 0)
          << cfg << " token " << t << " alone";
    }
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
      const std::vector<uint16_t> eight = layer.forward(x.data() + t0 * dim, 8);
      ASSERT_EQ(std::memcmp(eight.data(), all.data() + t0 * dim, 2 * 8 * dim), 0)
          << cfg << " tokens " << t0 << "..+8";
    }
  }
}

// Image spans (model.py Gate.bias_vl): the emulation's picks and weights equal route_from_logits
// of its own logits with the mask (bit for bit), unmasked tokens' outputs equal the unmasked
// run's, each token routed alone with its slice of the mask equals its row, some masked token
// picks differently (not vacuous), and every leg (bounds against the Exact reference run with the
// same mask, statistical, local) holds: a leg re-routing with the plain bias would report
// unexplained flips. Repro: --gtest_filter=EmuMoeLayer.tiny_vision_T12_mixed_image_mask.
TEST(EmuMoeLayer, tiny_vision_T12_mixed_image_mask) {
  GenOptions o = preset("tiny", SharedExpertType::kBF16);
  o.vision = true;
  const LayerWeights w = generate_layer(o, 1);
  const int64_t T = 12, K = w.config.topk, dim = w.config.dim;
  const std::vector<uint16_t> x = generate_input(6, T, dim);
  const std::vector<uint8_t> mask = {0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0};
  const emu::MoeLayer layer(w, opts(RouterVariant::kStaged));
  LayerTaps tm;
  const std::vector<uint16_t> ym = layer.forward(x.data(), T, &tm, nullptr, mask.data());
  const std::vector<uint16_t> y0 = layer.forward(x.data(), T);
  EXPECT_EQ(tm.image_mask, mask);
  const Routing want = route_from_logits(
      tm.router_logits.data(), T, RouteBias{w.bias, w.bias_vl, mask.data()}, w.config, w.layer);
  EXPECT_EQ(tm.topk_ids, want.ids);
  for (size_t i = 0; i < want.weights.size(); ++i)
    EXPECT_EQ(f32_bits(tm.topk_weights[i]), f32_bits(want.weights[i])) << "pick " << i;
  const Routing plain = route_from_logits(tm.router_logits.data(), T, w.bias, w.config, w.layer);
  int changed = 0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<uint16_t> one =
        layer.forward(x.data() + t * dim, 1, nullptr, nullptr, mask.data() + t);
    EXPECT_EQ(std::memcmp(one.data(), ym.data() + t * dim, 2 * dim), 0)
        << "token " << t << " alone";
    if (mask[t] == 0)
      EXPECT_EQ(std::memcmp(y0.data() + t * dim, ym.data() + t * dim, 2 * dim), 0)
          << "token " << t << " (not masked) changed";
    else
      changed += !std::equal(plain.ids.begin() + t * K, plain.ids.begin() + (t + 1) * K,
                             want.ids.begin() + t * K);
  }
  EXPECT_GT(changed, 0) << "bias_vl moved no masked token's picks: the test would be vacuous";
  // The legs re-route with the taps' mask: no flip at all (an explained flip would hide a leg
  // that re-routes with the plain bias).
  EXPECT_EQ(check_local(w, tm, RouterVariant::kStaged).flips, 0) << "local leg";
  int flips = -1;
  emutest::check_against_reference(w, x, T, opts(RouterVariant::kStaged),
                                   "tiny_vision_T12_mixed_image_mask layer 1 seed 6", &flips,
                                   mask.data());
  EXPECT_EQ(flips, 0) << "bounds leg";
}

TEST(EmuMoeLayer, RejectsBadWeightsAndOptions) {
  LayerWeights w = generate_layer(preset("tiny", SharedExpertType::kBF16), 0);
  EXPECT_THROW({ const emu::MoeLayer l(w, opts(RouterVariant::kStaged, 3)); }, InputError);
  LayerWeights bad = w;
  bad.down_exps.type = GgmlType::kBF16;
  EXPECT_THROW({ const emu::MoeLayer l(bad, {}); }, InputError);
  bad = w;
  bad.gate_exps.cols = 256;
  EXPECT_THROW({ const emu::MoeLayer l(bad, {}); }, InputError);
  bad = w;
  bad.shared_up.type = GgmlType::kQ2K;  // gate bf16, up K-quant: mixed shared expert
  EXPECT_THROW({ const emu::MoeLayer l(bad, {}); }, InputError);
  bad = w;
  bad.bias = nullptr;
  EXPECT_THROW({ const emu::MoeLayer l(bad, {}); }, InputError);
  // A NaN logit is routing's InputError (it names the token and expert).
  std::vector<uint16_t> x = generate_input(1, 2, w.config.dim);
  x[w.config.dim + 5] = 0x7FC0;
  EXPECT_THROW(emu::MoeLayer(w, {}).forward(x.data(), 2), InputError);
  EXPECT_TRUE(emu::MoeLayer(w, {}).forward(x.data(), 0).empty());
}

// ds41 with the experts that either routing picks generated into calloc'd stacks.
void ds41_vs_reference(int64_t T, uint64_t seed) {
  emutest::LazyLayer lazy(preset_options("ds41"), 0);
  const LayerWeights& w = lazy.weights();
  const std::vector<uint16_t> x = generate_input(seed, T, w.config.dim);
  const emu::LayerOptions o = opts(RouterVariant::kStaged);
  std::vector<float> logits(static_cast<size_t>(T * w.config.n_routed));
  emu::router_gemv(o.router, w.router, x.data(), logits.data(), w.config.n_routed, w.config.dim, T);
  lazy.fill(route_from_logits(logits.data(), T, w.bias, w.config, 0).ids);
  lazy.fill(ref::Gate(w).forward_exact(x.data(), T).ids);
  emutest::check_against_reference(
      w, x, T, o, "ds41_T" + std::to_string(T) + "_staged seed " + std::to_string(seed));
}

TEST(EmuMoeLayer, ds41_T1_vs_reference) { ds41_vs_reference(1, 1); }
TEST(EmuMoeLayer, ds41_T8_vs_reference) { ds41_vs_reference(8, 2); }

}  // namespace
}  // namespace moecheck
