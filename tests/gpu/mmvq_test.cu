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
#include <utility>

#include "core/error.h"
#include "cuda/kernels.h"
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
// picks; 100000 (h + 1) + code: that code with a ring head of h steps issued before the
// activations are staged (cuda::set_mmvq_stream_head; 8: the whole ring first; no prefix: the
// default, one step).
void set_engine(int e) {
  cuda::set_mmvq_stream_head(e / 100000 - 1);
  e %= 100000;
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
  cuda::set_mmvq_stream_head(-1);
  cuda::set_mmvq_stream_step(0);
  cuda::set_mmvq_stream_pass_shape(0, false);
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
  cuda::set_mmvq_stream_shape(0, 0);
  cuda::set_mmvq_rows_per_warp(0);
}

std::string engine_name(int e) {
  if (e >= 100000) return "head" + std::to_string(e / 100000 - 1) + "_" + engine_name(e % 100000);
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
                      std::tuple{GgmlType::kQ2K, 8, 8042}, std::tuple{GgmlType::kQ2K, 8, 100020},
                      std::tuple{GgmlType::kQ2K, 8, 900020}, std::tuple{GgmlType::kQ2K, 8, 308020},
                      std::tuple{GgmlType::kQ2K, 8, 140}, std::tuple{GgmlType::kQ2K, 8, 143},
                      std::tuple{GgmlType::kQ3K, 2, 0}, std::tuple{GgmlType::kQ3K, 4, 0},
                      std::tuple{GgmlType::kQ3K, 8, 0}, std::tuple{GgmlType::kQ3K, 8, 4},
                      std::tuple{GgmlType::kQ3K, 8, 14}, std::tuple{GgmlType::kQ3K, 8, 20},
                      std::tuple{GgmlType::kQ3K, 8, 42}, std::tuple{GgmlType::kQ3K, 8, 83},
                      std::tuple{GgmlType::kQ3K, 8, 4020}, std::tuple{GgmlType::kQ3K, 8, 8020},
                      std::tuple{GgmlType::kQ3K, 8, 8042}, std::tuple{GgmlType::kQ3K, 8, 100020},
                      std::tuple{GgmlType::kQ3K, 8, 900020}, std::tuple{GgmlType::kQ3K, 8, 308020},
                      std::tuple{GgmlType::kQ3K, 8, 140}, std::tuple{GgmlType::kQ3K, 8, 143}),
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
    // 140, 143, 8140: the one-token shape of 14 warps (2 stages, 3 stages; steps of 8 take 12).
    for (int engine : {0,    4,      6,      14,     20,     42,     83,     124, 4020, 8020, 8083,
                       8124, 100020, 200020, 300020, 900020, 208020, 104124, 140, 143,  8140}) {
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

// The streamed engine's launch diagnostics (cuda::set_mmvq_stream_diagnostic, read by
// tests/bench/mmvq_bench.cu): mode 1's kernels compute what the product kernels do, bit for bit;
// mode 2 writes no output; under both every warp of the launch leaves a record whose passes add
// up to the launch's, whose clocks are in the kernel's order and whose steps are its passes'
// steps. The ds41 shapes (down: 9 super-blocks a row, so the shared rem blocks) and small random
// ones at 1 - 12 super-blocks; launches the records cannot describe throw.
TEST(MmvqDiagnostic, TimelineKernelsComputeAsTheProductKernelsAndRecordEveryWarp) {
  MOECHECK_REQUIRE_GPU();
  struct Reset {  // the process's settings as before, whatever fails
    ~Reset() {
      cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
      cuda::set_mmvq_stream_step(0);
      cuda::set_mmvq_stream_shape(0, 0);
    }
  } reset;
  constexpr int kW = cuda::kMmvqTimelineWords;
  const int64_t cap = 4096;
  DevArray<uint64_t> buf(static_cast<size_t>(cap * kW));
  struct Case {
    GgmlType type;
    int64_t rows, K, n;
    uint64_t seed;
  };
  std::vector<Case> cases = {{GgmlType::kQ2K, 2304, 5120, 6, 1},
                             {GgmlType::kQ3K, 5120, 2304, 6, 2}};
  for (uint64_t seed = 3; seed < 23; ++seed) {
    emutest::Gen g(seed * 2654435761u);
    cases.push_back({seed % 2 == 0 ? GgmlType::kQ2K : GgmlType::kQ3K, 1 + g.u32() % 40,
                     kQK_K * (1 + static_cast<int64_t>(g.u32() % 12)), 1 + g.u32() % 12, seed});
  }
  for (const Case& c : cases) {
    emutest::Gen g(c.seed * 7 + 1);
    const int64_t rb = row_bytes(c.type, c.K);
    const auto w = emutest::make_rows(g, c.type, c.n * c.rows, c.K, 0.05);
    const bool per_expert = c.type == GgmlType::kQ3K;
    const auto a = make_act(g, per_expert ? c.n : 1, c.K, false);
    std::vector<const uint8_t*> hp;
    for (int64_t i = 0; i < c.n; ++i) hp.push_back(w.data() + i * c.rows * rb);
    std::vector<float> want(static_cast<size_t>(c.n * c.rows));
    emu::mmvq_experts(c.type, hp.data(), c.n, a.data(), per_expert, want.data(), c.rows, c.K);
    DevArray<uint8_t> dw(w);
    std::vector<const uint8_t*> dp;
    for (int64_t i = 0; i < c.n; ++i) dp.push_back(dw.get() + i * c.rows * rb);
    DevArray<const uint8_t*> dtab(dp);
    DevArray<BlockQ8_1> da(a);
    const std::string r = gputest::repro(
        c.seed, "rows=" + std::to_string(c.rows) + " K=" + std::to_string(c.K) +
                    " n=" + std::to_string(c.n) + (c.type == GgmlType::kQ2K ? " Q2_K" : " Q3_K"));
    const int nsb = static_cast<int>(c.K / kQK_K);
    const int64_t steps_a_pass = nsb / 4 > 0 ? nsb / 4 : 1;  // steps of 4, the rem with the last
    const int64_t passes = (c.rows + 7) / 8 * c.n;
    for (int mode = 1; mode <= 2; ++mode) {
      DevArray<float> dy(want.size());
      buf.poison();
      cuda::set_mmvq_stream_diagnostic(mode, buf.get(), cap);
      cuda::mmvq_experts(c.type, dtab.get(), c.n, da.get(), per_expert, dy.get(), c.rows, c.K, 8,
                         nullptr);
      cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << r;
      const auto y = dy.host();
      if (mode == 1) {
        ASSERT_TRUE(same_f32("mmvq_experts (timeline kernel)", y, want, c.rows, r));
      } else {
        for (size_t i = 0; i < y.size(); ++i) {
          uint32_t bits;
          std::memcpy(&bits, &y[i], 4);
          ASSERT_EQ(bits, 0xFFFFFFFFu) << "copies alone wrote output " << i << "; " << r;
        }
      }
      const auto rec = buf.host();
      int64_t warps = 0, sum_passes = 0;
      std::vector<std::pair<int64_t, int64_t>> blocks;  // (record, its block)
      for (int64_t k = 0; k < cap; ++k) {
        const uint64_t* q = rec.data() + k * kW;
        if (q[cuda::kTlEntryNs] == ~uint64_t{0}) continue;
        ++warps;
        const std::string at =
            "mode " + std::to_string(mode) + ", warp record " + std::to_string(k) + "; " + r;
        ASSERT_NE(q[cuda::kTlExitClk], ~uint64_t{0}) << at;
        ASSERT_LE(q[cuda::kTlEntryNs], q[cuda::kTlExitNs]) << at;
        blocks.emplace_back(k, static_cast<int64_t>(q[cuda::kTlSmBlock] >> 32));
        const int64_t np = static_cast<int64_t>(q[cuda::kTlPasses]);
        sum_passes += np;
        if (np == 0) continue;
        ASSERT_EQ(static_cast<int64_t>(q[cuda::kTlSteps]), np * steps_a_pass) << at;
        std::vector<uint64_t> order = {q[cuda::kTlEntryClk], q[cuda::kTlIssuedClk],
                                       q[cuda::kTlPdlClk], q[cuda::kTlStagedClk],
                                       q[cuda::kTlFirstDataClk]};
        for (int64_t j = 0; j < np && j < cuda::kTlPassEnds; ++j)
          order.push_back(q[cuda::kTlPassEnd0 + j]);
        order.push_back(q[cuda::kTlExitClk]);
        for (size_t i = 1; i < order.size(); ++i)
          ASSERT_LE(order[i - 1], order[i]) << "clock " << i << " before " << i - 1 << "; " << at;
        ASSERT_LE(q[cuda::kTlWaitClk] + q[cuda::kTlComputeClk],
                  q[cuda::kTlExitClk] - q[cuda::kTlEntryClk])
            << at;
      }
      ASSERT_GT(warps, 0) << r;
      ASSERT_EQ(warps % 4, 0) << "whole blocks of 4, 8, 12 or 16 warps; " << r;
      // Record k is warp k % W of block k / W, W the warps a block: the records of each block.
      const int64_t nb = blocks.back().second + 1, wpb = warps / nb;
      ASSERT_EQ(wpb * nb, warps) << r;
      for (const auto& [k, b] : blocks) ASSERT_EQ(b, k / wpb) << "record " << k << "; " << r;
      ASSERT_EQ(sum_passes, passes) << "mode " << mode << "; " << r;
    }
  }
  // Launches the records cannot describe: several-token groups, steps of 8, too small a buffer.
  {
    emutest::Gen g(99);
    const int64_t K = 2048, rows = 16;
    const auto w = emutest::make_rows(g, GgmlType::kQ2K, rows, K, 0.0);
    const auto a = make_act(g, 4, K, false);
    DevArray<uint8_t> dw(w);
    DevArray<const uint8_t*> dtab(std::vector<const uint8_t*>{dw.get()});
    DevArray<BlockQ8_1> da(a);
    DevArray<float> dy(static_cast<size_t>(4 * rows));
    std::vector<MmvqGroup> groups(1);
    groups[0].slot = 0;
    groups[0].n = 4;
    for (int i = 0; i < 4; ++i) groups[0].a_row[i] = groups[0].y_row[i] = i;
    DevArray<MmvqGroup> dg(groups);
    cuda::set_mmvq_stream_diagnostic(1, buf.get(), cap);
    EXPECT_THROW(cuda::mmvq_groups(GgmlType::kQ2K, dtab.get(), dg.get(), 1, 4, da.get(), dy.get(),
                                   rows, K, 8, nullptr),
                 InputError);
    cuda::set_mmvq_stream_step(8);
    EXPECT_THROW(cuda::mmvq_experts(GgmlType::kQ2K, dtab.get(), 1, da.get(), false, dy.get(), rows,
                                    K, 8, nullptr),
                 InputError);
    cuda::set_mmvq_stream_step(0);
    cuda::set_mmvq_stream_shape(14, 0);  // the one-token shape of 14 warps records no timeline
    EXPECT_THROW(cuda::mmvq_experts(GgmlType::kQ2K, dtab.get(), 1, da.get(), false, dy.get(), rows,
                                    K, 8, nullptr),
                 InputError);
    cuda::set_mmvq_stream_shape(0, 0);
    cuda::set_mmvq_stream_diagnostic(1, buf.get(), 3);
    EXPECT_THROW(cuda::mmvq_experts(GgmlType::kQ2K, dtab.get(), 1, da.get(), false, dy.get(), rows,
                                    K, 8, nullptr),
                 InputError);
    cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
    cuda::mmvq_experts(GgmlType::kQ2K, dtab.get(), 1, da.get(), false, dy.get(), rows, K, 8,
                       nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
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
