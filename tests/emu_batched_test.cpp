// The emulated batched layer (T > 8: experts with more than 8 pairs, which the CUDA driver runs
// through MMQ; the emulation computes the same bits through its MMVQ twin): every stage against
// the reference in Exact mode by every leg (tests/emu_layer_check.h) at T = 64 and 65, skewed
// routing included; and the statement of docs/numerics.md "mmvq_q2k, mmvq_q3k" (Batch
// independence): a token's output is the same bits alone, inside a batch, and inside the
// reversed batch. Repro: --gtest_filter=EmuBatched.<name>.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/emu_layer_check.h"

namespace moecheck {
namespace {

emu::LayerOptions staged() {
  emu::LayerOptions o;
  o.router = RouterVariant::kStaged;
  return o;
}

TEST(EmuBatched, tiny_T65_vs_reference) {
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  emutest::check_against_reference(w, generate_input(31, 65, w.config.dim), 65, staged(),
                                   "tiny_T65 seed 31");
}

TEST(EmuBatched, small_T64_randomblocks_vs_reference) {
  GenOptions o = preset_options("small");
  o.blocks = ExpertBlocks::kRandomValid;
  const LayerWeights w = generate_layer(o, 0);
  emutest::check_against_reference(w, generate_input(32, 64, w.config.dim), 64, staged(),
                                   "small_T64_randomblocks seed 32");
}

// Expert 5's bias 1000 above the rest: every token picks it (a run of T pairs).
TEST(EmuBatched, tiny_T64_skewed_vs_reference) {
  LayerWeights w = generate_layer(preset_options("tiny"), 0);
  std::vector<float> bias(w.bias, w.bias + w.config.n_routed);
  bias[5] += 1000.0f;
  w.bias = bias.data();
  emutest::check_against_reference(w, generate_input(33, 64, w.config.dim), 64, staged(),
                                   "tiny_T64_skewed expert 5 seed 33");
}

TEST(EmuBatched, BatchIndependence_T65_AloneInBatchReversed) {
  for (bool skew : {false, true}) {
    LayerWeights w = generate_layer(preset_options("tiny"), 0);
    std::vector<float> bias(w.bias, w.bias + w.config.n_routed);
    if (skew) bias[5] += 1000.0f;
    w.bias = bias.data();
    const int64_t T = 65, dim = w.config.dim;
    const std::vector<uint16_t> x = generate_input(34, T, dim);
    const emu::MoeLayer layer(w, staged());
    const std::vector<uint16_t> all = layer.forward(x.data(), T);
    std::vector<uint16_t> rev(x.size());
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(rev.data() + t * dim, x.data() + (T - 1 - t) * dim, 2 * dim);
    const std::vector<uint16_t> all_rev = layer.forward(rev.data(), T);
    for (int64_t t = 0; t < T; ++t) {
      const std::string where = std::string(skew ? "skewed" : "plain") + " token " +
                                std::to_string(t) + " (--gtest_filter=EmuBatched.Batch*)";
      const std::vector<uint16_t> one = layer.forward(x.data() + t * dim, 1);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + t * dim, 2 * dim), 0) << where << " alone";
      ASSERT_EQ(std::memcmp(all_rev.data() + (T - 1 - t) * dim, all.data() + t * dim, 2 * dim), 0)
          << where << " in the reversed batch";
    }
  }
}

// max_tokens: T up to it runs, a larger T is refused by name, a negative value at construction.
TEST(EmuBatched, MaxTokens_UpToItRuns_LargerRefused) {
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  emu::LayerOptions o = staged();
  o.max_tokens = 12;
  const emu::MoeLayer layer(w, o);
  const std::vector<uint16_t> x = generate_input(35, 13, w.config.dim);
  EXPECT_EQ(layer.forward(x.data(), 12), emu::MoeLayer(w, staged()).forward(x.data(), 12));
  try {
    layer.forward(x.data(), 13);
    ADD_FAILURE() << "T=13 with max_tokens 12 ran (--gtest_filter=EmuBatched.MaxTokens*)";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("T=13 exceeds LayerOptions::max_tokens=12"),
              std::string::npos)
        << e.what();
  }
  o.max_tokens = -1;
  EXPECT_THROW(emu::MoeLayer(w, o), InputError);
}

}  // namespace
}  // namespace moecheck
