// emu::mmvq / emu::mmvq_experts (docs/numerics.md "mmvq_q2k, mmvq_q3k"): bit equality with a
// literal replay of the contract (tests/emu_test_util.h, per-element decoders), the derived
// bound against an f64 product on the dequantised weights, independence from the token count and
// from the launch form, NaN propagation, adversarial blocks (d = 0, subnormal d, all-max
// sub-scales). Configs are named Q2K_K2304_R8_T3 etc.; repro: --gtest_filter=EmuMmvq*.<name>.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

struct Case {
  GgmlType t;
  int64_t K, rows, T;
  double adversarial;
  std::string name() const {
    return std::string(t == GgmlType::kQ2K ? "Q2K" : "Q3K") + "_K" + std::to_string(K) + "_R" +
           std::to_string(rows) + "_T" + std::to_string(T) + (adversarial > 0 ? "_adv" : "");
  }
};

struct Data {
  std::vector<uint8_t> w;
  std::vector<float> x;
  std::vector<BlockQ8_1> a;
  std::vector<float> y;
};

Data make(const Case& c, uint64_t seed) {
  emutest::Gen g(seed);
  Data d;
  d.w = emutest::make_rows(g, c.t, c.rows, c.K, c.adversarial);
  d.x = g.f32(c.T * c.K, 1.0);
  d.a.resize(static_cast<size_t>(c.T * c.K / 32));
  emu::quantize_q8_1(d.x.data(), d.a.data(), c.T, c.K);
  d.y.assign(static_cast<size_t>(c.T * c.rows), 0.0f);
  emu::mmvq(c.t, d.w.data(), d.a.data(), d.y.data(), c.rows, c.K, c.T);
  return d;
}

class EmuMmvq : public ::testing::TestWithParam<Case> {};

TEST_P(EmuMmvq, EqualsContractReplayAndBound) {
  const Case c = GetParam();
  const Data d = make(c, 11);
  const int64_t rb = row_bytes(c.t, c.K), units = c.K / 32;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t r = 0; r < c.rows; ++r) {
      const float got = d.y[t * c.rows + r];
      const float want =
          emutest::mmvq_replay(c.t, d.w.data() + r * rb, d.a.data() + t * units, c.K);
      ASSERT_EQ(f32_bits(got), f32_bits(want))
          << c.name() << " row " << r << " token " << t << ": " << emutest::hex(got)
          << " vs replay " << emutest::hex(want);
      const emutest::Bounded e = emutest::mmvq_exact_bound(
          c.t, d.w.data() + r * rb, d.a.data() + t * units, d.x.data() + t * c.K, c.K);
      ASSERT_LE(std::fabs(got - e.exact), e.bound)
          << c.name() << " row " << r << " token " << t << ": emu " << got << " exact " << e.exact;
    }
  }
}

TEST_P(EmuMmvq, IndependentOfTokenCountAndLaunchForm) {
  const Case c = GetParam();
  const Data d = make(c, 12);
  const int64_t units = c.K / 32;
  std::vector<float> one(static_cast<size_t>(c.rows));
  for (int64_t t = 0; t < c.T; ++t) {
    emu::mmvq(c.t, d.w.data(), d.a.data() + t * units, one.data(), c.rows, c.K, 1);
    ASSERT_EQ(std::memcmp(one.data(), d.y.data() + t * c.rows, one.size() * 4), 0)
        << c.name() << " token " << t;
  }
  // The one-token multi-expert form: rows split into two "experts" at non-contiguous pointers.
  const int64_t half = c.rows / 2, rb = row_bytes(c.t, c.K);
  std::vector<uint8_t> e1(d.w.begin() + half * rb, d.w.end());
  const uint8_t* ptrs[2] = {d.w.data(), e1.data()};
  std::vector<float> y2(static_cast<size_t>(2 * half));
  emu::mmvq_experts(c.t, ptrs, 2, d.a.data(), false, y2.data(), half, c.K);
  ASSERT_EQ(std::memcmp(y2.data(), d.y.data(), y2.size() * 4), 0) << c.name();
  // Twice, bitwise.
  const Data again = make(c, 12);
  ASSERT_EQ(std::memcmp(again.y.data(), d.y.data(), d.y.size() * 4), 0) << c.name();
}

INSTANTIATE_TEST_SUITE_P(
    Configs, EmuMmvq,
    ::testing::Values(Case{GgmlType::kQ2K, 256, 4, 2, 0.0}, Case{GgmlType::kQ3K, 256, 4, 2, 0.0},
                      Case{GgmlType::kQ2K, 2304, 8, 3, 0.0}, Case{GgmlType::kQ3K, 2304, 8, 3, 0.0},
                      Case{GgmlType::kQ2K, 5120, 6, 2, 0.0}, Case{GgmlType::kQ3K, 5120, 6, 2, 0.0},
                      Case{GgmlType::kQ2K, 2304, 8, 2, 0.3}, Case{GgmlType::kQ3K, 2304, 8, 2, 0.3},
                      Case{GgmlType::kQ2K, 512, 4, 9, 0.0}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

TEST(EmuMmvqEdge, NaNScaleOrActivationPropagates) {
  emutest::Gen g(5);
  for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
    std::vector<uint8_t> w = emutest::make_rows(g, t, 2, 512);
    // Row 0's second block gets a NaN d (f16 0x7E00); row 1 stays finite.
    const size_t doff = t == GgmlType::kQ2K ? offsetof(BlockQ2K, d) : offsetof(BlockQ3K, d);
    const uint16_t nan16 = 0x7E00;
    std::memcpy(w.data() + row_bytes(t, 256) + doff, &nan16, 2);
    std::vector<float> x = g.f32(512, 1.0);
    std::vector<BlockQ8_1> a(16);
    emu::quantize_q8_1(x.data(), a.data(), 1, 512);
    float y[2];
    emu::mmvq(t, w.data(), a.data(), y, 2, 512, 1);
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_TRUE(std::isfinite(y[1]));
    x[300] = std::nanf("");  // poisons activation block 9 -> every row
    emu::quantize_q8_1(x.data(), a.data(), 1, 512);
    emu::mmvq(t, w.data(), a.data(), y, 2, 512, 1);
    EXPECT_TRUE(std::isnan(y[1]));
  }
}

// NaN and +-Inf scales in any field (d; Q2_K's dmin too) follow IEEE through the contract's
// operations: the emulation equals the literal replay bit for bit on rows where a third of the
// blocks carry one, and such rows do produce NaN and +-Inf outputs (checked, so the GPU test that
// uses the same kinds, tests/gpu/mmvq_test.cu, is not vacuous).
TEST(EmuMmvqEdge, NanAndInfScalesEqualTheReplay_Q2K_Q3K_64Rows) {
  for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
    emutest::Gen g(77 + static_cast<int>(t));
    const int64_t K = 512, rows = 60, rb = row_bytes(t, K);
    std::vector<uint8_t> w = emutest::make_rows(g, t, rows, K, 0.0);
    emutest::sprinkle_nan_inf_scales(g, t, rows * (K / kQK_K), w);
    emutest::append_inf_rows(g, t, 4, K, w);  // rows 60..63: +Inf, -Inf, +Inf, -Inf
    std::vector<float> x = g.f32(K, 1.0);
    for (float& v : x) v = std::fabs(v) + 0.25f;  // positive activations
    std::vector<BlockQ8_1> a(static_cast<size_t>(K / kQK8_1));
    emu::quantize_q8_1(x.data(), a.data(), 1, K);
    std::vector<float> y(static_cast<size_t>(rows + 4));
    emu::mmvq(t, w.data(), a.data(), y.data(), rows + 4, K, 1);
    for (int64_t r = rows; r < rows + 4; ++r)
      EXPECT_EQ(y[r], (r - rows) % 2 ? -INFINITY : INFINITY) << "row " << r;
    int nan = 0, inf = 0;
    for (int64_t r = 0; r < rows + 4; ++r) {
      EXPECT_EQ(f32_bits(y[r]), f32_bits(emutest::mmvq_replay(t, w.data() + r * rb, a.data(), K)))
          << (t == GgmlType::kQ2K ? "Q2K" : "Q3K") << " row " << r;
      nan += std::isnan(y[r]);
      inf += std::isinf(y[r]);
    }
    EXPECT_GT(nan, 0);
    EXPECT_GE(inf, 4);
    std::printf("%s: %d NaN and %d Inf outputs of %lld rows\n", t == GgmlType::kQ2K ? "Q2K" : "Q3K",
                nan, inf, static_cast<long long>(rows + 4));
  }
}

TEST(EmuMmvqEdge, AdversarialBlocksEachKind) {
  // One kind at a time over whole rows: zero d gives only the min term (Q2_K) or exactly 0
  // (Q3_K); subnormal and all-max scales stay within the bound and equal the replay.
  for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
    for (auto kind : {emutest::BlockKind::kZeroScale, emutest::BlockKind::kSubnormalScale,
                      emutest::BlockKind::kAllMaxSub}) {
      emutest::Gen g(100 + static_cast<int>(kind));
      std::vector<uint8_t> w(static_cast<size_t>(row_bytes(t, 1024)));
      for (int b = 0; b < 4; ++b)
        emutest::put_block(
            g, t, kind, w.data() + b * (t == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K)));
      std::vector<float> x = g.f32(1024, 3.0);
      std::vector<BlockQ8_1> a(32);
      emu::quantize_q8_1(x.data(), a.data(), 1, 1024);
      float y = 0;
      emu::mmvq(t, w.data(), a.data(), &y, 1, 1024, 1);
      const std::string where = std::string(t == GgmlType::kQ2K ? "Q2K" : "Q3K") + " kind " +
                                std::to_string(static_cast<int>(kind));
      EXPECT_EQ(f32_bits(y), f32_bits(emutest::mmvq_replay(t, w.data(), a.data(), 1024))) << where;
      const emutest::Bounded e = emutest::mmvq_exact_bound(t, w.data(), a.data(), x.data(), 1024);
      EXPECT_LE(std::fabs(y - e.exact), e.bound) << where;
      if (kind == emutest::BlockKind::kZeroScale && t == GgmlType::kQ3K) {
        EXPECT_EQ(y, 0.0f) << where;
      }
    }
  }
}

// Any K (256 .. 2048), any share of adversarial blocks, any activation scale: the fast path
// equals the literal replay bitwise, and finite results stay within the bound.
RC_GTEST_PROP(EmuMmvqProp, FastPathEqualsReplayAndBound, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const GgmlType t = *rc::gen::element(GgmlType::kQ2K, GgmlType::kQ3K);
  const int64_t K = 256 * *rc::gen::inRange(1, 9);
  const double adv = *rc::gen::element(0.0, 0.25, 1.0);
  const double sigma = std::pow(10.0, *rc::gen::inRange(-6, 4));
  emutest::Gen g(seed);
  const std::vector<uint8_t> w = emutest::make_rows(g, t, 2, K, adv);
  const std::vector<float> x = g.f32(K, sigma);
  std::vector<BlockQ8_1> a(static_cast<size_t>(K / 32));
  emu::quantize_q8_1(x.data(), a.data(), 1, K);
  float y[2];
  emu::mmvq(t, w.data(), a.data(), y, 2, K, 1);
  const std::string repro = "seed " + std::to_string(seed) + " K " + std::to_string(K);
  for (int r = 0; r < 2; ++r) {
    const uint8_t* row = w.data() + r * row_bytes(t, K);
    RC_ASSERT(f32_bits(y[r]) == f32_bits(emutest::mmvq_replay(t, row, a.data(), K)));
    const emutest::Bounded e = emutest::mmvq_exact_bound(t, row, a.data(), x.data(), K);
    if (!(std::fabs(y[r] - e.exact) <= e.bound)) RC_FAIL(repro + ": outside the bound");
  }
}

// The layer's form: groups over a slot table, any row range, equal to the plain form per
// (row, token); groups larger than 8 rows and bad row ranges are refused.
TEST(EmuMmvqGroups, EqualsPlainPerRowAndAnyRowSplit_Q2K_Q3K) {
  for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
    emutest::Gen g(77 + static_cast<uint64_t>(t));
    const int64_t K = 512, rows = 9, A = 5;
    std::vector<std::vector<uint8_t>> mats;
    std::vector<const uint8_t*> slots;
    for (int s = 0; s < 3; ++s) mats.push_back(emutest::make_rows(g, t, rows, K, 0.25));
    for (const auto& m : mats) slots.push_back(m.data());
    const std::vector<float> x = g.f32(A * K, 1.0);
    std::vector<BlockQ8_1> a(static_cast<size_t>(A * K / 32));
    emu::quantize_q8_1(x.data(), a.data(), A, K);
    std::vector<MmvqGroup> groups(4);
    int32_t y_next = 0;
    for (auto& gr : groups) {
      gr.slot = static_cast<int32_t>(g.u32() % 3);
      gr.n = static_cast<int32_t>(1 + g.u32() % kMaxGroupRows);
      for (int i = 0; i < gr.n; ++i) {
        gr.a_row[i] = static_cast<int32_t>(g.u32() % A);
        gr.y_row[i] = y_next++;
      }
    }
    std::vector<float> y(static_cast<size_t>(y_next * rows)), split(y.size());
    emu::mmvq_groups(t, slots.data(), groups.data(), 4, a.data(), y.data(), rows, K);
    emu::mmvq_groups(t, slots.data(), groups.data(), 4, a.data(), split.data(), rows, K, 0, 4);
    emu::mmvq_groups(t, slots.data(), groups.data(), 4, a.data(), split.data(), rows, K, 4, rows);
    ASSERT_EQ(std::memcmp(y.data(), split.data(), y.size() * 4), 0) << "row split changed bits";
    for (const auto& gr : groups) {
      for (int i = 0; i < gr.n; ++i) {
        std::vector<float> one(static_cast<size_t>(rows));
        emu::mmvq(t, slots[gr.slot], a.data() + gr.a_row[i] * (K / 32), one.data(), rows, K, 1);
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(f32_bits(y[gr.y_row[i] * rows + r]), f32_bits(one[r]))
              << "slot " << gr.slot << " row " << r;
      }
    }
    groups[0].n = 9;
    EXPECT_THROW(emu::mmvq_groups(t, slots.data(), groups.data(), 1, a.data(), y.data(), rows, K),
                 InputError);
    groups[0].n = 1;
    EXPECT_THROW(
        emu::mmvq_groups(t, slots.data(), groups.data(), 1, a.data(), y.data(), rows, K, 5, 4),
        InputError);
  }
}

TEST(EmuMmvqEdge, RejectsBadShapes) {
  std::vector<uint8_t> w(84);
  BlockQ8_1 a[8]{};
  float y = 0;
  EXPECT_THROW(emu::mmvq(GgmlType::kQ2K, w.data(), a, &y, 1, 128, 1), InputError);
  EXPECT_THROW(emu::mmvq(GgmlType::kBF16, w.data(), a, &y, 1, 256, 1), InputError);
}

}  // namespace
}  // namespace moecheck
