// MMQ against MMVQ on the same groups, at the ds41 expert shapes: E experts, each with n token
// rows (groups of 8 consecutive rows, the last ragged), gate+up (2E x [2304, 5120] Q2_K, one
// launch) and down (E x [5120, 2304] Q3_K), for n = 1, 2, 4, 8, 9, 16, 32, 64 and 128. MMVQ
// twice: the default (two rows per warp) and one row per warp (cuda::set_mmvq_rows_per_warp(1),
// the kernel every group of more than one token took before row_pair_n: the before / after of
// one process), and at n = 1 also launched as one-token groups (max_n = 1, the host route's
// form). Every kernel is first checked bit for bit against the emulation (emu::mmvq_groups) on
// the same bytes (exit 1 if not). Each figure: weight bytes (every expert's once) / kernel time,
// beside the device-to-device copy bandwidth measured first in this process, and the integer MACs
// per second. Weights are random bytes with finite f16 factors (finite_factors); they rotate among
// sets larger than L2 between launches; launches replayed from a CUDA graph. Markdown table last.
// `mmq_bench N...` times only the given rows per expert (1 to 128), each validated first (a
// profiler's run of one shape).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "emulate/mmvq.h"
#include "tests/bench/bench_util.h"

using namespace moecheck;
using moecheck::bench::graph_us;

namespace {

constexpr int64_t kDim = 5120, kInter = 2304, kExperts = 16, kSets = 6;
constexpr int64_t kMaxRows = 128;  // the largest rows per expert timed

// The groups of E experts with n rows each: projection 0 (gate) slots 0..E-1 then projection 1
// (up) slots E..2E-1 at proj_stride G; down reuses projection 0's shape with slots 2E + e.
struct Groups {
  std::vector<MmvqGroup> gu, down;
  int64_t G = 0;
};

Groups make_groups(int64_t n) {
  Groups r;
  for (int64_t e = 0; e < kExperts; ++e)
    for (int64_t s0 = 0; s0 < n; s0 += kMaxGroupRows) {
      MmvqGroup g;
      g.slot = static_cast<int32_t>(e);
      g.n = static_cast<int32_t>(n - s0 < kMaxGroupRows ? n - s0 : kMaxGroupRows);
      for (int i = 0; i < g.n; ++i) {
        g.a_row[i] = static_cast<int32_t>((e * 7 + s0 + i) % n);  // tokens of a batch of n
        g.y_row[i] = static_cast<int32_t>(e * n + s0 + i);
      }
      r.gu.push_back(g);
      MmvqGroup d = g;
      d.slot = static_cast<int32_t>(2 * kExperts + e);
      for (int i = 0; i < g.n; ++i) d.a_row[i] = d.y_row[i];
      r.down.push_back(d);
    }
  r.G = static_cast<int64_t>(r.gu.size());
  std::vector<MmvqGroup> up = r.gu;
  for (auto& g : up) {
    g.slot += static_cast<int32_t>(kExperts);
    for (int i = 0; i < g.n; ++i) g.y_row[i] += static_cast<int32_t>(kExperts * kMaxRows);
  }
  r.gu.insert(r.gu.end(), up.begin(), up.end());
  return r;
}

// Random bytes make about one f16 factor in 32 an Inf or a NaN, and MMQ computes a 16-row tile's
// super-block in its plain form when the factor of its biased conversion (Q2_K's dmin, Q3_K's d)
// is not finite in any of the tile's rows (docs/numerics.md "mmvq_q2k, mmvq_q3k"): about two
// tiles in five, which real models never see (and a non-finite d makes a row's outputs NaN). So
// every factor at byte `off` (and the `count` - 1 after it) of the `nblocks` blocks of `bytes`
// bytes at p is made finite: an all-ones exponent loses its top bit (0x7C00 -> 0x3C00), the
// other bits as drawn.
__global__ void finite_factors_kernel(uint8_t* p, int64_t nblocks, int bytes, int off, int count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nblocks;
       i += int64_t{gridDim.x} * blockDim.x)
    for (int f = 0; f < count; ++f) {
      uint8_t* h = p + i * bytes + off + 2 * f;  // little-endian f16
      if ((h[1] & 0x7C) == 0x7C) h[1] = static_cast<uint8_t>(h[1] & ~0x40);
    }
}

void finite_factors(uint8_t* p, int64_t nblocks, GgmlType t) {
  if (t == GgmlType::kQ2K)
    finite_factors_kernel<<<1024, 256>>>(p, nblocks, sizeof(BlockQ2K), 80, 2);      // d, dmin
  else finite_factors_kernel<<<1024, 256>>>(p, nblocks, sizeof(BlockQ3K), 108, 1);  // d
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

struct Row {
  std::string what;
  int64_t n;
  double us, gbs, frac, tops;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<int64_t> ns = {1, 2, 4, 8, 9, 16, 32, 64, 128};
  const bool chosen = argc > 1;
  if (chosen) {
    ns.clear();
    for (int i = 1; i < argc; ++i) {
      char* end = nullptr;
      const long long n = std::strtoll(argv[i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 1 || n > kMaxRows) {
        std::fprintf(stderr, "mmq_bench: rows per expert must be 1..%lld, found '%s'\n",
                     static_cast<long long>(kMaxRows), argv[i]);
        return 2;
      }
      ns.push_back(n);
    }
  }
  const double copy = bench::copy_bandwidth_gbs();
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);
  cudaStream_t s;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t gstride = kInter * row_bytes(GgmlType::kQ2K, kDim);
  const int64_t dstride = kDim * row_bytes(GgmlType::kQ3K, kInter);
  const int64_t set_bytes = kExperts * (2 * gstride + dstride);  // 205 MB
  uint8_t* pool = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&pool, kSets * set_bytes + 16));
  bench::fill_random(pool, kSets * set_bytes + 16, 11);
  for (int64_t i = 0; i < kSets; ++i) {  // set i: 2E Q2_K matrices, then E Q3_K matrices
    uint8_t* set = pool + i * set_bytes;
    finite_factors(set, 2 * kExperts * gstride / static_cast<int64_t>(sizeof(BlockQ2K)),
                   GgmlType::kQ2K);
    finite_factors(set + 2 * kExperts * gstride,
                   kExperts * dstride / static_cast<int64_t>(sizeof(BlockQ3K)), GgmlType::kQ3K);
  }
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<const uint8_t*> tab;  // set i: gate E, up E, down E
  for (int64_t i = 0; i < kSets; ++i)
    for (int64_t e = 0; e < 3 * kExperts; ++e)
      tab.push_back(
          pool + i * set_bytes +
          (e < 2 * kExperts ? e * gstride : 2 * kExperts * gstride + (e - 2 * kExperts) * dstride));
  const uint8_t** d_tab = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_tab, tab.size() * sizeof(void*)));
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(d_tab, tab.data(), tab.size() * sizeof(void*), cudaMemcpyHostToDevice));
  BlockQ8_1 *xq = nullptr, *hq = nullptr;
  float* y = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&xq, kMaxRows * kDim / 32 * sizeof(BlockQ8_1)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&hq, kExperts * kMaxRows * kInter / 32 * sizeof(BlockQ8_1)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&y, 2 * kExperts * kMaxRows * kDim * sizeof(float)));
  bench::fill_q8_1(xq, kMaxRows, kDim, 12);
  bench::fill_q8_1(hq, kExperts * kMaxRows, kInter, 13);
  MmvqGroup* d_groups = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_groups, 4 * kExperts * kMaxRows * sizeof(MmvqGroup)));

  std::vector<Row> rows;
  for (int64_t n : ns) {
    const Groups gr = make_groups(n);
    const int64_t G = gr.G;
    std::vector<MmvqGroup> all = gr.gu;
    all.insert(all.end(), gr.down.begin(), gr.down.end());
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(d_groups, all.data(), all.size() * sizeof(MmvqGroup), cudaMemcpyHostToDevice));
    const MmvqGroup* dgu = d_groups;
    const MmvqGroup* ddn = d_groups + 2 * G;
    // Validation on set 0 (n = 2, 9 and 64: small, ragged and full groups; every chosen n).
    if (chosen || n == 2 || n == 9 || n == 64) {
      const auto w = bench::to_host<uint8_t>(pool, set_bytes);
      std::vector<const uint8_t*> hs;
      for (int64_t e = 0; e < 3 * kExperts; ++e) hs.push_back(w.data() + (tab[e] - pool));
      const auto hx = bench::to_host<BlockQ8_1>(xq, n * kDim / 32);
      const auto hh = bench::to_host<BlockQ8_1>(hq, kExperts * n * kInter / 32);
      const int64_t ny = kExperts * kMaxRows * 2;
      std::vector<float> want_gu(static_cast<size_t>(ny * kInter), 0.0f),
          want_d(static_cast<size_t>(kExperts * n * kDim), 0.0f);
      emu::mmvq_groups(GgmlType::kQ2K, hs.data(), gr.gu.data(), 2 * G, hx.data(), want_gu.data(),
                       kInter, kDim);
      emu::mmvq_groups(GgmlType::kQ3K, hs.data(), gr.down.data(), G, hh.data(), want_d.data(), kDim,
                       kInter);
      for (int k = 0; k < 3; ++k) {
        const std::string tag = (k == 0   ? " mmvq (streamed engine) n="
                                 : k == 1 ? " mmq n="
                                          : " mmvq (dp4a kernel) n=") +
                                std::to_string(n);
        cuda::set_mmvq_engine(k == 2 ? cuda::MmvqEngine::kDp4a : cuda::MmvqEngine::kStreamed);
        MOECHECK_CUDA_CHECK(cudaMemset(y, 0, want_gu.size() * sizeof(float)));
        if (k != 1) {
          cuda::mmvq_groups(GgmlType::kQ2K, d_tab, dgu, 2 * G, 8, xq, y, kInter, kDim, 8, s);
        } else {
          cuda::mmq_groups(GgmlType::kQ2K, d_tab, dgu, G, 2, G, xq, y, kInter, kDim, s);
        }
        MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
        bench::require_emu_bits("gate+up Q2_K" + tag, y, want_gu);
        if (k != 1) cuda::mmvq_groups(GgmlType::kQ3K, d_tab, ddn, G, 8, hq, y, kDim, kInter, 8, s);
        else cuda::mmq_groups(GgmlType::kQ3K, d_tab, ddn, G, 1, G, hq, y, kDim, kInter, s);
        MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
        bench::require_emu_bits("down Q3_K" + tag, y, want_d);
      }
      cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
    }
    auto table = [&](int i) { return d_tab + (i % kSets) * 3 * kExperts; };
    const int reps = 2 * kSets;
    const double gu_bytes = 2.0 * kExperts * gstride, d_bytes = 1.0 * kExperts * dstride;
    const double macs = static_cast<double>(kExperts * n) * kDim * kInter;
    auto add = [&](const std::string& what, double us, double bytes, double mac) {
      rows.push_back({what, n, us, bytes / us * 1e-3, bytes / us * 1e-3 / copy, mac / us * 1e-6});
    };
    // MMVQ: the streamed engine (the default) and the dp4a kernel; max_n 8 as the device route
    // launches, and 1 where every group holds one token.
    auto engine = [](int e) {
      cuda::set_mmvq_engine(e == 1 ? cuda::MmvqEngine::kDp4a : cuda::MmvqEngine::kStreamed);
    };
    auto mmvq_gu = [&](int e, int max_n) {
      engine(e);
      const double us = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::mmvq_groups(GgmlType::kQ2K, table(i), dgu, 2 * G, max_n, xq, y, kInter, kDim, 8,
                              st);
          },
          reps, s, 2, 10);
      engine(0);
      return us;
    };
    auto mmvq_dn = [&](int e, int max_n) {
      engine(e);
      const double us = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::mmvq_groups(GgmlType::kQ3K, table(i), ddn, G, max_n, hq, y, kDim, kInter, 8, st);
          },
          reps, s, 2, 10);
      engine(0);
      return us;
    };
    add("gate+up Q2_K, MMVQ (streamed engine)", mmvq_gu(0, 8), gu_bytes, 2 * macs);
    add("gate+up Q2_K, MMVQ (dp4a kernel, 8 warps)", mmvq_gu(1, 8), gu_bytes, 2 * macs);
    if (n == 1)
      add("gate+up Q2_K, MMVQ one-token launch (max_n 1), streamed", mmvq_gu(0, 1), gu_bytes,
          2 * macs);
    add("gate+up Q2_K, MMQ",
        graph_us(
            [&](int i, cudaStream_t st) {
              cuda::mmq_groups(GgmlType::kQ2K, table(i), dgu, G, 2, G, xq, y, kInter, kDim, st);
            },
            reps, s, 2, 10),
        gu_bytes, 2 * macs);
    add("down Q3_K, MMVQ (streamed engine)", mmvq_dn(0, 8), d_bytes, macs);
    add("down Q3_K, MMVQ (dp4a kernel, 8 warps)", mmvq_dn(1, 8), d_bytes, macs);
    if (n == 1)
      add("down Q3_K, MMVQ one-token launch (max_n 1), streamed", mmvq_dn(0, 1), d_bytes, macs);
    add("down Q3_K, MMQ",
        graph_us(
            [&](int i, cudaStream_t st) {
              cuda::mmq_groups(GgmlType::kQ3K, table(i), ddn, G, 1, G, hq, y, kDim, kInter, st);
            },
            reps, s, 2, 10),
        d_bytes, macs);
  }
  std::printf(
      "\n| kernel | rows per expert | us | weight GB/s | of copy | int8 TMAC/s |\n"
      "|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %.1f | %.0f | %.0f%% | %.2f |\n", r.what.c_str(),
                static_cast<long long>(r.n), r.us, r.gbs, 100.0 * r.frac, r.tops);
  std::printf("(%lld experts per launch; copy %.0f GB/s)\n", static_cast<long long>(kExperts),
              copy);
  return 0;
}
