// RouteBias (core/routing.h): model.py Gate.forward's image-span bias in the host routing. Image
// tokens select with bias_vl, the others with bias; a mask without bias_vl (or bias_vl without a
// mask) changes nothing; from() slices the mask; a NaN in bias_vl reaches only image tokens.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"

namespace moecheck {
namespace {

// RouteBias (model.py Gate.forward: torch.where(image_mask, bias_vl, bias)). Every token has the
// same logits, so only its bias can move a pick: bias lifts experts 0, 1 and bias_vl experts 4, 5.
// Repro: routing_test --gtest_filter='RouteBias*'.
struct MaskCase {
  MoeConfig c;
  std::vector<float> row = {0.5f, 0.25f, 0.75f, 0.0f, 0.125f, -0.25f}, z;
  std::vector<float> b = {1, 1, 0, 0, 0, 0}, bvl = {0, 0, 0, 0, 1, 1};
  std::vector<uint8_t> mask = {0, 1, 0, 1};
  MaskCase() {
    c.n_routed = 6, c.topk = 2, c.route_scale = 1.5f;
    for (size_t t = 0; t < mask.size(); ++t) z.insert(z.end(), row.begin(), row.end());
  }
};

void expect_token_routes_as(const Routing& r, int64_t t, const Routing& one, const char* what) {
  const int64_t K = r.topk, n = static_cast<int64_t>(r.scores.size()) / r.tokens;
  for (int64_t j = 0; j < K; ++j) {
    EXPECT_EQ(r.ids[t * K + j], one.ids[j]) << "token " << t << " pick " << j << ": " << what;
    EXPECT_EQ(f32_bits(r.weights[t * K + j]), f32_bits(one.weights[j])) << "token " << t << what;
  }
  for (int64_t e = 0; e < n; ++e)  // the scores never see a bias
    EXPECT_EQ(f32_bits(r.scores[t * n + e]), f32_bits(one.scores[e])) << "token " << t;
}

TEST(RouteBias, ImageTokensSelectWithBiasVlOthersWithBias_T4_E6_K2) {
  const MaskCase k;
  const Routing rb = route_from_logits(k.row.data(), 1, k.b.data(), k.c, 2);
  const Routing rv = route_from_logits(k.row.data(), 1, k.bvl.data(), k.c, 2);
  ASSERT_EQ(rb.ids, (std::vector<int32_t>{0, 1})) << "bias must lift experts 0, 1";
  ASSERT_EQ(rv.ids, (std::vector<int32_t>{4, 5})) << "bias_vl must lift experts 4, 5";
  const Routing r =
      route_from_logits(k.z.data(), 4, RouteBias{k.b.data(), k.bvl.data(), k.mask.data()}, k.c, 2);
  for (int64_t t = 0; t < 4; ++t)
    expect_token_routes_as(r, t, k.mask[t] ? rv : rb, k.mask[t] ? " (image: bias_vl)" : " (bias)");
}

// model.py applies bias_vl only when both the mask and bias_vl exist: either alone is no effect.
TEST(RouteBias, MaskWithoutBiasVlOrBiasVlWithoutMaskChangesNothing_T4_E6_K2) {
  const MaskCase k;
  const Routing no_vl =
      route_from_logits(k.z.data(), 4, RouteBias{k.b.data(), nullptr, k.mask.data()}, k.c, 2);
  const Routing no_mask =
      route_from_logits(k.z.data(), 4, RouteBias{k.b.data(), k.bvl.data(), nullptr}, k.c, 2);
  const Routing plain = route_from_logits(k.row.data(), 1, k.b.data(), k.c, 2);
  for (int64_t t = 0; t < 4; ++t) {
    expect_token_routes_as(no_vl, t, plain, " (mask, no bias_vl)");
    expect_token_routes_as(no_mask, t, plain, " (bias_vl, no mask)");
  }
}

// from(first) slices the mask (one token routed alone keeps its bias), and a NaN in bias_vl is an
// error only for the tokens that select with it.
TEST(RouteBias, FromSlicesTheMaskAndNanInBiasVlHitsOnlyImageTokens_T4_E6_K2) {
  MaskCase k;
  const RouteBias rb{k.b.data(), k.bvl.data(), k.mask.data()};
  const Routing all = route_from_logits(k.z.data(), 4, rb, k.c, 2);
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(rb.from(t).of(0), rb.of(t)) << "token " << t;
    expect_token_routes_as(all, t, route_from_logits(k.z.data() + t * 6, 1, rb.from(t), k.c, 2),
                           " (routed alone)");
  }
  k.bvl[3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> none(4, 0);
  EXPECT_NO_THROW(
      route_from_logits(k.z.data(), 4, RouteBias{k.b.data(), k.bvl.data(), none.data()}, k.c, 2));
  try {
    route_from_logits(k.z.data(), 4, RouteBias{k.b.data(), k.bvl.data(), k.mask.data()}, k.c, 2);
    FAIL() << "no InputError for the NaN in bias_vl";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("layer 2 token 1 expert 3"), std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace moecheck
