// The streamed MMVQ engine's host side (cuda/mmvq_sb.cuh), checked without a GPU (CI runs this
// binary; it needs no device): the step plans, the blocks' split of a launch's items, and the
// launch choice (warps, stages, step form, grid, activation slots) at the ds41 layer's shapes
// and for random launches. The kernel's own results against the emulation are
// tests/gpu/mmvq_test.cu's.
#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "cuda/gemv_stream_layout.cuh"
#include "cuda/kernels.h"
#include "cuda/mmvq_sb.cuh"
#include "cuda/moe_layer.h"
#include "tests/emu_test_util.h"

namespace moecheck {
namespace {

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

// Each of `bad` given to set (one of the process-wide settings, `name`) throws InputError whose
// message names the value ("found <v>").
template <class Set>
void expect_refusals_name_the_value(const char* name, std::initializer_list<int> bad,
                                    const Set& set) {
  for (int v : bad) {
    try {
      set(v);
      ADD_FAILURE() << name << "(" << v << ") did not throw";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("found " + std::to_string(v)), std::string::npos)
          << e.what();
    }
  }
}

// The streamed engine's step setting takes 0, 4 or 8 super-blocks and names the others.
TEST(MmvqStreamStep, RejectsOtherSizes_Host) {
  expect_refusals_name_the_value("set_mmvq_stream_step", {-1, 1, 2, 3, 5, 12, 16},
                                 [](int v) { cuda::set_mmvq_stream_step(v); });
  for (int ok : {4, 8, 0}) EXPECT_NO_THROW(cuda::set_mmvq_stream_step(ok));
}

// The streamed engine's ring head (cuda::set_mmvq_stream_head) takes -1 (the default) or 0 - 8
// steps and names the others.
TEST(MmvqStreamHead, RejectsOtherCounts_Host) {
  expect_refusals_name_the_value("set_mmvq_stream_head", {-2, 9, 100},
                                 [](int v) { cuda::set_mmvq_stream_head(v); });
  for (int ok : {0, 1, 8, -1}) EXPECT_NO_THROW(cuda::set_mmvq_stream_head(ok));
}

// The launch diagnostics' setting (cuda::set_mmvq_stream_diagnostic) takes modes 0 - 2 and,
// for 1 and 2, a buffer of a record or more; the refusals name what was wrong and come before any
// device call (mode 0 touches no device state).
TEST(MmvqStreamDiagnostic, RejectsOtherModesAndMissingBuffers_Host) {
  uint64_t word = 0;
  expect_refusals_name_the_value("set_mmvq_stream_diagnostic", {-1, 3, 7},
                                 [&](int v) { cuda::set_mmvq_stream_diagnostic(v, &word, 1); });
  for (int mode : {1, 2}) {
    EXPECT_THROW(cuda::set_mmvq_stream_diagnostic(mode, nullptr, 16), InputError) << mode;
    EXPECT_THROW(cuda::set_mmvq_stream_diagnostic(mode, &word, 0), InputError) << mode;
  }
  EXPECT_NO_THROW(cuda::set_mmvq_stream_diagnostic(0, nullptr, 0));
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
      const auto [b0, b1] =
          cuda::mmvq_sb::block_items_by_work(static_cast<uint32_t>(b), static_cast<uint32_t>(B),
                                             kTok, w0, G, pre.data(), cpre.data(), passes);
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
// pass in layers of up to 32 tokens and two above (cuda::mmvq_stream_pass_tokens); the warps the
// layer asks for come from cuda::gate_up_stream_warps and LayerOptions.
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
  p.pass_tokens = cuda::mmvq_stream_pass_tokens(T);
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
// streamed engine takes: at T = 1 the gate / up launch's one-token shape, 14 warps x 2 stages
// and 99.3 KB of shared memory (kOneTokenWarps; before the thirty-ninth session 12 warps x 3
// stages and 122.9 KB, the shape ncu measured on the device, docs/performance.md "Double steps"),
// and the down launch's, 16 warps and 159.3 KB (2 stages: the down rings of 3 do not fit at 16
// warps, as ncu measured),
// and the double-step rule: the gate / up launch of the layers of 2 - 32 tokens takes double
// steps at 16 warps x 2 stages with a block per multiprocessor, the down launch and the T >= 33
// gate / up launches (passes of two tokens, whose activation slots leave no room) do not.
TEST(MmvqStreamGeometry, Ds41LayerLaunchesAtTheDefaults_Host) {
  using cuda::mmvq_sb::choose;
  const Settings set;
  const cuda::LayerOptions lo;
  for (int64_t T = 1; T <= 64; ++T) {
    const std::string at = "T=" + std::to_string(T);
    Geometry gu, dn;
    ASSERT_TRUE(choose(sbgeo::planned(T, 2, 2304, 5120), GgmlType::kQ2K,
                       cuda::gate_up_stream_warps(lo, T), 0, 132, set, gu))
        << at;
    ASSERT_TRUE(choose(sbgeo::planned(T, 1, 5120, 2304), GgmlType::kQ3K, lo.down_stream_warps, 0,
                       132, set, dn))
        << at;
    const std::string gs = at + " gate/up " + sbgeo::describe(gu),
                      ds = at + " down " + sbgeo::describe(dn);
    EXPECT_TRUE(gu.one_wave && gu.grid == 132) << gs;
    EXPECT_TRUE(dn.one_wave && dn.grid == 132) << ds;
    EXPECT_EQ(dn.warps, 16) << ds;
    EXPECT_EQ(dn.per, 1) << ds;
    EXPECT_EQ(dn.stages, 2) << ds;
    EXPECT_EQ(gu.tok, T <= 32 ? 1 : 2) << gs;
    if (T == 1) {
      EXPECT_EQ(gu.warps, 14) << gs;
      EXPECT_EQ(gu.stages, 2) << gs;
      EXPECT_EQ(gu.per, 1) << gs;
      EXPECT_EQ(gu.n_act, 2) << gs;
      EXPECT_EQ(gu.bytes, 99312) << gs;
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

// The one-token shape of 14 warps (cuda/mmvq_sb.cuh kOneTokenWarps), asked for the ds41 layer's
// gate / up launch: at one token it keeps 14 warps with 2 stages (3 when asked), a block per
// multiprocessor, shared memory that leaves room for one block of the shared expert's pair GEMV
// beside it (cuda/gemv_stream_layout.cuh: 4 warps x 2 stages of a 10240-byte row, x, 8 barriers),
// and at most two passes a warp where 12 warps leave some warps three; launches of several-token
// groups and forced steps of 8 take 12 warps in its place. Asked through the options and
// set_mmvq_stream_shape, 14 is accepted; 10 and 6 (what the old step-down would have reached)
// are not.
TEST(MmvqStreamGeometry, FourteenWarpsAreAOneTokenShape_Host) {
  using cuda::mmvq_sb::block_items;
  using cuda::mmvq_sb::choose;
  using cuda::mmvq_sb::kPassRows;
  const Settings set;
  constexpr int64_t kSmPerSm = 228 * 1024, kBlockReserve = 1024;
  namespace gs = cuda::gemv_stream;
  const int64_t pair_gemv_bytes =
      gs::stream_layout(5120, gs::kDefaultWarps, gs::kSmemMax, gs::kDefaultStages).bytes;
  EXPECT_EQ(pair_gemv_bytes, 4 * 2 * 10240 + 10240 + 4 * 2 * 8);  // 92224: the shape named above
  auto most_passes_a_warp = [](const Geometry& g, int64_t items) {
    int64_t most = 0;
    for (int64_t b = 0; b < g.grid; ++b) {
      const auto r = block_items(static_cast<uint32_t>(b), static_cast<uint32_t>(g.grid), items);
      most = std::max(most, (r.b1 - r.b0 + g.warps - 1) / g.warps);
    }
    return most;
  };
  const int64_t items = 2 * 6 * 2304 / kPassRows;  // gate and up of 6 experts, passes of 8 rows
  Geometry g14, g12, g14s3;
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K, 14, 0, 132, set, g14));
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K, 12, 0, 132, set, g12));
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K, 14, 3, 132, set, g14s3));
  const std::string d14 = sbgeo::describe(g14), d12 = sbgeo::describe(g12);
  EXPECT_EQ(g14.warps, 14) << d14;
  EXPECT_EQ(g14.stages, 2) << d14;
  EXPECT_EQ(g14.per, 1) << d14;
  EXPECT_EQ(g14.grid, 132) << d14;
  EXPECT_EQ(g14.bytes, 99312) << d14;
  EXPECT_LE(g14.bytes + kBlockReserve + pair_gemv_bytes + kBlockReserve, kSmPerSm) << d14;
  EXPECT_EQ(g14s3.warps, 14) << sbgeo::describe(g14s3);
  EXPECT_EQ(g14s3.stages, 3) << sbgeo::describe(g14s3);
  EXPECT_EQ(most_passes_a_warp(g14, items), 2) << d14;
  EXPECT_EQ(g12.warps, 12) << d12;
  EXPECT_EQ(most_passes_a_warp(g12, items), 3) << d12;
  for (int64_t T = 2; T <= 64; T += 7) {
    Geometry g;
    ASSERT_TRUE(choose(sbgeo::planned(T, 2, 2304, 5120), GgmlType::kQ2K, 14, 0, 132, set, g));
    EXPECT_TRUE(g.warps != 14 && cuda::stream_warps_allowed(g.warps))
        << "T=" << T << " " << sbgeo::describe(g);
  }
  Settings step8;
  step8.step = 8;
  Geometry g8;
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K, 14, 0, 132, step8, g8));
  EXPECT_TRUE(g8.warps != 14 && cuda::stream_warps_allowed(g8.warps)) << sbgeo::describe(g8);
  EXPECT_EQ(g8.per, 2) << sbgeo::describe(g8);
  EXPECT_TRUE(cuda::stream_warps_allowed(14));
  EXPECT_FALSE(cuda::stream_warps_allowed(10));
  EXPECT_FALSE(cuda::stream_warps_allowed(6));
  cuda::LayerOptions lo;
  lo.gate_up_stream_warps = 14;
  EXPECT_EQ(cuda::gate_up_stream_warps(lo, 1), 14);
}

// choose() sets every field of the Geometry it is given: one reused for a launch of double steps
// and then for a one-token launch gives the one-token launch's steps of one a class.
TEST(MmvqStreamGeometry, ChoiceSetsEveryField_Host) {
  using cuda::mmvq_sb::choose;
  const Settings set;
  const cuda::LayerOptions lo;
  Geometry reused, fresh;
  ASSERT_TRUE(choose(sbgeo::planned(8, 2, 2304, 5120), GgmlType::kQ2K,
                     cuda::gate_up_stream_warps(lo, 8), 0, 132, set, reused));
  ASSERT_EQ(reused.per, 2) << sbgeo::describe(reused);
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K,
                     cuda::gate_up_stream_warps(lo, 1), 0, 132, set, reused));
  ASSERT_TRUE(choose(sbgeo::planned(1, 2, 2304, 5120), GgmlType::kQ2K,
                     cuda::gate_up_stream_warps(lo, 1), 0, 132, set, fresh));
  EXPECT_EQ(sbgeo::describe(reused), sbgeo::describe(fresh));
  EXPECT_EQ(reused.per, 1) << sbgeo::describe(reused);
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
    // The kernel's split (cuda/mmvq_sb.cuh block_items, block_items_by_work).
    const bool work = prefixed && g.tok > 1;
    int64_t prev = 0;
    for (int64_t b = 0; b < g.grid; ++b) {
      const auto bb = static_cast<uint32_t>(b), B = static_cast<uint32_t>(g.grid);
      const auto [b0, b1] =
          work ? cuda::mmvq_sb::block_items_by_work(bb, B, g.tok, cuda::mmvq_sb::pass_weight(t), G,
                                                    pre.data(), cpre.data(), passes)
               : cuda::mmvq_sb::block_items(bb, B, total);
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

}  // namespace
}  // namespace moecheck
