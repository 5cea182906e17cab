// The one-token ds41 layer (router + 6 routed experts + bf16 shared expert + finish) through
// cuda::MoeLayer, per option set, against the floor: the bytes one forward must read (router,
// the six experts' gate / up / down, the shared expert) over the device-to-device copy
// bandwidth measured first in this process. Forward time is host wall clock per synchronous
// forward (input upload, host route and output download included), median of 200 after 20
// warm-ups, over 64 rotating inputs (different experts). Before timing, each option set's
// forward on the first input is checked bit for bit against emu::MoeLayer (exit 1 if not).
// Markdown table last.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/bench/bench_util.h"

using namespace moecheck;

int main() {
  const double copy = bench::copy_bandwidth_gbs();
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);
  const GenOptions o = preset_options("ds41");
  auto t0 = std::chrono::steady_clock::now();
  const LayerWeights w = generate_layer(o, 0);
  std::printf("generated ds41 layer 0 (fast blocks) in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const MoeConfig& c = w.config;

  struct Variant {
    std::string name;
    cuda::LayerOptions opt;
    int64_t T;
  };
  std::vector<Variant> vs;
  auto add = [&](std::string name, RouterVariant r, int warps, bool side, bool graphs, int64_t T,
                 RoutePlace route = RoutePlace::kHost) {
    cuda::LayerOptions lo;
    lo.router = r;
    lo.expert_warps = warps;
    lo.shared_side_stream = side;
    lo.use_graphs = graphs;
    lo.route = route;
    vs.push_back({std::move(name), lo, T});
  };
  add("default (staged, 8 warps, side stream)", RouterVariant::kStaged, 8, true, false, 1);
  add("graphs", RouterVariant::kStaged, 8, true, true, 1);
  add("no side stream", RouterVariant::kStaged, 8, false, false, 1);
  add("4 warps", RouterVariant::kStaged, 4, true, false, 1);
  add("2 warps", RouterVariant::kStaged, 2, true, false, 1);
  add("plain router", RouterVariant::kPlain, 8, true, false, 1);
  add("default, T=8", RouterVariant::kStaged, 8, true, false, 8);
  // The device route: no host round trip between the router and the routed experts.
  add("device route", RouterVariant::kStaged, 8, true, false, 1, RoutePlace::kDevice);
  add("device route, graphs", RouterVariant::kStaged, 8, true, true, 1, RoutePlace::kDevice);
  add("device route, T=8", RouterVariant::kStaged, 8, true, false, 8, RoutePlace::kDevice);
  add("device route, graphs, T=8", RouterVariant::kStaged, 8, true, true, 8, RoutePlace::kDevice);

  struct Result {
    std::string name;
    int64_t T;
    double ms, route_ms, floor_ms;
  };
  std::vector<Result> res;
  for (const Variant& v : vs) {
    cuda::MoeLayer layer(w, v.opt);
    std::vector<std::vector<uint16_t>> xs;
    for (int i = 0; i < 64; ++i) xs.push_back(generate_input(1000 + i, v.T, c.dim));
    {
      emu::LayerOptions eo;
      eo.router = v.opt.router;
      eo.expert_warps = v.opt.expert_warps;
      const std::vector<uint16_t> want = emu::MoeLayer(w, eo).forward(xs[0].data(), v.T);
      bench::require_emu_bits("layer output (" + v.name + ")", layer.forward(xs[0].data(), v.T),
                              want);
    }
    for (int i = 0; i < 20; ++i) layer.forward(xs[i % xs.size()].data(), v.T);
    std::vector<double> t, route;
    uint64_t bytes = 0;
    for (int i = 0; i < 200; ++i) {
      LayerTiming tm;
      const auto a = std::chrono::steady_clock::now();
      layer.forward(xs[i % xs.size()].data(), v.T, nullptr, &tm);
      t.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      route.push_back(tm.route_ms);
      bytes += tm.bytes_read;
    }
    const double floor_ms = static_cast<double>(bytes) / 200.0 / (copy * 1e9) * 1e3;
    res.push_back({v.name, v.T, bench::median(t), bench::median(route), floor_ms});
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("\n### layer_bench: ds41 layer, %s, %s, copy %.0f GB/s\n\n",
              bench::gpu_name().c_str(), date, copy);
  std::printf(
      "| options | T | forward us (median) | until routed us | floor us | forward / floor |\n"
      "|---|---|---|---|---|---|\n");
  for (const Result& r : res)
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.2fx |\n", r.name.c_str(),
                static_cast<long long>(r.T), r.ms * 1e3, r.route_ms * 1e3, r.floor_ms * 1e3,
                r.ms / r.floor_ms);
  return 0;
}
