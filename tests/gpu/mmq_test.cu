// cuda::mmq (plain, groups, planned) vs emu::mmvq / emu::mmvq_groups, bitwise, for Q2_K and
// Q3_K: MMQ keeps MMVQ's contract (docs/numerics.md "mmvq_q2k, mmvq_q3k"), so its twin is the
// MMVQ emulation. Seeded random cases with rows across the 64-row tiles and a pair item's
// 32-row phases (the checked and the unchecked variant), K across the 4-super-block rounds
// (ragged last round), T across the 16-token column blocks and their 8-token halves (9, 16, 63,
// 64, 65 always among them), groups paired into items or not, adversarial blocks (zero,
// subnormal, NaN and Inf scales; NaN, huge and zero activation blocks), weight bases at 2- / 4-byte
// offsets (every 16-byte phase of a row), gate and up in one launch (two projections), the
// live range read from the device (the device route), ds41 shapes; every launch twice.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "cuda/kernels.h"
#include "emulate/mmvq.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/mmvq_cases.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::make_act;
using gputest::OffsetCopy;
using gputest::same_f32;

class MmqTest : public ::testing::TestWithParam<GgmlType> {};

// One plain case: weights [rows, K] with explicit NaN / Inf scales in some seeds.
void plain_case(GgmlType type, uint64_t seed, int64_t rows, int64_t K, int64_t T, bool adv) {
  emutest::Gen g(seed);
  auto w = emutest::make_rows(g, type, rows, K, adv ? 0.3 : 0.0);
  if (adv && rows > 2) {  // one NaN and one Inf scale (whole outputs NaN / Inf)
    for (auto kind : {emutest::BlockKind::kNanScale, emutest::BlockKind::kInfScale}) {
      uint8_t* blk = w.data() + (g.u32() % rows) * row_bytes(type, K);
      if (type == GgmlType::kQ2K) {
        const BlockQ2K b = emutest::make_q2k(g, kind);
        std::memcpy(blk, &b, sizeof b);
      } else {
        const BlockQ3K b = emutest::make_q3k(g, kind);
        std::memcpy(blk, &b, sizeof b);
      }
    }
  }
  const auto a = make_act(g, T, K, adv);
  std::vector<float> want(static_cast<size_t>(T * rows));
  emu::mmvq(type, w.data(), a.data(), want.data(), rows, K, T);
  const OffsetCopy dw(w, 0);
  DevArray<BlockQ8_1> da(a);
  DevArray<float> dy(want.size());
  const std::string r = gputest::repro(
      seed, "type=" + std::to_string(static_cast<int>(type)) + " K=" + std::to_string(K) +
                " rows=" + std::to_string(rows) + " T=" + std::to_string(T));
  cuda::mmq(type, dw.p, da.get(), dy.get(), rows, K, T, nullptr);
  const auto first = dy.host();
  ASSERT_TRUE(same_f32("mmq", first, want, rows, r));
  dy.poison();
  cuda::mmq(type, dw.p, da.get(), dy.get(), rows, K, T, nullptr);
  ASSERT_TRUE(same_f32("mmq (second run)", dy.host(), first, rows, r));
}

TEST_P(MmqTest, PlainEqualsEmu_80Seeds) {
  MOECHECK_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t fixed_T[] = {9, 16, 63, 64, 65};
  for (uint64_t seed = 1; seed <= 80; ++seed) {
    emutest::Gen g(seed * 6151 + static_cast<uint64_t>(type));
    const int64_t K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 13));
    const int64_t rows = 1 + g.u32() % 150;
    const int64_t T = seed <= 5 ? fixed_T[seed - 1] : 1 + g.u32() % 70;
    plain_case(type, seed * 6151 + static_cast<uint64_t>(type) + 1, rows, K, T, seed % 2 == 0);
  }
}

TEST_P(MmqTest, Ds41ShapesEqualsEmu) {
  MOECHECK_REQUIRE_GPU();
  const GgmlType type = GetParam();
  // gate / up [2304, 5120] (Q2_K in the ds41 preset) and down [5120, 2304] (Q3_K), both types
  for (auto [rows, K] : {std::pair<int64_t, int64_t>{2304, 5120}, {5120, 2304}})
    for (int64_t T : {9, 64})
      plain_case(type, 77 + static_cast<uint64_t>(T + rows), rows, K, T, T == 9);
}

// Experts in one buffer at their own offsets (slot pointers, not a stack), random groups of
// 1..8 rows of any expert; n_proj 2 reads the second projection's groups proj_stride later.
// runs: the plan's shape instead, runs of 1..5 consecutive groups of one expert (a run's groups
// full but its last), so that MMQ pairs the groups of a run at either parity of the range.
struct GroupCase {
  std::vector<uint8_t> all;
  std::vector<size_t> offs;
  std::vector<MmvqGroup> groups;
  std::vector<BlockQ8_1> a;
  int64_t rows = 0, K = 0, ny = 0;
};

GroupCase make_groups_case(emutest::Gen& g, GgmlType type, int64_t n_groups, int64_t proj_stride,
                           int n_proj, bool runs = false) {
  GroupCase c;
  c.K = kQK_K * (1 + static_cast<int64_t>(g.u32() % 10));
  c.rows = 1 + g.u32() % 140;
  const int64_t n_exp = 1 + g.u32() % 5, T = 1 + g.u32() % 40;
  const size_t step = type == GgmlType::kQ2K ? 4 : 2;  // Q2_K blocks are read as aligned words
  for (int64_t i = 0; i < n_exp; ++i) {
    c.all.resize(c.all.size() + step * (g.u32() % 8));
    c.offs.push_back(c.all.size());
    const auto w = emutest::make_rows(g, type, c.rows, c.K, i % 2 == 0 ? 0.3 : 0.0);
    c.all.insert(c.all.end(), w.begin(), w.end());
  }
  c.a = make_act(g, T, c.K, g.u32() % 2 == 0);
  c.groups.assign(static_cast<size_t>(proj_stride * n_proj), MmvqGroup{});
  int32_t next_y = 0;
  for (int j = 0; j < n_proj; ++j) {
    int64_t run_left = 0;
    int32_t run_slot = 0;
    for (int64_t q = 0; q < n_groups; ++q) {
      MmvqGroup& G = c.groups[static_cast<size_t>(j * proj_stride + q)];
      if (runs) {
        if (run_left == 0) {
          run_left = 1 + g.u32() % 5;
          run_slot = (run_slot + 1 + static_cast<int32_t>(g.u32() % (n_exp > 1 ? n_exp - 1 : 1))) %
                     static_cast<int32_t>(n_exp);  // a run's expert differs from the last one's
        }
        --run_left;
        G.slot = run_slot;
        G.n = run_left > 0 ? kMaxGroupRows : static_cast<int32_t>(1 + g.u32() % kMaxGroupRows);
      } else {
        G.slot = static_cast<int32_t>(g.u32() % n_exp);
        G.n = static_cast<int32_t>(1 + g.u32() % kMaxGroupRows);
      }
      for (int i = 0; i < G.n; ++i) {
        G.a_row[i] = static_cast<int32_t>(g.u32() % T);
        G.y_row[i] = next_y++;
      }
    }
  }
  c.ny = next_y;
  return c;
}

void groups_case(GgmlType type, uint64_t seed, bool planned, bool runs = false) {
  emutest::Gen g(seed);
  const int n_proj = 1 + static_cast<int>(g.u32() % 2);
  const int64_t n_groups = 1 + g.u32() % (runs ? 24 : 12), stride = n_groups + g.u32() % 3;
  // planned: groups [g0, n_groups) are live (at least one)
  const int64_t g0 = planned ? std::min<int64_t>(g.u32() % 3, n_groups - 1) : 0;
  const GroupCase c = make_groups_case(g, type, n_groups, stride, n_proj, runs);
  std::vector<const uint8_t*> host_slots;
  for (size_t off : c.offs) host_slots.push_back(c.all.data() + off);
  std::vector<float> want(static_cast<size_t>(c.ny * c.rows), 0.0f);
  for (int j = 0; j < n_proj; ++j)
    emu::mmvq_groups(type, host_slots.data(), c.groups.data() + j * stride + g0, n_groups - g0,
                     c.a.data(), want.data(), c.rows, c.K);
  const OffsetCopy dall(c.all, 0);
  std::vector<const uint8_t*> dev_slots;
  for (size_t off : c.offs) dev_slots.push_back(dall.p + off);
  DevArray<const uint8_t*> ds(dev_slots);
  DevArray<MmvqGroup> dg(c.groups);
  DevArray<BlockQ8_1> da(c.a);
  DevArray<float> dy(want.size());
  const std::vector<int32_t> counts = {0, static_cast<int32_t>(n_groups), 0,
                                       static_cast<int32_t>(g0)};
  DevArray<int32_t> dc(counts);
  const std::string r = gputest::repro(
      seed, std::string(planned ? "planned" : "groups") + (runs ? " runs" : "") +
                " K=" + std::to_string(c.K) + " rows=" + std::to_string(c.rows) +
                " groups=" + std::to_string(n_groups) + " n_proj=" + std::to_string(n_proj));
  for (int run = 0; run < 2; ++run) {
    (void)cudaMemset(dy.get(), 0, dy.bytes());
    if (planned)
      cuda::mmq_groups_planned(type, ds.get(), dg.get(), dc.get(), n_proj, stride, da.get(),
                               dy.get(), c.rows, c.K, nullptr);
    else
      cuda::mmq_groups(type, ds.get(), dg.get(), n_groups, n_proj, stride, da.get(), dy.get(),
                       c.rows, c.K, nullptr);
    ASSERT_TRUE(
        same_f32(run == 0 ? "mmq_groups" : "mmq_groups (second run)", dy.host(), want, c.rows, r));
  }
}

TEST_P(MmqTest, GroupsEqualsEmu_60Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 60; ++seed)
    groups_case(GetParam(), seed * 2621 + static_cast<uint64_t>(GetParam()), false);
}

TEST_P(MmqTest, PlannedRangeFromDeviceEqualsEmu_60Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 60; ++seed)
    groups_case(GetParam(), seed * 4099 + static_cast<uint64_t>(GetParam()), true);
}

// Groups in runs of one expert, as the plan lays them out: MMQ computes two groups of a slot at
// positions 2 j, 2 j + 1 of the live range as one item of 16 token columns (its 64 rows in two
// phases of 32), any other group alone over 64 rows; every output equal to the emulation's
// either way.
TEST_P(MmqTest, GroupsInRunsPairedEqualsEmu_60Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 60; ++seed)
    groups_case(GetParam(), seed * 5237 + static_cast<uint64_t>(GetParam()), seed % 2 == 0, true);
}

TEST_P(MmqTest, BadArgumentsThrowBeforeLaunch) {
  MOECHECK_REQUIRE_GPU();
  DevArray<uint8_t> w(4096);
  DevArray<BlockQ8_1> a(64);
  DevArray<float> y(64);
  const GgmlType t = GetParam();
  EXPECT_THROW(cuda::mmq(t, w.get(), a.get(), y.get(), 4, 100, 1, nullptr), InputError);
  EXPECT_THROW(cuda::mmq(t, w.get(), a.get(), y.get(), 4, 256, -1, nullptr), InputError);
  EXPECT_THROW(cuda::mmq(t, w.get() + 2, a.get(), y.get(), 4, 256, 1, nullptr), InputError);
  EXPECT_THROW(cuda::mmq(GgmlType::kBF16, w.get(), a.get(), y.get(), 4, 256, 1, nullptr),
               InputError);
  EXPECT_THROW(cuda::mmq_groups(t, nullptr, nullptr, 3, 2, 1, a.get(), y.get(), 4, 256, nullptr),
               InputError);
}

INSTANTIATE_TEST_SUITE_P(Types, MmqTest, ::testing::Values(GgmlType::kQ2K, GgmlType::kQ3K),
                         [](const auto& i) {
                           return std::string(i.param == GgmlType::kQ2K ? "Q2_K" : "Q3_K");
                         });

}  // namespace
}  // namespace moecheck
