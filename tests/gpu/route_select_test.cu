// The device route against its twins, bitwise: cuda::route_select's header (status, error
// locations, picks, weight bits, plan slots) equals emu::route_select's on 200 seeded cases
// (random logits; exact ties, +-0 and +-Inf keys; NaN logits, NaN bias and Inf - Inf keys; image
// masks with bias_vl; partly filled slot tables; every score function; norm on / off); the
// device plan (cuda::route_plan) equals build_layer_plan's; the score functions give the same
// bits on the device as on the host for every f32 input; and cuda::MoeLayer's miss flag: a
// picked expert that is not resident fails with its layer, token and expert on both routes, and
// the next forward (every expert resident again) equals the emulation. Contract:
// docs/numerics.md "route_select", "Score functions".
#include <algorithm>
#include <thread>

#include "core/error.h"
#include "core/layer_plan.h"
#include "core/route_header.h"
#include "core/score_math.h"
#include "cuda/kernels.h"
#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "emulate/route_select.h"
#include "golden/generator.h"
#include "tests/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

using gputest::DevArray;

struct Case {
  MoeConfig c;
  int64_t T = 1;
  std::vector<float> logits, bias, bias_vl;
  std::vector<uint8_t> mask;
  std::vector<int32_t> slots;
};

// Seeded case: n_routed, topk, T, score function, norm and scale drawn; then per seed class
// ties (logits repeated, +-0 keys), infinities, NaNs, a mask and a partly empty slot table.
Case make_case(uint64_t seed) {
  emutest::Gen g(seed);
  Case k;
  // 1500 and 2048: several experts a thread in route_select's staging, slot pointers not staged
  // by route_plan (over 1024 experts).
  const int64_t sizes[] = {4, 8, 16, 64, 256, 384, 1000, 1500, 2048};
  k.c.n_routed = sizes[g.u32() % 9];
  k.c.topk = 1 + static_cast<int64_t>(g.u32() % std::min<int64_t>(k.c.n_routed, 8));
  k.c.score_func = static_cast<ScoreFunc>(g.u32() % 3);
  k.c.norm_topk_prob = g.u32() % 4 != 0;
  k.c.route_scale = g.u32() % 2 ? 1.0f : 2.5f;
  k.c.gate_temp = g.u32() % 3 ? 1.0f : 0.7f;
  k.T = 1 + static_cast<int64_t>(g.u32() % (seed % 5 == 0 ? 40 : 8));
  const int64_t n = k.c.n_routed;
  k.logits = g.f32(k.T * n, 3.0);
  k.bias = g.f32(n, 0.5);
  k.bias_vl = g.f32(n, 0.5);
  if (seed % 4 == 1) {  // exact ties: a few values repeated across experts, zero logits and bias
    for (auto& v : k.logits) v = static_cast<float>(static_cast<int>(v));
    for (int64_t e = 0; e < n; ++e) k.bias[e] = e % 3 == 0 ? -0.0f : 0.0f;
  }
  if (seed % 7 == 2) k.logits[g.u32() % k.logits.size()] = INFINITY;
  if (seed % 7 == 3) k.logits[g.u32() % k.logits.size()] = NAN;
  if (seed % 11 == 4) k.bias[g.u32() % n] = NAN;
  if (seed % 13 == 5) {  // Inf - Inf key
    k.bias[0] = -INFINITY;
    k.logits[0] = INFINITY;
  }
  if (seed % 3 != 0) {
    k.mask.resize(static_cast<size_t>(k.T));
    for (auto& m : k.mask) m = g.u32() % 2;
  }
  k.slots.resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e)
    k.slots[e] = seed % 6 == 0 && g.u32() % 5 == 0 ? -1 : static_cast<int32_t>(n - 1 - e);
  return k;
}

cuda::RouteParams params(const MoeConfig& c) {
  return {c.n_routed,      c.topk, c.gate_temp, c.route_scale, static_cast<int>(c.score_func),
          c.norm_topk_prob};
}

TEST(RouteSelect, HeaderEqualsEmu_200Seeds_TiesNaNMaskMisses) {
  MOECHECK_REQUIRE_GPU();
  int statuses[4] = {0, 0, 0, 0};
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const Case k = make_case(seed * 7919);
    const RouteHeaderLayout L{k.T, k.c.topk};
    const bool masked = !k.mask.empty();
    std::vector<int32_t> want(static_cast<size_t>(L.words()));
    emu::route_select(k.logits.data(), k.T,
                      RouteBias{k.bias.data(), k.bias_vl.data(), masked ? k.mask.data() : nullptr},
                      k.c, k.slots.data(), want.data());
    DevArray<float> dz(k.logits), db(k.bias), dbv(k.bias_vl);
    DevArray<uint8_t> dm(masked ? k.mask : std::vector<uint8_t>(1));
    DevArray<int32_t> ds(k.slots), dh(static_cast<size_t>(L.words()));
    const std::string r =
        gputest::repro(seed * 7919, "n_routed " + std::to_string(k.c.n_routed) + " topk " +
                                        std::to_string(k.c.topk) + " T " + std::to_string(k.T));
    for (int run = 0; run < 2; ++run) {
      dh.poison();
      cuda::route_select(dz.get(), k.T, db.get(), dbv.get(), masked ? dm.get() : nullptr,
                         params(k.c), ds.get(), dh.get(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << r;
      const std::vector<int32_t> got = dh.host();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i])
            << "header word " << i << " (picks at " << RouteHeaderLayout::kPicks << ", weights at "
            << L.weights() << ", slots at " << L.slots() << ")\n  repro: " << r;
      }
    }
    ++statuses[want[RouteHeaderLayout::kStatus] & 3];
  }
  // The seeds reach every status: clean, miss, NaN, and both.
  for (int st = 0; st < 3; ++st) EXPECT_GT(statuses[st], 0) << "status " << st << " never reached";
}

// The device plan of case k's clean header (NaN and infinities replaced, every expert resident)
// against build_layer_plan of the same routing, with the MMVQ / MMQ split mr.
void expect_plan_equals_build(Case k, int mr, uint64_t seed) {
  for (auto& v : k.logits) v = std::isnan(v) || std::isinf(v) ? 0.5f : v;
  for (auto& v : k.bias) v = std::isnan(v) || std::isinf(v) ? 0.0f : v;
  const int64_t n = k.c.n_routed, P = k.T * k.c.topk;
  for (int64_t e = 0; e < n; ++e) k.slots[e] = static_cast<int32_t>(n - 1 - e);
  const Routing rt = route_from_logits(k.logits.data(), k.T, k.bias.data(), k.c, 0);
  cuda::RouteParams rp = params(k.c);
  rp.mmvq_max_rows = mr;
  const LayerPlan want = build_layer_plan(rt, n, mr);
  // Slot pointers: fake bases, slot s of gate at 0x10000 + 64 s, up + 0x100000, down + 0x200000.
  std::vector<const uint8_t*> ptrs(static_cast<size_t>(3 * n));
  for (int64_t s = 0; s < 3 * n; ++s)
    ptrs[s] =
        reinterpret_cast<const uint8_t*>(uintptr_t{0x10000} + 0x100000 * (s / n) + 64 * (s % n));
  const RouteHeaderLayout L{k.T, k.c.topk};
  const DevicePlanLayout D(k.T, k.c.topk);
  DevArray<float> dz(k.logits), db(k.bias);
  DevArray<int32_t> ds(k.slots), dh(static_cast<size_t>(L.words()));
  DevArray<const uint8_t*> dp(ptrs);
  DevArray<uint8_t> plan(D.bytes);
  const std::string r = gputest::repro(
      seed, "n_routed " + std::to_string(n) + " topk " + std::to_string(k.c.topk) + " T " +
                std::to_string(k.T) + " mmvq_max_rows " + std::to_string(mr));
  cuda::route_select(dz.get(), k.T, db.get(), nullptr, nullptr, rp, ds.get(), dh.get(), nullptr);
  cuda::route_plan(dh.get(), k.T, rp, ds.get(), dp.get(), dp.get() + n, dp.get() + 2 * n,
                   plan.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << r;
  const std::vector<uint8_t> got = plan.host();
  const auto* counts = reinterpret_cast<const int32_t*>(got.data() + D.counts);
  const int64_t U = want.n_experts(), G = want.n_proj_groups;
  ASSERT_EQ(counts[0], 2 * G) << r;
  ASSERT_EQ(counts[1], G) << r;
  ASSERT_EQ(counts[2], U) << r;
  ASSERT_EQ(counts[3], want.n_mmvq_groups) << r;
  const auto* gp = reinterpret_cast<const uint8_t* const*>(got.data() + D.slots);
  for (int64_t u = 0; u < U; ++u) {
    const int64_t e = want.experts[u], s = k.slots[e];
    ASSERT_EQ(gp[u], ptrs[s]) << "gate slot pointer of expert " << e << "\n  repro: " << r;
    ASSERT_EQ(gp[U + u], ptrs[n + s]) << "up slot pointer of expert " << e << "\n  repro: " << r;
    ASSERT_EQ(gp[2 * U + u], ptrs[2 * n + s]) << "down slot pointer\n  repro: " << r;
  }
  const auto* gg = reinterpret_cast<const MmvqGroup*>(got.data() + D.groups);
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t g = 0; g < G; ++g)
      ASSERT_EQ(std::memcmp(&gg[j * P + g], &want.groups[j * G + g], sizeof(MmvqGroup)), 0)
          << "projection " << j << " group " << g << "\n  repro: " << r;
  const auto* rows = reinterpret_cast<const int32_t*>(got.data() + D.rows);
  const auto* wts = reinterpret_cast<const float*>(got.data() + D.weights);
  for (int64_t i = 0; i < P; ++i) {
    ASSERT_EQ(rows[i], want.acc_rows[i]) << "acc row " << i << "\n  repro: " << r;
    ASSERT_EQ(f32_bits(wts[i]), f32_bits(want.acc_weights[i]))
        << "acc weight " << i << "\n  repro: " << r;
  }
}

// The MMVQ / MMQ split of seed s: the default 8, every expert on MMQ (0), and 2.
int split_of(uint64_t s) { return s % 3 == 0 ? 0 : (s % 3 == 1 ? kMaxGroupRows : 2); }

TEST(RoutePlan, EqualsBuildLayerPlan_100Seeds) {
  MOECHECK_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    expect_plan_equals_build(make_case(seed * 104729), split_of(seed), seed * 104729);
    if (HasFatalFailure()) return;
  }
}

// route_plan's shared-memory forms at their edges (cuda/route_plan.cu PlanSmem): P = T topk at
// and over kStagedPicks (3072: the picks staged or read from the header), over 48 KB of shared
// memory (the raised limit), more than 1024 experts (slot pointers read, not staged), and at and
// over kOneWarpPicks (64: warp 0 ranks the picks alone, or every warp a chunk; 65 leaves most
// warps' chunks empty), with few experts (16: long runs of one expert across chunks).
TEST(RoutePlan, EqualsBuildLayerPlan_StagingEdges) {
  MOECHECK_REQUIRE_GPU();
  const struct {
    int64_t n, k, T;
  } shapes[] = {{384, 6, 512},  {384, 6, 513}, {1024, 6, 512}, {1024, 8, 400}, {2048, 6, 8},
                {2048, 6, 520}, {1500, 3, 1},  {16, 4, 1000},  {384, 8, 8},    {384, 5, 13},
                {16, 4, 16},    {16, 4, 17},   {384, 6, 64},   {8, 1, 65},     {8, 8, 300}};
  uint64_t seed = 77;
  for (const auto& sh : shapes) {
    ++seed;
    emutest::Gen g(seed);
    Case k = make_case(seed);
    k.c.n_routed = sh.n;
    k.c.topk = sh.k;
    k.T = sh.T;
    k.logits = g.f32(k.T * sh.n, 3.0);
    k.bias = g.f32(sh.n, 0.5);
    k.slots.assign(static_cast<size_t>(sh.n), 0);
    expect_plan_equals_build(k, split_of(seed), seed);
    if (HasFatalFailure()) return;
  }
}

// The one-token fused launch (route_select_plan_one, the layer's T = 1 device route) against
// route_select followed by route_plan on 200 seeded one-token cases (ties, infinities, NaN
// logits and bias, masks, partly empty slot tables: every status): the header and the whole
// device plan, scratch included, are the same bytes (both outputs poisoned alike first).
TEST(RouteSelectPlanOne, EqualsSelectThenPlan_200Seeds) {
  MOECHECK_REQUIRE_GPU();
  int statuses[4] = {0, 0, 0, 0};
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Case k = make_case(seed * 7919 + 3);
    const int64_t n = k.c.n_routed;
    // Token 0 of the case (keeping its NaN or infinity when it fell there).
    k.T = 1;
    k.logits.resize(static_cast<size_t>(n));
    if (!k.mask.empty()) k.mask.resize(1);
    if (seed % 9 == 0) k.logits[seed % n] = NAN;
    std::vector<const uint8_t*> ptrs(static_cast<size_t>(3 * n));
    for (int64_t s = 0; s < 3 * n; ++s)
      ptrs[s] =
          reinterpret_cast<const uint8_t*>(uintptr_t{0x10000} + 0x100000 * (s / n) + 64 * (s % n));
    const RouteHeaderLayout L{1, k.c.topk};
    const DevicePlanLayout D(1, k.c.topk);
    DevArray<float> dz(k.logits), db(k.bias), dbv(k.bias_vl);
    DevArray<uint8_t> dm(k.mask.empty() ? std::vector<uint8_t>{0} : k.mask);
    DevArray<int32_t> ds(k.slots), h1(static_cast<size_t>(L.words())),
        h2(static_cast<size_t>(L.words()));
    DevArray<const uint8_t*> dp(ptrs);
    DevArray<uint8_t> p1(D.bytes), p2(D.bytes);
    const float* bvl = k.mask.empty() ? nullptr : dbv.get();
    const uint8_t* mk = k.mask.empty() ? nullptr : dm.get();
    const std::string r = gputest::repro(seed * 7919 + 3, "n " + std::to_string(n));
    cuda::route_select(dz.get(), 1, db.get(), bvl, mk, params(k.c), ds.get(), h1.get(), nullptr);
    cuda::route_plan(h1.get(), 1, params(k.c), ds.get(), dp.get(), dp.get() + n, dp.get() + 2 * n,
                     p1.get(), nullptr);
    cuda::route_select_plan_one(dz.get(), db.get(), bvl, mk, params(k.c), ds.get(), h2.get(),
                                dp.get(), dp.get() + n, dp.get() + 2 * n, p2.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << r;
    const std::vector<int32_t> a = h1.host(), b = h2.host();
    ASSERT_EQ(a, b) << "route headers differ\n  repro: " << r;
    const std::vector<uint8_t> pa = p1.host(), pb = p2.host();
    for (size_t i = 0; i < pa.size(); ++i)
      ASSERT_EQ(pa[i], pb[i]) << "plan byte " << i << " of " << pa.size() << "\n  repro: " << r;
    ++statuses[a[RouteHeaderLayout::kStatus] & 3];
  }
  for (int st = 0; st < 3; ++st) EXPECT_GT(statuses[st], 0) << "status " << st << " never reached";
}

template <int kFn>
__global__ void score_kernel(uint32_t first, uint32_t n, float* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float z = __uint_as_float(first + i);
  out[i] = kFn == 0 ? psoftplus(z) : kFn == 1 ? psigmoid(z) : psqrt_softplus(z);
}

// Every f32 input of psoftplus, psigmoid and psqrt_softplus: device bits == host bits (NaN as
// NaN: both return the canonical NaN).
template <int kFn>
void all_f32_equal(const char* name) {
  constexpr uint32_t kChunk = 1u << 28;
  DevArray<float> d(kChunk);
  std::vector<float> dev(kChunk);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  uint64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint64_t first = 0; first < (uint64_t{1} << 32); first += kChunk) {
    score_kernel<kFn><<<kChunk / 256, 256>>>(static_cast<uint32_t>(first), kChunk, d.get());
    ASSERT_EQ(cudaMemcpy(dev.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<uint64_t> bad(threads, 0);
    std::vector<uint32_t> where(threads, 0);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (uint32_t i = t; i < kChunk; i += threads) {
          const float z = bits_f32(static_cast<uint32_t>(first) + i);
          const float h = kFn == 0 ? psoftplus(z) : kFn == 1 ? psigmoid(z) : psqrt_softplus(z);
          if (f32_bits(h) != f32_bits(dev[i]) && !(h != h && dev[i] != dev[i])) {
            if (bad[t]++ == 0) where[t] = static_cast<uint32_t>(first) + i;
          }
        }
      });
    for (auto& th : pool) th.join();
    for (unsigned t = 0; t < threads; ++t) {
      if (bad[t] > 0 && mismatches == 0) first_bad = where[t];
      mismatches += bad[t];
    }
  }
  EXPECT_EQ(mismatches, 0u) << name << ": first mismatch at input bits "
                            << gputest::hex32(first_bad)
                            << "\n  repro: the whole f32 range, tests/gpu/route_select_test.cu";
  std::printf("%s: 2^32 inputs, %llu host/device mismatches\n", name,
              static_cast<unsigned long long>(mismatches));
}

TEST(ScoreMath, HostEqualsDevice_EveryF32Input) {
  MOECHECK_REQUIRE_GPU();
  all_f32_equal<0>("psoftplus");
  all_f32_equal<1>("psigmoid");
  all_f32_equal<2>("psqrt_softplus");
}

// A partly filled slot table: the forward whose picks include a non-resident expert fails with
// the same message on both routes (layer, lowest token, its lowest missing expert); with every
// expert resident again the next forward equals the emulation in every stage.
TEST(CudaMoeLayer, MissFlagNamesLayerTokenExpert_BothRoutes_NextForwardExact) {
  MOECHECK_REQUIRE_GPU();
  LayerWeights w = generate_layer(preset_options("small"), 0);
  w.layer = 5;
  const int64_t T = 4, E = w.config.n_routed, dim = w.config.dim;
  const auto x = generate_input(900, T, dim);
  const emu::MoeLayer ref(w, emu::LayerOptions{});
  LayerTaps want;
  const auto y_want = ref.forward(x.data(), T, &want);
  // Clear token 1's second and fourth picks (and nothing token 0 picked): token 1 is the lowest
  // token with a miss, and the smaller of the two ids is named.
  std::vector<uint8_t> resident(static_cast<size_t>(E), 1);
  const int64_t K = w.config.topk;
  const int32_t a = want.topk_ids[K + 1], b = want.topk_ids[K + 3];
  auto picked_by_0 = [&](int32_t e) {
    return std::find(want.topk_ids.begin(), want.topk_ids.begin() + K, e) !=
           want.topk_ids.begin() + K;
  };
  ASSERT_FALSE(picked_by_0(a) || picked_by_0(b)) << "seed 900 no longer separates token 0";
  resident[a] = resident[b] = 0;
  const std::string expect = "cuda::MoeLayer: layer 5 token 1 expert " +
                             std::to_string(std::min(a, b)) +
                             ": picked expert is not resident in the slot table";
  for (RoutePlace route : {RoutePlace::kHost, RoutePlace::kDevice})
    for (bool graphs : {false, true}) {
      cuda::LayerOptions co;
      co.route = route;
      co.use_graphs = graphs;
      cuda::MoeLayer layer(w, co);
      const std::string r = gputest::repro(
          900, std::string("route ") + route_place_name(route) + (graphs ? ", graphs" : ""));
      layer.set_resident(resident);
      std::string err;
      try {
        layer.forward(x.data(), T);
      } catch (const InputError& e) {
        err = e.what();
      }
      EXPECT_EQ(err.rfind(expect, 0), 0u) << "got: " << err << "\n  repro: " << r;
      layer.set_resident(std::vector<uint8_t>(static_cast<size_t>(E), 1));
      LayerTaps got;
      ASSERT_TRUE(gputest::same_u16("output after the miss", layer.forward(x.data(), T, &got),
                                    y_want, dim, r));
      ASSERT_EQ(got.topk_ids, want.topk_ids) << r;
      ASSERT_TRUE(gputest::same_f32("acc after the miss", got.acc, want.acc, dim, r));
    }
}

}  // namespace
}  // namespace moecheck
