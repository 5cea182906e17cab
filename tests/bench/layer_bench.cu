// The one-token ds41 layer (router + 6 routed experts + bf16 shared expert + finish) through
// cuda::MoeLayer, per option set, against the floor: the bytes one forward must read (router,
// the six experts' gate / up / down, the shared expert) over the device-to-device copy
// bandwidth measured first in this process. Forward time is host wall clock per synchronous
// forward (input upload, host route and output download included), median of 200 after 20
// warm-ups, over 64 rotating inputs (different experts). Before timing, each option set's
// forward on the first input is checked bit for bit against emu::MoeLayer (exit 1 if not).
// Markdown table last.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>
#include "cuda/kernels.h"
#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/cupti_trace.h"
#include "tests/bench/layer_skeleton.cuh"

using namespace moecheck;

namespace {

// Weight bytes one forward reads with U distinct experts: the router, U experts' gate / up / down
// and the shared expert.
double layer_bytes(const LayerWeights& w, int64_t U) {
  const MoeConfig& c = w.config;
  double b = static_cast<double>(c.n_routed * c.dim * 2);
  b += static_cast<double>(U) *
       static_cast<double>(w.gate_exps.expert_stride() + w.up_exps.expert_stride() +
                           w.down_exps.expert_stride());
  for (const MatView* m : {&w.shared_gate, &w.shared_up, &w.shared_down})
    b += static_cast<double>(m->rows * m->row_stride());
  return b;
}

struct GraphResult {
  std::string name;
  int64_t T;
  double dev_us, host_us, floor_us, queued_us;
};

// The device-resident forward (cuda::MoeLayer::graph_forward): one graph replay per input, from
// an input already on the device to the output on the device. Inputs rotate among 64, copied
// device-to-device into the layer's input buffer outside the timed span. Each input is timed
// twice, alternating: the replay event-timed on an idle stream beside the host wall time of
// replay + synchronise (the figures before 2026-12-05: the first event fires before the host has
// submitted the graph, so the span holds that submission), and the replay event-timed queued
// behind a hold (bench::Submit::kQueued: the device's own time from input to output); medians of
// 200 after 20 warm-ups. The first two inputs' outputs are checked against emu::MoeLayer bit for
// bit before any timing.
GraphResult time_graph(const LayerWeights& w, const cuda::LayerOptions& lo, int64_t T, double copy,
                       const std::string& name) {
  const int64_t dim = w.config.dim, n_in = 64;
  cuda::MoeLayer layer(w, lo);
  std::vector<uint16_t> xs;
  for (int64_t i = 0; i < n_in; ++i) {
    const auto x = generate_input(static_cast<uint64_t>(2000 + i), T, dim);
    xs.insert(xs.end(), x.begin(), x.end());
  }
  uint16_t* pool = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&pool, xs.size() * 2));
  MOECHECK_CUDA_CHECK(cudaMemcpy(pool, xs.data(), xs.size() * 2, cudaMemcpyHostToDevice));
  cudaStream_t s;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint16_t* in = layer.device_input(T);
  auto load = [&](int64_t i) {
    MOECHECK_CUDA_CHECK(
        cudaMemcpyAsync(in, pool + (i % n_in) * T * dim, T * dim * 2, cudaMemcpyDeviceToDevice, s));
  };
  emu::LayerOptions eo;
  eo.router = lo.router;
  const emu::MoeLayer ref(w, eo);
  for (int64_t v = 0; v < 2; ++v) {
    load(v);
    layer.graph_forward(T, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    bench::require_emu_bits("layer output (" + name + ", input " + std::to_string(v) + ")",
                            layer.device_output(), ref.forward(xs.data() + v * T * dim, T));
  }
  cudaEvent_t a, b;
  MOECHECK_CUDA_CHECK(cudaEventCreate(&a));
  MOECHECK_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> dev, host, floor, queued;
  const int late0 = bench::late_spans();
  for (int i = 0; i < 220; ++i) {
    load(i);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    MOECHECK_CUDA_CHECK(cudaEventRecord(a, s));
    layer.graph_forward(T, s);
    MOECHECK_CUDA_CHECK(cudaEventRecord(b, s));
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(b));
    const auto t1 = std::chrono::steady_clock::now();
    float ms = 0, qms = 0;
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    // The same input again, queued: load, hold, then the span.
    load(i);
    bench::timed_span([&] { layer.graph_forward(T, s); }, a, b, s, bench::Submit::kQueued);
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(b));
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&qms, a, b));
    if (i < 20) continue;
    dev.push_back(ms * 1e3);
    queued.push_back(qms * 1e3);
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    const Routing rt = layer.device_routing(T);
    std::vector<int32_t> ids = rt.ids;
    std::sort(ids.begin(), ids.end());
    const auto U = std::unique(ids.begin(), ids.end()) - ids.begin();
    floor.push_back(layer_bytes(w, U) / (copy * 1e9) * 1e6);
  }
  const int late = bench::late_spans() - late0;
  MOECHECK_CUDA_CHECK(cudaEventDestroy(a));
  MOECHECK_CUDA_CHECK(cudaEventDestroy(b));
  MOECHECK_CUDA_CHECK(cudaStreamDestroy(s));
  MOECHECK_CUDA_CHECK(cudaFree(pool));
  const GraphResult r{name,
                      T,
                      bench::median(dev),
                      bench::median(host),
                      bench::median(floor),
                      bench::median(queued)};
  // Each row as it is measured (the table follows at the end), so a run cut short keeps its rows.
  std::printf(
      "graph row: %s | T=%lld | device %.1f us | device queued %.1f us (%d of 220 late) | floor "
      "%.1f us | queued / floor %.2fx\n",
      name.c_str(), static_cast<long long>(T), r.dev_us, r.queued_us, late, r.floor_us,
      r.queued_us / r.floor_us);
  std::fflush(stdout);
  return r;
}

// The staged router alone on the layer's router weights (3.9 MB at ds41), event-timed single
// launches (median of 200): its share of the device-timed layer.
double router_us(const LayerWeights& w) {
  const MoeConfig& c = w.config;
  uint16_t *r = nullptr, *x = nullptr;
  float* y = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&r, c.n_routed * c.dim * 2));
  MOECHECK_CUDA_CHECK(cudaMalloc(&x, c.dim * 2));
  MOECHECK_CUDA_CHECK(cudaMalloc(&y, c.n_routed * 4));
  MOECHECK_CUDA_CHECK(cudaMemcpy(r, w.router, c.n_routed * c.dim * 2, cudaMemcpyHostToDevice));
  const auto xin = generate_input(7, 1, c.dim);
  MOECHECK_CUDA_CHECK(cudaMemcpy(x, xin.data(), c.dim * 2, cudaMemcpyHostToDevice));
  const double ms = bench::time_ms(
      [&] { cuda::router_gemv(RouterVariant::kStaged, r, x, y, c.n_routed, c.dim, 1, nullptr); },
      20, 200, nullptr);
  MOECHECK_CUDA_CHECK(cudaFree(r));
  MOECHECK_CUDA_CHECK(cudaFree(x));
  MOECHECK_CUDA_CHECK(cudaFree(y));
  return ms * 1e3;
}

// `layer_bench skeleton [T ...]` (default T = 1 and 8): the layer's own device-resident graph
// (time_graph, queued) beside its skeleton (tests/bench/layer_skeleton.cuh) in each form, on the
// same 64 inputs' expert sets (the layer's own device routing of each), all in this process and
// against the same floor: what the launch structure costs with plain reads for kernels.

// The skeleton's bytes at T tokens: the expert sets of the 64 inputs time_graph uses (the layer's
// own device routing) and the median of their floors.
struct SkeletonInput {
  int64_t T;
  bench::skeleton::Bytes bytes;
  double floor_us;
};
SkeletonInput skeleton_input(const LayerWeights& w, double copy, int64_t T) {
  const MoeConfig& c = w.config;
  cuda::LayerOptions lo;
  lo.route = RoutePlace::kDevice;
  cuda::MoeLayer layer(w, lo);
  SkeletonInput in{T, {}, 0};
  bench::skeleton::Bytes& b = in.bytes;
  std::vector<double> floors;
  for (int64_t i = 0; i < 64; ++i) {
    const auto x = generate_input(static_cast<uint64_t>(2000 + i), T, c.dim);
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(layer.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    layer.graph_forward(T);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> ids = layer.device_routing(T).ids;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    floors.push_back(layer_bytes(w, static_cast<int64_t>(ids.size())) / (copy * 1e9) * 1e6);
    b.experts.push_back(std::move(ids));
  }
  b.router_bytes = c.n_routed * c.dim * 2;
  b.gu_bytes = w.gate_exps.expert_stride() + w.up_exps.expert_stride();
  b.down_bytes = w.down_exps.expert_stride();
  b.shared_pair_bytes =
      w.shared_gate.rows * w.shared_gate.row_stride() + w.shared_up.rows * w.shared_up.row_stride();
  b.shared_down_bytes = w.shared_down.rows * w.shared_down.row_stride();
  b.swiglu_n = T * c.topk * w.gate_exps.rows;
  b.acc_n = T * c.dim;
  in.floor_us = bench::median(floors);
  return in;
}

// The forms' rows at each input's T; with_layer: the layer's own graph first (time_graph), each
// row then set beside it.
void skeleton_rows(const LayerWeights& w, double copy, const std::vector<SkeletonInput>& ins,
                   const std::vector<bench::skeleton::Form>& forms, bool with_layer) {
  for (const SkeletonInput& in : ins) {
    const int64_t T = in.T;
    cuda::LayerOptions lo;
    lo.route = RoutePlace::kDevice;
    const GraphResult layer =
        with_layer ? time_graph(w, lo, T, copy, "device route, one graph (skeleton's layer)")
                   : GraphResult{"", T, 0, 0, 0, 0};
    bench::skeleton::Skeleton sk(in.bytes, w.config.n_routed);
    const double floor = in.floor_us;
    std::printf("skeleton at T=%lld: %.1f MB a forward (median), persistent grid %d blocks\n",
                static_cast<long long>(T), floor * copy * 1e-3, sk.persistent_grid());
    for (const bench::skeleton::Form f : forms) {
      const double us = sk.time_form(f, 20, 200);
      if (us < 0) continue;
      std::printf("skeleton row: %s | T=%lld | queued %.1f us | floor %.1f us | %.2fx the floor",
                  bench::skeleton::form_name(f), static_cast<long long>(T), us, floor, us / floor);
      if (with_layer)
        std::printf(" | the layer %.1f us queued, %.2fx this", layer.queued_us,
                    layer.queued_us / us);
      std::printf("\n");
    }
  }
}

}  // namespace

// The keys of `layer_bench trace` and `layer_bench profile` (default: the driver's), set on lo
// or process-wide; false (with a message naming the option) on an unknown one: prog = 0 / 1
// (LayerOptions::programmatic_launch), carve = 0 / 1 (cuda::set_max_shared_carveout), prio = 0 / 1
// (graph_node_priority), fork = 0..3 (SharedFork for every T: input, router start, after the
// router, after the selection), side = 0 / 1 (shared_side_stream), mmvq_warps = 0 / 4 / 8 / 12 / 14
// / 16 (cuda::set_mmvq_stream_shape), gu_warps / down_warps = 0 / 4 / 8 / 12 / 14 / 16
// (gate_up_stream_warps, down_stream_warps), prefetch_plan = 0 / 1 (LayerOptions::prefetch_plan),
// x_staged = 0 / 1 (cuda::set_bf16_gemv_x_staged), tok_blocks = 0..32
// (cuda::set_bf16_gemv_tokens_blocks), stream_tokens = 0.. (cuda::set_mmvq_stream_layer_tokens: the
// streamed MMVQ above 8 tokens), whole_sm = 0 / 1 and pass_tokens = 0..2
// (cuda::set_mmvq_stream_pass_shape; whole_sm first), router_gemm = 0 / 1 (cuda::set_router_gemm:
// the staged router's GEMM above 8 tokens), rres = 0 / 1 (cuda::set_router_gemm_resident: that
// GEMM's persistent form), acc4 = 0 / 1 (cuda::set_accumulate_vector: four elements a thread), step
// = 0 / 4 / 8 (cuda::set_mmvq_stream_step: the streamed MMVQ's super-blocks a row a step), head =
// -1..8 (cuda::set_mmvq_stream_head: the steps a warp issues before its block stages the
// activations), mmq_beside = -1..2 (LayerOptions::mmq_beside; -1 the default by T).
static bool apply_keys(const std::vector<std::string>& kv, cuda::LayerOptions& lo,
                       const char* mode) {
  bool whole_sm = false;
  for (const std::string& a : kv) {
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq);
    const int v = eq == std::string::npos ? -1 : std::stoi(a.substr(eq + 1));
    if (k == "prog" && v >= 0) lo.programmatic_launch = v != 0;
    else if (k == "carve" && v >= 0) cuda::set_max_shared_carveout(v != 0);
    else if (k == "prio" && v >= 0) lo.graph_node_priority = v != 0;
    else if (k == "fork" && v >= 0 && v <= 3)
      cuda::set_shared_fork_everywhere(lo, static_cast<cuda::SharedFork>(v));
    else if (k == "side" && v >= 0) lo.shared_side_stream = v != 0;
    else if (k == "mmvq_warps" && v >= 0) cuda::set_mmvq_stream_shape(v, 0);
    else if (k == "gu_warps" && v >= 0) lo.gate_up_stream_warps = v;
    else if (k == "down_warps" && v >= 0) lo.down_stream_warps = v;
    else if (k == "prefetch_plan" && (v == 0 || v == 1)) lo.prefetch_plan = v == 1;
    else if (k == "mmq_beside" && v >= -1 && v <= 2) lo.mmq_beside = v;
    else if (k == "x_staged" && (v == 0 || v == 1)) cuda::set_bf16_gemv_x_staged(v == 1);
    else if (k == "tok_blocks" && v >= 0 && v <= 32) cuda::set_bf16_gemv_tokens_blocks(v);
    else if (k == "stream_tokens" && v >= 0) cuda::set_mmvq_stream_layer_tokens(v);
    else if (k == "router_gemm" && (v == 0 || v == 1)) cuda::set_router_gemm(v == 1);
    else if (k == "rres" && (v == 0 || v == 1)) cuda::set_router_gemm_resident(v == 1);
    else if (k == "acc4" && (v == 0 || v == 1)) cuda::set_accumulate_vector(v == 1);
    else if (k == "step" && (v == 0 || v == 4 || v == 8)) cuda::set_mmvq_stream_step(v);
    else if (k == "head" && eq != std::string::npos && v >= -1 && v <= 8)
      cuda::set_mmvq_stream_head(v);
    else if (k == "pass_tokens" && v >= 0 && v <= 2) cuda::set_mmvq_stream_pass_shape(v, whole_sm);
    else if (k == "whole_sm" && (v == 0 || v == 1)) {
      whole_sm = v == 1;
      cuda::set_mmvq_stream_pass_shape(0, whole_sm);
    } else {
      std::fprintf(stderr, "layer_bench %s: unknown option '%s'\n", mode, a.c_str());
      return false;
    }
  }
  return true;
}

// `layer_bench graph` times only the one-token device-resident graph (for profilers);
// `layer_bench profile T [key=value ...]` runs three device-route forwards of T tokens after
// checking the first against the emulation, and times nothing (for a kernel profiler's
// per-launch durations), the keys as apply_keys.
static int profile_forwards(const LayerWeights& w, int64_t T, const std::vector<std::string>& kv) {
  cuda::LayerOptions lo;
  lo.route = RoutePlace::kDevice;
  if (!apply_keys(kv, lo, "profile")) return 2;
  cuda::MoeLayer layer(w, lo);
  emu::LayerOptions eo;
  eo.router = lo.router;
  eo.expert_warps = lo.expert_warps;
  const auto x = generate_input(1000, T, w.config.dim);
  bench::require_emu_bits("layer output (profile, T=" + std::to_string(T) + ")",
                          layer.forward(x.data(), T), emu::MoeLayer(w, eo).forward(x.data(), T));
  for (int i = 0; i < 3; ++i) layer.forward(x.data(), T);
  std::printf("profile: 3 device-route forwards of T = %lld done\n", static_cast<long long>(T));
  return 0;
}

// `layer_bench trace T [key=value ...]`: 30 replays of the device-resident graph at T tokens,
// each synchronised, with CUPTI's kernel timeline (the output checked first against the
// emulation), the keys as apply_keys.
static int trace_graph(const LayerWeights& w, int64_t T, const std::vector<std::string>& kv) {
  cuda::LayerOptions lo;
  lo.route = RoutePlace::kDevice;
  if (!apply_keys(kv, lo, "trace")) return 2;
  cuda::MoeLayer layer(w, lo);
  const auto x = generate_input(1000, T, w.config.dim);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(layer.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  layer.graph_forward(T);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  bench::require_emu_bits("layer output (trace, T=" + std::to_string(T) + ")",
                          layer.device_output(), emu::MoeLayer(w, emu::LayerOptions{}).forward(x.data(), T));
#ifdef MOECHECK_HAVE_CUPTI
  cupti_trace::start();
#endif
  for (int i = 0; i < 30; ++i) {
    layer.graph_forward(T);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  }
#ifdef MOECHECK_HAVE_CUPTI
  cupti_trace::report(30);
#endif
  std::string opts;
  for (const std::string& a : kv) opts += " " + a;
  std::printf("trace: 30 graph replays of T = %lld, options:%s\n", static_cast<long long>(T),
              opts.empty() ? " (defaults)" : opts.c_str());
  return 0;
}

int main(int argc, char** argv) {
  const bool graph_only = argc > 1 && std::string(argv[1]) == "graph";
  const bool profile = argc > 2 && std::string(argv[1]) == "profile";
  const bool trace = argc > 2 && std::string(argv[1]) == "trace";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a failed check's exit(1) keeps every line printed
  const double copy = bench::copy_bandwidth_gbs();
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);
  const GenOptions o = preset_options("ds41");
  auto t0 = std::chrono::steady_clock::now();
  const LayerWeights w = generate_layer(o, 0);
  std::printf("generated ds41 layer 0 (fast blocks) in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const MoeConfig& c = w.config;
  if (profile)
    return profile_forwards(w, std::stoll(argv[2]),
                            std::vector<std::string>(argv + 3, argv + argc));
  if (trace)
    return trace_graph(w, std::stoll(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  if (argc > 1 && std::string(argv[1]) == "skeleton") {
    std::vector<int64_t> Ts;
    for (int i = 2; i < argc; ++i) Ts.push_back(std::stoll(argv[i]));
    if (Ts.empty()) Ts = {1, 8};
    std::vector<SkeletonInput> ins;
    for (const int64_t T : Ts) ins.push_back(skeleton_input(w, copy, T));
    using bench::skeleton::Form;
    skeleton_rows(w, copy, ins,
                  {Form::kOneRead, Form::kLaunches, Form::kLaunchesPdl, Form::kPersistent,
                   Form::kBarriersOnly},
                  true);
    // The counters forms (not yet run on a device when they were written) in a second pass, so
    // that a fault of theirs leaves every other row printed.
    skeleton_rows(w, copy, ins, {Form::kFlow, Form::kFlowOnly}, false);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "quick") {
    // The default device-resident graph at T = 1 - 8 in three passes: a short device call's
    // rows, set beside another build's in the same call.
    // Passes 1 and 2 also time the 2 - 8 token GEMV with as many blocks a multiprocessor as fit
    // (cuda::set_bf16_gemv_tokens_blocks(32); the default leaves one selection block's room).
    // `layer_bench quick key=value ...`: the keys of trace and profile (apply_keys; e.g. step=N,
    // head=N).
    cuda::LayerOptions lo;
    lo.route = RoutePlace::kDevice;
    if (!apply_keys(std::vector<std::string>(argv + 2, argv + argc), lo, "quick")) return 2;
    for (int pass = 1; pass <= 3; ++pass) {
      const std::string p = " quick pass " + std::to_string(pass);
      for (const int64_t T : {1, 2, 3, 4, 5, 6, 7, 8})
        (void)time_graph(w, lo, T, copy, "device route, one graph," + p);
      if (pass == 3) break;
      cuda::set_bf16_gemv_tokens_blocks(32);
      for (const int64_t T : {2, 3, 4, 5, 6, 7, 8})
        (void)time_graph(w, lo, T, copy,
                         "device route, one graph, tokens GEMV as many blocks as fit," + p);
      cuda::set_bf16_gemv_tokens_blocks(0);
    }
    return 0;
  }

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
  if (graph_only) vs.clear();
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
      bytes += tm.weight_bytes;
    }
    const double floor_ms = static_cast<double>(bytes) / 200.0 / (copy * 1e9) * 1e3;
    res.push_back({v.name, v.T, bench::median(t), bench::median(route), floor_ms});
  }

  // The device-resident forward as one graph, event-timed.
  std::vector<GraphResult> gres;
  {
    cuda::LayerOptions lo;
    lo.route = RoutePlace::kDevice;
    gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph"));
    gres.push_back(time_graph(w, lo, 8, copy, "device route, one graph, T=8"));
    // Where the shared expert forks (LayerOptions::shared_fork_small at T = 1, _large at T = 8):
    // every fork point other than the default.
    using cuda::SharedFork;
    const std::pair<SharedFork, const char*> forks[] = {
        {SharedFork::kInput, "at the input"},
        {SharedFork::kRouterStart, "at the router's start"},
        {SharedFork::kRouter, "after the router"},
        {SharedFork::kSelection, "after the selection"}};
    for (const auto& [f, name] : forks)
      for (const int64_t T : {1, 8}) {
        cuda::LayerOptions fo = lo;
        SharedFork& at = T == 1 ? fo.shared_fork_small : fo.shared_fork_large;
        if (at == f) continue;
        at = f;
        gres.push_back(time_graph(w, fo, T, copy,
                                  std::string("device route, one graph") + (T == 1 ? "" : ", T=8") +
                                      ", shared expert forked " + name));
      }
    // Programmatic dependent launch (LayerOptions::programmatic_launch), at the default fork
    // points and at those of the tree before the router-start fork (6521703).
    lo.programmatic_launch = true;
    gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph, programmatic launch"));
    gres.push_back(time_graph(w, lo, 8, copy, "device route, one graph, T=8, programmatic launch"));
    {
      cuda::LayerOptions fo = lo;
      fo.shared_fork_small = SharedFork::kInput;
      fo.shared_fork_large = SharedFork::kRouter;
      gres.push_back(time_graph(w, fo, 1, copy,
                                "device route, one graph, programmatic launch, forked at the "
                                "input"));
      gres.push_back(time_graph(w, fo, 8, copy,
                                "device route, one graph, T=8, programmatic launch, forked after "
                                "the router"));
    }
    lo.programmatic_launch = false;
    // The streamed MMVQ at 8 and 12 warps a block (about half and three quarters of a
    // multiprocessor's registers), so that a shared GEMV block fits beside it.
    for (int mw : {8, 12}) {
      cuda::set_mmvq_stream_shape(mw, 0);
      gres.push_back(time_graph(w, lo, 1, copy,
                                "device route, one graph, streamed MMVQ " + std::to_string(mw) +
                                    " warps"));
      gres.push_back(time_graph(w, lo, 8, copy,
                                "device route, one graph, T=8, streamed MMVQ " +
                                    std::to_string(mw) + " warps"));
    }
    cuda::set_mmvq_stream_shape(0, 0);
    // 12 warps for one of the two launches only (LayerOptions::gate_up_stream_warps,
    // down_stream_warps): the shared down GEMV's blocks fit beside that launch's.
    for (const auto& [gw, dw] : {std::pair{16, 12}, std::pair{12, 16}, std::pair{12, 12}}) {
      cuda::LayerOptions fo = lo;
      fo.gate_up_stream_warps = gw;
      fo.down_stream_warps = dw;
      const std::string shape = ", streamed MMVQ gate/up " + std::to_string(gw) + " x down " +
                                std::to_string(dw) + " warps";
      gres.push_back(time_graph(w, fo, 1, copy, "device route, one graph" + shape));
      gres.push_back(time_graph(w, fo, 8, copy, "device route, one graph, T=8" + shape));
    }
    gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph (again)"));
    gres.push_back(time_graph(w, lo, 8, copy, "device route, one graph, T=8 (again)"));
    // Three more alternating passes, one process: the default against the levers it replaced
    // (16-warp gate / up launches at one token; the plan not prefetched; x of the 2 - 8 token
    // GEMVs read from L2), since a default moves on repeated A / B pairs, not on one sample.
    for (int pass = 2; pass <= 4; ++pass) {
      const std::string again = " (A/B pass " + std::to_string(pass) + ")";
      gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph" + again));
      {
        cuda::LayerOptions fo = lo;
        fo.gate_up_stream_warps = 16;
        gres.push_back(time_graph(
            w, fo, 1, copy,
            "device route, one graph, streamed MMVQ gate/up 16 x down 16 warps (before)" + again));
        fo = lo;
        fo.prefetch_plan = false;
        gres.push_back(
            time_graph(w, fo, 1, copy, "device route, one graph, plan not prefetched" + again));
      }
      gres.push_back(time_graph(w, lo, 8, copy, "device route, one graph, T=8" + again));
      cuda::set_bf16_gemv_x_staged(false);
      gres.push_back(
          time_graph(w, lo, 8, copy, "device route, one graph, T=8, x not staged" + again));
      if (pass == 2)
        gres.push_back(time_graph(w, lo, 4, copy, "device route, one graph, T=4, x not staged"));
      cuda::set_bf16_gemv_x_staged(true);
      if (pass == 2) gres.push_back(time_graph(w, lo, 4, copy, "device route, one graph, T=4"));
    }
    // The routed MMVQs on the dp4a kernel (the engine before the streamed one), in two passes
    // around a second pass of the default, for the spread.
    for (int pass = 0; pass < 2 && !graph_only; ++pass) {
      cuda::set_mmvq_engine(cuda::MmvqEngine::kDp4a);
      gres.push_back(time_graph(w, lo, 1, copy,
                                "device route, one graph, MMVQ dp4a kernel (before), pass " +
                                    std::to_string(pass + 1)));
      cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
      if (pass == 0)
        gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph (pass 2)"));
    }
    if (!graph_only) {
      // The default fork points up to 4 tokens (shared_fork_max_tokens), at T = 4.
      gres.push_back(time_graph(w, lo, 4, copy, "device route, one graph, T=4"));
      lo.shared_fork_max_tokens = 4;
      gres.push_back(time_graph(w, lo, 4, copy,
                                "device route, one graph, T=4, shared expert forked at the "
                                "router's start"));
      lo.shared_fork_max_tokens = cuda::LayerOptions{}.shared_fork_max_tokens;
      cuda::set_bf16_gemv_stream(false);
      gres.push_back(time_graph(w, lo, 1, copy,
                                "device route, one graph, shared GEMVs register-staged (before)"));
      cuda::set_bf16_gemv_stream(true);
      // The routed MMVQ's grid capped, so the shared expert's GEMVs can run beside it.
      for (int cap : {2, 1}) {
        cuda::set_mmvq_blocks_per_sm(cap);
        gres.push_back(time_graph(
            w, lo, 1, copy,
            "device route, one graph, MMVQ at " + std::to_string(cap) + " block(s) per SM"));
      }
      cuda::set_mmvq_blocks_per_sm(0);
      // The shared GEMVs' streaming shapes (warps x stages of the pair, then of down): before
      // (8 x 2, 8 x 5), others, and the default (4 x 2 both); two warps (at most 64 registers)
      // fit beside the routed MMVQ's three blocks per SM. Each shape is timed in two passes, for
      // the spread.
      struct GemvShapes {
        int pw, ps, dw, ds;
      };
      const GemvShapes shapes[] = {{8, 2, 8, 5}, {4, 2, 8, 2}, {4, 2, 4, 2}, {4, 2, 2, 2}};
      for (int pass = 0; pass < 2; ++pass)
        for (const GemvShapes& g : shapes) {
          cuda::set_bf16_gemv_stream_shape(g.pw, g.ps, 2);
          cuda::set_bf16_gemv_stream_shape(g.dw, g.ds, 1);
          gres.push_back(time_graph(w, lo, 1, copy,
                                    "device route, one graph, shared pair " + std::to_string(g.pw) +
                                        " warps x " + std::to_string(g.ps) + " stages, down " +
                                        std::to_string(g.dw) + " x " + std::to_string(g.ds) +
                                        " (pass " + std::to_string(pass + 1) + ")"));
        }
      cuda::set_bf16_gemv_stream_shape(0, 0);
      cuda::set_mmvq_blocks_per_sm(0);
      gres.push_back(time_graph(w, lo, 8, copy, "device route, one graph, T=8"));
      cuda::set_mmvq_engine(cuda::MmvqEngine::kDp4a);
      gres.push_back(time_graph(w, lo, 8, copy,
                                "device route, one graph, T=8, MMVQ dp4a kernel (before)"));
      cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
      // Before two rows per warp reached groups of several tokens: one row per warp for every
      // launch whose groups may hold more than one token (all of them at T = 8).
      cuda::set_mmvq_rows_per_warp(1);
      gres.push_back(time_graph(w, lo, 8, copy,
                                "device route, one graph, T=8, MMVQ one row per warp (before)"));
      cuda::set_mmvq_rows_per_warp(0);
      gres.push_back(time_graph(w, lo, 4, copy, "device route, one graph, T=4"));
      lo.shared_side_stream = false;
      gres.push_back(time_graph(w, lo, 1, copy, "device route, one graph, no side stream"));
    }
  }
  const double router = router_us(w);

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
  std::printf(
      "\n#### device-resident forward, one graph replay (input and output on the device)\n\n"
      "| options | T | device us, queued (events, median) | device us, idle stream | host us "
      "(replay + sync) | floor us | queued / floor | idle / floor |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const GraphResult& r : gres)
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", r.name.c_str(),
                static_cast<long long>(r.T), r.queued_us, r.dev_us, r.host_us, r.floor_us,
                r.queued_us / r.floor_us, r.dev_us / r.floor_us);
  std::printf(
      "\nrouter_gemv staged alone (event-timed launch, median of 200): %.1f us = %.0f%% of "
      "the one-token device-resident layer\n",
      router, 100.0 * router / gres[0].queued_us);
  std::printf(
      "queued spans submitted after their hold ended (their start waited on the host): %d\n",
      bench::late_spans());
  return 0;
}
