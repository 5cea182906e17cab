// cuda::mmvq (plain, one-token experts, groups) vs emu::mmvq / emu::mmvq_experts, bitwise, for
// Q2_K and Q3_K at 2, 4 and 8 warps: >= 100 seeded random cases per type and warps, weight bases
// at 2-byte offsets (unaligned staging), adversarial blocks (zero, subnormal f16 scales, all-max
// sub-scales), activations with NaN, large and zero blocks, and each launch twice.
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k".
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>

#include "core/error.h"
#include "cuda/kernels.h"
#include "cuda/mmvq_sb.cuh"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/mmvq_cases.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::make_act;
using gputest::OffsetCopy;
using gputest::same_f32;

// Engine codes of the tests: 0 the dp4a kernel; 4 and 6 the tensor-core engine with bulk copies
// and 4 / 6 tile stages, 14 the same with 16-byte cp.async copies; 20 the streamed engine (the
// default) in its default shape, 42 it at 4 warps x 2 stages, 83 at 8 x 3, 124 at 12 x 4 (every
// engine but dp4a takes one-token launches only; launches with larger groups still take the dp4a
// kernel); 1000 s + code: the streamed engine's code with steps of s super-blocks forced (4: a
// block a class, 8: two; cuda::set_mmvq_stream_step), so both forms run whatever the default
// picks.
void set_engine(int e) {
  cuda::set_mmvq_stream_step(e / 1000);
  e %= 1000;
  if (e == 0) {
    cuda::set_mmvq_engine(cuda::MmvqEngine::kDp4a);
  } else if (e < 20) {
    cuda::set_mmvq_engine(cuda::MmvqEngine::kTensorCore, e % 10, e / 10);
  } else {
    cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
    cuda::set_mmvq_stream_shape(e == 20 ? 0 : e / 10, e == 20 ? 0 : e % 10);
  }
}

void reset_engine() {
  cuda::set_mmvq_stream_step(0);
  cuda::set_mmvq_stream_pass_shape(0, false);
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
  cuda::set_mmvq_stream_shape(0, 0);
  cuda::set_mmvq_rows_per_warp(0);
}

std::string engine_name(int e) {
  if (e >= 1000) return engine_name(e % 1000) + "_step" + std::to_string(e / 1000);
  if (e == 0) return "dp4a";
  if (e < 10) return "tc_bulk" + std::to_string(e);
  if (e < 20) return "tc_async";
  if (e == 20) return "streamed";
  return "streamed_w" + std::to_string(e / 10) + "s" + std::to_string(e % 10);
}

// (type, warps, engine code).
class MmvqTest : public ::testing::TestWithParam<std::tuple<GgmlType, int, int>> {
 protected:
  void SetUp() override { set_engine(std::get<2>(GetParam())); }
  void TearDown() override { reset_engine(); }
};

TEST_P(MmvqTest, PlainEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  const auto [type, warps, engine] = GetParam();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed * 7919 + static_cast<uint64_t>(type) * 31 + static_cast<uint64_t>(warps) +
                   static_cast<uint64_t>(engine) * 1009);
    const int64_t K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 9));
    const int64_t rows = 1 + g.u32() % 37;
    const int64_t T = 1 + g.u32() % 11;  // crosses the 8-row group boundary
    const bool adv = seed % 2 == 0;
    const auto w = emutest::make_rows(g, type, rows, K, adv ? 0.3 : 0.0);
    const auto a = make_act(g, T, K, adv);
    std::vector<float> want(static_cast<size_t>(T * rows));
    emu::mmvq(type, w.data(), a.data(), want.data(), rows, K, T);
    const OffsetCopy dw(w, 2 * (seed % 8));
    DevArray<BlockQ8_1> da(a);
    DevArray<float> dy(want.size());
    cuda::mmvq(type, dw.p, da.get(), dy.get(), rows, K, T, warps, nullptr);
    const auto first = dy.host();
    const std::string r =
        gputest::repro(seed, "K=" + std::to_string(K) + " rows=" + std::to_string(rows) +
                                 " T=" + std::to_string(T));
    ASSERT_TRUE(same_f32("mmvq", first, want, rows, r));
    // The second run with one row per warp: the dp4a kernel's fallback where two rows' tiles do
    // not fit (the launches the other engines take run again unchanged): the same bits.
    dy.poison();
    cuda::set_mmvq_rows_per_warp(1);
    cuda::mmvq(type, dw.p, da.get(), dy.get(), rows, K, T, warps, nullptr);
    cuda::set_mmvq_rows_per_warp(0);
    ASSERT_TRUE(same_f32("mmvq (second run, one row per warp)", dy.host(), first, rows, r));
  }
}

TEST_P(MmvqTest, ExpertsEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  const auto [type, warps, engine] = GetParam();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed * 104729 + static_cast<uint64_t>(type) * 17 + static_cast<uint64_t>(warps) +
                   static_cast<uint64_t>(engine) * 1009);
    // 1 .. 12 super-blocks a row: the streamed engine's steps of 4 and its last 1 - 3.
    const int64_t K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 12));
    const int64_t rows = 1 + g.u32() % 20;
    const int64_t n = 1 + g.u32() % 12;
    const bool per_expert = seed % 2 == 1;
    const int64_t rb = row_bytes(type, K);
    // All experts in one buffer, each at its own 2-byte offset: slot pointers, not a stack.
    std::vector<uint8_t> all;
    std::vector<size_t> offs;
    for (int64_t i = 0; i < n; ++i) {
      all.resize(all.size() + 2 * (g.u32() % 8));
      offs.push_back(all.size());
      const auto w = emutest::make_rows(g, type, rows, K, seed % 3 == 0 ? 0.3 : 0.0);
      all.insert(all.end(), w.begin(), w.end());
    }
    const auto a = make_act(g, per_expert ? n : 1, K, seed % 3 == 0);
    std::vector<const uint8_t*> hp;
    for (size_t o : offs) hp.push_back(all.data() + o);
    std::vector<float> want(static_cast<size_t>(n * rows));
    emu::mmvq_experts(type, hp.data(), n, a.data(), per_expert, want.data(), rows, K);
    DevArray<uint8_t> dall(all);
    std::vector<const uint8_t*> dp;
    for (size_t o : offs) dp.push_back(dall.get() + o);
    DevArray<const uint8_t*> dtab(dp);
    DevArray<BlockQ8_1> da(a);
    DevArray<float> dy(want.size());
    cuda::mmvq_experts(type, dtab.get(), n, da.get(), per_expert, dy.get(), rows, K, warps,
                       nullptr);
    const std::string r = gputest::repro(
        seed, "n=" + std::to_string(n) + " K=" + std::to_string(K) + " rb=" + std::to_string(rb));
    const auto first = dy.host();
    ASSERT_TRUE(same_f32("mmvq_experts", first, want, rows, r));
    dy.poison();
    cuda::mmvq_experts(type, dtab.get(), n, da.get(), per_expert, dy.get(), rows, K, warps,
                       nullptr);
    ASSERT_TRUE(same_f32("mmvq_experts (second run)", dy.host(), first, rows, r));
  }
}

// Groups with arbitrary activation / output rows (the layer's form) equal the plain emulation
// row by row: no (row, token) result depends on the grouping.
TEST_P(MmvqTest, GroupsEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  const auto [type, warps, engine] = GetParam();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed * 15485863 + static_cast<uint64_t>(type) + static_cast<uint64_t>(warps) +
                   static_cast<uint64_t>(engine) * 1009);
    const int64_t K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 10));
    const int64_t rows = 1 + g.u32() % 17;
    const int64_t n_slots = 1 + g.u32() % 4, A = 1 + g.u32() % 12;
    std::vector<std::vector<uint8_t>> mats;
    for (int64_t s = 0; s < n_slots; ++s) mats.push_back(emutest::make_rows(g, type, rows, K, 0.1));
    const auto a = make_act(g, A, K, seed % 4 == 0);
    std::vector<MmvqGroup> groups(1 + g.u32() % 6);
    int32_t y_next = 0;
    for (auto& gr : groups) {
      gr.slot = static_cast<int32_t>(g.u32() % n_slots);
      gr.n = static_cast<int32_t>(1 + g.u32() % kMaxGroupRows);
      if (seed % 2 == 1) gr.n = 1;  // one-token groups: the tensor-core engine's form
      for (int i = 0; i < gr.n; ++i) {
        gr.a_row[i] = static_cast<int32_t>(g.u32() % A);
        gr.y_row[i] = y_next++;
      }
    }
    int max_n = 1;
    for (const auto& gr : groups) max_n = std::max(max_n, static_cast<int>(gr.n));
    std::vector<float> want(static_cast<size_t>(y_next * rows));
    std::vector<const uint8_t*> host_slots;
    for (const auto& m : mats) host_slots.push_back(m.data());
    emu::mmvq_groups(type, host_slots.data(), groups.data(), static_cast<int64_t>(groups.size()),
                     a.data(), want.data(), rows, K);
    std::vector<std::unique_ptr<DevArray<uint8_t>>> dm;
    std::vector<const uint8_t*> dp;
    for (const auto& m : mats) {
      dm.push_back(std::make_unique<DevArray<uint8_t>>(m));
      dp.push_back(dm.back()->get());
    }
    DevArray<const uint8_t*> dtab(dp);
    DevArray<MmvqGroup> dg(groups);
    DevArray<BlockQ8_1> da(a);
    DevArray<float> dy(want.size());
    cuda::mmvq_groups(type, dtab.get(), dg.get(), static_cast<int64_t>(groups.size()), max_n,
                      da.get(), dy.get(), rows, K, warps, nullptr);
    ASSERT_TRUE(same_f32("mmvq_groups", dy.host(), want, rows, gputest::repro(seed)));
    dy.poison();
    cuda::set_mmvq_rows_per_warp(1);
    cuda::mmvq_groups(type, dtab.get(), dg.get(), static_cast<int64_t>(groups.size()), max_n,
                      da.get(), dy.get(), rows, K, warps, nullptr);
    cuda::set_mmvq_rows_per_warp(0);
    ASSERT_TRUE(
        same_f32("mmvq_groups (one row per warp)", dy.host(), want, rows, gputest::repro(seed)));
    // The streamed engine's passes of one token (its default for layers of up to 8 tokens; this
    // launch's unknown layer_tokens gave two), with a multiprocessor's whole shared memory.
    dy.poison();
    cuda::set_mmvq_stream_pass_shape(1, true);
    cuda::mmvq_groups(type, dtab.get(), dg.get(), static_cast<int64_t>(groups.size()), max_n,
                      da.get(), dy.get(), rows, K, warps, nullptr);
    cuda::set_mmvq_stream_pass_shape(0, false);
    ASSERT_TRUE(same_f32("mmvq_groups (streamed: one token a pass, whole SM)", dy.host(), want,
                         rows, gputest::repro(seed)));
  }
}

// NaN and +-Inf weight scales (d, or Q2_K's dmin; docs/numerics.md "mmvq_q2k, mmvq_q3k": IEEE
// through the operations): rows where about a third of the blocks carry one, the rest valid;
// plus two rows built to give +-Inf (tests/emu_test_util.h append_inf_rows; positive activations
// on even seeds); plain and one-token expert forms equal the emulation bitwise (canonical NaN),
// and the expected outputs do contain NaN and +-Inf (the cases are not vacuous).
TEST_P(MmvqTest, NanInfWeightScalesEqualEmu_40Seeds) {
  MOECHECK_REQUIRE_GPU();
  const auto [type, warps, engine] = GetParam();
  int64_t nan_out = 0, inf_out = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    emutest::Gen g(seed * 7001 + static_cast<uint64_t>(type) * 3 + static_cast<uint64_t>(warps) +
                   static_cast<uint64_t>(engine) * 1009);
    const int64_t K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 4));
    const int64_t rows = 1 + g.u32() % 24, T = 1 + g.u32() % 9, rb = row_bytes(type, K);
    std::vector<uint8_t> w = emutest::make_rows(g, type, rows, K, 0.0);
    emutest::sprinkle_nan_inf_scales(g, type, rows * (K / kQK_K), w);
    const int64_t n_inf = 2;  // rows whose output is +-Inf for positive activations
    emutest::append_inf_rows(g, type, n_inf, K, w);
    const int64_t all_rows = rows + n_inf;
    std::vector<float> x = g.f32(T * K, 1.0);
    if (seed % 2 == 0)
      for (float& v : x) v = std::fabs(v) + 0.25f;
    std::vector<BlockQ8_1> a(static_cast<size_t>(T * K / kQK8_1));
    emu::quantize_q8_1(x.data(), a.data(), T, K);
    std::vector<float> want(static_cast<size_t>(T * all_rows));
    emu::mmvq(type, w.data(), a.data(), want.data(), all_rows, K, T);
    for (float v : want) nan_out += std::isnan(v), inf_out += std::isinf(v);
    const std::string r =
        gputest::repro(seed, "NaN/Inf scales K=" + std::to_string(K) +
                                 " rows=" + std::to_string(rows) + " T=" + std::to_string(T));
    DevArray<uint8_t> dw(w);
    DevArray<BlockQ8_1> da(a);
    DevArray<float> dy(want.size());
    cuda::mmvq(type, dw.get(), da.get(), dy.get(), all_rows, K, T, warps, nullptr);
    ASSERT_TRUE(same_f32("mmvq NaN/Inf scales", dy.host(), want, all_rows, r));
    // The one-token expert form over the same matrix cut into single-row "experts".
    std::vector<const uint8_t*> hp, dp;
    for (int64_t i = 0; i < all_rows; ++i) {
      hp.push_back(w.data() + i * rb);
      dp.push_back(dw.get() + i * rb);
    }
    std::vector<float> want_e(static_cast<size_t>(all_rows));
    emu::mmvq_experts(type, hp.data(), all_rows, a.data(), false, want_e.data(), 1, K);
    DevArray<const uint8_t*> dtab(dp);
    DevArray<float> de(want_e.size());
    cuda::mmvq_experts(type, dtab.get(), all_rows, da.get(), false, de.get(), 1, K, warps, nullptr);
    ASSERT_TRUE(same_f32("mmvq_experts NaN/Inf scales", de.host(), want_e, 1, r));
  }
  EXPECT_GT(nan_out, 0) << "no NaN output: the NaN-scale cases are vacuous";
  EXPECT_GT(inf_out, 0) << "no Inf output: the Inf-scale cases are vacuous";
}

INSTANTIATE_TEST_SUITE_P(
    Types, MmvqTest,
    ::testing::Values(std::tuple{GgmlType::kQ2K, 2, 0}, std::tuple{GgmlType::kQ2K, 4, 0},
                      std::tuple{GgmlType::kQ2K, 8, 0}, std::tuple{GgmlType::kQ2K, 8, 4},
                      std::tuple{GgmlType::kQ2K, 8, 14}, std::tuple{GgmlType::kQ2K, 8, 20},
                      std::tuple{GgmlType::kQ2K, 8, 42}, std::tuple{GgmlType::kQ2K, 8, 83},
                      std::tuple{GgmlType::kQ2K, 8, 4020}, std::tuple{GgmlType::kQ2K, 8, 8020},
                      std::tuple{GgmlType::kQ2K, 8, 8042}, std::tuple{GgmlType::kQ3K, 2, 0},
                      std::tuple{GgmlType::kQ3K, 4, 0}, std::tuple{GgmlType::kQ3K, 8, 0},
                      std::tuple{GgmlType::kQ3K, 8, 4}, std::tuple{GgmlType::kQ3K, 8, 14},
                      std::tuple{GgmlType::kQ3K, 8, 20}, std::tuple{GgmlType::kQ3K, 8, 42},
                      std::tuple{GgmlType::kQ3K, 8, 83}, std::tuple{GgmlType::kQ3K, 8, 4020},
                      std::tuple{GgmlType::kQ3K, 8, 8020}, std::tuple{GgmlType::kQ3K, 8, 8042}),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == GgmlType::kQ2K ? "Q2K" : "Q3K") + "_W" +
             std::to_string(std::get<1>(info.param)) + "_" + engine_name(std::get<2>(info.param));
    });

// The seeds' one-token shapes: 6 experts of gate [2304, 5120] Q2_K and down [5120, 2304] Q3_K.
TEST(MmvqDs41, SixExpertsOneLaunch_Gate2304x5120Q2K_Down5120x2304Q3K) {
  MOECHECK_REQUIRE_GPU();
  for (auto [type, rows, K] :
       {std::tuple{GgmlType::kQ2K, 2304, 5120}, std::tuple{GgmlType::kQ3K, 5120, 2304}}) {
    emutest::Gen g(41 + rows);
    const int64_t n = 6, rb = row_bytes(type, K);
    const auto w = emutest::make_rows(g, type, n * rows, K, 0.01);
    const auto a = make_act(g, type == GgmlType::kQ3K ? n : 1, K, false);
    std::vector<const uint8_t*> hp;
    for (int64_t i = 0; i < n; ++i) hp.push_back(w.data() + i * rows * rb);
    std::vector<float> want(static_cast<size_t>(n * rows));
    emu::mmvq_experts(type, hp.data(), n, a.data(), type == GgmlType::kQ3K, want.data(), rows, K);
    DevArray<uint8_t> dw(w);
    std::vector<const uint8_t*> dp;
    for (int64_t i = 0; i < n; ++i) dp.push_back(dw.get() + i * rows * rb);
    DevArray<const uint8_t*> dtab(dp);
    DevArray<BlockQ8_1> da(a);
    for (int engine : {0, 4, 6, 14, 20, 42, 83, 124, 4020, 8020, 8083, 8124}) {
      set_engine(engine);
      for (int warps : {2, 4, 8}) {
        DevArray<float> dy(want.size());
        cuda::mmvq_experts(type, dtab.get(), n, da.get(), type == GgmlType::kQ3K, dy.get(), rows, K,
                           warps, nullptr);
        ASSERT_TRUE(same_f32("mmvq_experts ds41", dy.host(), want, rows,
                             gputest::repro(41 + rows, "warps=" + std::to_string(warps) +
                                                           " engine=" + engine_name(engine))));
      }
    }
    reset_engine();
  }
}

// The streamed engine's step plans (cuda/mmvq_sb.cuh StepPlan), for rows of 1 - 200 super-blocks
// in steps of one and two a class: the steps take every super-block once; a class's blocks (the
// lane's chains) come in increasing sb; the shared rem blocks are the row's last nsb % 4, after
// every class block, in the last step; and each step's covering copy fits its slot, whose pitch
// is an odd multiple of 16 bytes (the bank spread the kernel's header describes).
TEST(MmvqStreamStep, PlansTakeEverySuperBlockOnceInChainOrder_Host) {
  using cuda::mmvq_sb::kChunkSb;
  using cuda::mmvq_sb::slot_bytes;
  using cuda::mmvq_sb::StepPlan;
  for (int per : {1, 2}) {
    for (int nsb = 1; nsb <= 200; ++nsb) {
      const std::string at = "per=" + std::to_string(per) + " nsb=" + std::to_string(nsb);
      const StepPlan sp(nsb, per);
      std::vector<int> seen(static_cast<size_t>(nsb), 0);
      int last_class[kChunkSb] = {-1, -1, -1, -1}, last_class_any = -1, rem_seen = 0;
      for (int q = 0; q < sp.nq; ++q) {
        const int start = kChunkSb * per * q;
        const int ncb = sp.class_blocks(q);
        ASSERT_EQ(sp.blocks(q), kChunkSb * ncb + (q == sp.nq - 1 ? sp.rem : 0)) << at;
        for (int i = 0; i < ncb; ++i)
          for (int c = 0; c < kChunkSb; ++c) {
            const int sb = start + kChunkSb * i + c;
            ASSERT_LT(sb, nsb) << at << " q=" << q;
            ASSERT_EQ(sb % kChunkSb, c) << at;
            ASSERT_GT(sb, last_class[c]) << at << " q=" << q << ": class " << c << " out of order";
            last_class[c] = sb;
            last_class_any = std::max(last_class_any, sb);
            ++seen[static_cast<size_t>(sb)];
          }
        if (q == sp.nq - 1)
          for (int o = 0; o < sp.rem; ++o) {
            const int sb = start + kChunkSb * ncb + o;
            ASSERT_LT(sb, nsb) << at;
            ASSERT_GE(sb, nsb - nsb % kChunkSb) << at << ": a shared block that is not a rem";
            ASSERT_GT(sb, last_class_any) << at << ": a rem block before a class block";
            ++seen[static_cast<size_t>(sb)];
            ++rem_seen;
          }
        for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
          const int slot = slot_bytes(t, nsb, per), kb = t == GgmlType::kQ2K ? 84 : 110;
          ASSERT_GE(slot, 14 + sp.blocks(q) * kb + 2 + 4) << at << " q=" << q;
          ASSERT_EQ(slot % 32, 16) << at;
        }
      }
      EXPECT_EQ(rem_seen, nsb % kChunkSb) << at;
      for (int sb = 0; sb < nsb; ++sb)
        ASSERT_EQ(seen[static_cast<size_t>(sb)], 1)
            << at << " sb=" << sb << " taken " << seen[static_cast<size_t>(sb)] << " times";
    }
  }
}

// The streamed engine's step setting takes 0, 4 or 8 super-blocks and names the others.
TEST(MmvqStreamStep, RejectsOtherSizes_Host) {
  for (int bad : {-1, 1, 2, 3, 5, 12, 16}) {
    try {
      cuda::set_mmvq_stream_step(bad);
      ADD_FAILURE() << "set_mmvq_stream_step(" << bad << ") did not throw";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("found " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
  for (int ok : {4, 8, 0}) EXPECT_NO_THROW(cuda::set_mmvq_stream_step(ok));
}

// The streamed engine's split of several-token launches by work (cuda/mmvq_sb.cuh first_item),
// on the host (no GPU needed): for random groups (0 - 8 tokens; on a third of the seeds nearly
// all of one token, the lightest chunks), row passes and grids, the blocks' item ranges start at
// 0, meet, end at the last item, each holds at most its share of the work plus one item's, and
// touches at most max_chunks_per_block chunks (the bound of its activation slots, which the
// kernel traps on).
TEST(MmvqStreamSplit, WorkRangesCoverEveryItemOnce_Host) {
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    emutest::Gen g(seed * 2654435761u);
    const int64_t kTok = 2, w0 = seed % 2 == 0 ? cuda::mmvq_sb::pass_weight(GgmlType::kQ2K)
                                               : cuda::mmvq_sb::pass_weight(GgmlType::kQ3K);
    const int64_t G = 1 + g.u32() % 300, passes = 1 + g.u32() % (seed % 5 == 0 ? 4 : 300);
    std::vector<int32_t> pre(static_cast<size_t>(G + 1), 0), cpre(static_cast<size_t>(G + 1), 0);
    std::vector<int64_t> chunk_w;  // weight a pass of each chunk
    for (int64_t i = 0; i < G; ++i) {
      int32_t n = static_cast<int32_t>(g.u32() % 9);
      if (seed % 3 == 0) n = g.u32() % 50 == 0 ? 2 : 1;
      pre[i + 1] = pre[i] + n;
      cpre[i + 1] = cpre[i] + (n + 1) / 2;
      for (int32_t t = 0; t < n; t += 2) chunk_w.push_back(std::min<int64_t>(2, n - t) + w0);
    }
    const int64_t B = 1 + g.u32() % (seed % 7 == 0 ? std::max<int64_t>(1, pre[G]) : 200);
    const int64_t total = passes * cpre[G], W = passes * (pre[G] + w0 * cpre[G]);
    const int64_t bound = cuda::mmvq_sb::max_chunks_per_block(pre[G], B);
    const std::string r = "seed=" + std::to_string(seed) + " G=" + std::to_string(G) +
                          " passes=" + std::to_string(passes) + " B=" + std::to_string(B);
    int64_t prev = 0, most_w = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t b0 =
          cuda::mmvq_sb::first_item(W * b / B, kTok, w0, G, pre.data(), cpre.data(), passes);
      const int64_t b1 =
          cuda::mmvq_sb::first_item(W * (b + 1) / B, kTok, w0, G, pre.data(), cpre.data(), passes);
      ASSERT_EQ(b0, prev) << r << " b=" << b;
      ASSERT_LE(b0, b1) << r << " b=" << b;
      int64_t work = 0;
      for (int64_t it = b0; it < b1; ++it) work += chunk_w[static_cast<size_t>(it / passes)];
      most_w = std::max(most_w, work);
      if (b1 > b0) {
        const int64_t chunks = (b1 - 1) / passes - b0 / passes + 1;
        ASSERT_LE(chunks, bound) << r << " b=" << b;
      }
      prev = b1;
    }
    ASSERT_EQ(prev, total) << r;
    ASSERT_LE(most_w, (W + B - 1) / B + kTok + w0) << r;
  }
}

// The streamed engine's launch choice (cuda/mmvq_sb.cuh choose(), geometry()), on the host.
using cuda::mmvq_sb::Geometry;
using cuda::mmvq_sb::Settings;
using cuda::mmvq_tiles::Form;
using cuda::mmvq_tiles::MmvqParams;

namespace sbgeo {

// A launch as cuda::mmvq_groups_planned forms it for the device-routed layer
// (cuda/moe_layer_route.cu): n_proj projections of the plan's capacity P = 6 T pairs each, the
// MMVQ groups bounded by min(P, 384) a projection, groups of up to min(T, 8) tokens, one token a
// pass in layers of up to 32 tokens and two above (cuda/mmvq.cu stream_pass_tokens).
MmvqParams planned(int64_t T, int n_proj, int64_t rows, int64_t K) {
  static const int32_t count = 0;  // never read on the host; marks the planned form
  MmvqParams p{Form::kGroups, nullptr, nullptr, nullptr, nullptr, false, nullptr,
               rows,          K,       0,       0,       0,       0};
  const int64_t P = 6 * T;
  p.dev_count = &count;
  p.proj_stride = P;
  p.n_proj = n_proj;
  p.max_n = static_cast<int>(std::min<int64_t>(T, kMaxGroupRows));
  p.n_groups = n_proj * std::min<int64_t>(P, 384);
  p.pass_tokens = T <= 4 * kMaxGroupRows ? 1 : 2;
  return p;
}

std::string describe(const Geometry& g) {
  return "warps=" + std::to_string(g.warps) + " stages=" + std::to_string(g.stages) +
         " per=" + std::to_string(g.per) + " grid=" + std::to_string(g.grid) +
         " n_act=" + std::to_string(g.n_act) + " bytes=" + std::to_string(g.bytes) +
         " tok=" + std::to_string(g.tok) + " one_wave=" + std::to_string(g.one_wave);
}

}  // namespace sbgeo

// The ds41 layer's two streamed launches on the H200's 132 multiprocessors, at every T the
// streamed engine takes: the T = 1 shapes ncu measured on the device (docs/performance.md
// "Double steps", the one-token launches under ncu: gate / up 12 warps and 122.9 KB of shared
// memory, down 16 warps and 159.3 KB: 2 stages, the down rings of 3 do not fit at 16 warps),
// and the double-step rule: the gate / up launch of the layers of 2 - 32 tokens takes double
// steps at 16 warps x 2 stages with a block per multiprocessor, the down launch and the T >= 33
// gate / up launches (passes of two tokens, whose activation slots leave no room) do not.
TEST(MmvqStreamGeometry, Ds41LayerLaunchesAtTheDefaults_Host) {
  using cuda::mmvq_sb::choose;
  const Settings set;
  for (int64_t T = 1; T <= 64; ++T) {
    const std::string at = "T=" + std::to_string(T);
    Geometry gu, dn;
    ASSERT_TRUE(
        choose(sbgeo::planned(T, 2, 2304, 5120), GgmlType::kQ2K, T == 1 ? 12 : 0, 0, 132, set, gu))
        << at;
    ASSERT_TRUE(choose(sbgeo::planned(T, 1, 5120, 2304), GgmlType::kQ3K, 0, 0, 132, set, dn)) << at;
    const std::string gs = at + " gate/up " + sbgeo::describe(gu),
                      ds = at + " down " + sbgeo::describe(dn);
    EXPECT_TRUE(gu.one_wave && gu.grid == 132) << gs;
    EXPECT_TRUE(dn.one_wave && dn.grid == 132) << ds;
    EXPECT_EQ(dn.warps, 16) << ds;
    EXPECT_EQ(dn.per, 1) << ds;
    EXPECT_EQ(dn.stages, 2) << ds;
    EXPECT_EQ(gu.tok, T <= 32 ? 1 : 2) << gs;
    if (T == 1) {
      EXPECT_EQ(gu.warps, 12) << gs;
      EXPECT_EQ(gu.stages, 3) << gs;
      EXPECT_EQ(gu.per, 1) << gs;
      EXPECT_EQ(gu.n_act, 2) << gs;
      EXPECT_EQ(gu.bytes, 122928) << gs;
      EXPECT_EQ(dn.n_act, 2) << ds;
      EXPECT_EQ(dn.bytes, 159312) << ds;
    } else if (T <= 32) {
      EXPECT_EQ(gu.warps, 16) << gs;
      EXPECT_EQ(gu.per, 2) << gs;
      EXPECT_EQ(gu.stages, 2) << gs;
    } else {
      EXPECT_EQ(gu.warps, 16) << gs;
      EXPECT_EQ(gu.per, 1) << gs;
    }
  }
}

// For random launches of every form (plain, one-token experts, groups with host counts, groups
// planned on the device with live counts under their bounds), shapes, multiprocessor counts,
// asked warps and stages and every setting: the choice fits shared memory and is the rule's, and
// every block of the kernel's split (by count, or by work through first_item for passes of two
// tokens) touches at most n_act pairs, which the kernel traps on (cuda/mmvq_sb.cu). The split
// and the pairs are recomputed here from the live groups as the kernel's Pairs walks them.
TEST(MmvqStreamGeometry, EveryBlockPairsFitItsActivationSlots_Host) {
  using cuda::mmvq_sb::choose;
  using cuda::mmvq_sb::kPassRows;
  using cuda::mmvq_sb::kSmemMax;
  using cuda::mmvq_sb::Layout;
  using cuda::mmvq_sb::slot_bytes;
  int checked = 0, multi_block = 0, doubled = 0, by_work = 0, fewer_warps = 0, unfit = 0;
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    emutest::Gen r(seed * 0x9E3779B97F4A7C15ull);
    const int form = static_cast<int>(r.u32() % 4);  // plain, experts, groups, planned
    const GgmlType t = r.u32() % 2 == 0 ? GgmlType::kQ2K : GgmlType::kQ3K;
    const int64_t K = kQK_K * (1 + r.u32() % (seed % 10 == 0 ? 120 : 24)),
                  rows = 1 + r.u32() % 3000;
    MmvqParams p{Form::kPlain, nullptr, nullptr, nullptr, nullptr, false, nullptr,
                 rows,         K,       0,       0,       0,       0};
    std::vector<int32_t> n;  // live groups' token counts (kGroups)
    static const int32_t dev_count = 0;
    if (form == 0) {
      p.T = 1 + r.u32() % 64;
      p.max_n = static_cast<int>(std::min<int64_t>(p.T, kMaxGroupRows));
      p.n_groups = (p.T + kMaxGroupRows - 1) / kMaxGroupRows;
    } else if (form == 1) {
      p.form = Form::kExperts;
      p.T = 1;
      p.max_n = 1;
      p.n_groups = 1 + r.u32() % 64;
    } else {
      p.form = Form::kGroups;
      p.max_n = 1 + static_cast<int>(r.u32() % kMaxGroupRows);
      p.pass_tokens = 1 + static_cast<int>(r.u32() % 2);
      if (form == 2) {
        p.n_groups = 1 + r.u32() % 600;
        for (int64_t g = 0; g < p.n_groups; ++g)
          n.push_back(static_cast<int32_t>(r.u32() % (p.max_n + 1)));
      } else {  // planned: per projection at most per_proj groups and proj_stride pairs
        p.dev_count = &dev_count;
        p.n_proj = 1 + static_cast<int>(r.u32() % 2);
        p.proj_stride = 1 + r.u32() % 400;
        const int64_t per_proj = 1 + r.u32() % std::min<int64_t>(p.proj_stride, 384);
        p.n_groups = p.n_proj * per_proj;
        const int64_t live = 1 + r.u32() % per_proj;
        for (int j = 0; j < p.n_proj; ++j) {
          int64_t left = p.proj_stride;
          for (int64_t g = 0; g < live; ++g) {
            int32_t v = static_cast<int32_t>(r.u32() % (p.max_n + 1));
            if (seed % 3 == 0) v = p.max_n;  // as full as the bounds allow
            v = static_cast<int32_t>(std::min<int64_t>(v, left));
            left -= v;
            n.push_back(v);
          }
        }
      }
    }
    Settings set;
    set.step = seed % 5 == 0 ? 4 : seed % 5 == 1 ? 8 : 0;
    set.pass_tokens = seed % 7 == 0 ? 1 + static_cast<int>(r.u32() % 2) : 0;
    set.whole_sm = seed % 11 == 0;
    const int64_t sms = seed % 4 == 0 ? 1 + r.u32() % 8 : 1 + r.u32() % 200;
    const int asked_w = static_cast<int>((r.u32() % 5) * 4), asked_s = [&] {
      const int s = static_cast<int>(r.u32() % 8);
      return s < 2 ? 0 : s;
    }();
    const std::string at =
        "seed=" + std::to_string(seed) + " form=" + std::to_string(form) +
        " K=" + std::to_string(K) + " rows=" + std::to_string(rows) +
        " groups=" + std::to_string(p.n_groups) + " max_n=" + std::to_string(p.max_n) +
        " sms=" + std::to_string(sms) + " warps=" + std::to_string(asked_w) +
        " stages=" + std::to_string(asked_s) + " step=" + std::to_string(set.step);
    Geometry g;
    const bool ok = choose(p, t, asked_w, asked_s, sms, set, g);
    ASSERT_TRUE(ok || K > 8192) << at << ": no geometry";
    if (!ok) {
      ++unfit;
      continue;
    }
    const std::string gat = at + " -> " + sbgeo::describe(g);
    const bool prefixed = cuda::mmvq_sb::prefixed(p);
    const int nsb = static_cast<int>(K / kQK_K), units = static_cast<int>(K / kQK8_1);
    const int w0 = asked_w != 0 ? asked_w : cuda::mmvq_sb::kDefaultWarps;
    const int want = asked_s != 0 ? asked_s : cuda::mmvq_sb::kDefaultStages;
    // The choice: its warps, stages, step and chunk as the rule says, and shared memory that fits.
    ASSERT_TRUE(g.warps == 4 || g.warps == 8 || g.warps == 12 || g.warps == 16) << gat;
    ASSERT_LE(g.warps, std::max(w0, 4)) << gat;
    ASSERT_TRUE(g.stages >= 2 && g.stages <= want) << gat;
    ASSERT_EQ(g.tok, !prefixed ? 1 : set.pass_tokens != 0 ? set.pass_tokens : p.pass_tokens) << gat;
    if (g.per == 2)
      ASSERT_TRUE(set.step == 8 ||
                  (set.step == 0 && prefixed && nsb >= 8 && g.one_wave && g.warps == w0))
          << gat;
    if (set.step == 4 || (set.step == 0 && !prefixed)) ASSERT_EQ(g.per, 1) << gat;
    const int need = Layout(slot_bytes(t, nsb, g.per), units, g.warps, g.stages, g.n_act).bytes +
                     cuda::mmvq_sb::extra_bytes(p, g.n_act);
    ASSERT_LE(need, g.bytes) << gat;
    ASSERT_LE(g.bytes, kSmemMax) << gat;
    ASSERT_GE(g.grid, 1) << gat;
    if (g.one_wave) ASSERT_LE(g.grid, sms) << gat;
    // The live launch: its chunks (with the prefixes the kernel builds) and the blocks' ranges.
    const int64_t G = p.form == Form::kGroups ? static_cast<int64_t>(n.size()) : 0;
    std::vector<int32_t> pre(static_cast<size_t>(G + 1), 0), cpre(static_cast<size_t>(G + 1), 0);
    for (int64_t i = 0; i < G; ++i) {
      pre[i + 1] = pre[i] + n[i];
      cpre[i + 1] = cpre[i] + (n[i] + g.tok - 1) / g.tok;
    }
    const int64_t chunks = p.form == Form::kPlain     ? p.T
                           : p.form == Form::kExperts ? p.n_groups
                           : prefixed                 ? cpre[G]
                                                      : G;
    const int64_t passes = (rows + kPassRows - 1) / kPassRows, total = passes * chunks;
    // A chunk's first pair and its token count (cuda/mmvq_sb.cu Pairs::chunk).
    auto pair_of = [&](int64_t ci, int64_t& pi, int& nt) {
      if (!prefixed) {
        pi = ci;
        nt = 1;
        return;
      }
      const int64_t gi =
          std::upper_bound(cpre.begin(), cpre.end(), static_cast<int32_t>(ci)) - cpre.begin() - 1;
      const int tok0 = g.tok * static_cast<int>(ci - cpre[gi]);
      nt = std::min(g.tok, n[gi] - tok0);
      pi = pre[gi] + tok0;
    };
    const bool work = prefixed && g.tok > 1;
    const int64_t w0p = cuda::mmvq_sb::pass_weight(t);
    const int64_t W = work ? passes * (pre[G] + w0p * cpre[G]) : 0;
    int64_t prev = 0;
    for (int64_t b = 0; b < g.grid; ++b) {
      int64_t b0 = total * b / g.grid, b1 = total * (b + 1) / g.grid;
      if (work) {
        b0 = cuda::mmvq_sb::first_item(W * b / g.grid, g.tok, w0p, G, pre.data(), cpre.data(),
                                       passes);
        b1 = cuda::mmvq_sb::first_item(W * (b + 1) / g.grid, g.tok, w0p, G, pre.data(), cpre.data(),
                                       passes);
      }
      ASSERT_EQ(b0, prev) << gat << " block " << b;
      prev = b1;
      if (b1 <= b0) continue;
      int64_t pi0, pi1;
      int nt0, nt1;
      pair_of(b0 / passes, pi0, nt0);
      pair_of((b1 - 1) / passes, pi1, nt1);
      const int64_t np = pi1 + nt1 - pi0;
      ASSERT_LE(np, g.n_act) << gat << " block " << b << " [" << b0 << ", " << b1
                             << "): the kernel would trap";
    }
    ASSERT_EQ(prev, total) << gat;
    ++checked;
    multi_block += g.one_wave ? 0 : 1;
    doubled += g.per == 2 ? 1 : 0;
    by_work += work ? 1 : 0;
    fewer_warps += g.warps < w0 ? 1 : 0;
  }
  // The draw reaches every branch: grids above a block per multiprocessor, double steps, the
  // split by work, fewer warps than asked (long rows), rows too long for the engine.
  EXPECT_GT(checked, 1200);
  EXPECT_GT(multi_block, 20);
  EXPECT_GT(doubled, 50);
  EXPECT_GT(by_work, 100);
  EXPECT_GT(fewer_warps, 10);
  EXPECT_GT(unfit, 0);
  std::printf(
      "checked %d launches: %d over a block per multiprocessor, %d double steps, %d split "
      "by work, %d at fewer warps than asked; %d did not fit\n",
      checked, multi_block, doubled, by_work, fewer_warps, unfit);
}

TEST(MmvqPreconditions, BadWarpsTypeAndShapeThrowBeforeLaunch) {
  MOECHECK_REQUIRE_GPU();
  DevArray<uint8_t> w(4096);
  DevArray<BlockQ8_1> a(64);
  DevArray<float> y(64);
  EXPECT_THROW(cuda::mmvq(GgmlType::kQ2K, w.get(), a.get(), y.get(), 1, 256, 1, 3, nullptr),
               InputError);
  EXPECT_THROW(cuda::mmvq(GgmlType::kBF16, w.get(), a.get(), y.get(), 1, 256, 1, 8, nullptr),
               InputError);
  EXPECT_THROW(cuda::mmvq(GgmlType::kQ2K, w.get(), a.get(), y.get(), 1, 100, 1, 8, nullptr),
               InputError);
  EXPECT_THROW(cuda::mmvq(GgmlType::kQ2K, w.get() + 1, a.get(), y.get(), 1, 256, 1, 8, nullptr),
               InputError);
}

}  // namespace
}  // namespace moecheck
