// A read's rate against the bytes each multiprocessor keeps in flight, by path: plain 16-byte
// loads into registers (the load / store unit) and bulk copies into shared memory completing on
// an mbarrier (the copy engine the streamed MMVQ uses, cuda/mmvq_sb.cu), the latter in the
// engine's own access pattern (8 rows of a pass, a step of 336 bytes of each at a time) and in
// larger contiguous copies. The bytes are the one-token gate + up launch's: 12 Q2_K matrices of
// [2304, 5120], 46.4 MB, read as one launch (rotating over 8 such sets, 371 MB, several times L2)
// and, for the steady rate, all 8 sets in one launch. Nothing is computed: each kernel xor-folds
// every 16-byte word it read, and before a configuration is timed the xor of its blocks' folds
// must equal the host's fold of exactly those bytes (exit 1 otherwise: a read that skipped or
// repeated bytes never reports a speed). Each launch is replayed from a CUDA graph (queued behind
// a hold, medians), against the device-to-device copy bandwidth measured first in this process.
// What it is for: docs/performance.md "Bytes in flight".
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/bulk_copy.cuh"
#include "tests/bench/bench_util.h"

using namespace moecheck;

namespace {

// The launch's bytes: 12 x 2304 rows of 1680 bytes (Q2_K, K = 5120), 3456 passes of 8 rows.
constexpr int64_t kRowBytes = 1680;
constexpr int64_t kPassBytes = 8 * kRowBytes;
constexpr int64_t kSetBytes = 12 * 2304 * kRowBytes;  // 46,448,640
constexpr int kSets = 8;

// Plain loads: bench::read_words_kernel<kLoads> (kLoads 1, 2 or 4 in flight a thread) in blocks of
// 256 threads, so a multiprocessor keeps blocks x 256 x kLoads x 16 bytes in flight.
using bench::read_words_kernel;

// Bulk copies: the bytes are chunks of R x pitch bytes (R rows of a pass); a chunk is read in
// pitch / c steps, step q copying bytes [q c, q c + c) of each of its R rows (lane r < R issues
// row r's copy, lane 0 the stage's transaction count). Warp w of block b takes the chunks
// b W + w, + grid W, ..., each warp a ring of `stages` stages of R c bytes; after a stage's bytes
// land its lanes fold them and it is refilled with the warp's step `stages` further on, as the
// streamed MMVQ's rings are. A multiprocessor (one block) keeps up to W x stages x R x c bytes in
// flight.
struct BulkShape {
  int warps, stages, rows;
  int64_t copy, pitch;  // bytes a copy (a multiple of 16), bytes between a chunk's rows
};

__global__ void __launch_bounds__(512, 1)
    bulk_read(const uint8_t* p, int64_t chunks, BulkShape s, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t stage_bytes = s.rows * s.copy;
  const int steps_per_chunk = static_cast<int>(s.pitch / s.copy);
  uint8_t* ring = smem + static_cast<int64_t>(warp) * s.stages * stage_bytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + int64_t{s.warps} * s.stages * stage_bytes) +
                  warp * s.stages;
  const int64_t gw = int64_t{blockIdx.x} * s.warps + warp, nw = int64_t{gridDim.x} * s.warps;
  const int64_t my_chunks = gw < chunks ? (chunks - gw + nw - 1) / nw : 0;
  const int64_t items = my_chunks * steps_per_chunk;
  if (lane == 0) {
    for (int k = 0; k < s.stages; ++k) cuda::bulk::bar_init(bar + k, 1);
    cuda::bulk::fence_bar_init();
  }
  __syncwarp();
  auto issue = [&](int64_t j, int k) {
    const int64_t chunk = gw + (j / steps_per_chunk) * nw;
    const int64_t q = j % steps_per_chunk;
    if (lane == 0) cuda::bulk::bar_expect_tx(bar + k, static_cast<uint32_t>(stage_bytes));
    __syncwarp();
    if (lane < s.rows)
      cuda::bulk::copy(ring + k * stage_bytes + lane * s.copy,
                       p + chunk * s.rows * s.pitch + lane * s.pitch + q * s.copy,
                       static_cast<uint32_t>(s.copy), bar + k);
  };
  for (int k = 0; k < s.stages && k < items; ++k) issue(k, k);
  uint32_t acc = 0, parity = 0;
  int k = 0;
  for (int64_t j = 0; j < items; ++j) {
    cuda::bulk::bar_wait(bar + k, parity);
    const uint4* st = reinterpret_cast<const uint4*>(ring + k * stage_bytes);
    for (int64_t w = lane; w < stage_bytes / 16; w += 32) {
      const uint4 v = st[w];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();  // every lane is done with stage k
    if (j + s.stages < items) {
      cuda::bulk::fence_proxy_async();
      issue(j + s.stages, k);
    }
    if (++k == s.stages) {
      k = 0;
      parity ^= 1u;
    }
  }
  bench::block_fold_to(acc, sink);
}

int64_t bulk_smem(const BulkShape& s) {
  return int64_t{s.warps} * s.stages * (s.rows * s.copy + 8);
}

struct Config {
  std::string path, shape;
  int64_t inflight;  // bytes a multiprocessor keeps in flight at most
  // Launches the read of `bytes` bytes at p (a multiple of kPassBytes), one fold a block in sink.
  std::function<void(const uint8_t*, int64_t, uint32_t*, cudaStream_t)> launch;
};

}  // namespace

// `inflight_bench`: the table of every configuration (docs/performance.md "Bytes in flight").
int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const double copy = bench::copy_bandwidth_gbs();
  int sms = 0;
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "GPU: %s, %d multiprocessors\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, "
      "median of 25)\n",
      bench::gpu_name().c_str(), sms, copy);

  const int64_t all = kSets * kSetBytes;
  uint8_t* data = nullptr;
  uint32_t* sink = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&data, static_cast<size_t>(all)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&sink, 8 * 1024 * sizeof(uint32_t)));
  bench::fill_random(data, static_cast<size_t>(all), 38);
  const uint32_t fold_set0 = bench::xor_fold(data, static_cast<size_t>(kSetBytes));
  const uint32_t fold_all = bench::xor_fold(data, static_cast<size_t>(all));

  std::vector<Config> configs;
  // Plain loads: bps blocks a multiprocessor asked; the bytes in flight count the blocks that fit
  // (cudaOccupancyMaxActiveBlocksPerMultiprocessor: more loads a thread take more registers).
  auto add_lsu = [&](int bps, int loads) {
    const int grid = bps * sms;
    const void* fn = loads == 1   ? reinterpret_cast<const void*>(read_words_kernel<1>)
                     : loads == 2 ? reinterpret_cast<const void*>(read_words_kernel<2>)
                                  : reinterpret_cast<const void*>(read_words_kernel<4>);
    int fit = 0;
    MOECHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, fn, 256, 0));
    const int resident = fit < bps ? fit : bps;
    auto launch = [grid, loads](const uint8_t* p, int64_t bytes, uint32_t* sk, cudaStream_t st) {
      const auto* q = reinterpret_cast<const uint4*>(p);
      const int64_t n = bytes / 16;
      if (loads == 1) read_words_kernel<1><<<grid, 256, 0, st>>>(q, n, sk);
      else if (loads == 2) read_words_kernel<2><<<grid, 256, 0, st>>>(q, n, sk);
      else read_words_kernel<4><<<grid, 256, 0, st>>>(q, n, sk);
      MOECHECK_CUDA_CHECK(cudaGetLastError());
    };
    configs.push_back({"plain loads",
                       std::to_string(bps) + " x 256 threads x " + std::to_string(loads) +
                           " loads of 16 B" +
                           (resident < bps ? " (" + std::to_string(resident) + " blocks fit)" : ""),
                       int64_t{resident} * 256 * loads * 16, launch});
  };
  int64_t most_smem = 0;  // bulk_read's dynamic shared memory, raised once to the largest
  auto add_bulk = [&](const char* what, BulkShape sh) {
    const int64_t smem = bulk_smem(sh);
    most_smem = smem > most_smem ? smem : most_smem;
    const int grid = sms;
    auto launch = [grid, sh, smem](const uint8_t* p, int64_t bytes, uint32_t* sk, cudaStream_t st) {
      bulk_read<<<grid, sh.warps * 32, static_cast<size_t>(smem), st>>>(
          p, bytes / (sh.rows * sh.pitch), sh, sk);
      MOECHECK_CUDA_CHECK(cudaGetLastError());
    };
    configs.push_back({std::string("bulk copies, ") + what,
                       std::to_string(sh.warps) + " warps x " + std::to_string(sh.stages) +
                           " stages of " + std::to_string(sh.rows) + " x " +
                           std::to_string(sh.copy) + " B",
                       int64_t{sh.warps} * sh.stages * sh.rows * sh.copy, launch});
  };
  for (const auto& [bps, loads] : std::vector<std::pair<int, int>>{
           {1, 1}, {1, 2}, {1, 4}, {2, 4}, {3, 4}, {4, 4}, {6, 4}, {8, 4}, {8, 1}, {8, 2}})
    add_lsu(bps, loads);
  // The engine's pattern: a pass's 8 rows, 336 bytes of each a step (steps of 4 Q2_K blocks).
  for (const auto& [w, st] :
       std::vector<std::pair<int, int>>{{4, 3}, {8, 3}, {16, 2}, {16, 3}, {16, 4}, {16, 5}})
    add_bulk("a pass's 8 rows, 336 B of each a step", {w, st, 8, 336, kRowBytes});
  // Whole rows a step: 8 copies of 1680 bytes (a pass a step).
  for (const auto& [w, st] : std::vector<std::pair<int, int>>{{2, 3}, {4, 2}, {4, 3}, {8, 2}})
    add_bulk("a pass's 8 whole rows a step", {w, st, 8, kRowBytes, kRowBytes});
  // One contiguous copy a step: 2688 bytes (the engine's step size), or a whole pass.
  for (const auto& [w, st] : std::vector<std::pair<int, int>>{{8, 3}, {16, 3}, {16, 5}})
    add_bulk("one contiguous copy of 2688 B a step", {w, st, 1, 2688, 2688});
  for (const auto& [w, st] : std::vector<std::pair<int, int>>{{2, 2}, {4, 2}, {4, 3}, {8, 2}})
    add_bulk("one copy of a whole pass a step", {w, st, 1, kPassBytes, kPassBytes});

  MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(bulk_read, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(most_smem)));
  cudaStream_t s;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Every configuration's fold first, over one set and over all 8.
  auto folds = [&](const Config& c, int64_t bytes) {
    MOECHECK_CUDA_CHECK(cudaMemset(sink, 0, 8 * 1024 * sizeof(uint32_t)));
    c.launch(data, bytes, sink, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    return bench::xor_fold(sink, 8 * 1024 * sizeof(uint32_t));
  };
  for (const Config& c : configs) {
    const uint32_t f1 = folds(c, kSetBytes), f8 = folds(c, all);
    if (f1 != fold_set0 || f8 != fold_all) {
      std::fprintf(stderr,
                   "inflight_bench: %s (%s) folded %08x / %08x over one set / all sets, the host "
                   "%08x / %08x\n",
                   c.path.c_str(), c.shape.c_str(), f1, f8, fold_set0, fold_all);
      return 1;
    }
  }
  std::printf(
      "validated: every configuration's fold equals the host's over one set and over all "
      "%d\n\n",
      kSets);

  std::printf(
      "### inflight_bench: a read's rate against the bytes a multiprocessor keeps in "
      "flight (graph replays, us a launch)\n\n");
  std::printf(
      "| path | shape | in flight a multiprocessor (KB) | 46.4 MB launch us | of copy | "
      "371 MB launch us | of copy | fixed-cost estimate us |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Config& c : configs) {
    const double us1 = bench::graph_us(
        [&](int i, cudaStream_t st) {
          c.launch(data + (i % kSets) * kSetBytes, kSetBytes, sink, st);
        },
        32, s);
    const double us8 =
        bench::graph_us([&](int, cudaStream_t st) { c.launch(data, all, sink, st); }, 4, s);
    const double gbs1 = static_cast<double>(kSetBytes) / us1 * 1e-3;
    const double gbs8 = static_cast<double>(all) / us8 * 1e-3;
    // The launch's time beyond its bytes at the large launch's rate.
    const double fixed = us1 - static_cast<double>(kSetBytes) / gbs8 * 1e-3;
    std::printf("| %s | %s | %.0f | %.2f | %.0f %% | %.1f | %.0f %% | %.2f |\n", c.path.c_str(),
                c.shape.c_str(), static_cast<double>(c.inflight) / 1024.0, us1, 100.0 * gbs1 / copy,
                us8, 100.0 * gbs8 / copy, fixed);
  }
  MOECHECK_CUDA_CHECK(cudaStreamDestroy(s));
  MOECHECK_CUDA_CHECK(cudaFree(sink));
  MOECHECK_CUDA_CHECK(cudaFree(data));
  return 0;
}
