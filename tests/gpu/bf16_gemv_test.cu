// cuda::bf16_gemv and cuda::bf16_gemv_pair vs emu::bf16_gemv / emu::bf16_gemv_pair, bitwise:
// >= 100 seeded cases (tests/gpu/gemv_cases.h), each launch twice; the pair at the ds41 shared
// expert's shape; above 8 tokens the GEMM form (cuda/bf16_gemm.cu) at T = 9 .. 512 on tiny
// ragged shapes and both ds41 shared-expert shapes, with NaN, Inf, subnormal and overflowing
// values. Contract: docs/numerics.md "bf16_gemv".
#include <algorithm>
#include <thread>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "cuda/kernels.h"
#include "emulate/bf16_gemv.h"
#include "tests/gpu/gemv_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;
using gputest::same_f32;

void check(uint64_t seed, int64_t force_T = 0) {
  gputest::check_gemv_case(
      seed, "y", emu::bf16_gemv,
      [](const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T) {
        cuda::bf16_gemv(w, x, y, rows, K, T, nullptr);
      },
      force_T);
}

TEST(Bf16Gemv, EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t s = 1; s <= 100; ++s) ASSERT_NO_FATAL_FAILURE(check(s));
}

// One token of seeded values at [rows, K] against emu::bf16_gemv (the generator g continues from
// the shape draws of seed s).
void one_token_case(uint64_t s, emutest::Gen& g, int64_t rows, int64_t K, const char* what) {
  const auto w = g.bf16(rows * K, 0.05), x = g.bf16(K, 1.0);
  std::vector<float> want(static_cast<size_t>(rows));
  emu::bf16_gemv(w.data(), x.data(), want.data(), rows, K, 1);
  DevArray<uint16_t> dw(w), dx(x);
  DevArray<float> dy(want.size());
  cuda::bf16_gemv(dw.get(), dx.get(), dy.get(), rows, K, 1, nullptr);
  ASSERT_TRUE(
      same_f32(what, dy.host(), want, rows,
               gputest::repro(s, "K=" + std::to_string(K) + " rows=" + std::to_string(rows))));
}

// Restores the default one-token kernel (the streaming one) when a test ends.
struct StreamDefault {
  ~StreamDefault() {
    cuda::set_bf16_gemv_stream(true);
    cuda::set_bf16_gemv_stream_shape(0, 0);
  }
};

// One token: the streaming kernel (bulk-copied row stages, K up to about 6000; the default) and
// the kernel that loads the lane's whole row first (K up to 3200 here, and beyond 8192 values
// the general kernel).
TEST(Bf16Gemv, OneTokenEqualsEmu_60Seeds) {
  MOECHECK_REQUIRE_GPU();
  StreamDefault restore;
  for (bool streamed : {true, false}) {
    SCOPED_TRACE(streamed ? "streaming kernel" : "register-staged kernel");
    cuda::set_bf16_gemv_stream(streamed);
    for (uint64_t s = 1001; s <= 1060; ++s) ASSERT_NO_FATAL_FAILURE(check(s, 1));
  }
  cuda::set_bf16_gemv_stream(true);
  for (uint64_t s = 4001; s <= 4008; ++s) {  // K where only the streaming kernel's 2 - 8 stages fit
    emutest::Gen g(s);
    const int64_t rows = 1 + g.u32() % 700, K = 3200 + 8 * (1 + g.u32() % 350);
    ASSERT_NO_FATAL_FAILURE(one_token_case(s, g, rows, K, "y (streamed)"));
  }
  // Every shape: 2, 4 and 8 warps per block with 2 stages and with as many as fit (up to 8;
  // two warps at most 64 registers), K up to 5600.
  for (const auto& [wp, st] : {std::pair{2, 2}, {2, 0}, {4, 2}, {4, 0}, {8, 2}, {8, 0}}) {
    cuda::set_bf16_gemv_stream_shape(wp, st);
    const std::string what =
        "y (streamed, " + std::to_string(wp) + " warps x " + std::to_string(st) + " stages)";
    const uint64_t s0 = 4200 + 100 * static_cast<uint64_t>(wp + st);
    for (uint64_t s = s0 + 1; s <= s0 + 6; ++s) {
      emutest::Gen g(s);
      const int64_t rows = 1 + g.u32() % 900, K = 8 * (1 + g.u32() % 700);
      ASSERT_NO_FATAL_FAILURE(one_token_case(s, g, rows, K, what.c_str()));
    }
  }
  cuda::set_bf16_gemv_stream_shape(0, 0);
  for (uint64_t s = 1061; s <= 1064; ++s) {  // K beyond the one-token kernel's 8192
    emutest::Gen g(s);
    const int64_t K = 8192 + 8 * (1 + g.u32() % 64);
    ASSERT_NO_FATAL_FAILURE(one_token_case(s, g, 5, K, "y (K > 8192)"));
  }
}

TEST(Bf16Gemv, PairEqualsEmu_Ds41Shared_T1_T8) {
  MOECHECK_REQUIRE_GPU();
  StreamDefault restore;
  // T, streamed, warps of the streaming kernel (0: the default, 4)
  const std::tuple<int64_t, bool, int> runs[] = {
      {1, true, 0}, {1, true, 8}, {1, true, 2}, {1, false, 0}, {8, true, 0}};
  for (const auto& [T, streamed, warps] : runs) {
    cuda::set_bf16_gemv_stream(streamed);
    cuda::set_bf16_gemv_stream_shape(warps, warps != 0 ? 2 : 0);
    emutest::Gen g(77 + T);
    const int64_t rows = 2304, K = 5120;
    const auto w0 = g.bf16(rows * K, 0.02), w1 = g.bf16(rows * K, 0.02), x = g.bf16(T * K, 1.0);
    std::vector<float> want0(static_cast<size_t>(T * rows)), want1(want0.size());
    emu::bf16_gemv_pair(w0.data(), w1.data(), x.data(), want0.data(), want1.data(), rows, K, T);
    DevArray<uint16_t> d0(w0), d1(w1), dx(x);
    DevArray<float> y0(want0.size()), y1(want1.size());
    cuda::bf16_gemv_pair(d0.get(), d1.get(), dx.get(), y0.get(), y1.get(), rows, K, T, nullptr);
    const std::string r =
        gputest::repro(77 + T, "T=" + std::to_string(T) + (streamed ? "" : " register-staged") +
                                   (warps != 0 ? " warps=" + std::to_string(warps) : ""));
    ASSERT_TRUE(same_f32("shared gate", y0.host(), want0, rows, r));
    ASSERT_TRUE(same_f32("shared up", y1.host(), want1, rows, r));
  }
}

// Restores the default GEMV of 2 - 8 tokens (x staged in shared memory) when a test ends.
struct XStagedDefault {
  ~XStagedDefault() {
    cuda::set_bf16_gemv_x_staged(true);
    cuda::set_bf16_gemv_tokens_blocks(0);
  }
};

// 2 - 8 tokens: the kernel with the tokens' x staged in shared memory (the default; its warps
// stride over the rows, several rows a warp from about 2000 rows) and the kernel that reads x
// from L2 per row (set_bf16_gemv_x_staged(false); also the fallback where n x K bf16 exceed a
// block's shared memory, K = 16384 at T = 8 below), both against emu::bf16_gemv / _pair.
TEST(Bf16Gemv, SeveralTokens_XStagedAndNot_EqualsEmu) {
  MOECHECK_REQUIRE_GPU();
  XStagedDefault restore;
  // Modes: x staged with the default blocks a multiprocessor (room left for the selection), x
  // staged with one block a multiprocessor (set_bf16_gemv_tokens_blocks(1): more rows a warp),
  // x read from L2, x staged with as many blocks as fit (set_bf16_gemv_tokens_blocks(32)).
  const char* const names[] = {"x staged in shared memory", "x staged, one block a multiprocessor",
                               "x read from L2", "x staged, as many blocks as fit"};
  for (int mode : {0, 1, 2, 3}) {
    const bool staged = mode != 2;
    SCOPED_TRACE(names[mode]);
    cuda::set_bf16_gemv_x_staged(staged);
    cuda::set_bf16_gemv_tokens_blocks(mode == 1 ? 1 : (mode == 3 ? 32 : 0));
    for (uint64_t s = 2001; s <= 2040; ++s) ASSERT_NO_FATAL_FAILURE(check(s, 2 + s % 7));
    for (uint64_t s = 2101; s <= 2106; ++s) {  // many rows, every T of the kernel
      emutest::Gen g(s);
      const int64_t T = 2 + static_cast<int64_t>(s % 7),
                    rows = s == 2106 ? 300 : 1500 + g.u32() % 3000,
                    K = s == 2106 ? 16384 : 8 * (1 + g.u32() % 800);
      const auto w0 = g.bf16(rows * K, 0.05), w1 = g.bf16(rows * K, 0.05), x = g.bf16(T * K, 1.0);
      std::vector<float> want0(static_cast<size_t>(T * rows)), want1(want0.size());
      emu::bf16_gemv_pair(w0.data(), w1.data(), x.data(), want0.data(), want1.data(), rows, K, T);
      DevArray<uint16_t> d0(w0), d1(w1), dx(x);
      DevArray<float> y0(want0.size()), y1(want1.size());
      const std::string r =
          gputest::repro(s, "rows=" + std::to_string(rows) + " K=" + std::to_string(K) +
                                " T=" + std::to_string(T) + " (" + names[mode] + ")");
      cuda::bf16_gemv_pair(d0.get(), d1.get(), dx.get(), y0.get(), y1.get(), rows, K, T, nullptr);
      ASSERT_TRUE(same_f32("pair 0", y0.host(), want0, rows, r));
      ASSERT_TRUE(same_f32("pair 1", y1.host(), want1, rows, r));
      y0.poison();
      cuda::bf16_gemv(d0.get(), dx.get(), y0.get(), rows, K, T, nullptr);
      ASSERT_TRUE(same_f32("single", y0.host(), want0, rows, r));
    }
    // A larger x after a smaller one and again (the layer's pair, then down, then the pair): the
    // kernel's shared-memory limit must admit every launch, not only the last size set.
    for (const int64_t K : {5120, 2304, 5120, 2304}) {
      emutest::Gen g(2200 + static_cast<uint64_t>(K));
      const int64_t T = 8, rows = 64;
      const auto w = g.bf16(rows * K, 0.05), x = g.bf16(T * K, 1.0);
      std::vector<float> want(static_cast<size_t>(T * rows));
      emu::bf16_gemv(w.data(), x.data(), want.data(), rows, K, T);
      DevArray<uint16_t> dw(w), dx(x);
      DevArray<float> dy(want.size());
      cuda::bf16_gemv(dw.get(), dx.get(), dy.get(), rows, K, T, nullptr);
      ASSERT_TRUE(same_f32("y (sizes alternating)", dy.host(), want, rows,
                           gputest::repro(2200 + static_cast<uint64_t>(K),
                                          "K=" + std::to_string(K) + " T=8 after another K")));
    }
  }
  EXPECT_THROW(cuda::set_bf16_gemv_tokens_blocks(-1), InputError);
  EXPECT_THROW(cuda::set_bf16_gemv_tokens_blocks(33), InputError);
}

// ---- the GEMM form (T > 8) ----

const int64_t kGemmTs[] = {9, 16, 63, 64, 65, 512};

// Seeded weights and tokens; kind = seed % 4 adds adversarial values: 1 subnormal bf16 in w and
// x, 2 NaN and +-Inf (one token's NaN, an Inf weight, a -Inf activation), 3 magnitudes near the
// bf16 maximum (products and partial sums overflowing to Inf).
void gemm_values(uint64_t seed, int64_t rows, int64_t K, int64_t T, std::vector<uint16_t>& w,
                 std::vector<uint16_t>& x) {
  emutest::Gen g(seed);
  w = g.bf16(rows * K, 0.05);
  x = g.bf16(T * K, 1.0);
  auto sub = [&] { return static_cast<uint16_t>((g.u32() & 0x8000u) | (1 + g.u32() % 0x7F)); };
  switch (seed % 4) {
    case 1:
      for (size_t i = 0; i < w.size(); i += 5) w[i] = sub();
      for (size_t i = 2; i < x.size(); i += 9) x[i] = sub();
      break;
    case 2:
      x[(T / 2) * K + g.u32() % K] = 0x7FC1;     // NaN (payload): a whole token NaN
      w[(rows - 1) * K + g.u32() % K] = 0x7F80;  // +Inf weight: the last row Inf or NaN
      x[g.u32() % K] = 0xFF80;                   // -Inf in token 0
      break;
    case 3:
      for (size_t i = 0; i < x.size(); i += 7)
        x[i] = static_cast<uint16_t>((g.u32() & 0x8000u) | 0x7F00u | (g.u32() & 0x7Fu));
      for (size_t i = 3; i < w.size(); i += 11)
        w[i] = static_cast<uint16_t>((g.u32() & 0x8000u) | 0x7E00u | (g.u32() & 0xFFu));
      break;
    default: break;
  }
}

// emu::bf16_gemv over row slices on every host thread (each output depends on its row and
// token only), y [T, rows].
std::vector<float> emu_gemv_threaded(const std::vector<uint16_t>& w, const std::vector<uint16_t>& x,
                                     int64_t rows, int64_t K, int64_t T) {
  std::vector<float> y(static_cast<size_t>(T * rows));
  const int64_t n =
      std::max<int64_t>(1, std::min<int64_t>(rows, std::thread::hardware_concurrency()));
  const int64_t per = (rows + n - 1) / n;
  std::vector<std::thread> th;
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    th.emplace_back([&, r0] {
      const int64_t nr = std::min(per, rows - r0);
      std::vector<float> part(static_cast<size_t>(T * nr));
      emu::bf16_gemv(w.data() + r0 * K, x.data(), part.data(), nr, K, T);
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(part.begin() + t * nr, nr, y.begin() + t * rows + r0);
    });
  }
  for (auto& t : th) t.join();
  return y;
}

// bf16_gemv (pair = false) or bf16_gemv_pair (pair = true; the second matrix from seed + 1000)
// at [rows, K] x T tokens against the emulation, bitwise, output poisoned first.
void check_gemm(uint64_t seed, int64_t rows, int64_t K, int64_t T, bool pair) {
  std::vector<uint16_t> w0, w1, x, x_unused;
  gemm_values(seed, rows, K, T, w0, x);
  if (pair) gemm_values(seed + 1000, rows, K, T, w1, x_unused);
  const std::string r =
      gputest::repro(seed, std::string(pair ? "pair " : "") + "rows=" + std::to_string(rows) +
                               " K=" + std::to_string(K) + " T=" + std::to_string(T));
  DevArray<uint16_t> d0(w0), d1(pair ? w1 : w0), dx(x);
  DevArray<float> y0(static_cast<size_t>(T * rows)), y1(static_cast<size_t>(T * rows));
  y0.poison();
  y1.poison();
  if (pair)
    cuda::bf16_gemv_pair(d0.get(), d1.get(), dx.get(), y0.get(), y1.get(), rows, K, T, nullptr);
  else cuda::bf16_gemv(d0.get(), dx.get(), y0.get(), rows, K, T, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << r;
  ASSERT_TRUE(same_f32(pair ? "gemm y0" : "gemm y", y0.host(), emu_gemv_threaded(w0, x, rows, K, T),
                       rows, r));
  if (pair)
    ASSERT_TRUE(same_f32("gemm y1", y1.host(), emu_gemv_threaded(w1, x, rows, K, T), rows, r));
}

// Shapes that are no multiple of the tile (48 rows x 16 tokens x 256 values): rows 40, K 72
// (one partial slab); rows 33, K 264 (a second slab of one chunk); rows 7, K 8 (one chunk, one
// partial warp tile); rows 70 (a full and a partial row tile); every adversarial kind at every
// T. The tile copies zero-fill past the bounds (cuda/bf16_gemm.cu), which these shapes reach in
// every direction.
TEST(Bf16Gemm, EqualsEmu_TinyShapes) {
  MOECHECK_REQUIRE_GPU();
  const int64_t shapes[][2] = {{40, 72}, {33, 264}, {7, 8}, {70, 3200}};
  uint64_t seed = 5000;
  for (const auto& sh : shapes)
    for (int64_t T : kGemmTs)
      for (int kind = 0; kind < 4; ++kind, ++seed)
        ASSERT_NO_FATAL_FAILURE(check_gemm(seed, sh[0], sh[1], T, kind % 2 == 1));
}

// The ds41 shared expert: gate / up [2304, 5120] as the pair, down [5120, 2304] alone.
TEST(Bf16Gemm, EqualsEmu_Ds41Shapes) {
  MOECHECK_REQUIRE_GPU();
  uint64_t seed = 6000;
  for (int64_t T : kGemmTs) {
    ASSERT_NO_FATAL_FAILURE(check_gemm(seed++, 2304, 5120, T, true));
    ASSERT_NO_FATAL_FAILURE(check_gemm(seed++, 5120, 2304, T, false));
  }
}

}  // namespace
}  // namespace moecheck
