// Streamed layers (cuda::MoeLayer through a cuda::ExpertLru) against the emulation, bit for bit in
// the output and every stage: multi-layer runs of several passes at T = 1 and T = 64, for every
// cache size from the smallest that holds one forward's experts to all resident, prefetch off
// and at several depths, reader pool off and on, side stream off and on, host and device route,
// pipelined and not; a failed read names its expert and the next forward is exact; a device-route
// graph replays the cache's slots. Contract: docs/streaming.md.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cuda/pipeline.h"
#include "tests/emu_lazy_layer.h"
#include "tests/gpu/moe_layer_check.h"
#include "tests/gpu/stream_test_util.h"

namespace moecheck {
namespace {

using gputest::FaultySource;

struct Setting {
  int64_t slots = 0;
  int prefetch_k = 0;
  int readers = 0;
  bool side = true;
  RoutePlace route = RoutePlace::kHost;
  bool pipeline = false;
  std::string name() const {
    std::string s = "slots" + std::to_string(slots);
    s += " prefetch" + std::to_string(prefetch_k);
    s += " readers" + std::to_string(readers);
    s += side ? " side" : " noside";
    s += route == RoutePlace::kDevice ? " devroute" : " hostroute";
    s += pipeline ? " pipelined" : "";
    return s;
  }
};

// The emulation's outputs and taps of every (pass, layer) on its seeded input, and the largest
// forward's distinct experts (the smallest cache that can run them).
struct Reference {
  int64_t T = 0;
  int passes = 0;
  std::vector<std::vector<uint16_t>> x;  // [pass * layers + l]
  std::vector<LayerTaps> taps;
  int64_t max_distinct = 0, forwards_distinct = 0, keys = 0;
};

Reference emu_reference(const std::vector<const LayerWeights*>& layers, int64_t T, int passes,
                        uint64_t seed) {
  Reference r;
  r.T = T;
  r.passes = passes;
  std::set<std::pair<int, int32_t>> keys;
  for (int p = 0; p < passes; ++p)
    for (const LayerWeights* w : layers) {
      r.x.push_back(
          generate_input(seed + 1000 * static_cast<uint64_t>(p) + static_cast<uint64_t>(w->layer),
                         T, w->config.dim));
      LayerTaps t;
      (void)emu::MoeLayer(*w).forward(r.x.back().data(), T, &t);
      const int64_t d = static_cast<int64_t>(t.experts.size());
      r.max_distinct = std::max(r.max_distinct, d);
      r.forwards_distinct += d;
      for (const ExpertTaps& e : t.experts) keys.insert({w->layer, e.expert});
      r.taps.push_back(std::move(t));
    }
  r.keys = static_cast<int64_t>(keys.size());
  return r;
}

// A layer's resident weights with the stacks' bytes removed: the streamed layer must never read
// them.
LayerWeights without_stacks(LayerWeights w) {
  w.gate_exps.data = w.up_exps.data = w.down_exps.data = nullptr;
  return w;
}

// One streamed run of every pass over `layers` with setting s; each forward against the reference.
void run_streamed(const std::vector<const LayerWeights*>& layers,
                  std::shared_ptr<const ExpertSource> src, const Reference& ref, const Setting& s,
                  const std::string& what) {
  const MoeConfig& c = layers[0]->config;
  cuda::CacheOptions co;
  co.slots = s.slots;
  co.reader_threads = s.readers;
  auto cache = std::make_shared<cuda::ExpertLru>(src, expert_layout(*layers[0]), c.n_routed, co);
  cuda::LayerOptions lo;
  lo.shared_side_stream = s.side;
  lo.route = s.route;
  lo.prefetch_k = s.prefetch_k;
  std::vector<std::unique_ptr<cuda::MoeLayer>> ls;
  for (const LayerWeights* w : layers)
    ls.push_back(std::make_unique<cuda::MoeLayer>(without_stacks(*w), cache, lo));
  if (s.prefetch_k > 0)  // each layer predicts the next, the last the first (the next pass)
    for (size_t i = 0; i < ls.size(); ++i) ls[i]->set_next(ls[(i + 1) % ls.size()].get());
  const std::string r = gputest::repro(0, what + " T=" + std::to_string(ref.T) + " " + s.name());
  const size_t L = layers.size();
  for (int p = 0; p < ref.passes; ++p) {
    std::vector<LayerTaps> got(L);
    std::vector<std::vector<uint16_t>> y(L);
    if (s.pipeline) {
      std::vector<cuda::MoeLayer*> lp;
      std::vector<const uint16_t*> xs;
      for (size_t l = 0; l < L; ++l) {
        lp.push_back(ls[l].get());
        xs.push_back(ref.x[p * L + l].data());
      }
      y = cuda::forward_pipelined(lp, xs, ref.T, {}, &got);
    } else {
      for (size_t l = 0; l < L; ++l) y[l] = ls[l]->forward(ref.x[p * L + l].data(), ref.T, &got[l]);
    }
    for (size_t l = 0; l < L; ++l) {
      const LayerTaps& want = ref.taps[p * L + l];
      const std::string rl = r + " pass " + std::to_string(p) + " layer " + std::to_string(l);
      ASSERT_TRUE(gputest::same_u16("output", y[l], want.output, c.dim, rl));
      ASSERT_TRUE(gputest::same_taps(got[l], want, c, rl));
    }
  }
  cache->drain();
  const CacheCounters k = cache->counters();
  EXPECT_EQ(k.hits + k.misses, static_cast<uint64_t>(ref.forwards_distinct)) << r;
  if (s.slots >= ref.keys && s.prefetch_k == 0)
    EXPECT_EQ(k.misses, static_cast<uint64_t>(ref.keys)) << r;
  EXPECT_EQ(k.bytes_read, (k.misses + k.prefetch_issued - k.failed_reads) *
                              static_cast<uint64_t>(cache->expert_bytes()))
      << r;
}

std::vector<Setting> settings(const Reference& ref, int64_t topk) {
  std::vector<Setting> v;
  const int64_t sizes[3] = {ref.max_distinct, ref.max_distinct + topk, ref.keys};
  for (int64_t n : sizes) {
    Setting base;
    base.slots = n;
    v.push_back(base);  // caller reads misses, side stream, host route
    Setting a = base;
    a.readers = 3;
    v.push_back(a);
    a.prefetch_k = 2;
    v.push_back(a);
    a.prefetch_k = static_cast<int>(topk);
    v.push_back(a);
    Setting b = base;
    b.side = false;
    v.push_back(b);
    Setting d = base;
    d.route = RoutePlace::kDevice;
    v.push_back(d);
    d.readers = 3;
    d.prefetch_k = static_cast<int>(topk);
    v.push_back(d);
    Setting p = base;
    p.readers = 3;
    p.pipeline = true;
    v.push_back(p);
  }
  return v;
}

// host_source: the layers' own bytes (HostExpertSource), else the generator on demand (slow for
// the quantised presets' blocks: sampled and quantised per expert).
void sweep_preset(const std::string& preset, int n_layers, bool host_source) {
  const GenOptions o = preset_options(preset);
  const std::vector<LayerWeights> layers = gputest::generated_layers(o, n_layers);
  std::vector<const LayerWeights*> lp;
  for (const LayerWeights& w : layers) lp.push_back(&w);
  std::shared_ptr<const ExpertSource> src;
  if (host_source) src = std::make_shared<HostExpertSource>(layers);
  else src = std::make_shared<gputest::GeneratedSource>(o);
  for (int64_t T : {int64_t{1}, int64_t{64}}) {
    const Reference ref = emu_reference(lp, T, 2, 7 + static_cast<uint64_t>(T));
    for (const Setting& s : settings(ref, o.config.topk)) {
      run_streamed(lp, src, ref, s, preset + " (" + src->name() + ")");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(StreamedLayers, Tiny_ThreeLayers_T1_T64_EveryCacheSizeAndSetting) {
  MOECHECK_REQUIRE_GPU();
  sweep_preset("tiny", 3, true);
}

TEST(StreamedLayers, Small_ThreeLayers_T1_T64_EveryCacheSizeAndSetting) {
  MOECHECK_REQUIRE_GPU();
  sweep_preset("small", 3, true);
}

// ds41 with a cache smaller than one layer's 384 experts, against the emulation on layers that
// hold only the experts the routing picks.
TEST(StreamedLayers, Ds41_TwoLayers_CacheSmallerThanALayer_T1_T64) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("ds41");
  std::vector<std::unique_ptr<emutest::LazyLayer>> lazy;
  std::vector<const LayerWeights*> lp;
  for (int l = 0; l < 2; ++l) {
    lazy.push_back(std::make_unique<emutest::LazyLayer>(o, l));
    lp.push_back(&lazy.back()->weights());
  }
  const MoeConfig& c = o.config;
  for (int64_t T : {int64_t{1}, int64_t{64}}) {
    // Fill the experts each forward will pick (the emulation's own routing), then the reference.
    for (int p = 0; p < 2; ++p)
      for (int l = 0; l < 2; ++l) {
        const auto x = generate_input(7 + static_cast<uint64_t>(T) + 1000 * p + l, T, c.dim);
        std::vector<float> z(static_cast<size_t>(T * c.n_routed));
        emu::router_gemv(RouterVariant::kStaged, lp[l]->router, x.data(), z.data(), c.n_routed,
                         c.dim, T);
        lazy[l]->fill(route_from_logits(z.data(), T, lp[l]->bias, c, l).ids);
      }
    const Reference ref = emu_reference(lp, T, 2, 7 + static_cast<uint64_t>(T));
    ASSERT_LT(ref.max_distinct + 8, c.n_routed);
    auto src = std::make_shared<gputest::GeneratedSource>(o);
    Setting host;
    host.slots = ref.max_distinct + 8;
    host.readers = 4;
    host.prefetch_k = 6;
    run_streamed(lp, src, ref, host, "ds41");
    Setting dev;
    dev.slots = ref.max_distinct;
    dev.route = RoutePlace::kDevice;
    run_streamed(lp, src, ref, dev, "ds41");
  }
}

// A read that fails mid-forward: the forward raises the source's message (layer, expert), the
// failed expert is not used, and the next forward on the same layers is exact.
TEST(StreamedLayers, FailedReadNamesTheExpertNextForwardExact) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("small");
  const std::vector<LayerWeights> layers = gputest::generated_layers(o, 2);
  std::vector<const LayerWeights*> lp{&layers[0], &layers[1]};
  const Reference ref = emu_reference(lp, 8, 1, 31);
  for (RoutePlace route : {RoutePlace::kHost, RoutePlace::kDevice})
    for (int readers : {0, 2}) {
      auto faulty = std::make_shared<FaultySource>(std::make_shared<HostExpertSource>(layers));
      cuda::CacheOptions co;
      co.slots = ref.max_distinct + 4;
      co.reader_threads = readers;
      auto cache = std::make_shared<cuda::ExpertLru>(faulty, expert_layout(layers[0]),
                                                     o.config.n_routed, co);
      cuda::LayerOptions lo;
      lo.route = route;
      cuda::MoeLayer l0(without_stacks(layers[0]), cache, lo),
          l1(without_stacks(layers[1]), cache, lo);
      const std::string r = gputest::repro(
          31, std::string(route_place_name(route)) + " readers " + std::to_string(readers));
      faulty->arm(4, FaultySource::Mode::kGarbageThenError);
      try {
        (void)l0.forward(ref.x[0].data(), 8);
        ADD_FAILURE() << "the injected fault did not surface; " << r;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("layer 0 expert"), std::string::npos) << e.what();
      }
      faulty->disarm();
      for (int round = 0; round < 2; ++round) {
        LayerTaps t0, t1;
        const auto y0 = l0.forward(ref.x[0].data(), 8, &t0);
        const auto y1 = l1.forward(ref.x[1].data(), 8, &t1);
        ASSERT_TRUE(gputest::same_u16("output layer 0", y0, ref.taps[0].output, o.config.dim, r));
        ASSERT_TRUE(gputest::same_taps(t0, ref.taps[0], o.config, r));
        ASSERT_TRUE(gputest::same_u16("output layer 1", y1, ref.taps[1].output, o.config.dim, r));
      }
    }
}

// The device-resident replay reads the slots the cache filled: after a forward() that read the
// misses, graph_forward on the same input gives the same bits.
TEST(StreamedLayers, GraphReplayReadsTheCacheSlots) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("small");
  const std::vector<LayerWeights> layers = gputest::generated_layers(o, 1);
  const Reference ref = emu_reference({&layers[0]}, 1, 1, 5);
  cuda::CacheOptions co;
  co.slots = 16;
  auto cache = std::make_shared<cuda::ExpertLru>(std::make_shared<HostExpertSource>(layers),
                                                 expert_layout(layers[0]), o.config.n_routed, co);
  cuda::LayerOptions lo;
  lo.route = RoutePlace::kDevice;
  cuda::MoeLayer l0(without_stacks(layers[0]), cache, lo);
  EXPECT_EQ(l0.forward(ref.x[0].data(), 1), ref.taps[0].output);
  uint16_t* din = l0.device_input(1);
  ASSERT_EQ(cudaMemcpy(din, ref.x[0].data(), ref.x[0].size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  l0.graph_forward(1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> y(static_cast<size_t>(o.config.dim));
  ASSERT_EQ(cudaMemcpy(y.data(), l0.device_output(), y.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(gputest::same_u16("graph output", y, ref.taps[0].output, o.config.dim,
                                gputest::repro(5, "small T=1 device route graph")));
  EXPECT_EQ(l0.device_routing(1).ids, ref.taps[0].topk_ids);
}

TEST(StreamedLayers, RefusesWiringThatCannotWork) {
  MOECHECK_REQUIRE_GPU();
  const GenOptions o = preset_options("tiny");
  const std::vector<LayerWeights> layers = gputest::generated_layers(o, 2);
  auto src = std::make_shared<HostExpertSource>(layers);
  cuda::CacheOptions co;
  co.slots = 4;
  auto cache =
      std::make_shared<cuda::ExpertLru>(src, expert_layout(layers[0]), o.config.n_routed, co);
  auto other =
      std::make_shared<cuda::ExpertLru>(src, expert_layout(layers[0]), o.config.n_routed, co);
  cuda::LayerOptions pf;
  pf.prefetch_k = 2;
  EXPECT_THROW(cuda::MoeLayer(layers[0], cache, pf), InputError);  // prefetch needs readers
  cuda::MoeLayer a(without_stacks(layers[0]), cache), b(without_stacks(layers[1]), other);
  EXPECT_THROW(a.set_next(&b), InputError);  // another cache
  EXPECT_THROW(a.set_next(&a), InputError);
  EXPECT_THROW(a.set_resident(std::vector<uint8_t>(16, 1)), InputError);
  const GenOptions so = preset_options("small");
  const LayerWeights s0 = generate_layer(so, 0);
  EXPECT_THROW(cuda::MoeLayer(without_stacks(s0), cache), InputError);  // other expert shapes
  cuda::LayerOptions dev;
  dev.route = RoutePlace::kDevice;
  cuda::MoeLayer d(without_stacks(layers[0]), cache, dev);
  const auto x = generate_input(3, 1, o.config.dim);
  EXPECT_THROW((void)d.stage(x.data(), 1), InputError);  // the split is the host route's
  EXPECT_THROW(a.launch(), InputError);                  // nothing staged
  (void)a.stage(x.data(), 1);                            // 4 experts: the cache's 4 slots
  EXPECT_THROW((void)a.stage(x.data(), 1), InputError);  // one stage at a time
  EXPECT_EQ(a.finish(), emu::MoeLayer(layers[0]).forward(x.data(), 1));
}

}  // namespace
}  // namespace moecheck
