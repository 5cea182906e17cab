// cuda::ExpertLru on the device: misses copy the source's bytes into their slots, hits copy
// nothing, the slot table follows every miss and eviction, prefetches become hits, failed reads
// leave nothing valid, the check hook runs once per (layer, expert, projection) and its errors
// surface later, bad options are refused. Contract: docs/streaming.md "The device cache".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <tuple>

#include "core/route_header.h"
#include "tests/gpu/stream_test_util.h"

namespace moecheck {
namespace {

using gputest::FaultySource;

struct Fixture {
  GenOptions o = preset_options("tiny");
  std::vector<LayerWeights> layers = gputest::generated_layers(o, 2);
  std::shared_ptr<const ExpertSource> host = std::make_shared<HostExpertSource>(layers);
  ExpertLayout layout = expert_layout(layers[0]);
  int64_t E = o.config.n_routed;
};

// Every projection of the expert in each slot of the lease equals the source's bytes.
::testing::AssertionResult slots_hold(const cuda::ExpertLru& c, const cuda::CacheLease& l,
                                      const ExpertSource& src) {
  for (size_t i = 0; i < l.experts.size(); ++i)
    for (Proj p : kAllProjs) {
      std::vector<uint8_t> want(static_cast<size_t>(src.layout(l.layer).bytes(p)));
      src.read(l.layer, l.experts[i], p, want.data());
      if (gputest::slot_bytes(c, l.slots[i], p) != want)
        return ::testing::AssertionFailure()
               << "slot " << l.slots[i] << " (layer " << l.layer << " expert " << l.experts[i]
               << ", " << proj_name(p) << ") differs from the source";
    }
  return ::testing::AssertionSuccess();
}

class ExpertLruThreads : public ::testing::TestWithParam<int> {};

TEST_P(ExpertLruThreads, MissesCopyTheSourceHitsCopyNothingTableFollows) {
  MOECHECK_REQUIRE_GPU();
  Fixture f;
  cuda::CacheOptions co;
  co.slots = 5;
  co.reader_threads = GetParam();
  cuda::ExpertLru c(f.host, f.layout, f.E, co);
  const auto a = c.acquire(0, {1, 3, 7}, nullptr);
  EXPECT_EQ(a.misses, 3u);
  EXPECT_EQ(a.hits, 0u);
  EXPECT_EQ(a.bytes_read, 3u * static_cast<uint64_t>(f.layout.expert_bytes()));
  EXPECT_TRUE(slots_hold(c, a, *f.host));
  std::vector<int32_t> t = gputest::slot_table(c);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t[static_cast<size_t>(a.experts[i])], a.slots[i]);
  c.release(a, nullptr);
  const auto b = c.acquire(0, {3, 7, 9}, nullptr);  // two hits, one miss into the last free slots
  EXPECT_EQ(b.hits, 2u);
  EXPECT_EQ(b.misses, 1u);
  EXPECT_EQ(b.slots[0], a.slots[1]);
  EXPECT_EQ(b.slots[1], a.slots[2]);
  EXPECT_TRUE(slots_hold(c, b, *f.host));
  c.release(b, nullptr);
  // Layer 1 needs 3 slots: the one free, then the least recently used: expert 1 of layer 0, then
  // expert 3 (9 and 7 were used after it... 3, 7, 9 in that order: 3 is older).
  const auto d = c.acquire(1, {0, 1, 2}, nullptr);
  EXPECT_EQ(d.misses, 3u);
  EXPECT_TRUE(slots_hold(c, d, *f.host));
  t = gputest::slot_table(c);
  EXPECT_EQ(t[1], -1) << "layer 0 expert 1 was evicted";
  EXPECT_EQ(t[3], -1) << "layer 0 expert 3 was evicted";
  EXPECT_EQ(t[7], b.slots[1]);
  EXPECT_EQ(t[9], b.slots[2]);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t[static_cast<size_t>(f.E + d.experts[i])], d.slots[i]);
  c.release(d, nullptr);
  const CacheCounters k = c.counters();
  EXPECT_EQ(k.hits, 2u);
  EXPECT_EQ(k.misses, 7u);
  EXPECT_EQ(k.evictions, 2u);
}

INSTANTIATE_TEST_SUITE_P(Readers, ExpertLruThreads, ::testing::Values(0, 3),
                         [](const auto& i) { return "readers" + std::to_string(i.param); });

TEST(ExpertLru, PinnedHostViewsAreCopiedDirectly) {
  MOECHECK_REQUIRE_GPU();
  Fixture f;
  // Pin the generated stacks: the readers then copy from the views without staging.
  for (const LayerWeights& w : f.layers)
    for (Proj p : kAllProjs) {
      const ExpertStackView& s = expert_layout(w).stack(p);
      ASSERT_EQ(cudaHostRegister(const_cast<uint8_t*>(s.data),
                                 static_cast<size_t>(s.expert_stride() * s.n_experts),
                                 cudaHostRegisterDefault),
                cudaSuccess);
    }
  {
    cuda::CacheOptions co;
    co.slots = 8;
    co.reader_threads = 2;
    cuda::ExpertLru c(f.host, f.layout, f.E, co);
    const auto a = c.acquire(1, {15, 0, 8, 4}, nullptr);
    EXPECT_TRUE(slots_hold(c, a, *f.host));
    c.release(a, nullptr);
    c.drain();
  }
  for (const LayerWeights& w : f.layers)
    for (Proj p : kAllProjs)
      (void)cudaHostUnregister(const_cast<uint8_t*>(expert_layout(w).stack(p).data));
}

TEST(ExpertLru, PrefetchedExpertsBecomeHits) {
  MOECHECK_REQUIRE_GPU();
  Fixture f;
  cuda::CacheOptions co;
  co.slots = 6;
  co.reader_threads = 2;
  cuda::ExpertLru c(f.host, f.layout, f.E, co);
  c.prefetch(1, {4, 5, 99});  // 99 is no expert: skipped
  const auto a = c.acquire(1, {4, 5, 6}, nullptr);
  EXPECT_EQ(a.hits, 2u);
  EXPECT_EQ(a.misses, 1u);
  EXPECT_TRUE(slots_hold(c, a, *f.host));
  c.release(a, nullptr);
  c.drain();
  const CacheCounters k = c.counters();
  EXPECT_EQ(k.prefetch_issued, 2u);
  EXPECT_EQ(k.prefetch_used, 2u);
  EXPECT_LE(k.prefetch_late, 2u);
  EXPECT_EQ(k.bytes_read, 3u * static_cast<uint64_t>(f.layout.expert_bytes()));
  const std::vector<int32_t> t = gputest::slot_table(c);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t[static_cast<size_t>(f.E + a.experts[i])], a.slots[i]);
}

// A read that fails (after writing part of the bytes) leaves its key uncached and -1 in the
// table; the forward's other experts stay valid; the next acquisition reads it correctly.
TEST(ExpertLru, FailedReadLeavesNothingValidNextAcquireIsCorrect) {
  MOECHECK_REQUIRE_GPU();
  for (auto mode : {FaultySource::Mode::kShortRead, FaultySource::Mode::kGarbageThenError})
    for (int readers : {0, 3}) {
      Fixture f;
      auto faulty = std::make_shared<FaultySource>(f.host);
      cuda::CacheOptions co;
      co.slots = 6;
      co.reader_threads = readers;
      cuda::ExpertLru c(faulty, f.layout, f.E, co);
      faulty->arm(readers == 0 ? 5 : 2, mode);  // 3 reads per expert: the 2nd expert (or any)
      try {
        (void)c.acquire(0, {2, 5, 11}, nullptr);
        ADD_FAILURE() << "the injected fault did not surface (readers " << readers << ")";
      } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("short read"), std::string::npos) << msg;
        EXPECT_NE(msg.find("layer 0 expert"), std::string::npos) << msg;
      }
      faulty->disarm();
      int valid = 0;
      for (int32_t s = 0; s < c.n_slots(); ++s) valid += c.slot_valid(s);
      EXPECT_EQ(valid, 2) << "two of the three experts arrived whole, readers " << readers;
      const std::vector<int32_t> t = gputest::slot_table(c);
      int in_table = 0;
      for (int e : {2, 5, 11}) in_table += t[static_cast<size_t>(e)] >= 0;
      EXPECT_EQ(in_table, 2);
      const auto a = c.acquire(0, {2, 5, 11}, nullptr);
      EXPECT_EQ(a.misses, 1u);
      EXPECT_TRUE(slots_hold(c, a, *f.host)) << "readers " << readers;
      c.release(a, nullptr);
    }
}

// on_read runs once per (layer, expert, projection) for the cache's life, however often the
// expert is read again; an error from it drops the expert and is raised by a later call.
TEST(ExpertLru, CheckHookOncePerKeyErrorsSurfaceLater) {
  MOECHECK_REQUIRE_GPU();
  Fixture f;
  std::mutex mu;
  std::map<std::tuple<int, int64_t, int>, int> calls;
  cuda::CacheOptions co;
  co.slots = 3;
  co.reader_threads = 2;
  co.on_read = [&](int layer, int64_t e, Proj p, const uint8_t* bytes, size_t n) {
    std::vector<uint8_t> want(n);
    f.host->read(layer, e, p, want.data());
    if (std::memcmp(want.data(), bytes, n) != 0) throw std::runtime_error("hook saw other bytes");
    std::lock_guard<std::mutex> lock(mu);
    ++calls[{layer, e, static_cast<int>(p)}];
    if (layer == 1 && e == 9) throw InputError("check: layer 1 expert 9 has a non-finite scale");
  };
  cuda::ExpertLru c(f.host, f.layout, f.E, co);
  for (int round = 0; round < 3; ++round)
    for (int l = 0; l < 2; ++l) {
      const auto a = c.acquire(l, {0, 1, 2}, nullptr);  // evicts the other layer's three
      c.release(a, nullptr);
    }
  c.drain();
  EXPECT_EQ(c.counters().misses, 18u);
  for (int l = 0; l < 2; ++l)
    for (int64_t e = 0; e < 3; ++e)
      for (int p = 0; p < 3; ++p) EXPECT_EQ((calls[{l, e, p}]), 1) << l << " " << e << " " << p;
  try {
    const auto b = c.acquire(1, {9}, nullptr);
    c.release(b, nullptr);  // raises it when the check has ended by now, else drain() does
    c.drain();
    ADD_FAILURE() << "the hook's error did not surface";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 expert 9"), std::string::npos) << e.what();
  }
  for (int32_t s = 0; s < c.n_slots(); ++s) {
    const auto k = c.slot_key(s);
    EXPECT_FALSE(k && k->layer == 1 && k->expert == 9) << "the bad expert stayed cached";
  }
}

TEST(ExpertLru, RefusesOptionsThatCannotWork) {
  MOECHECK_REQUIRE_GPU();
  Fixture f;
  auto refused = [&](cuda::CacheOptions co, const std::string& part) {
    try {
      cuda::ExpertLru c(f.host, f.layout, f.E, co);
      ADD_FAILURE() << "accepted; expected a refusal naming " << part;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  cuda::CacheOptions both;
  both.slots = 2;
  both.bytes = 1 << 20;
  refused(both, "exactly one of slots and bytes");
  cuda::CacheOptions tiny_bytes;
  tiny_bytes.bytes = 100;
  refused(tiny_bytes, "hold no slot");
  cuda::CacheOptions huge;
  huge.slots = int64_t{1} << 29;
  refused(huge, "free");
  cuda::CacheOptions readers;
  readers.slots = 2;
  readers.reader_threads = 65;
  refused(readers, "reader_threads");
  cuda::CacheOptions ok;
  ok.slots = 2;
  cuda::ExpertLru c(f.host, f.layout, f.E, ok);
  EXPECT_THROW((void)c.acquire(0, {1, 2, 3}, nullptr), InputError);  // more experts than slots
  EXPECT_THROW((void)c.acquire(0, {1, 16}, nullptr), InputError);    // no expert 16
  EXPECT_THROW((void)c.acquire(2, {1}, nullptr), InputError);        // the source has no layer 2
  EXPECT_THROW(c.prefetch(0, {1}), InputError);                      // no reader pool
  const auto a = c.acquire(0, {1, 2}, nullptr);
  EXPECT_THROW((void)c.acquire(1, {1}, nullptr), CacheFullError);  // both slots pinned
  c.release(a, nullptr);
  const auto b = c.acquire(1, {1}, nullptr);
  EXPECT_EQ(b.misses, 1u);
  c.release(b, nullptr);
}

}  // namespace
}  // namespace moecheck
