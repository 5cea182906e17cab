// cuda::router_gemv (plain, staged) vs emu::router_gemv, bitwise: >= 100 seeded random cases per
// variant (T = 1..11 crosses the 8-token group; the staged GEMM above 8 tokens up to T = 140),
// adversarial inputs (tests/gpu/gemv_cases.h), each launch twice. Contract: docs/numerics.md
// "router_gemv".
#include "core/error.h"
#include "cuda/kernels.h"
#include "emulate/quantize_q8_1.h"
#include "emulate/router_gemv.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gemv_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::same_f32;

// wt: the weights' type; the F16 cases read the same random bits as f16 (normals, subnormals,
// and whatever the adversarial cases plant). force_T = 1: the one-token kernel.
void check(RouterVariant v, uint64_t seed, GgmlType wt = GgmlType::kBF16, int64_t force_T = 0) {
  gputest::check_gemv_case(
      seed, wt == GgmlType::kF16 ? "logits (f16 router)" : "logits",
      [v, wt](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        emu::router_gemv(v, w, x, y, rows, K, T, wt);
      },
      [v, wt](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        cuda::router_gemv(v, w, x, y, rows, K, T, nullptr, wt);
      },
      force_T);
}

TEST(RouterGemv, PlainEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kPlain, s));
}

TEST(RouterGemv, StagedEqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kStaged, s));
}

// The F16 routers of the deepseek4 / deepseek41 conventions: both variants, any T and one token.
TEST(RouterGemv, F16WeightsEqualEmu_BothVariants_100Seeds_AndOneToken) {
  MOECHECK_REQUIRE_GPU();
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged})
    for (uint64_t s = 1; s <= 100; ++s) {
      ASSERT_NO_FATAL_FAILURE(check(v, 7000 + s, GgmlType::kF16));
      ASSERT_NO_FATAL_FAILURE(check(v, 7500 + s, GgmlType::kF16, 1));
    }
}

TEST(RouterGemv, Ds41Router384x5120_BothVariants_T1_T8) {
  MOECHECK_REQUIRE_GPU();
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    for (int64_t T : {1, 8}) {
      emutest::Gen g(4100 + T);
      const int64_t rows = 384, K = 5120;
      const auto w = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
      std::vector<float> want(static_cast<size_t>(T * rows));
      emu::router_gemv(v, w.data(), x.data(), want.data(), rows, K, T);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      cuda::router_gemv(v, dw.get(), dx.get(), dy.get(), rows, K, T, nullptr);
      ASSERT_TRUE(
          same_f32("router logits", dy.host(), want, rows,
                   gputest::repro(4100 + T, v == RouterVariant::kPlain ? "plain" : "staged")));
    }
  }
}

// The staged variant above 8 tokens runs as a GEMM of 8 rows x 8 tokens a block: token counts
// across its tiles (9 .. 140, ragged last tiles), ragged rows (1 .. 70) and K from one chunk
// (threads without a chunk hold +0) to 400, bf16 and f16 weights, the adversarial cases of
// gemv_cases.h (ties, overflowing products, subnormals, NaN, Inf). The groups-of-8 kernel
// (cuda::set_router_gemm(false)) on the same cases gives the same bits.
TEST(RouterGemv, StagedGemmEqualsEmu_T9To140_BothWeightTypes_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) {
    const int64_t T = 9 + static_cast<int64_t>((s * 37) % 132);
    ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kStaged, 12000 + s, GgmlType::kBF16, T));
    ASSERT_NO_FATAL_FAILURE(check(RouterVariant::kStaged, 12500 + s, GgmlType::kF16, T));
  }
  cuda::set_router_gemm(false);
  for (uint64_t s = 1; s <= 20; ++s)
    ASSERT_NO_FATAL_FAILURE(
        check(RouterVariant::kStaged, 12000 + s, GgmlType::kBF16, 9 + (s * 37) % 132));
  cuda::set_router_gemm(true);
}

// The ds41 router (384 x 5120) at T = 64 and 512 through the GEMM, twice, bitwise equal to the
// emulation both times.
TEST(RouterGemv, Ds41Router384x5120_StagedGemm_T64_T512_Twice) {
  MOECHECK_REQUIRE_GPU();
  for (int64_t T : {64, 512}) {
    emutest::Gen g(4300 + T);
    const int64_t rows = 384, K = 5120;
    const auto w = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
    std::vector<float> want(static_cast<size_t>(T * rows));
    emu::router_gemv(RouterVariant::kStaged, w.data(), x.data(), want.data(), rows, K, T);
    DevArray<uint16_t> dw(w), dx(x);
    DevArray<float> dy(want.size());
    for (int rep = 0; rep < 2; ++rep) {
      dy.poison();
      cuda::router_gemv(RouterVariant::kStaged, dw.get(), dx.get(), dy.get(), rows, K, T, nullptr);
      ASSERT_TRUE(same_f32("router logits (GEMM)", dy.host(), want, rows,
                           gputest::repro(4300 + T, "staged T=" + std::to_string(T) + " run " +
                                                        std::to_string(rep))));
    }
  }
}

// The GEMM copies a thread's chunks in rounds of 3 x 256 (cuda/router_gemv.cu): K at one full
// round (768 chunks), one chunk past it, several rounds with a ragged last one, bf16 and f16
// weights, ragged rows and tokens, twice each, bitwise equal to the emulation.
TEST(RouterGemv, StagedGemmEqualsEmu_RoundsOfChunks_BothWeightTypes) {
  MOECHECK_REQUIRE_GPU();
  for (const int64_t K : {6144, 6152, 12800, 18440}) {
    for (const GgmlType wt : {GgmlType::kBF16, GgmlType::kF16}) {
      const uint64_t seed = 4700 + static_cast<uint64_t>(K) + (wt == GgmlType::kF16 ? 1 : 0);
      emutest::Gen g(seed);
      const int64_t rows = 13, T = K % 3 == 0 ? 9 : 20;
      const auto w = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
      std::vector<float> want(static_cast<size_t>(T * rows));
      emu::router_gemv(RouterVariant::kStaged, w.data(), x.data(), want.data(), rows, K, T, wt);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      for (int rep = 0; rep < 2; ++rep) {
        dy.poison();
        cuda::router_gemv(RouterVariant::kStaged, dw.get(), dx.get(), dy.get(), rows, K, T, nullptr,
                          wt);
        ASSERT_TRUE(same_f32("router logits (GEMM, rounds)", dy.host(), want, rows,
                             gputest::repro(seed, "staged rows=13 K=" + std::to_string(K) +
                                                      " T=" + std::to_string(T) +
                                                      (wt == GgmlType::kF16 ? " f16" : " bf16") +
                                                      " run " + std::to_string(rep))));
      }
    }
  }
}

// The GEMM's persistent form (K <= 6144: a grid of at most one block a multiprocessor walking
// the tiles, a token tile's x resident, the weights through a ring of three steps): blocks with
// one and several row tiles, token tiles shared by many blocks and, past 8 tokens a
// multiprocessor, blocks that take several token tiles (the x copied again); ragged rows,
// tokens and chunks (threads with 0 - 3 chunks); bf16 and f16 weights; q8_1 of x written by the
// same launch. Bitwise equal to the emulation and to the form of a block a tile, twice.
TEST(RouterGemv, StagedGemmResidentEqualsEmuAndTiledForm_TileWalks) {
  MOECHECK_REQUIRE_GPU();
  struct Shape {
    int64_t rows, K, T;
  };
  const int sms = gputest::sm_count();
  const std::vector<Shape> shapes = {{384, 5120, 64},
                                     {384, 5120, 17},
                                     {13, 6144, 9},
                                     {70, 2056, 140},
                                     {9, 8, 33},
                                     {1, 4096, 300},
                                     {40, 1032, 8 * sms + 5},
                                     {16, 256, 16 * sms + 9},
                                     {384, 5120, 512},
                                     {200, 3000 - 3000 % 8, 77}};
  uint64_t seed = 4900;
  for (const Shape& sh : shapes) {
    for (const GgmlType wt : {GgmlType::kBF16, GgmlType::kF16}) {
      ++seed;
      emutest::Gen g(seed);
      const auto w = g.bf16(sh.rows * sh.K, 0.02);
      auto x = g.bf16(sh.T * sh.K, 1.0);
      if (seed % 3 == 0) x[g.u32() % x.size()] = 0x7FC0;  // NaN
      std::vector<float> want(static_cast<size_t>(sh.T * sh.rows));
      emu::router_gemv(RouterVariant::kStaged, w.data(), x.data(), want.data(), sh.rows, sh.K, sh.T,
                       wt);
      const bool q8 = sh.K % kQK8_1 == 0;
      std::vector<BlockQ8_1> want_q(q8 ? static_cast<size_t>(sh.T * sh.K / kQK8_1) : 0);
      if (q8) emu::quantize_q8_1_bf16(x.data(), want_q.data(), sh.T, sh.K);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      DevArray<BlockQ8_1> dq(q8 ? want_q.size() : 1);
      for (int form = 0; form < 3; ++form) {  // resident, resident again, a block a tile
        cuda::set_router_gemm_resident(form < 2);
        dy.poison();
        dq.poison();
        cuda::router_gemv(RouterVariant::kStaged, dw.get(), dx.get(), dy.get(), sh.rows, sh.K, sh.T,
                          nullptr, wt, q8 ? dq.get() : nullptr);
        const std::string r = gputest::repro(
            seed, std::string(form < 2 ? "resident" : "tiled") +
                      " rows=" + std::to_string(sh.rows) + " K=" + std::to_string(sh.K) +
                      " T=" + std::to_string(sh.T) + (wt == GgmlType::kF16 ? " f16" : " bf16"));
        cuda::set_router_gemm_resident(true);
        ASSERT_TRUE(same_f32("router logits (GEMM forms)", dy.host(), want, sh.rows, r));
        if (q8)
          ASSERT_TRUE(gputest::same_q8("x_q8 (router GEMM)", dq.host(), want_q, sh.K / kQK8_1, r));
      }
    }
  }
}

// q8_1 of x written by the router's launch (the device route's form): the bytes of
// emu::quantize_q8_1_bf16 and the logits unchanged, both variants, T from 1 to 40 (more q8_1
// blocks than the staged grid has spare warps at small row counts: the grid-stride loop), NaN
// and Inf in x included.
TEST(RouterGemv, FusedQ8_1EqualsEmuQuantize_BothVariants_40Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    for (uint64_t s = 1; s <= 40; ++s) {
      emutest::Gen g(9100 + s);
      const int64_t rows = 1 + g.u32() % 400, K = 32 * (1 + g.u32() % 170), T = s;
      const auto w = g.bf16(rows * K, 0.05);
      auto x = g.bf16(T * K, 1.0);
      if (s % 5 == 0) x[g.u32() % x.size()] = 0x7FC0;  // NaN
      if (s % 7 == 0) x[g.u32() % x.size()] = 0xFF80;  // -Inf
      std::vector<float> want(static_cast<size_t>(T * rows));
      emu::router_gemv(v, w.data(), x.data(), want.data(), rows, K, T);
      std::vector<BlockQ8_1> want_q(static_cast<size_t>(T * K / kQK8_1));
      emu::quantize_q8_1_bf16(x.data(), want_q.data(), T, K);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      DevArray<BlockQ8_1> dq(want_q.size());
      dq.poison();
      cuda::router_gemv(v, dw.get(), dx.get(), dy.get(), rows, K, T, nullptr, GgmlType::kBF16,
                        dq.get());
      const std::string r =
          gputest::repro(9100 + s, std::string(v == RouterVariant::kPlain ? "plain" : "staged") +
                                       " rows=" + std::to_string(rows) + " K=" + std::to_string(K) +
                                       " T=" + std::to_string(T));
      ASSERT_TRUE(same_f32("router logits (with q8_1 of x)", dy.host(), want, rows, r));
      ASSERT_TRUE(gputest::same_q8("x_q8 (router launch)", dq.host(), want_q, K / kQK8_1, r));
    }
  }
  DevArray<uint16_t> w(1024), x(1024);
  DevArray<float> y(64);
  DevArray<BlockQ8_1> q(64);
  EXPECT_THROW(cuda::router_gemv(RouterVariant::kStaged, w.get(), x.get(), y.get(), 2, 48, 1,
                                 nullptr, GgmlType::kBF16, q.get()),
               InputError);  // K not a multiple of 32
}

TEST(RouterGemv, BadShapesThrowBeforeLaunch) {
  MOECHECK_REQUIRE_GPU();
  DevArray<uint16_t> w(1024), x(1024);
  DevArray<float> y(64);
  EXPECT_THROW(
      cuda::router_gemv(RouterVariant::kStaged, w.get(), x.get(), y.get(), 2, 12, 1, nullptr),
      InputError);
  EXPECT_THROW(
      cuda::router_gemv(RouterVariant::kPlain, w.get() + 1, x.get(), y.get(), 2, 16, 1, nullptr),
      InputError);
  EXPECT_THROW(cuda::bf16_gemv(w.get(), x.get(), y.get(), -1, 16, 1, nullptr), InputError);
}

}  // namespace
}  // namespace moecheck
