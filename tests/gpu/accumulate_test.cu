// cuda::accumulate and cuda::finish vs emu::accumulate / emu::finish, bitwise: >= 100 seeded
// cases (picks in random order, the kernel given them in ascending expert id as the layer
// does), adversarial values (NaN, Inf, huge, values whose sum rounds on a bf16 tie), twice, and
// once more with one element a thread (cuda::set_accumulate_vector(false)).
// Contract: docs/numerics.md "accumulate, finish".
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda/kernels.h"
#include "emulate/accumulate.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;

TEST(Accumulate, EqualsEmu_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    emutest::Gen g(seed * 2654435761u);
    // topk up to 12: the kernel issues every load ahead up to 8 picks, and loops beyond.
    // The four-element kernel runs above 8 tokens where dim % 4 == 0 and topk <= 8; dim % 4 !=
    // 0 on every seventh seed, T from 1 to 24 (the one-element kernel at 8 tokens and fewer, and
    // on every seed once more, below).
    const int64_t T = 1 + g.u32() % 24, topk = 1 + g.u32() % 12,
                  dim = 32 * (1 + g.u32() % 40) + (seed % 7 == 0 ? 2 : 0);
    const int64_t n_exp = topk + g.u32() % 20;
    std::vector<int32_t> ids(static_cast<size_t>(T * topk));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> e(static_cast<size_t>(n_exp));
      std::iota(e.begin(), e.end(), 0);
      for (int64_t i = n_exp - 1; i > 0; --i) std::swap(e[i], e[g.u32() % (i + 1)]);
      std::copy_n(e.begin(), topk, ids.begin() + t * topk);
    }
    auto weights = g.f32(T * topk, 0.5);
    auto down = g.f32(T * topk * dim, 1.0), shared = g.f32(T * dim, 1.0);
    if (seed % 3 == 0) {
      down[g.u32() % down.size()] = std::nanf("");
      down[g.u32() % down.size()] = INFINITY;
      shared[g.u32() % shared.size()] = 3.0e38f;
      for (size_t i = 0; i < shared.size(); i += 5)
        shared[i] = bf16_to_f32(0x3F81) + std::ldexp(1.0f, -8);  // bf16 tie
    }
    // The layer's form: rows of down and weights per token in ascending expert id.
    std::vector<int32_t> rows(ids.size());
    std::vector<float> w_sorted(ids.size());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> ord(static_cast<size_t>(topk));
      std::iota(ord.begin(), ord.end(), int64_t{0});
      std::sort(ord.begin(), ord.end(),
                [&](int64_t a, int64_t b) { return ids[t * topk + a] < ids[t * topk + b]; });
      for (int64_t k = 0; k < topk; ++k) {
        rows[t * topk + k] = static_cast<int32_t>(t * topk + ord[k]);
        w_sorted[t * topk + k] = weights[t * topk + ord[k]];
      }
    }
    std::vector<float> acc(static_cast<size_t>(T * dim));
    std::vector<uint16_t> y(acc.size());
    emu::accumulate(rows.data(), w_sorted.data(), topk, down.data(), shared.data(), acc.data(),
                    y.data(), T, dim);
    DevArray<int32_t> drows(rows);
    DevArray<float> dw(w_sorted), dd(down), ds(shared), dacc(acc.size());
    DevArray<uint16_t> dy(y.size()), dy2(y.size());
    const std::string r = gputest::repro(seed * 2654435761u);
    for (int run = 0; run < 3; ++run) {  // twice as the layer runs it, then one element a thread
      cuda::set_accumulate_vector(run < 2);
      dacc.poison();
      dy.poison();
      cuda::accumulate(drows.get(), dw.get(), topk, dd.get(), ds.get(), dacc.get(), dy.get(), T,
                       dim, nullptr);
      cuda::set_accumulate_vector(true);
      const std::string rr = r + (run < 2 ? " (default)" : " (set_accumulate_vector(false))");
      ASSERT_TRUE(gputest::same_f32("acc", dacc.host(), acc, dim, rr));
      ASSERT_TRUE(gputest::same_u16("output", dy.host(), y, dim, rr));
    }
    cuda::finish(dacc.get(), dy2.get(), T * dim, nullptr);
    std::vector<uint16_t> y2(y.size());
    emu::finish(acc.data(), y2.data(), T * dim);
    ASSERT_TRUE(gputest::same_u16("finish", dy2.host(), y2, dim, r));
  }
}

}  // namespace
}  // namespace moecheck
