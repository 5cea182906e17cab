// The batched layer (T > 8): cuda::MoeLayer vs emu::MoeLayer bitwise in the output and every
// LayerTaps stage, each forward twice, at T = 9, 16, 63, 64, 65 and seeded random T, at the
// tiny, small and ds41 presets; the host and the device route; MMVQ for experts with at most 4
// pairs and MMQ above (the default above 8 tokens), at most 8 pairs (mmvq_max_rows 8), every
// expert through MMQ (mmvq_max_rows 0) and none (at T <= 8 the default: the T = 1..8 suite);
// skewed routing (one expert picked by every
// token: a group run of T rows; most experts with no token) and the K-quant shared expert on
// MMQ. Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k" (MMQ keeps MMVQ's bits).
#include <limits>

#include "core/error.h"
#include "cuda/kernels.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_layer_check.h"

namespace moecheck {
namespace {

using gputest::run_layer;
using gputest::Variant;

constexpr auto kHost = RoutePlace::kHost;
constexpr auto kDevice = RoutePlace::kDevice;

std::vector<Variant> batched_variants() {
  return {{8, RouterVariant::kStaged, true, false, kHost},
          {4, RouterVariant::kPlain, false, true, kHost, 0},
          {8, RouterVariant::kStaged, true, false, kDevice},
          {2, RouterVariant::kPlain, false, true, kDevice, 0},
          {8, RouterVariant::kStaged, true, true, kDevice, 3},
          {4, RouterVariant::kStaged, true, true, kHost, 8},
          {8, RouterVariant::kStaged, true, true, kDevice, 8},
          // The MMQ launches beside the MMVQ launches (LayerOptions::mmq_beside), in a graph at
          // the main stream's priority and without graphs at the side stream's; after them on the
          // main stream at every T (the default does that only outside 48 - 128 tokens).
          {8, RouterVariant::kStaged, true, true, kDevice, cuda::kMmvqRowsAuto, false, -1, 0, 0,
           true, 1},
          {8, RouterVariant::kStaged, true, true, kDevice, cuda::kMmvqRowsAuto, false, -1, 0, 0,
           true, 0},
          {8, RouterVariant::kStaged, true, false, kDevice, cuda::kMmvqRowsAuto, false, -1, 0, 0,
           true, 2}};
}

// T = 9, 16, 63, 64, 65 and two seeded random T in [9, 200].
std::vector<int64_t> batched_tokens(uint64_t seed) {
  std::vector<int64_t> Ts = {9, 16, 63, 64, 65};
  for (int i = 0; i < 2; ++i)
    Ts.push_back(9 + static_cast<int64_t>((seed * 2654435761u + i * 97) % 192));
  return Ts;
}

TEST(CudaMoeLayerBatched, Tiny_T9_16_63_64_65_Random_MmvqAndMmq) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("tiny"), batched_tokens(11), batched_variants(), 1100);
}

TEST(CudaMoeLayerBatched, Small_T9_16_63_64_65_Random_MmvqAndMmq) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("small"), batched_tokens(12), batched_variants(), 1200);
}

TEST(CudaMoeLayerBatched, Tiny_KQuantShared_OnMmq) {
  MOECHECK_REQUIRE_GPU();
  GenOptions o = preset_options("tiny");
  o.shared = SharedExpertType::kKQuant;
  run_layer(o, {9, 64, 65}, batched_variants(), 1300);
}

TEST(CudaMoeLayerBatched, ImageMask_Small_T16_65) {
  MOECHECK_REQUIRE_GPU();
  run_layer(preset_options("small"), {16, 65}, batched_variants(), 1400, true);
}

// One expert picked by every token (its bias 1000 above the rest: a run of T pair rows, one
// MMQ group of 8 after another), the rest of the picks spread; most experts get no token.
TEST(CudaMoeLayerBatched, Skewed_OneExpertTakesEveryToken_Tiny_Small) {
  MOECHECK_REQUIRE_GPU();
  for (const char* preset : {"tiny", "small"}) {
    const GenOptions o = preset_options(preset);
    LayerWeights w = generate_layer(o, 0);
    std::vector<float> bias(w.bias, w.bias + w.config.n_routed);
    bias[5] += 1000.0f;
    w.bias = bias.data();
    gputest::run_layer_weights(w, o, {9, 64, 65, 130}, batched_variants(), 1500);
  }
}

TEST(CudaMoeLayerBatched, Ds41_T9_16_63_64_65_Random_HostAndDeviceRoute) {
  MOECHECK_REQUIRE_GPU();
  std::vector<int64_t> Ts = {9, 16, 63, 64, 65};
  for (int i = 0; i < 2; ++i)
    Ts.push_back(9 + static_cast<int64_t>((1601u * 2654435761u + i * 7919u) % 248));
  run_layer(preset_options("ds41"), Ts,
            {{8, RouterVariant::kStaged, true, false, kHost},
             {8, RouterVariant::kStaged, true, true, kDevice},
             {4, RouterVariant::kStaged, false, false, kDevice, 0},
             {8, RouterVariant::kStaged, true, true, kDevice, cuda::kMmvqRowsAuto, false, -1, 0, 0,
              true, 1}},
            1600);
}

// The MMVQ groups of batched layers on each engine and pass shape: the dp4a kernel
// (cuda::set_mmvq_stream_layer_tokens(8), the default before the streamed engine took them), the
// streamed engine in passes of one token and of two (cuda::set_mmvq_stream_pass_shape; the
// default picks one up to 32 tokens and two above, which the other tests of this file run), at T
// where most groups hold one token and where many hold several, and with one expert taking every
// token. The same bits as the emulation.
TEST(CudaMoeLayerBatched, MmvqEngines_Dp4aAndStreamedPasses_Ds41_SmallSkewed) {
  MOECHECK_REQUIRE_GPU();
  struct Reset {
    ~Reset() {
      cuda::set_mmvq_stream_layer_tokens(0);
      cuda::set_mmvq_stream_pass_shape(0, false);
    }
  } reset;
  const GenOptions so = preset_options("small");
  LayerWeights skewed = generate_layer(so, 0);
  std::vector<float> bias(skewed.bias, skewed.bias + skewed.config.n_routed);
  bias[3] += 1000.0f;
  skewed.bias = bias.data();
  struct Setting {
    int64_t limit;
    int pass_tokens;
  };
  for (const Setting st : {Setting{8, 0}, Setting{0, 1}, Setting{0, 2}}) {
    SCOPED_TRACE("stream layer tokens " + std::to_string(st.limit) + ", pass tokens " +
                 std::to_string(st.pass_tokens));
    cuda::set_mmvq_stream_layer_tokens(st.limit);
    cuda::set_mmvq_stream_pass_shape(st.pass_tokens, false);
    run_layer(preset_options("ds41"), {9, 16, 64, 100},
              {{8, RouterVariant::kStaged, true, true, kDevice},
               {8, RouterVariant::kStaged, true, false, kHost}},
              1700);
    gputest::run_layer_weights(skewed, so, {9, 64, 130}, batched_variants(), 1701);
  }
  EXPECT_THROW(cuda::set_mmvq_stream_layer_tokens(-1), InputError);
  EXPECT_THROW(cuda::set_mmvq_stream_pass_shape(3, false), InputError);
  EXPECT_THROW(cuda::set_mmvq_stream_pass_shape(-1, false), InputError);
}

// The device route's MMVQ launches bound their live groups by n_routed (one group per expert of
// up to mmvq_max_rows pairs), not by the plan's capacity 6 T a projection: at T = 400 the gate /
// up launch's bound is 2 x 384 groups, so it can take the streamed engine (its group prefix
// holds 4096), where 2 x 2400 always took the dp4a kernel before. The same bits as the
// emulation with both types streamed (passes of one token and of two) and with Q2_K's launches
// on the dp4a kernel (the type-limited setter).
TEST(CudaMoeLayerBatched, StreamedEngine_GroupBoundByExperts_Ds41T400) {
  MOECHECK_REQUIRE_GPU();
  struct Reset {
    ~Reset() {
      cuda::set_mmvq_stream_pass_shape(0, false);
      cuda::set_mmvq_stream_layer_tokens(0);
    }
  } reset;
  // both types streamed at every T
  cuda::set_mmvq_stream_layer_tokens(std::numeric_limits<int64_t>::max());
  for (const int pass_tokens : {1, 2}) {
    SCOPED_TRACE("pass tokens " + std::to_string(pass_tokens));
    cuda::set_mmvq_stream_pass_shape(pass_tokens, false);
    run_layer(preset_options("ds41"), {400}, {{8, RouterVariant::kStaged, true, true, kDevice}},
              1702);
  }
  cuda::set_mmvq_stream_pass_shape(0, false);
  cuda::set_mmvq_stream_layer_tokens(8, GgmlType::kQ2K);
  SCOPED_TRACE("Q2_K on the dp4a kernel above 8 tokens");
  run_layer(preset_options("ds41"), {400}, {{8, RouterVariant::kStaged, true, true, kDevice}},
            1703);
  EXPECT_THROW(cuda::set_mmvq_stream_layer_tokens(8, GgmlType::kBF16), InputError);
  EXPECT_THROW(cuda::set_mmvq_stream_layer_tokens(-1, GgmlType::kQ2K), InputError);
}

// max_tokens: buffers allocated at construction; T up to it runs (equal to the emulation), a
// larger T is refused by name on both forwards.
TEST(CudaMoeLayerBatched, MaxTokens_UpToItRuns_LargerRefused) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("tiny");
  const LayerWeights w = generate_layer(o, 0);
  cuda::LayerOptions co;
  co.max_tokens = 24;
  co.route = kDevice;
  cuda::MoeLayer layer(w, co);
  const emu::MoeLayer ref(w, {});
  const auto x = generate_input(1800, 25, o.config.dim);
  for (int64_t T : {24, 9, 1}) {
    const std::string r = gputest::repro(1800, "T=" + std::to_string(T) + " max_tokens 24");
    ASSERT_TRUE(gputest::same_u16("output", layer.forward(x.data(), T), ref.forward(x.data(), T),
                                  o.config.dim, r));
  }
  EXPECT_THROW(layer.forward(x.data(), 25), InputError);
  EXPECT_THROW(layer.graph_forward(25), InputError);
  co.max_tokens = -1;
  EXPECT_THROW(cuda::MoeLayer(w, co), InputError);
}

// Which fork point the options give each T (host only: runs without a GPU). The defaults:
// kSelection at 17 - 128 tokens, kRouter otherwise (one token included since 2026-12-05); a
// forward's bits do not depend on it (the device-route variants above run the defaults at T = 9
// .. 200, the T = 1..8 suite at one token).
TEST(CudaMoeLayerBatched, SharedForkAt_DefaultsAndCustomRanges) {
  using cuda::SharedFork;
  const cuda::LayerOptions d;
  for (int64_t T = 1; T <= 600; ++T) {
    const SharedFork want = T >= 17 && T <= 128 ? SharedFork::kSelection : SharedFork::kRouter;
    ASSERT_EQ(cuda::shared_fork_at(d, T), want) << "repro: default LayerOptions, T=" << T;
  }
  cuda::LayerOptions o;
  o.shared_fork_max_tokens = 4;
  o.shared_fork_small = SharedFork::kInput;
  o.shared_fork_mid_min_tokens = 2;  // below max_tokens: the small range wins up to 4
  o.shared_fork_mid_max_tokens = 8;
  o.shared_fork_large = SharedFork::kRouterStart;
  const std::pair<int64_t, SharedFork> cases[] = {{1, SharedFork::kInput},
                                                  {4, SharedFork::kInput},
                                                  {5, SharedFork::kSelection},
                                                  {8, SharedFork::kSelection},
                                                  {9, SharedFork::kRouterStart}};
  for (const auto& [T, want] : cases)
    EXPECT_EQ(cuda::shared_fork_at(o, T), want) << "repro: max_tokens 4, mid 2..8, T=" << T;
  o.shared_fork_mid_min_tokens = 9;  // an empty middle range
  o.shared_fork_mid_max_tokens = 8;
  EXPECT_EQ(cuda::shared_fork_at(o, 8), SharedFork::kRouterStart) << "repro: empty mid range, T=8";
  cuda::set_shared_fork_everywhere(o, SharedFork::kSelection);  // every range, one point
  for (int64_t T : {1, 4, 8, 9, 600})
    EXPECT_EQ(cuda::shared_fork_at(o, T), SharedFork::kSelection) << "repro: one point, T=" << T;
}

// The MMVQ / MMQ split the options give each T (host only): by default every expert on MMVQ up
// to 8 tokens (no MMQ launch), experts of more than kBatchedMmvqMaxRows pairs on MMQ above; an
// explicit setting holds at every T.
TEST(CudaMoeLayerBatched, MmvqMaxRowsAt_DefaultAndExplicit) {
  const cuda::LayerOptions d;
  ASSERT_EQ(d.mmvq_max_rows, cuda::kMmvqRowsAuto);
  for (int64_t T = 1; T <= 5000; ++T) {
    const int want = T <= kMaxGroupRows ? kMaxGroupRows : cuda::kBatchedMmvqMaxRows;
    ASSERT_EQ(cuda::mmvq_max_rows_at(d, T), want) << "repro: default LayerOptions, T=" << T;
  }
  ASSERT_EQ(cuda::kBatchedMmvqMaxRows, 4);
  for (int mr = 0; mr <= kMaxGroupRows; ++mr) {
    cuda::LayerOptions o;
    o.mmvq_max_rows = mr;
    for (int64_t T : {1, 4, 8, 9, 64, 512, 4096})
      EXPECT_EQ(cuda::mmvq_max_rows_at(o, T), mr) << "repro: mmvq_max_rows " << mr << ", T=" << T;
  }
}

// Where the options put the MMQ launches at each T (host only): by default after the MMVQ
// launches below 48 tokens and above 128, beside them at the side stream's priority at 48 - 112
// and at the main stream's at 113 - 128; an explicit setting holds at every T.
TEST(CudaMoeLayerBatched, MmqBesideAt_DefaultAndExplicit) {
  const cuda::LayerOptions d;
  ASSERT_EQ(d.mmq_beside, cuda::kMmqBesideAuto);
  for (int64_t T = 1; T <= 5000; ++T) {
    const int want = T >= 48 && T <= 112 ? 2 : T > 112 && T <= 128 ? 1 : 0;
    ASSERT_EQ(cuda::mmq_beside_at(d, T), want) << "repro: default LayerOptions, T=" << T;
  }
  for (int b = 0; b <= 2; ++b) {
    cuda::LayerOptions o;
    o.mmq_beside = b;
    for (int64_t T : {1, 9, 32, 48, 64, 112, 113, 128, 129, 512, 4096})
      EXPECT_EQ(cuda::mmq_beside_at(o, T), b) << "repro: mmq_beside " << b << ", T=" << T;
  }
}

TEST(CudaMoeLayerBatched, BadMmqBesideThrows) {
  MOECHECK_REQUIRE_GPU();
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  for (int bad : {-2, 3}) {
    cuda::LayerOptions co;
    co.mmq_beside = bad;
    EXPECT_THROW(cuda::MoeLayer(w, co), InputError) << "mmq_beside=" << bad;
  }
}

TEST(CudaMoeLayerBatched, BadMmvqMaxRowsThrows) {
  MOECHECK_REQUIRE_GPU();
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  for (int bad : {-2, 9}) {
    cuda::LayerOptions co;
    co.mmvq_max_rows = bad;
    EXPECT_THROW(cuda::MoeLayer(w, co), InputError) << "mmvq_max_rows=" << bad;
  }
}

}  // namespace
}  // namespace moecheck
