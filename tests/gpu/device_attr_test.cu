// The launch helpers of cuda/device_util.cuh that every large-shared-memory kernel goes through:
// allow_dynamic_smem (the per (kernel, device) dynamic shared-memory limit, raised and never
// lowered, safe from several host threads) and resident_blocks_per_sm (the occupancy API's
// answer, kept per kernel, device, block size and bytes). Checked against the runtime's own
// attribute and occupancy calls, with kernels of this file that use every byte they ask for.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_util.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck {
namespace {

// Every thread writes its words of the dynamic shared buffer (word i = i * 2654435761 + seed),
// then thread 0 sums them (mod 2^32) into out: a launch that did not get its bytes fails to
// launch, and one that got them gives the sum the host computes.
template <int kTag>
__global__ void smem_probe_kernel(uint32_t seed, int words, uint32_t* out) {
  extern __shared__ uint32_t buf[];
  for (int i = static_cast<int>(threadIdx.x); i < words; i += static_cast<int>(blockDim.x))
    buf[i] = static_cast<uint32_t>(i) * 2654435761u + seed;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t s = 0;
    for (int i = 0; i < words; ++i) s += buf[i];
    out[blockIdx.x] = s;
  }
}

uint32_t expected_sum(uint32_t seed, int words) {
  uint32_t s = 0;
  for (int i = 0; i < words; ++i) s += static_cast<uint32_t>(i) * 2654435761u + seed;
  return s;
}

int max_dynamic_attr(const void* k) {
  cudaFuncAttributes fa{};
  EXPECT_EQ(cudaFuncGetAttributes(&fa, k), cudaSuccess);
  return fa.maxDynamicSharedSizeBytes;
}

int optin_bytes() {
  int dev = 0, optin = 0;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return optin;
}

// One launch of the probe with `bytes` of dynamic shared memory on `stream`; the error of the
// launch and of the stream, and the sum checked.
template <int kTag>
::testing::AssertionResult probe(int bytes, uint32_t seed, cudaStream_t stream) {
  gputest::DevArray<uint32_t> out(1);
  const int words = bytes / 4;
  smem_probe_kernel<kTag><<<1, 256, static_cast<size_t>(bytes), stream>>>(seed, words, out.get());
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    return ::testing::AssertionFailure()
           << "launch of " << bytes << " bytes: " << cudaGetErrorString(e)
           << " (repro: ctest -R DeviceAttr)";
  const uint32_t got = out.host()[0], want = expected_sum(seed, words);
  if (got != want)
    return ::testing::AssertionFailure()
           << "sum at " << bytes << " bytes: got 0x" << std::hex << got << ", want 0x" << want
           << " (repro: ctest -R DeviceAttr)";
  return ::testing::AssertionSuccess();
}

TEST(DeviceAttr, AllowDynamicSmemRaisesAndNeverLowers) {
  MOECHECK_REQUIRE_GPU();
  const void* k = reinterpret_cast<const void*>(smem_probe_kernel<0>);
  const int optin = optin_bytes();
  ASSERT_GT(optin, 64 * 1024) << "the device opts in to no more than 64 KiB a block";
  const int before = max_dynamic_attr(k);
  ASSERT_LE(before, 48 * 1024);
  // Up to 48 KiB needs nothing: the limit stays the runtime's default.
  cuda::allow_dynamic_smem(k, 40 * 1024);
  EXPECT_EQ(max_dynamic_attr(k), before);
  EXPECT_TRUE(probe<0>(40 * 1024, 7u, nullptr));
  // Without the helper a 64 KiB launch is refused; with it, it runs.
  const int big = 64 * 1024;
  {
    gputest::DevArray<uint32_t> out(1);
    smem_probe_kernel<0><<<1, 256, static_cast<size_t>(big)>>>(1u, big / 4, out.get());
    EXPECT_NE(cudaGetLastError(), cudaSuccess) << "64 KiB launched before the limit was raised";
    (void)cudaDeviceSynchronize();
  }
  cuda::allow_dynamic_smem(k, big);
  EXPECT_EQ(max_dynamic_attr(k), big);
  EXPECT_TRUE(probe<0>(big, 11u, nullptr));
  // A smaller request later leaves the larger limit (a lowered limit would refuse the 64 KiB
  // launch of another caller).
  cuda::allow_dynamic_smem(k, 56 * 1024);
  EXPECT_EQ(max_dynamic_attr(k), big);
  EXPECT_TRUE(probe<0>(big, 13u, nullptr));
  cuda::allow_dynamic_smem(k, optin);
  EXPECT_EQ(max_dynamic_attr(k), optin);
  EXPECT_TRUE(probe<0>(optin, 17u, nullptr));
  cuda::allow_dynamic_smem(k, big);
  EXPECT_EQ(max_dynamic_attr(k), optin);
}

// Eight host threads, each with its own stream and size (52 KiB .. the opt-in limit), ask for
// their limit and launch at once, three rounds: every launch runs with its sum right, and the
// kernel's limit ends at the largest request.
TEST(DeviceAttr, AllowDynamicSmemFromEightThreads) {
  MOECHECK_REQUIRE_GPU();
  const void* k = reinterpret_cast<const void*>(smem_probe_kernel<1>);
  const int optin = optin_bytes();
  constexpr int kThreads = 8;
  std::vector<int> bytes(kThreads);
  for (int i = 0; i < kThreads; ++i)
    bytes[i] = std::min(optin, 52 * 1024 + ((optin - 52 * 1024) / (kThreads - 1)) * i) / 16 * 16;
  std::vector<std::string> fails(kThreads);
  std::vector<std::thread> pool;
  for (int i = 0; i < kThreads; ++i) {
    pool.emplace_back([&, i] {
      cudaStream_t s = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fails[i] = "stream";
        return;
      }
      for (int round = 0; round < 3; ++round) {
        const int b = bytes[(i + round) % kThreads];
        cuda::allow_dynamic_smem(k, b);
        const auto r = probe<1>(b, static_cast<uint32_t>(100 * i + round), s);
        if (!r) fails[i] += std::string(r.message()) + "; ";
      }
      (void)cudaStreamDestroy(s);
    });
  }
  for (auto& t : pool) t.join();
  for (int i = 0; i < kThreads; ++i)
    EXPECT_TRUE(fails[i].empty()) << "thread " << i << ": " << fails[i];
  EXPECT_EQ(max_dynamic_attr(k), *std::max_element(bytes.begin(), bytes.end()));
}

// resident_blocks_per_sm gives the occupancy API's answer for each (threads, bytes), asked in
// an order where a cache keyed on fewer fields would return a stale count.
TEST(DeviceAttr, ResidentBlocksPerSmMatchesTheOccupancyApi) {
  MOECHECK_REQUIRE_GPU();
  const void* k = reinterpret_cast<const void*>(smem_probe_kernel<2>);
  const int optin = optin_bytes();
  cuda::allow_dynamic_smem(k, optin);
  const int sizes[] = {0, 16 * 1024, 64 * 1024, 100 * 1024, optin, 16 * 1024};
  std::vector<int> seen;
  for (int threads : {128, 256, 1024, 128}) {
    for (int b : sizes) {
      int direct = 0;
      ASSERT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&direct, k, threads,
                                                              static_cast<size_t>(b)),
                cudaSuccess);
      const int got = cuda::resident_blocks_per_sm(k, threads, b);
      EXPECT_EQ(got, direct) << "threads=" << threads << " bytes=" << b
                             << " (repro: ctest -R DeviceAttr)";
      EXPECT_EQ(cuda::resident_blocks_per_sm(k, threads, b), direct);
      seen.push_back(got);
    }
  }
  // The sizes span at least two occupancies, so a cache that ignored the bytes would fail above.
  std::sort(seen.begin(), seen.end());
  EXPECT_GE(std::unique(seen.begin(), seen.end()) - seen.begin(), 2);
}

}  // namespace
}  // namespace moecheck
