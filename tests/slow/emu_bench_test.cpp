// CPU benchmark of the emulation's layer forward at ds41 size, one and eight tokens (6 experts a
// token, bf16 shared expert, staged router), printed for docs/performance.md "CPU emulation". The
// time is measured and printed, not asserted (a timed assertion would be flaky on shared CI).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

#include "core/routing.h"
#include "emulate/moe_layer.h"
#include "emulate/router_gemv.h"
#include "tests/emu_lazy_layer.h"

namespace moecheck {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(EmuBench, Ds41OneAndEightTokens) {
  const GenOptions o = preset_options("ds41");
  emutest::LazyLayer lazy(o, 0);
  const LayerWeights& w = lazy.weights();
  const MoeConfig& c = w.config;
  for (int threads : {1, 2}) {
    emu::LayerOptions lo;
    lo.threads = threads;
    const emu::MoeLayer layer(w, lo);
    for (int64_t T : {1, 8}) {
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        const std::vector<uint16_t> x = generate_input(seed, T, c.dim);
        std::vector<float> logits(static_cast<size_t>(T * c.n_routed));
        emu::router_gemv(RouterVariant::kStaged, w.router, x.data(), logits.data(), c.n_routed,
                         c.dim, T);
        lazy.fill(route_from_logits(logits.data(), T, w.bias, c, 0).ids);
        LayerTiming tm;
        const double t0 = now_ms();
        const std::clock_t c0 =
            std::clock();  // process CPU time: steadier than wall on a shared machine
        const std::vector<uint16_t> y = layer.forward(x.data(), T, nullptr, &tm);
        const std::clock_t c1 = std::clock();
        const double t1 = now_ms();
        std::printf(
            "emu ds41 T=%lld threads=%d input seed %llu: %.1f ms wall, %.1f ms cpu (route %.1f ms, "
            "compute %.1f ms)\n",
            static_cast<long long>(T), threads, static_cast<unsigned long long>(seed), t1 - t0,
            1000.0 * static_cast<double>(c1 - c0) / CLOCKS_PER_SEC, tm.route_ms, tm.compute_ms);
        EXPECT_EQ(y.size(), static_cast<size_t>(T * c.dim));
      }
    }
  }
}

}  // namespace
}  // namespace moecheck
