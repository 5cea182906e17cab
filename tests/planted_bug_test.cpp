// The planted-bug suite at the tiny and small sizes (tests/planted_pipeline.h: 22 bugs across
// router, routing, q8_1, MMVQ decode / scales / reduction / edge rows, SwiGLU clamps, accumulate,
// finish and the shared expert, plus 6 legal changes of the arithmetic): every bug caught by a
// reference leg and attributed to its stage, every legal change passing every leg. The pipeline
// without a bug is the emulation bit for bit. ds41: tests/slow/planted_bug_ds41_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "emulate/moe_layer.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "tests/planted_bug_check.h"

namespace moecheck::planted {
namespace {

std::vector<uint16_t> inputs(const LayerWeights& w, uint64_t seed, int64_t seeded) {
  std::vector<uint16_t> x = generate_input(seed, seeded, w.config.dim);
  for (const AdversarialToken& a : adversarial_tokens(w, seed))
    x.insert(x.end(), a.x.begin(), a.x.end());
  return x;
}

TEST(PlantedPipeline, WithoutABugItIsTheEmulationBitForBit) {
  for (const SharedExpertType sh : {SharedExpertType::kBF16, SharedExpertType::kKQuant}) {
    for (const char* preset : {"tiny", "small"}) {
      GenOptions o = preset_options(preset);
      o.shared = sh;
      o.blocks = ExpertBlocks::kRandomValid;  // valid blocks written directly: fast
      const LayerWeights w = generate_layer(o, 0);
      const std::vector<uint16_t> x = inputs(w, 3, 8);
      const int64_t T = 8 + kAdversarialTokens;
      for (const RouterVariant v : {RouterVariant::kStaged, RouterVariant::kPlain}) {
        emu::LayerOptions lo;
        lo.router = v;
        LayerTaps want;
        emu::MoeLayer(w, lo).forward(x.data(), T, &want);
        const LayerTaps got = forward(w, x, T, v, Bug::kNone);
        std::string what;
        EXPECT_TRUE(same_taps(got, want, &what))
            << preset << (sh == SharedExpertType::kBF16 ? " bf16" : " K-quant")
            << " shared, router " << (v == RouterVariant::kPlain ? "plain" : "staged")
            << ": the pipeline differs at " << what;
      }
    }
  }
}

TEST(PlantedBugs, tiny_T8plus4_EveryBugCaughtAtItsStageLegalChangesPass) {
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  run_suite("tiny", w, inputs(w, 1, 8), 8 + kAdversarialTokens, RouterVariant::kStaged);
}

TEST(PlantedBugs, small_T8plus4_EveryBugCaughtAtItsStageLegalChangesPass) {
  GenOptions o = preset_options("small");
  o.shared = SharedExpertType::kKQuant;  // the K-quant shared expert (tiny has the bf16 one)
  o.blocks = ExpertBlocks::kRandomValid;
  const LayerWeights w = generate_layer(o, 0);
  run_suite("small", w, inputs(w, 2, 8), 8 + kAdversarialTokens, RouterVariant::kPlain);
}

// The batched path: 64 tokens on tiny's 16 experts (top-4) give every expert about 16 pairs,
// more than an MMVQ group's 8 (the CUDA driver runs them through MMQ; its twin is the same
// emulation): the pipeline is still the emulation bit for bit, and every bug is caught.
TEST(PlantedBugs, tiny_T60plus4_Batched_EveryBugCaughtAtItsStageLegalChangesPass) {
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  const std::vector<uint16_t> x = inputs(w, 4, 60);
  const int64_t T = 60 + kAdversarialTokens;
  LayerTaps want;
  emu::MoeLayer(w, {}).forward(x.data(), T, &want);
  size_t max_rows = 0;
  for (const ExpertTaps& e : want.experts) max_rows = std::max(max_rows, e.tokens.size());
  ASSERT_GT(max_rows, static_cast<size_t>(kMaxGroupRows)) << "no expert on the batched path";
  std::string what;
  ASSERT_TRUE(same_taps(forward(w, x, T, RouterVariant::kStaged, Bug::kNone), want, &what))
      << "tiny T=64: the pipeline differs at " << what;
  run_suite("tiny T=64", w, x, T, RouterVariant::kStaged);
}

}  // namespace
}  // namespace moecheck::planted
