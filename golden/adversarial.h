// Adversarial tokens crafted from a layer's weights, so that every edge case of the layer happens
// in a plain run: the SwiGLU clamps from both sides (a token scaled until, in its picked experts,
// gate passes +L and -L and up passes both sides), the zero token (all logits equal: with the
// generator's bias, an exact routing tie at the top-k boundary), a near tie (the zero token's
// direction plus a tiny seeded token: the tied pair is decided by logits a few ulps apart) and
// routing where model.py's +1e-20 matters (a token anti-aligned with every router row, so every
// logit / gate_temp is about -75 or below under sqrt-softplus, -40 under sigmoid; never under
// softmax).
// Each token says what it was made for; the check report measures what actually happened
// (compare/check.h). Contract: docs/cli.md "check" (adversarial inputs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer_weights.h"

namespace moecheck {

// The adversarial tokens, always in this order and number (so every layer of a dump has the
// same token count).
inline constexpr int kAdversarialTokens = 4;
inline constexpr const char* kAdversarialNames[kAdversarialTokens] = {"clamps", "zero", "near-tie",
                                                                      "eps"};

struct AdversarialToken {
  std::string name;         // one of kAdversarialNames
  bool made = false;        // false: the layer cannot make it (a clamp no scale reaches, the
                            // +1e-20 under softmax); x is then the closest attempt, or zero
  std::vector<uint16_t> x;  // bf16 [dim]
};

// The layer's adversarial tokens, deterministic in (weights, seed).
std::vector<AdversarialToken> adversarial_tokens(const LayerWeights& w, uint64_t seed);

}  // namespace moecheck
