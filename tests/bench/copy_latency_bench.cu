// copy_latency_bench: how long one step of weight rows takes to land in a warp's hands, by bulk
// copy (cp.async.bulk into shared memory, completing on an mbarrier, as the streamed MMVQ engine
// asks for its ring) and by plain loads (ld.global.nc into registers, as a read kernel), alone
// and with the grid asking for more at the same time.
//
// Why: the one-token MMVQ launches (docs/performance.md, "The issues' figures on the H200
// again") cost 11.0 us (Q2_K) and 8.2 us (Q3_K) of fixed time against 2.4 and 2.0 us for a plain
// read of the same bytes, and a warp's first step lands 4.7 - 4.9 us after the warp asked for it,
// whether the ring's other steps were asked before or after it. This benchmark separates the
// mechanism (a bulk copy's own latency) from the load (every warp of the grid asking at once).
//
// A step is kRows rows of kStepBytes (one Q2_K row's four super-blocks) kPitch bytes apart (a
// Q2_K [2304, 5120] row); each warp reads its own kRows rows, the warps of the grid consecutive
// row groups, each timed launch a region of the buffer the seven launches before it did not touch
// (so no byte comes from L2). Lane 0 of each warp records the step's issue and the moment its bytes
// are usable (the mbarrier wait passed; the plain loads' fold done) on the multiprocessor clock,
// converted with the clock's rate measured against %globaltimer over 200 us. Before and after
// the timed step a warp may ask for `ahead` and `behind` more steps (other rows), as the ring's
// head and the rest of its stages do. Each configuration: 9 launches, the first untimed; the
// pooled per-warp latencies' p10 / p50 / p90 / max.
//
// No arithmetic of docs/numerics.md is involved: the bytes are only folded (xor) into a sink so
// the loads stay, and the fold is checked against the host's fold of the same bytes (exit 1 on a
// difference: a copy that moved the wrong bytes is not timed).
//
// `copy_latency_bench` (no arguments). Output: a markdown table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/bulk_copy.cuh"
#include "tests/bench/bench_util.h"

namespace {

using namespace moecheck;
namespace bulk = moecheck::cuda::bulk;

constexpr int kRows = 8;                         // rows a step (the streamed engine's pass)
constexpr int kStepBytes = 336;                  // 4 Q2_K super-blocks of 84 bytes
constexpr int kPitch = 1680;                     // a Q2_K row of 5120 values: 20 super-blocks
constexpr int kWords = kRows * kStepBytes / 16;  // 16-byte words a step: 168
constexpr int64_t kRegion = int64_t{128} << 20;  // bytes a launch reads from
constexpr int kRegions = 8;  // 1 GiB in all: consecutive launches never share an L2 line

enum class Mode : int { kBulk = 0, kPlain = 1 };

struct Record {
  long long issue, land;  // clock64 of lane 0
};

// clock64, not moved by the compiler across memory operations, and (clk_after) not read before
// dep is computed.
__device__ __forceinline__ long long clk() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ long long clk_after(uint32_t dep) {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) : "r"(dep) : "memory");
  return t;
}

// The row group g's step (s: which of its four-super-block steps, 0..4) starts at
// base + g * kRows * kPitch + s * kStepBytes; row r of it kPitch bytes further per row.
__device__ __forceinline__ const uint8_t* step_src(const uint8_t* base, int64_t g, int s) {
  return base + g * kRows * kPitch + int64_t{s} * kStepBytes;
}

// Steps of a warp: the timed one is step 0 of its row group; the extra steps are steps 1..4 of
// the same group and then steps of the groups after the grid's (g + n_groups * k), as the ring
// streams further along its rows.
__device__ __forceinline__ const uint8_t* extra_src(const uint8_t* base, int64_t g,
                                                    int64_t n_groups, int k) {
  const int s = 1 + k % 4;
  return step_src(base, g + n_groups * (k / 4), s);
}

__global__ void calibrate_kernel(unsigned long long* out) {
  uint64_t g0, g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  const long long c0 = clk();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  } while (g - g0 < 200000);
  const long long c1 = clk();
  out[0] = g - g0;
  out[1] = static_cast<unsigned long long>(c1 - c0);
}

constexpr int kPer = (kWords + 31) / 32;  // 16-byte words of a step a lane loads (plain)

// Word i of a step (row i / 21, its word i % 21), or zeros past the step.
__device__ __forceinline__ uint4 step_word(const uint8_t* src, int i) {
  return i < kWords ? __ldg(reinterpret_cast<const uint4*>(src + int64_t{i / 21} * kPitch +
                                                           int64_t{i % 21} * 16))
                    : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t fold4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// One launch: warps of (AHEAD, timed, BEHIND) steps. Dynamic shared memory (bulk copies): a
// warp's 1 + AHEAD + BEHIND steps of kRows * kStepBytes bytes, then two barriers a warp. Plain
// loads keep every step in registers (static indices: nothing spills, so no load is waited on
// before the warp asks for the next).
template <Mode M, int AHEAD, int BEHIND>
__global__ void __launch_bounds__(512)
    latency_kernel(const uint8_t* base, Record* rec, uint32_t* sink) {
  constexpr int kSteps = 1 + AHEAD + BEHIND;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t g = int64_t{blockIdx.x} * warps + w, n_groups = int64_t{gridDim.x} * warps;
  uint32_t acc = 0, extra_acc = 0;
  long long t_issue = 0, t_land = 0;
  if constexpr (M == Mode::kBulk) {
    uint8_t* mine = smem + static_cast<size_t>(w) * kSteps * kRows * kStepBytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(warps) * kSteps *
                                                            kRows * kStepBytes) +
                     2 * w;
    if (lane == 0) {
      bulk::bar_init(&bars[0], 1);
      bulk::bar_init(&bars[1], 1);
      bulk::fence_bar_init();
    }
    __syncwarp();
    // bars[0]: the timed step; bars[1]: every extra step.
    if (lane == 0 && AHEAD + BEHIND > 0)
      bulk::bar_expect_tx(&bars[1], static_cast<uint32_t>((AHEAD + BEHIND) * kRows * kStepBytes));
    __syncwarp();
#pragma unroll
    for (int k = 0; k < AHEAD; ++k)
      if (lane < kRows)
        bulk::copy(mine + (1 + k) * kRows * kStepBytes + lane * kStepBytes,
                   extra_src(base, g, n_groups, k) + int64_t{lane} * kPitch, kStepBytes, &bars[1]);
    __syncwarp();
    t_issue = clk();
    if (lane == 0) bulk::bar_expect_tx(&bars[0], kRows * kStepBytes);
    __syncwarp();
    if (lane < kRows)
      bulk::copy(mine + lane * kStepBytes, step_src(base, g, 0) + int64_t{lane} * kPitch,
                 kStepBytes, &bars[0]);
#pragma unroll
    for (int k = AHEAD; k < AHEAD + BEHIND; ++k)
      if (lane < kRows)
        bulk::copy(mine + (1 + k) * kRows * kStepBytes + lane * kStepBytes,
                   extra_src(base, g, n_groups, k) + int64_t{lane} * kPitch, kStepBytes, &bars[1]);
    bulk::bar_wait(&bars[0], 0);
    t_land = clk();
    const uint4* s4 = reinterpret_cast<const uint4*>(mine);
    for (int i = lane; i < kWords; i += 32) acc ^= fold4(s4[i]);
    if (AHEAD + BEHIND > 0) {
      bulk::bar_wait(&bars[1], 0);
      const uint4* e4 = reinterpret_cast<const uint4*>(mine + kRows * kStepBytes);
      for (int i = lane; i < (AHEAD + BEHIND) * kWords; i += 32) extra_acc ^= fold4(e4[i]);
    }
    for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  } else {
    // The extra steps ahead, then the timed step, then the steps behind, all in flight at once;
    // the timed fold waits for its own loads only.
    uint4 ex[(AHEAD + BEHIND) * kPer + 1];
#pragma unroll
    for (int k = 0; k < AHEAD; ++k)
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        ex[k * kPer + j] = step_word(extra_src(base, g, n_groups, k), lane + 32 * j);
    t_issue = clk();
    uint4 v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = step_word(step_src(base, g, 0), lane + 32 * j);
#pragma unroll
    for (int k = AHEAD; k < AHEAD + BEHIND; ++k)
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        ex[k * kPer + j] = step_word(extra_src(base, g, n_groups, k), lane + 32 * j);
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc ^= fold4(v[j]);
    for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    t_land = clk_after(acc);
#pragma unroll
    for (int e = 0; e < (AHEAD + BEHIND) * kPer; ++e) extra_acc ^= fold4(ex[e]);
  }
  for (int o = 16; o > 0; o /= 2) extra_acc ^= __shfl_xor_sync(0xFFFFFFFFu, extra_acc, o);
  if (lane == 0) {
    rec[g] = Record{t_issue, t_land};
    sink[2 * g] = acc;
    sink[2 * g + 1] = extra_acc;
  }
}

using KernelFn = void (*)(const uint8_t*, Record*, uint32_t*);

uint32_t fold_words(const std::vector<uint8_t>& h, int64_t off) {
  uint32_t a = 0;
  for (int i = 0; i < kWords; ++i) {
    const int64_t p = off + int64_t{i / 21} * kPitch + int64_t{i % 21} * 16;
    for (int b = 0; b < 16; b += 4) {
      uint32_t u;
      std::memcpy(&u, h.data() + p + b, 4);
      a ^= u;
    }
  }
  return a;
}

struct Config {
  const char* name;
  KernelFn kernel;
  Mode mode;
  int ahead, behind;
  int blocks;  // 0: one block a multiprocessor
  int warps;
};

// A row of the table, its mode and steps taken from the kernel's own template arguments.
template <Mode M, int AHEAD, int BEHIND>
Config config(const char* name, int blocks, int warps) {
  return {name, latency_kernel<M, AHEAD, BEHIND>, M, AHEAD, BEHIND, blocks, warps};
}

constexpr Mode kB = Mode::kBulk, kP = Mode::kPlain;

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const double copy = bench::copy_bandwidth_gbs();
  cudaDeviceProp prop{};
  MOECHECK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int smem_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);

  unsigned long long* d_cal = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_cal, 2 * sizeof(unsigned long long)));
  calibrate_kernel<<<1, 1>>>(d_cal);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  unsigned long long cal[2];
  MOECHECK_CUDA_CHECK(cudaMemcpy(cal, d_cal, sizeof cal, cudaMemcpyDeviceToHost));
  MOECHECK_CUDA_CHECK(cudaFree(d_cal));
  const double ghz = static_cast<double>(cal[1]) / static_cast<double>(cal[0]);
  std::printf("multiprocessor clock: %.3f GHz (clock64 over %%globaltimer, 200 us)\n", ghz);

  const size_t bytes = static_cast<size_t>(kRegion) * kRegions;
  uint8_t* d_buf = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_buf, bytes));
  bench::fill_random(d_buf, bytes, 20261205);
  std::vector<uint8_t> h(bytes);
  MOECHECK_CUDA_CHECK(cudaMemcpy(h.data(), d_buf, bytes, cudaMemcpyDeviceToHost));

  const Config configs[] = {
      config<kB, 0, 0>("bulk, one warp alone", 1, 1),
      config<kP, 0, 0>("plain, one warp alone", 1, 1),
      config<kB, 0, 0>("bulk, one block of 16 warps", 1, 16),
      config<kP, 0, 0>("plain, one block of 16 warps", 1, 16),
      config<kB, 0, 0>("bulk, grid of 16 warps a multiprocessor", 0, 16),
      config<kP, 0, 0>("plain, grid of 16 warps a multiprocessor", 0, 16),
      config<kB, 0, 2>("bulk, grid, 2 steps behind (a ring of 3)", 0, 16),
      config<kP, 0, 2>("plain, grid, 2 steps behind", 0, 16),
      config<kB, 2, 0>("bulk, grid, 2 steps ahead", 0, 16),
      config<kP, 2, 0>("plain, grid, 2 steps ahead", 0, 16),
      // Nine steps of 16 warps would need 387 KB of shared memory: these rows take 8 warps.
      config<kB, 0, 8>("bulk, grid of 8 warps, 8 steps behind", 0, 8),
      config<kB, 8, 0>("bulk, grid of 8 warps, 8 steps ahead", 0, 8),
      config<kB, 0, 2>("bulk, grid of 12 warps, 2 steps behind (the one-token gate / up shape)", 0,
                       12),
      config<kB, 0, 0>("bulk, grid of 4 warps a multiprocessor", 0, 4),
      config<kP, 0, 0>("plain, grid of 4 warps a multiprocessor", 0, 4),
  };

  std::printf(
      "\n### copy_latency_bench: a step of %d rows x %d bytes (%d apart) to a warp's hands, %s\n\n"
      "| how | warps | steps ahead / behind | bytes asked at once (MB) | latency p10 us | p50 | "
      "p90 "
      "| max |\n|---|---|---|---|---|---|---|---|\n",
      kRows, kStepBytes, kPitch, bench::gpu_name().c_str());
  int region = 0;
  for (const Config& c : configs) {
    const int blocks = c.blocks > 0 ? c.blocks : sms;
    const int64_t n_warps = int64_t{blocks} * c.warps;
    const int steps = 1 + c.ahead + c.behind;
    // Extra step k reads row group g + n_groups * (k / 4) (extra_src): the last, k = steps - 2,
    // reaches n_groups * (1 + (steps - 2) / 4) groups.
    const int64_t groups_touched = n_warps * (1 + (steps > 1 ? (steps - 2) / 4 : 0));
    if (groups_touched * kRows * kPitch > kRegion) {
      std::fprintf(stderr, "copy_latency_bench: %s needs more than a region\n", c.name);
      return 1;
    }
    const size_t smem = c.mode == Mode::kBulk
                            ? static_cast<size_t>(c.warps) * steps * kRows * kStepBytes +
                                  static_cast<size_t>(c.warps) * 2 * sizeof(uint64_t)
                            : 0;
    if (smem > static_cast<size_t>(smem_optin)) {
      std::fprintf(stderr, "copy_latency_bench: %s needs %zu bytes of shared memory, above %d\n",
                   c.name, smem, smem_optin);
      return 1;
    }
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
    Record* d_rec = nullptr;
    uint32_t* d_sink = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&d_rec, n_warps * sizeof(Record)));
    MOECHECK_CUDA_CHECK(cudaMalloc(&d_sink, n_warps * 2 * sizeof(uint32_t)));
    std::vector<double> lat;
    for (int rep = 0; rep < 9; ++rep) {
      const int64_t off = (region++ % kRegions) * kRegion;
      c.kernel<<<blocks, c.warps * 32, smem>>>(d_buf + off, d_rec, d_sink);
      MOECHECK_CUDA_CHECK(cudaGetLastError());
      MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
      const auto rec = bench::to_host<Record>(d_rec, static_cast<size_t>(n_warps));
      const auto sink = bench::to_host<uint32_t>(d_sink, static_cast<size_t>(n_warps) * 2);
      for (int64_t g = 0; g < n_warps; ++g) {
        const uint32_t want = fold_words(h, off + g * kRows * kPitch);
        if (sink[2 * g] != want) {
          std::fprintf(stderr,
                       "copy_latency_bench: %s: warp %lld's step folds to %08x, the host's bytes "
                       "to %08x (repro: copy_latency_bench, launch %d)\n",
                       c.name, static_cast<long long>(g), sink[2 * g], want, rep);
          return 1;
        }
        if (rep > 0) lat.push_back(static_cast<double>(rec[g].land - rec[g].issue) / ghz * 1e-3);
      }
    }
    MOECHECK_CUDA_CHECK(cudaFree(d_rec));
    MOECHECK_CUDA_CHECK(cudaFree(d_sink));
    std::sort(lat.begin(), lat.end());
    const auto q = [&](double p) { return lat[static_cast<size_t>(p * (lat.size() - 1))]; };
    const double mb = static_cast<double>(n_warps) * steps * kRows * kStepBytes * 1e-6;
    std::printf("| %s | %lld | %d / %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", c.name,
                static_cast<long long>(n_warps), c.ahead, c.behind, mb, q(0.1), q(0.5), q(0.9),
                lat.back());
  }
  MOECHECK_CUDA_CHECK(cudaFree(d_buf));
  return 0;
}
