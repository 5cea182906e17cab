// Shared pieces of the GPU benchmarks (tests/bench/*.cu): the device-to-device copy bandwidth
// measured in the same process (the ceiling every result is divided by), event timing with
// medians, a device-side fill of random bytes (benchmarks never time zeros), and the check every
// benchmark runs before it times a kernel: its result equals the emulation's bit for bit, or the
// benchmark exits 1 naming the first difference (a wrong kernel never reports a speed). See
// docs/performance.md for how the numbers are read.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "cuda/check.h"
#include "emulate/quantize_q8_1.h"

namespace moecheck::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Holds stream s for `ns` nanoseconds of device time (one thread spinning on %globaltimer), so
// that the work the host queues behind it meanwhile starts back to back on the device: an event
// recorded behind the hold fires when the device reaches it, not as soon as the host has queued
// it while the next launch call is still being made (the blocking-kernel method of NVIDIA's
// nvbench). On an idle stream the span between two events also holds the host's own submission of
// the work between them (a graph launch: several microseconds), which is not the device's time.
static __global__ void hold_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// How a timed span is submitted: on an idle stream (the first event fires at once, the host's
// submission of the work inside the span), or queued behind a hold (the device's time alone).
enum class Submit { kIdle, kQueued };

// The hold of a queued span: long enough for the host to queue an event, a graph launch of a
// layer and another event (measured at 10 - 30 us), checked each time (late_spans).
constexpr uint64_t kHoldNs = 300000;

// Queued spans the host had not finished submitting when their hold ended (their start then
// waited on the host after all); printed by the benchmarks that time queued spans.
inline int& late_spans() {
  static int n = 0;
  return n;
}

// Records `a` on s, runs fn (which queues work on s), records `b`; queued: behind a hold, and
// counts the span as late when the host took longer than the hold to submit it.
template <class F>
void timed_span(F&& fn, cudaEvent_t a, cudaEvent_t b, cudaStream_t s, Submit how) {
  const auto t0 = std::chrono::steady_clock::now();
  if (how == Submit::kQueued) {
    hold_kernel<<<1, 1, 0, s>>>(kHoldNs);
    MOECHECK_CUDA_CHECK(cudaGetLastError());
  }
  MOECHECK_CUDA_CHECK(cudaEventRecord(a, s));
  fn();
  MOECHECK_CUDA_CHECK(cudaEventRecord(b, s));
  if (how == Submit::kQueued &&
      std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(kHoldNs))
    ++late_spans();
}

// Median milliseconds of fn() over `reps` timed runs after `warm` untimed ones, events on `s`,
// each span submitted as `how` says.
template <class F>
double time_ms(F fn, int warm, int reps, cudaStream_t s, Submit how = Submit::kIdle) {
  cudaEvent_t a, b;
  MOECHECK_CUDA_CHECK(cudaEventCreate(&a));
  MOECHECK_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn();
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    timed_span(fn, a, b, s, how);
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  MOECHECK_CUDA_CHECK(cudaEventDestroy(a));
  MOECHECK_CUDA_CHECK(cudaEventDestroy(b));
  return median(t);
}

// Per-launch microseconds of `launch(i)` for i = 0..n-1 captured in one CUDA graph (launch gaps
// out): median of `reps` graph replays after `warm` untimed ones, each queued behind a hold (the
// device's time; Submit::kIdle for the figures of the benchmarks before 2026-12-05, which held
// the host's submission of the graph as well).
inline double graph_us(const std::function<void(int, cudaStream_t)>& launch, int n, cudaStream_t s,
                       int warm = 3, int reps = 20, Submit how = Submit::kQueued) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) launch(i, s);
  MOECHECK_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOECHECK_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double ms =
      time_ms([&] { MOECHECK_CUDA_CHECK(cudaGraphLaunch(ge, s)); }, warm, reps, s, how);
  MOECHECK_CUDA_CHECK(cudaGraphExecDestroy(ge));
  MOECHECK_CUDA_CHECK(cudaGraphDestroy(g));
  return ms * 1e3 / n;
}

// Device-to-device cudaMemcpy of 1 GiB: (bytes read + bytes written) / time, median of 25, each
// queued behind a hold as the graph replays it is set beside (graph_us).
inline double copy_bandwidth_gbs(Submit how = Submit::kQueued) {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&a, n));
  MOECHECK_CUDA_CHECK(cudaMalloc(&b, n));
  MOECHECK_CUDA_CHECK(cudaMemset(a, 0x5A, n));
  const double ms = time_ms(
      [&] { MOECHECK_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, nullptr)); }, 3,
      25, nullptr, how);
  MOECHECK_CUDA_CHECK(cudaFree(a));
  MOECHECK_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(n) / (ms * 1e-3) / 1e9;
}

__global__ void fill_random_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n / 8;
       i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;  // splitmix64 finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    reinterpret_cast<uint64_t*>(p)[i] = z ^ (z >> 31);
  }
}

inline void fill_random(void* p, size_t n, uint64_t seed) {
  fill_random_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), n, seed);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
}

// rows x K values quantised to q8_1 blocks on the host (the emulation's rule, emu::quantize_q8_1)
// and uploaded to dst ([rows, K / 32] blocks): real activations, whose d8 are finite, so that a
// benchmark's bitwise check compares finite outputs (random bytes as blocks make about one d8 in
// 32 a NaN or Inf, and with 160 blocks a row nearly every output NaN). Values are uniform in
// (-1, 1) times a per-row scale between 2^-4 and 2^4.
inline void fill_q8_1(BlockQ8_1* dst, int64_t rows, int64_t K, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * K));
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&z] {
    z += 0x9E3779B97F4A7C15ull;
    uint64_t v = z;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(next() % 9) - 4);
    for (int64_t i = 0; i < K; ++i)
      x[static_cast<size_t>(r * K + i)] =
          scale * (static_cast<float>(next() >> 40) / static_cast<float>(1 << 23) - 1.0f);
  }
  std::vector<BlockQ8_1> q(static_cast<size_t>(rows * K / 32));
  emu::quantize_q8_1(x.data(), q.data(), rows, K);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(dst, q.data(), q.size() * sizeof(BlockQ8_1), cudaMemcpyHostToDevice));
}

// n elements of device memory on the host.
template <class T>
std::vector<T> to_host(const void* d, size_t n) {
  std::vector<T> v(n);
  if (n > 0) MOECHECK_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// The xor of acc over the block's threads, returned to thread 0 (the others get 0): the device side
// of the benchmarks' read checks, whose per-block folds the host xors against xor_fold below.
// Every thread of the block calls it; it synchronises the block first, so a kernel may call it
// more than once.
__device__ __forceinline__ uint32_t block_fold(uint32_t acc) {
  __shared__ uint32_t part[32];
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  uint32_t b = 0;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < blockDim.x / 32; ++w) b ^= part[w];
  return b;
}

// block_fold's result stored in sink[blockIdx.x]: the end of every read kernel whose per-block
// folds the host checks (every thread calls it once).
__device__ __forceinline__ void block_fold_to(uint32_t acc, uint32_t* sink) {
  const uint32_t b = block_fold(acc);
  if (threadIdx.x == 0) sink[blockIdx.x] = b;
}

// The benchmarks' plain read: every 16-byte word of p[0, n) loaded once (grid-stride, kLoads
// independent loads in flight a thread, the words of a round a stride apart) and xor-folded; each
// block stores its fold in sink[blockIdx.x], so the host can check against xor_fold below that the
// kernel read every byte once (and the loads stay). Up to 512 threads a block. kLoads 1, 2 or 4:
// written as 8, the sm_90 SASS keeps only 4 in flight (read with cuobjdump).
template <int kLoads = 4>
__global__ void __launch_bounds__(512)
    read_words_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + (kLoads - 1) * stride < n; i += kLoads * stride) {
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) v[k] = __ldg(p + i + k * stride);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  block_fold_to(acc, sink);
}

// The xor of the 32-bit words of `bytes` bytes of device memory (bytes a multiple of 4), on the
// host: what the benchmarks' read kernels must fold to when they read every byte once.
inline uint32_t xor_fold(const void* d, size_t bytes) {
  uint32_t f = 0;
  for (uint32_t w : to_host<uint32_t>(d, bytes / 4)) f ^= w;
  return f;
}

// The kernel's result against the emulation's, bitwise; exit 1 on the first difference.
template <class T>
void require_emu_bits(const std::string& what, const std::vector<T>& got,
                      const std::vector<T>& emu) {
  if (got.size() != emu.size()) {
    std::fprintf(stderr, "bench: %s has %zu values, the emulation %zu\n", what.c_str(), got.size(),
                 emu.size());
    std::exit(1);
  }
  const auto* a = reinterpret_cast<const unsigned char*>(got.data());
  const auto* b = reinterpret_cast<const unsigned char*>(emu.data());
  for (size_t i = 0; i < emu.size() * sizeof(T); ++i) {
    if (a[i] == b[i]) continue;
    std::fprintf(
        stderr,
        "bench: %s differs from the emulation at element %zu (byte %zu: 0x%02x vs 0x%02x); "
        "not timing a wrong kernel\n",
        what.c_str(), i / sizeof(T), i % sizeof(T), a[i], b[i]);
    std::exit(1);
  }
  std::printf("validated %s against the emulation: %zu values bitwise equal\n", what.c_str(),
              emu.size());
}

// The same for a result in device memory (emu.size() elements of T at dev).
template <class T>
void require_emu_bits(const std::string& what, const void* dev, const std::vector<T>& emu) {
  require_emu_bits(what, to_host<T>(dev, emu.size()), emu);
}

inline std::string gpu_name() {
  cudaDeviceProp prop{};
  MOECHECK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

}  // namespace moecheck::bench
