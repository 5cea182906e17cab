// cuda::MoeLayer vs emu::MoeLayer, bitwise, in the output AND every LayerTaps stage (router
// logits, routing, x_q8, each expert's gate / up / h / h_q8 / down, the shared expert, acc):
// T = 1..8 (and 11, 17: several groups of 8 rows per expert) at the tiny and small presets
// (golden/generator.h, in memory), expert warps 2 / 4 / 8, router plain / staged, shared side
// stream on / off, CUDA graphs on / off, bf16 and K-quant shared experts; the ds41 preset (fast
// blocks) at T = 1..8; the host route and the device route (route_select, route_plan), with and
// without an image mask (bias_vl for masked tokens). Every forward runs twice, bitwise equal.
// Contract: docs/numerics.md.
#include "core/error.h"
#include "core/route_header.h"
#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_layer_check.h"

#define MOECHECK_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

namespace moecheck {
namespace {

using gputest::run_layer;
using gputest::same_f32;
using gputest::same_taps;
using gputest::Variant;

// The device route's variants: the default fork points (cuda::LayerOptions) with and without
// graphs, both routers (a plain router's launch records no launch-completion event outside
// graphs), programmatic launches, every other fork point (the default is kRouter at every T up to
// 16: the router's start, the input and after the selection), and the streamed MMVQ's warps per
// launch (gate / up x down: 16 x 12, 12 x 8, 14 x 16: the one-token shape of 14 warps, 12 above
// one token), and the plan not prefetched into L1.
std::vector<Variant> device_variants() {
  constexpr auto kDev = RoutePlace::kDevice;
  constexpr int kAuto = cuda::kMmvqRowsAuto;  // the default split (every expert on MMVQ at T <= 8)
  using cuda::SharedFork;
  return {{8, RouterVariant::kStaged, true, false, kDev},
          {2, RouterVariant::kPlain, false, false, kDev},
          {4, RouterVariant::kStaged, false, true, kDev},
          {8, RouterVariant::kPlain, true, true, kDev},
          {4, RouterVariant::kPlain, true, false, kDev},
          {8, RouterVariant::kStaged, true, true, kDev, kAuto, true},
          {8, RouterVariant::kStaged, true, true, kDev, kAuto, false,
           static_cast<int>(SharedFork::kInput)},
          {8, RouterVariant::kStaged, true, false, kDev, kAuto, false,
           static_cast<int>(SharedFork::kRouterStart)},
          {4, RouterVariant::kStaged, true, true, kDev, kAuto, false,
           static_cast<int>(SharedFork::kSelection)},
          {8, RouterVariant::kStaged, true, true, kDev, kAuto, false, -1, 16, 12},
          {4, RouterVariant::kPlain, true, false, kDev, kAuto, false, -1, 12, 8},
          {8, RouterVariant::kStaged, true, true, kDev, kAuto, false, -1, 14, 16},
          {8, RouterVariant::kStaged, true, true, kDev, kAuto, false, -1, 0, 0, false}};
}

std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (int warps : {2, 4, 8})
    for (RouterVariant r : {RouterVariant::kPlain, RouterVariant::kStaged})
      for (bool side : {false, true}) v.push_back({warps, r, side, false});
  v.push_back({8, RouterVariant::kStaged, true, true});
  v.push_back({4, RouterVariant::kPlain, false, true});
  for (const Variant& d : device_variants()) v.push_back(d);
  return v;
}

TEST(CudaMoeLayer, Tiny_dim512_E16_K4_T1to8_11_17_AllVariants) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("tiny"), {1, 2, 3, 4, 5, 6, 7, 8, 11, 17}, all_variants(), 100);
}

TEST(CudaMoeLayer, Small_dim1024_E64_K6_T1to8_AllVariants) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("small"), {1, 2, 3, 4, 5, 6, 7, 8}, all_variants(), 200);
}

TEST(CudaMoeLayer, Tiny_KQuantShared_T1to8) {
  MOECHECK_REQUIRE_GPU();
  GenOptions o = preset_options("tiny");
  o.shared = SharedExpertType::kKQuant;
  run_layer(o, {1, 2, 3, 4, 5, 6, 7, 8, 9}, all_variants(), 300);
}

TEST(CudaMoeLayer, Ds41_dim5120_E384_K6_FastBlocks_T1to8) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("ds41"), {1, 2, 3, 4, 5, 6, 7, 8},
            {{8, RouterVariant::kStaged, true, false},
             {2, RouterVariant::kStaged, false, true},
             {4, RouterVariant::kPlain, true, false},
             {8, RouterVariant::kStaged, true, false, RoutePlace::kDevice},
             {4, RouterVariant::kPlain, false, true, RoutePlace::kDevice}},
            400);
}

// One ds41 token on both routes (what the compute-sanitizer run of .ci/gpu-suite sanitize covers
// at ds41 size; the T = 1..8 sweep above is the bitwise proof).
TEST(CudaMoeLayer, Ds41_OneToken_HostAndDeviceRoute) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("ds41"), {1},
            {{8, RouterVariant::kStaged, true, false},
             {8, RouterVariant::kStaged, true, false, RoutePlace::kDevice}},
            450);
}

// A deepseek4-convention layer: F16 router, per-layer clamps (layer 1's small enough to bite), the
// shared expert's differing from the routed experts'; every variant, both routes.
TEST(CudaMoeLayer, Deepseek4_F16Router_PerLayerClamps_Tiny_Ds41_T1to8) {
  MOECHECK_REQUIRE_GPU();
  for (const char* preset : {"tiny", "ds41"}) {
    GenOptions o = preset_options(preset);
    o.convention = Convention::kDeepseek4;
    o.router_type = GgmlType::kF16;
    o.swiglu_limits = {10.0f, 0.75f};
    o.swiglu_limits_shared = {10.0f, 0.25f};
    const bool tiny = o.preset == "tiny";
    run_layer(
        o, tiny ? std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8} : std::vector<int64_t>{1, 3, 8},
        tiny ? all_variants()
             : std::vector<Variant>{{8, RouterVariant::kStaged, true, false},
                                    {8, RouterVariant::kStaged, true, true, RoutePlace::kDevice},
                                    {4, RouterVariant::kPlain, false, false, RoutePlace::kDevice}},
        900, false, 1);
  }
}

// The image mask: bias_vl selects for tokens t % 3 != 0, host and device route, T = 1..8.
TEST(CudaMoeLayer, ImageMask_Tiny_Small_Ds41_T1to8_HostAndDeviceRoute) {
  MOECHECK_REQUIRE_GPU();
  std::vector<Variant> v = device_variants();
  v.push_back({8, RouterVariant::kStaged, true, false});
  v.push_back({4, RouterVariant::kPlain, false, true});
  const std::vector<int64_t> Ts = {1, 2, 3, 4, 5, 6, 7, 8};
  run_layer(preset_options("tiny"), Ts, v, 600, true);
  run_layer(preset_options("small"), Ts, v, 700, true);
  run_layer(preset_options("ds41"), Ts,
            {{8, RouterVariant::kStaged, true, false, RoutePlace::kDevice},
             {8, RouterVariant::kStaged, true, false}},
            800, true);
}

// A NaN in one token's input reaches the routing as NaN logits: the forward throws the same
// InputError as the emulation (naming layer, token and expert), on the host route and on the
// device route (the header's error word, raised after the forward), with the shared expert's
// side stream on and off and with graphs on and off; the forward after the error (same T, then
// another T) equals the emulation bit for bit in every stage (the side stream was fenced, no
// buffer of the failed forward leaks into the next).
TEST(CudaMoeLayer, NanInputThrowsTheEmulationsErrorAndTheNextForwardIsExact) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("tiny");
  const LayerWeights w = generate_layer(o, 0);
  const int64_t dim = w.config.dim;
  const emu::MoeLayer ref(w, emu::LayerOptions{});
  const auto x4 = generate_input(501, 4, dim), x7 = generate_input(502, 7, dim);
  auto bad = x4;
  bad[2 * dim + 7] = 0x7FC0;  // token 2: a NaN element, so every logit of token 2 is NaN
  std::string emu_error;
  try {
    ref.forward(bad.data(), 4);
  } catch (const InputError& e) {
    emu_error = e.what();
  }
  ASSERT_NE(emu_error.find("token 2"), std::string::npos) << emu_error;
  LayerTaps want4, want7;
  const auto y4 = ref.forward(x4.data(), 4, &want4);
  const auto y7 = ref.forward(x7.data(), 7, &want7);
  for (RoutePlace route : {RoutePlace::kHost, RoutePlace::kDevice}) {
    for (bool side : {true, false})
      for (bool graphs : {false, true}) {
        cuda::LayerOptions co;
        co.shared_side_stream = side;
        co.use_graphs = graphs;
        co.route = route;
        cuda::MoeLayer layer(w, co);
        const std::string r = gputest::repro(
            501, std::string("NaN input, side ") + (side ? "on" : "off") + ", graphs " +
                     (graphs ? "on" : "off") + ", route " + route_place_name(route));
        ASSERT_TRUE(
            gputest::same_u16("output before the error", layer.forward(x4.data(), 4), y4, dim, r));
        std::string cuda_error;
        try {
          layer.forward(bad.data(), 4);
        } catch (const InputError& e) {
          cuda_error = e.what();
        }
        EXPECT_EQ(cuda_error, emu_error) << r;
        LayerTaps got4, got7;
        ASSERT_TRUE(gputest::same_u16("output after the error", layer.forward(x4.data(), 4, &got4),
                                      y4, dim, r));
        ASSERT_TRUE(same_taps(got4, want4, w.config, r));
        ASSERT_TRUE(gputest::same_u16("output after the error, T=7",
                                      layer.forward(x7.data(), 7, &got7), y7, dim, r));
        ASSERT_TRUE(same_taps(got7, want7, w.config, r));
      }
  }
}

// Back-to-back replays with no host synchronisation between them (the programmatic launches
// early reads and early starts meet the previous replay's tail): for tiny and ds41, T = 1 and 8,
// programmatic launch on and off, 16 inputs copied in and 16 outputs copied out on the replay's
// stream, then one synchronisation; every output equals the emulation's.
TEST(CudaMoeLayer, GraphForwardBackToBack_EqualsEmu) {
  MOECHECK_REQUIRE_GPU();
  constexpr int kReplays = 16;
  for (const char* preset : {"tiny", "ds41"}) {
    const LayerWeights w = generate_layer(preset_options(preset), 0);
    const int64_t dim = w.config.dim;
    const emu::MoeLayer ref(w, emu::LayerOptions{});
    for (int64_t T : {1, 8}) {
      std::vector<uint16_t> xs;
      std::vector<std::vector<uint16_t>> want;
      for (int i = 0; i < kReplays; ++i) {
        const auto x = generate_input(1200 + 31 * static_cast<uint64_t>(T) + i, T, dim);
        want.push_back(ref.forward(x.data(), T));
        xs.insert(xs.end(), x.begin(), x.end());
      }
      const size_t n = static_cast<size_t>(T * dim);
      uint16_t *in_pool = nullptr, *out_pool = nullptr;
      MOECHECK_CUDA_OK(cudaMalloc(&in_pool, xs.size() * 2));
      MOECHECK_CUDA_OK(cudaMalloc(&out_pool, xs.size() * 2));
      MOECHECK_CUDA_OK(cudaMemcpy(in_pool, xs.data(), xs.size() * 2, cudaMemcpyHostToDevice));
      cudaStream_t s;
      MOECHECK_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (bool prog : {true, false}) {
        cuda::LayerOptions co;
        co.route = RoutePlace::kDevice;
        co.programmatic_launch = prog;
        cuda::MoeLayer layer(w, co);
        uint16_t* in = layer.device_input(T);
        MOECHECK_CUDA_OK(cudaMemsetAsync(out_pool, 0xFF, xs.size() * 2, s));
        for (int i = 0; i < kReplays; ++i) {
          MOECHECK_CUDA_OK(
              cudaMemcpyAsync(in, in_pool + i * n, n * 2, cudaMemcpyDeviceToDevice, s));
          layer.graph_forward(T, s);
          MOECHECK_CUDA_OK(cudaMemcpyAsync(out_pool + i * n, layer.device_output(), n * 2,
                                           cudaMemcpyDeviceToDevice, s));
        }
        MOECHECK_CUDA_OK(cudaStreamSynchronize(s));
        std::vector<uint16_t> got(xs.size());
        MOECHECK_CUDA_OK(
            cudaMemcpy(got.data(), out_pool, got.size() * 2, cudaMemcpyDeviceToHost));
        for (int i = 0; i < kReplays; ++i) {
          const std::vector<uint16_t> yi(got.begin() + i * n, got.begin() + (i + 1) * n);
          ASSERT_TRUE(gputest::same_u16(
              "back-to-back graph_forward output", yi, want[i], dim,
              gputest::repro(1200 + 31 * static_cast<uint64_t>(T) + i,
                             std::string(preset) + " T=" + std::to_string(T) + " replay " +
                                 std::to_string(i) + " programmatic " + (prog ? "on" : "off"))));
        }
      }
      MOECHECK_CUDA_OK(cudaStreamDestroy(s));
      MOECHECK_CUDA_OK(cudaFree(in_pool));
      MOECHECK_CUDA_OK(cudaFree(out_pool));
    }
  }
}

// The device-resident forward (graph_forward: one CUDA graph from device_input to
// device_output): for tiny, small and ds41, T = 1, 2, 8, side stream on and off, twelve inputs
// replayed through one captured graph per T, the output equals the emulation's and
// device_routing the emulation's picks and weights; a NaN token raises the emulation's error
// from device_routing and the next replay is exact; the host route refuses the API.
TEST(CudaMoeLayer, GraphForwardDeviceResident_EqualsEmu) {
  MOECHECK_REQUIRE_GPU();
  for (const char* preset : {"tiny", "small", "ds41"}) {
    const LayerWeights w = generate_layer(preset_options(preset), 0);
    const int64_t dim = w.config.dim;
    const emu::MoeLayer ref(w, emu::LayerOptions{});
    for (bool side : {true, false}) {
      cuda::LayerOptions co;
      co.route = RoutePlace::kDevice;
      co.shared_side_stream = side;
      cuda::MoeLayer layer(w, co);
      for (int64_t T : {1, 2, 8}) {
        for (int i = 0; i < 12; ++i) {
          const uint64_t seed = 900 + 13 * static_cast<uint64_t>(T) + static_cast<uint64_t>(i);
          const auto x = generate_input(seed, T, dim);
          LayerTaps want;
          const auto y = ref.forward(x.data(), T, &want);
          const std::string r =
              gputest::repro(seed, std::string(preset) + " T=" + std::to_string(T) + " side " +
                                       (side ? "on" : "off"));
          MOECHECK_CUDA_OK(
              cudaMemcpy(layer.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
          layer.graph_forward(T);
          MOECHECK_CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> got(static_cast<size_t>(T * dim));
          MOECHECK_CUDA_OK(cudaMemcpy(got.data(), layer.device_output(), got.size() * 2,
                                      cudaMemcpyDeviceToHost));
          ASSERT_TRUE(gputest::same_u16("graph_forward output", got, y, dim, r));
          const Routing rt = layer.device_routing(T);
          ASSERT_EQ(rt.ids, want.topk_ids) << r;
          ASSERT_TRUE(
              same_f32("graph_forward weights", rt.weights, want.topk_weights, w.config.topk, r));
        }
      }
      if (std::string(preset) == "tiny") {  // a NaN token, then an exact replay
        auto bad = generate_input(951, 2, dim);
        bad[dim + 3] = 0x7FC0;
        MOECHECK_CUDA_OK(
            cudaMemcpy(layer.device_input(2), bad.data(), bad.size() * 2, cudaMemcpyHostToDevice));
        layer.graph_forward(2);
        MOECHECK_CUDA_OK(cudaDeviceSynchronize());
        EXPECT_THROW(layer.device_routing(2), InputError);
        const auto x = generate_input(952, 2, dim);
        MOECHECK_CUDA_OK(
            cudaMemcpy(layer.device_input(2), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
        layer.graph_forward(2);
        MOECHECK_CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> got(static_cast<size_t>(2 * dim));
        MOECHECK_CUDA_OK(
            cudaMemcpy(got.data(), layer.device_output(), got.size() * 2, cudaMemcpyDeviceToHost));
        ASSERT_TRUE(gputest::same_u16("graph_forward after a NaN token", got,
                                      ref.forward(x.data(), 2), dim, gputest::repro(952)));
      }
    }
  }
  cuda::MoeLayer host_route(generate_layer(preset_options("tiny"), 0));
  EXPECT_THROW(host_route.graph_forward(1), InputError);
  EXPECT_THROW(host_route.device_input(1), InputError);
}

TEST(CudaMoeLayer, BadOptionsAndTokensThrow) {
  MOECHECK_REQUIRE_GPU();
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  cuda::LayerOptions bad;
  bad.expert_warps = 6;
  EXPECT_THROW(cuda::MoeLayer(w, bad), InputError);
  for (const bool down : {false, true}) {
    cuda::LayerOptions bad_sb;
    (down ? bad_sb.down_stream_warps : bad_sb.gate_up_stream_warps) = 6;
    EXPECT_THROW(cuda::MoeLayer(w, bad_sb), InputError);
  }
  LayerWeights far = w;
  far.layer = kSlotTableLayers;  // past the slot table: the device route refuses the layer
  cuda::LayerOptions dev;
  dev.route = RoutePlace::kDevice;
  EXPECT_THROW(cuda::MoeLayer(far, dev), InputError);
  EXPECT_NO_THROW(cuda::MoeLayer(far, cuda::LayerOptions{}));  // the host route has no such limit
  cuda::MoeLayer layer(w);
  const auto x = generate_input(1, 1, w.config.dim);
  EXPECT_THROW(layer.forward(x.data(), -1), InputError);
  EXPECT_TRUE(layer.forward(x.data(), 0).empty());
}

}  // namespace
}  // namespace moecheck
