// cuda::swiglu_q8 (h and its q8_1 blocks) and cuda::swiglu_bf16 vs emu::swiglu_q8, bitwise:
// >= 100 seeded random cases with limits 0 (no clamp) and 10 (ds41), adversarial g, u (NaN,
// +-Inf, values at +-limit, large negatives where pexp overflows, subnormals), twice each.
// Contract: docs/numerics.md "swiglu_q8".
#include <cmath>

#include "cuda/kernels.h"
#include "emulate/swiglu_q8.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;

void adversarial(emutest::Gen& g, std::vector<float>& v, float limit) {
  const float pick[] = {std::nanf(""), INFINITY, -INFINITY, limit, -limit,
                        -100.0f,       100.0f,   1e-40f,    -0.0f, 89.0f};
  for (size_t i = 0; i < v.size(); i += 1 + g.u32() % 13) v[i] = pick[g.u32() % 10];
}

TEST(SwigluQ8, EqualsEmu_100Seeds_Limits0And10) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed * 31337);
    const int64_t R = 1 + g.u32() % 9, inter = 32 * (1 + static_cast<int64_t>(g.u32() % 80));
    const float limit = seed % 2 == 0 ? 10.0f : 0.0f;
    auto gg = g.f32(R * inter, 4.0), uu = g.f32(R * inter, 4.0);
    if (seed % 3 == 0) {
      adversarial(g, gg, limit);
      adversarial(g, uu, limit);
    }
    std::vector<float> h(gg.size());
    std::vector<BlockQ8_1> hq(static_cast<size_t>(R * inter / kQK8_1));
    emu::swiglu_q8(gg.data(), uu.data(), h.data(), hq.data(), R, inter, limit);
    DevArray<float> dg(gg), du(uu), dh(h.size());
    DevArray<BlockQ8_1> dq(hq.size());
    const std::string r = gputest::repro(seed * 31337, "limit=" + std::to_string(limit));
    for (int run = 0; run < 2; ++run) {
      dh.poison();
      dq.poison();
      cuda::swiglu_q8(dg.get(), du.get(), dh.get(), dq.get(), R, inter, limit, nullptr);
      ASSERT_TRUE(gputest::same_f32("h", dh.host(), h, inter, r));
      ASSERT_TRUE(gputest::same_q8("h_q8", dq.host(), hq, inter / kQK8_1, r));
    }
    // The bf16 shared-expert form: the same h, then f32_to_bf16.
    DevArray<uint16_t> dhb(h.size());
    dh.poison();
    cuda::swiglu_bf16(dg.get(), du.get(), dh.get(), dhb.get(), R, inter, limit, nullptr);
    std::vector<uint16_t> hb(h.size());
    for (size_t i = 0; i < h.size(); ++i) hb[i] = f32_to_bf16(h[i]);
    ASSERT_TRUE(gputest::same_f32("h (swiglu_bf16)", dh.host(), h, inter, r));
    ASSERT_TRUE(gputest::same_u16("h bf16", dhb.host(), hb, inter, r));
  }
}

}  // namespace
}  // namespace moecheck
