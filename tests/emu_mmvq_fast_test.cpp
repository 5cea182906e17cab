// emu::mmvq_groups's fast path (emulate/mmvq_fast.h: an expert's consecutive groups together,
// each weight row decoded once, AVX2 or plain integer parts) against the straightforward
// per-group form emu::mmvq_groups_plain, bit for bit: real plans from build_layer_plan (one
// expert taking every token, the others picked at random), token counts around the group size
// and the lane count (1, 9, 16, 63, 64, 65), ragged K (units not a multiple of 32), NaN / Inf /
// zero / subnormal weight scales, NaN / Inf / zero activation scales and extreme quants, both
// integer kernels, row splits and groups out of slot order. Repro:
// --gtest_filter=EmuMmvqFast.*, the failing case's name is printed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/layer_plan.h"
#include "core/routing.h"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

constexpr int64_t kExperts = 5, kTopk = 2, kRows = 11;

struct Bench {  // one plan, its experts' weights and the activations
  LayerPlan plan;
  std::vector<std::vector<uint8_t>> w;  // per expert [kRows, K]
  std::vector<const uint8_t*> slots;
  std::vector<BlockQ8_1> a;  // [T, K / 32]
};

// Expert 0 takes every token; each token's second pick is random among the others.
Routing make_routing(emutest::Gen& g, int64_t T) {
  Routing r;
  r.tokens = T;
  r.topk = kTopk;
  for (int64_t t = 0; t < T; ++t) {
    r.ids.push_back(static_cast<int32_t>(1 + g.u32() % (kExperts - 1)));
    r.ids.push_back(0);
    r.weights.push_back(0.5f);
    r.weights.push_back(0.5f);
  }
  return r;
}

// q8_1 rows of random values, then every 7th block's d NaN / +-Inf / 0 and every 5th block's
// quants raw random bytes (including -128).
std::vector<BlockQ8_1> make_acts(emutest::Gen& g, int64_t T, int64_t K) {
  std::vector<float> x = g.f32(T * K, 1.0);
  std::vector<BlockQ8_1> a(static_cast<size_t>(T * K / 32));
  emu::quantize_q8_1(x.data(), a.data(), T, K);
  const uint16_t special[4] = {0x7E00, 0x7C00, 0xFC00, 0x0000};
  for (size_t b = 0; b < a.size(); ++b) {
    if (b % 7 == 3) a[b].d = special[g.u32() % 4];
    if (b % 5 == 1)
      for (auto& q : a[b].qs) q = static_cast<int8_t>(g.byte());
  }
  return a;
}

Bench make_bench(GgmlType t, int64_t K, int64_t T, uint64_t seed) {
  emutest::Gen g(seed);
  Bench s;
  s.plan = build_layer_plan(make_routing(g, T), kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    s.w.push_back(emutest::make_rows(g, t, kRows, K, 0.2));
    // A third of the first half of the rows' blocks NaN / Inf, and row 0's first block NaN.
    emutest::sprinkle_nan_inf_scales(g, t, kRows / 2 * K / kQK_K, s.w.back());
    emutest::put_block(g, t, emutest::BlockKind::kNanScale, s.w.back().data());
  }
  s.slots = plan_slots(s.plan, s.w[0].data(), 0, s.w[0].data(), 0, s.w[0].data(), 0);
  // plan_slots with stride 0 points every slot at expert 0: repoint at each used expert's rows.
  const int64_t U = s.plan.n_experts();
  for (int64_t u = 0; u < 3 * U; ++u) s.slots[u] = s.w[s.plan.experts[u % U]].data();
  s.a = make_acts(g, T, K);
  return s;
}

std::string name(GgmlType t, int64_t K, int64_t T, const char* kernel) {
  return std::string(t == GgmlType::kQ2K ? "Q2K" : "Q3K") + " K " + std::to_string(K) + " T " +
         std::to_string(T) + " " + kernel;
}

// Both forms over the gate groups (input rows = tokens, output rows = pair rows); bit equality.
void expect_same(GgmlType t, int64_t K, int64_t T, const Bench& s, const std::string& what,
                 int64_t r0 = 0, int64_t r1 = -1) {
  const int64_t n = s.plan.n_proj_groups, P = s.plan.pairs();
  std::vector<float> fast(static_cast<size_t>(P * kRows), -1.0f), plain(fast);
  emu::mmvq_groups_plain(t, s.slots.data(), s.plan.gate_groups(), n, s.a.data(), plain.data(),
                         kRows, K, r0, r1);
  emu::mmvq_groups(t, s.slots.data(), s.plan.gate_groups(), n, s.a.data(), fast.data(), kRows, K,
                   r0, r1);
  int nan = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    nan += fast[i] != fast[i];
    ASSERT_EQ(f32_bits(fast[i]), f32_bits(plain[i]))
        << what << ": pair row " << i / kRows << " row " << i % kRows << ": fast "
        << emutest::hex(fast[i]) << " vs plain " << emutest::hex(plain[i]) << " (T " << T << ")";
  }
  if (r0 == 0) {
    EXPECT_GT(nan, 0) << what << ": the NaN scales reached no output";
  }
}

class EmuMmvqFast : public ::testing::TestWithParam<GgmlType> {};

TEST_P(EmuMmvqFast, EqualsPerGroupPathBitForBit) {
  const GgmlType t = GetParam();
  for (const int64_t K : {256, 768, 2304}) {
    for (const int64_t T : {1, 9, 16, 63, 64, 65}) {
      const Bench s = make_bench(t, K, T, static_cast<uint64_t>(K * 1000 + T));
      ASSERT_EQ(s.plan.experts.front(), 0);
      ASSERT_EQ(s.plan.first_pair.size() > 1 ? s.plan.first_pair[1] : s.plan.pairs(), T)
          << "expert 0 takes every token";
      emu::set_mmvq_int_kernel(emu::MmvqIntKernel::kAuto);
      expect_same(t, K, T, s, name(t, K, T, "auto"));
      expect_same(t, K, T, s, name(t, K, T, "auto rows 3..9"), 3, 9);
      emu::set_mmvq_int_kernel(emu::MmvqIntKernel::kPortable);
      expect_same(t, K, T, s, name(t, K, T, "portable"));
      emu::set_mmvq_int_kernel(emu::MmvqIntKernel::kAuto);
    }
  }
}

// Groups out of slot order (each slot's groups split into runs) and the plain T-token form.
TEST_P(EmuMmvqFast, GroupOrderAndTokenForm) {
  const GgmlType t = GetParam();
  const int64_t K = 2304, T = 65;
  Bench s = make_bench(t, K, T, 7);
  const int64_t n = s.plan.n_proj_groups, units = K / 32;
  std::vector<MmvqGroup> shuffled(s.plan.gate_groups(), s.plan.gate_groups() + n);
  for (size_t i = 0; i + 1 < shuffled.size(); i += 2) std::swap(shuffled[i], shuffled[i + 1]);
  std::vector<float> fast(static_cast<size_t>(s.plan.pairs() * kRows)), plain(fast.size());
  emu::mmvq_groups(t, s.slots.data(), shuffled.data(), n, s.a.data(), fast.data(), kRows, K);
  emu::mmvq_groups_plain(t, s.slots.data(), shuffled.data(), n, s.a.data(), plain.data(), kRows, K);
  ASSERT_EQ(std::memcmp(fast.data(), plain.data(), fast.size() * 4), 0)
      << name(t, K, T, "groups out of slot order");
  // Expert 0's groups hold every token in order: mmvq over all T tokens gives its pair rows.
  std::vector<float> all(static_cast<size_t>(T * kRows));
  emu::mmvq(t, s.w[0].data(), s.a.data(), all.data(), kRows, K, T);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t r = 0; r < kRows; ++r)
      ASSERT_EQ(f32_bits(all[p * kRows + r]), f32_bits(plain[p * kRows + r]))
          << name(t, K, T, "mmvq T form") << ": token " << p << " row " << r << " (units " << units
          << ")";
}

INSTANTIATE_TEST_SUITE_P(Types, EmuMmvqFast, ::testing::Values(GgmlType::kQ2K, GgmlType::kQ3K),
                         [](const auto& i) {
                           return std::string(i.param == GgmlType::kQ2K ? "Q2K" : "Q3K");
                         });

}  // namespace
}  // namespace moecheck
