// The planted-bug suite at the ds41 size (dim 5120, inter 2304, 384 experts, top 6; the whole
// layer generated in memory, about 5 GB): 2 seeded tokens and the layer's 4 adversarial tokens,
// every bug caught at its stage, every legal change passing (tests/planted_bug_check.h). Label
// slow: a few minutes on 2 cores.
#include <gtest/gtest.h>

#include "golden/adversarial.h"
#include "golden/generator.h"
#include "tests/planted_bug_check.h"

namespace moecheck::planted {
namespace {

TEST(PlantedBugs, ds41_T2plus4_EveryBugCaughtAtItsStageLegalChangesPass) {
  const LayerWeights w = generate_layer(preset_options("ds41"), 0);
  std::vector<uint16_t> x = generate_input(4, 2, w.config.dim);
  for (const AdversarialToken& a : adversarial_tokens(w, 4)) {
    EXPECT_TRUE(a.made) << "ds41 adversarial token " << a.name << " not made";
    x.insert(x.end(), a.x.begin(), a.x.end());
  }
  run_suite("ds41", w, x, 2 + kAdversarialTokens, RouterVariant::kStaged);
}

}  // namespace
}  // namespace moecheck::planted
