// Kernel benchmarks at the seeds' one-token shapes: MMVQ over the six selected experts in one
// launch (gate: 6 x [2304, 5120] Q2_K; gate+up: 12 of them; down: 6 x [5120, 2304] Q3_K) with the
// dp4a kernel and the tensor-core engine, the router GEMV (plain, staged) and the shared expert's
// bf16 GEMVs. Each kernel is first checked bit for bit against its emulation twin on the same bytes
// (exit 1 if not); the rows marked "diagnostic" run the tensor-core engine's copies alone, compute
// and write nothing, and are labelled as such in the table (the copy pipeline's own rate). Each
// result is weight bytes / kernel time against the device-to-device copy bandwidth measured first
// in this process. Weights rotate among sets whose total is several times L2, so no launch finds
// its weights cached; launches are replayed from a CUDA graph (launch gaps out). Size-matched
// baselines: the same bytes moved by a graph-replayed memcpy and read by a plain read kernel
// (checked first), each with its fixed cost and per-matrix rate fitted like the MMVQ launches'.
// Markdown table, then the sections that follow it: the one-token launch warp by warp, the ring's
// head, and the one-token form against the layer's groups form at 12 - 90 matrices.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "emulate/bf16_gemv.h"
#include "emulate/mmvq.h"
#include "emulate/router_gemv.h"
#include "tests/bench/bench_util.h"

using namespace moecheck;
using moecheck::bench::graph_us;
using moecheck::bench::time_ms;

namespace {

struct Row {
  std::string kernel, shape, engine;
  double us, gbs, frac;
};

// The MMVQ engines timed side by side (cuda/kernels.h MmvqEngine): the streamed engine (the
// default) in several shapes, the dp4a kernel at 8 warps (the previous default) and the
// tensor-core engine at 4 and 6 tile stages.
struct Engine {
  const char* name;
  cuda::MmvqEngine e;
  int warps, stages, mode;
  bool diagnostic;  // copies only: not validated, no output (the copy pipeline's own rate)
  int sb_warps = 0, sb_stages = 0;  // the streamed engine's shape (0: its default)
  int sb_step = 0;  // its super-blocks a row a step (cuda::set_mmvq_stream_step; 0: the default)
};
const Engine kEngines[] = {
    {"streamed (default shape and step)", cuda::MmvqEngine::kStreamed, 8, 0, 0, false},
    {"streamed, steps of 4, 16 warps x 3 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 16,
     3, 4},
    {"streamed, steps of 4, 16 warps x 2 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 16,
     2, 4},
    {"streamed, steps of 4, 12 warps x 4 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 12,
     4, 4},
    {"streamed, steps of 4, 12 warps x 3 stages (the layer's one-token gate / up)",
     cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 12, 3, 4},
    {"streamed, steps of 4, 14 warps x 2 stages (one-token shape)", cuda::MmvqEngine::kStreamed, 8,
     0, 0, false, 14, 2, 4},
    {"streamed, steps of 4, 14 warps x 3 stages (one-token shape)", cuda::MmvqEngine::kStreamed, 8,
     0, 0, false, 14, 3, 4},
    {"streamed, steps of 8, 16 warps x 2 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 16,
     2, 8},
    {"streamed, steps of 8, 12 warps x 3 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 12,
     3, 8},
    {"streamed, steps of 8, 8 warps x 4 stages", cuda::MmvqEngine::kStreamed, 8, 0, 0, false, 8, 4,
     8},
    {"dp4a, 8 warps", cuda::MmvqEngine::kDp4a, 8, 0, 0, false},
    {"tensor cores, bulk copies, 4 stages", cuda::MmvqEngine::kTensorCore, 8, 4, 0, false},
    {"tensor cores, bulk copies, 6 stages", cuda::MmvqEngine::kTensorCore, 8, 6, 0, false},
    {"tensor cores, cp.async, 4 stages", cuda::MmvqEngine::kTensorCore, 8, 4, 1, false},
    {"tensor cores, cp.async, 6 stages", cuda::MmvqEngine::kTensorCore, 8, 6, 1, false},
    {"diagnostic: bulk copies alone, 4 stages", cuda::MmvqEngine::kTensorCore, 8, 4, 2, true},
    {"diagnostic: cp.async alone, 4 stages", cuda::MmvqEngine::kTensorCore, 8, 4, 3, true}};

// The one-token MMVQ launches' size-matched read (bench::read_words_kernel, four loads in flight
// a thread): the bytes without the arithmetic.
using moecheck::bench::read_words_kernel;

// read_words_kernel over p[0, bytes) once (grid blocks, folds in sink), its folds against the
// host's xor of the same bytes: prints "validated the read of <what>" and returns true, or names
// both folds and returns false (the caller then times nothing).
bool read_folds_to_host(const uint8_t* p, size_t bytes, int grid, uint32_t* sink, cudaStream_t s,
                        const std::string& what) {
  read_words_kernel<4><<<grid, 512, 0, s>>>(reinterpret_cast<const uint4*>(p),
                                            static_cast<int64_t>(bytes / 16), sink);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  const uint32_t want = bench::xor_fold(p, bytes);
  const uint32_t got = bench::xor_fold(sink, static_cast<size_t>(grid) * 4);
  if (got != want) {
    std::fprintf(stderr, "bench: read_words_kernel folded %08x over %s, the host %08x\n", got,
                 what.c_str(), want);
    return false;
  }
  std::printf("validated the read of %s: xor-fold %08x equal to the host's\n", what.c_str(), want);
  return true;
}

// time = fixed + slope * m by least squares over the sweep's (m, us).
void fit_line(const std::vector<double>& xs, const std::vector<double>& ys, double& fixed,
              double& slope) {
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    mx += xs[i] / static_cast<double>(xs.size());
    my += ys[i] / static_cast<double>(ys.size());
  }
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  slope = sxy / sxx;
  fixed = my - slope * mx;
}

// Fits the sweep's (matrices, us) as fit_line does and prints "<label>: fixed .. us, .. us per
// matrix (.. GB/s = ..% of copy per matrix)", bytes_each the bytes a matrix adds (moved or read).
void print_fit(const std::string& label, const std::vector<double>& xs,
               const std::vector<double>& ys, double bytes_each, double copy) {
  double fixed = 0, slope = 0;
  fit_line(xs, ys, fixed, slope);
  std::printf("%s: fixed %.2f us, %.3f us per matrix (%.0f GB/s = %.0f%% of copy per matrix)\n",
              label.c_str(), fixed, slope, bytes_each / slope * 1e-3,
              bytes_each / slope * 1e-3 / copy * 100);
}

// The one-token launch, warp by warp (cuda::set_mmvq_stream_diagnostic). Where a launch's
// fixed cost (the fit above: about 11 us for Q2_K, 8 us for Q3_K, against 2 - 2.5 us for a plain
// read of the same bytes) goes: each warp records when it started, issued its first copies,
// passed the programmatic-launch wait, had the block's activations staged, saw its first bytes,
// ended each pass and ended, with its cycles waiting for bytes and computing. Mode 1 computes as
// always (checked bitwise against the emulation first); mode 2 leaves the products and the output
// out (the launch's copies, waits, staging and bookkeeping alone; METHOD's "leave one stage out"),
// timed over the same matrix counts as the fit above. A recorded launch follows an ordinary one of
// the same shape on another weight set, as in the graph replays.
namespace tl {

struct Rec {
  uint64_t w[cuda::kMmvqTimelineWords];
  uint64_t operator[](int k) const { return w[k]; }
};
constexpr uint64_t kUnset = ~uint64_t{0};

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double x = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(x);
  const double f = x - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

// Pooled per-warp figures of several recorded launches, in microseconds.
struct Pool {
  std::vector<double> entry, issued, pdl, staged, first, pass1, pass2, pass3, tail, wait, compute,
      exit;
  std::vector<double> spans, busy, ghz;
  std::vector<int> passes_hist = std::vector<int>(8, 0);
  int warps = 0, blocks = 0, sms = 0;
};

void add(const std::vector<Rec>& recs, Pool& P) {
  std::vector<const Rec*> live;
  for (const Rec& r : recs)
    if (r[cuda::kTlEntryNs] != kUnset && r[cuda::kTlExitNs] != kUnset) live.push_back(&r);
  if (live.empty()) return;
  double sum_ns = 0, sum_clk = 0;
  uint64_t t0 = kUnset, t1 = 0;
  for (const Rec* r : live) {
    sum_ns += static_cast<double>((*r)[cuda::kTlExitNs] - (*r)[cuda::kTlEntryNs]);
    sum_clk += static_cast<double>((*r)[cuda::kTlExitClk] - (*r)[cuda::kTlEntryClk]);
    t0 = std::min(t0, (*r)[cuda::kTlEntryNs]);
    t1 = std::max(t1, (*r)[cuda::kTlExitNs]);
  }
  const double ns_per_clk = sum_ns / sum_clk;  // the multiprocessors' clock, from both timers
  P.ghz.push_back(1.0 / ns_per_clk);
  const double span = static_cast<double>(t1 - t0) * 1e-3;
  P.spans.push_back(span);
  auto us = [&](uint64_t a, uint64_t b) {  // cycles a -> b of one warp, in us
    return static_cast<double>(b - a) * ns_per_clk * 1e-3;
  };
  std::vector<uint64_t> blocks, sms;
  double busy = 0;
  for (const Rec* rp : live) {
    const Rec& r = *rp;
    const uint64_t e = r[cuda::kTlEntryClk];
    P.entry.push_back(static_cast<double>(r[cuda::kTlEntryNs] - t0) * 1e-3);
    P.exit.push_back(static_cast<double>(r[cuda::kTlExitNs] - t0) * 1e-3);
    busy += us(e, r[cuda::kTlExitClk]);
    blocks.push_back(r[cuda::kTlSmBlock] >> 32);
    sms.push_back(r[cuda::kTlSmBlock] & 0xFFFFFFFFu);
    const int np = static_cast<int>(r[cuda::kTlPasses]);
    ++P.passes_hist[std::min(np, 7)];
    if (np == 0 || r[cuda::kTlStagedClk] == kUnset) continue;
    P.issued.push_back(us(e, r[cuda::kTlIssuedClk]));
    P.pdl.push_back(us(e, r[cuda::kTlPdlClk]));
    P.staged.push_back(us(e, r[cuda::kTlStagedClk]));
    P.first.push_back(us(e, r[cuda::kTlFirstDataClk]));
    P.wait.push_back(us(0, r[cuda::kTlWaitClk]));
    P.compute.push_back(us(0, r[cuda::kTlComputeClk]));
    uint64_t prev = r[cuda::kTlFirstDataClk];
    const int nrec = std::min(np, static_cast<int>(cuda::kTlPassEnds));
    for (int j = 0; j < nrec; ++j) {
      const uint64_t end = r[cuda::kTlPassEnd0 + j];
      (j == 0 ? P.pass1 : j == 1 ? P.pass2 : P.pass3).push_back(us(prev, end));
      prev = end;
    }
    if (np <= cuda::kTlPassEnds) P.tail.push_back(us(prev, r[cuda::kTlExitClk]));
  }
  std::sort(blocks.begin(), blocks.end());
  std::sort(sms.begin(), sms.end());
  P.warps = static_cast<int>(live.size());
  P.blocks = static_cast<int>(std::unique(blocks.begin(), blocks.end()) - blocks.begin());
  P.sms = static_cast<int>(std::unique(sms.begin(), sms.end()) - sms.begin());
  P.busy.push_back(busy / (static_cast<double>(live.size()) * span));
}

void print(const char* what, const char* mode, double graph, const Pool& P) {
  std::printf(
      "\n#### timeline: %s, %s: graph-replayed %.2f us a launch; recorded launches' span (first "
      "warp's start to last warp's end, %%globaltimer) %.2f us (median of %zu, %.2f - %.2f); "
      "%d warps in %d blocks on %d multiprocessors; multiprocessor clock %.3f GHz (clock64 over "
      "%%globaltimer); warps busy %.0f %% of the span\n\n",
      what, mode, graph, bench::median(P.spans), P.spans.size(), pct(P.spans, 0), pct(P.spans, 1),
      P.warps, P.blocks, P.sms, bench::median(P.ghz), 100.0 * bench::median(P.busy));
  std::printf("| per warp, us (pooled over the launches) | n | p10 | p50 | p90 | max |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto row = [](const char* name, const std::vector<double>& v) {
    if (v.empty()) return;
    std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f |\n", name, v.size(), pct(v, 0.1),
                pct(v, 0.5), pct(v, 0.9), pct(v, 1.0));
  };
  row("start, after the launch's first warp (globaltimer)", P.entry);
  row("its first steps issued, from its start", P.issued);
  row("past the programmatic-launch wait, from its start", P.pdl);
  row("block's activations staged, from its start", P.staged);
  row("first step's bytes landed, from its start", P.first);
  row("pass 1 (from the first bytes)", P.pass1);
  row("pass 2", P.pass2);
  row("passes 3 and later, each", P.pass3);
  row("last pass's end to the warp's end", P.tail);
  row("waiting for bytes, the warp's total", P.wait);
  row("from bytes to a step's end, the warp's total", P.compute);
  row("end, after the launch's first warp (globaltimer)", P.exit);
  std::printf("\npasses a warp (warps, pooled):");
  for (int k = 0; k < 8; ++k)
    if (P.passes_hist[k] != 0) std::printf(" %s%d: %d", k == 7 ? ">=" : "", k, P.passes_hist[k]);
  std::printf("\n");
}

// Records `reps` launches (launch(i, stream) launches on weight set i) under diagnostic mode
// `mode` into one Pool, each after an ordinary launch on another weight set (its predecessor, as
// in the graph replays); the buffer (cap warps' records) is cleared before each. Leaves the
// diagnostic off.
template <class Launch>
Pool record(const Launch& launch, int mode, uint64_t* buf, int64_t cap, int reps, cudaStream_t s) {
  const size_t bytes = static_cast<size_t>(cap) * cuda::kMmvqTimelineWords * sizeof(uint64_t);
  Pool P;
  for (int r = 0; r < reps; ++r) {
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
    MOECHECK_CUDA_CHECK(cudaMemsetAsync(buf, 0xFF, bytes, s));
    launch(2 * r + 1, s);
    cuda::set_mmvq_stream_diagnostic(mode, buf, cap);
    launch(2 * r + 2, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    add(bench::to_host<Rec>(buf, static_cast<size_t>(cap)), P);
  }
  cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
  // Every MMVQ engine gives the same bits, so the bitwise checks cannot tell which one ran; only
  // the streamed engine records a timeline. No record: another engine was set, and the section's
  // rows would time it under the streamed engine's name.
  if (P.warps == 0) {
    std::fprintf(stderr,
                 "mmvq_bench: no warp recorded a timeline (the streamed engine is not the one "
                 "set; cuda::set_mmvq_engine)\n");
    std::exit(1);
  }
  return P;
}

}  // namespace tl

void timeline_section(const uint8_t** d_tab, int64_t gate_stride, int64_t down_stride,
                      const BlockQ8_1* x_q8, const BlockQ8_1* h_q8, float* y,
                      const std::vector<float>& want_gu, const std::vector<float>& want_d,
                      int64_t inter, int64_t dim, int64_t sets, double copy, cudaStream_t s) {
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);  // the engine these rows name
  int sms = 0, dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t cap = static_cast<int64_t>(sms) * 16;  // a block a multiprocessor, 16 warps at most
  uint64_t* buf = nullptr;
  const size_t buf_bytes = static_cast<size_t>(cap) * cuda::kMmvqTimelineWords * sizeof(uint64_t);
  MOECHECK_CUDA_CHECK(cudaMalloc(&buf, buf_bytes));
  const int nsel = 6, n = 4 * static_cast<int>(sets), reps = 7;
  auto table = [&](int64_t i) { return d_tab + (i % sets) * 3 * nsel; };
  std::printf("\n### mmvq_bench: the one-token launch, warp by warp (copy %.0f GB/s)\n", copy);
  struct Shape {
    const char* what;
    GgmlType t;
    int off, m;
    int64_t R, K;
    const BlockQ8_1* a;
    bool per_expert;
  };
  const Shape shapes[] = {
      {"gate+up, 12 x Q2_K [2304, 5120]", GgmlType::kQ2K, 0, 12, inter, dim, x_q8, false},
      {"gate, 6 x Q2_K [2304, 5120]", GgmlType::kQ2K, 0, 6, inter, dim, x_q8, false},
      {"2 x Q2_K [2304, 5120]", GgmlType::kQ2K, 0, 2, inter, dim, x_q8, false},
      {"down, 6 x Q3_K [5120, 2304]", GgmlType::kQ3K, 2 * nsel, 6, dim, inter, h_q8, true},
      {"1 x Q3_K [5120, 2304]", GgmlType::kQ3K, 2 * nsel, 1, dim, inter, h_q8, true}};
  for (const Shape& sh : shapes) {
    auto run = [&](const uint8_t** tab, cudaStream_t st) {
      cuda::mmvq_experts(sh.t, tab + sh.off, sh.m, sh.a, sh.per_expert, y, sh.R, sh.K, 8, st);
    };
    for (int mode = 1; mode <= 2; ++mode) {
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      cuda::set_mmvq_stream_diagnostic(mode, buf, cap);
      if (mode == 1) {  // the recording kernel computes what the product kernel does
        run(d_tab, s);
        MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
        const std::vector<float>& want = sh.t == GgmlType::kQ2K ? want_gu : want_d;
        bench::require_emu_bits(std::string("timeline kernel, ") + sh.what, y,
                                std::vector<float>(want.begin(), want.begin() + sh.m * sh.R));
      }
      const double graph =
          bench::graph_us([&](int i, cudaStream_t st) { run(table(i), st); }, n, s);
      const tl::Pool P = tl::record([&](int64_t i, cudaStream_t st) { run(table(i), st); }, mode,
                                    buf, cap, reps, s);
      tl::print(sh.what, mode == 1 ? "computing (timeline)" : "copies alone (no products)", graph,
                P);
    }
  }
  // The copies alone over the fit's matrix counts: what the launch costs without its products.
  cuda::set_mmvq_stream_diagnostic(2, buf, cap);
  std::printf("\n");
  for (int k = 0; k < 2; ++k) {
    const GgmlType t = k == 0 ? GgmlType::kQ2K : GgmlType::kQ3K;
    const std::vector<int> ms =
        k == 0 ? std::vector<int>{2, 4, 6, 8, 10, 12} : std::vector<int>{1, 2, 3, 4, 5, 6};
    const int off = k == 0 ? 0 : 2 * nsel;
    const int64_t R = k == 0 ? inter : dim, K = k == 0 ? dim : inter;
    const double each = static_cast<double>(k == 0 ? gate_stride : down_stride);
    std::vector<double> xs, ys;
    for (int m : ms) {
      const double us = bench::graph_us(
          [&](int i, cudaStream_t st) {
            cuda::mmvq_experts(t, table(i) + off, m, k == 0 ? x_q8 : h_q8, k == 1, y, R, K, 8, st);
          },
          n, s);
      xs.push_back(m);
      ys.push_back(us);
      std::printf("copies-alone sweep: %s, %d matrices: %.2f us\n", k == 0 ? "Q2_K" : "Q3_K", m,
                  us);
    }
    print_fit(
        std::string("copies-alone fit: ") + (k == 0 ? "Q2_K [2304, 5120]" : "Q3_K [5120, 2304]"),
        xs, ys, each, copy);
  }
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  cuda::set_mmvq_stream_diagnostic(0, nullptr, 0);
  MOECHECK_CUDA_CHECK(cudaFree(buf));
}

// The ring's head (cuda::set_mmvq_stream_head): how many steps each warp issues before its block
// stages the activations, the rest of the ring issued right after. With the whole ring first
// (head 8, the order before 2026-12-05) a gate + up launch's first products came 9 us in: the
// prologue asks for all three stages (384 bulk copies a multiprocessor, about 134 KB) before the
// staging. The default is one step. Heads 8, 0, 1 and 2 at the default ring (16 warps x 3 stages
// here), 16 x 2 and 12 x 4, twice over (interleaved against drift): every shape first bitwise equal
// to the emulation, then graph-replayed; gate + up and down recorded (mode 1, p50 of each phase
// over the pooled warps) and their copies alone (mode 2) replayed.
void head_section(const uint8_t** d_tab, const BlockQ8_1* x_q8, const BlockQ8_1* h_q8, float* y,
                  const std::vector<float>& want_gu, const std::vector<float>& want_d,
                  int64_t inter, int64_t dim, int64_t sets, double copy, double gate_bytes,
                  double down_bytes, cudaStream_t s) {
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);  // the engine these rows name
  int sms = 0, dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t cap = static_cast<int64_t>(sms) * 16;
  uint64_t* buf = nullptr;
  const size_t buf_bytes = static_cast<size_t>(cap) * cuda::kMmvqTimelineWords * sizeof(uint64_t);
  MOECHECK_CUDA_CHECK(cudaMalloc(&buf, buf_bytes));
  const int nsel = 6, n = 4 * static_cast<int>(sets), reps = 7;
  auto table = [&](int64_t i) { return d_tab + (i % sets) * 3 * nsel; };
  struct Shape {
    const char* what;
    GgmlType t;
    int off, m;
    int64_t R, K;
    const BlockQ8_1* a;
    bool per_expert, record;
    double bytes;
  };
  const Shape shapes[] = {
      {"gate+up 12 x Q2_K", GgmlType::kQ2K, 0, 12, inter, dim, x_q8, false, true, 12 * gate_bytes},
      {"gate 6 x Q2_K", GgmlType::kQ2K, 0, 6, inter, dim, x_q8, false, false, 6 * gate_bytes},
      {"2 x Q2_K", GgmlType::kQ2K, 0, 2, inter, dim, x_q8, false, false, 2 * gate_bytes},
      {"down 6 x Q3_K", GgmlType::kQ3K, 2 * nsel, 6, dim, inter, h_q8, true, true, 6 * down_bytes},
      {"1 x Q3_K", GgmlType::kQ3K, 2 * nsel, 1, dim, inter, h_q8, true, false, down_bytes}};
  std::printf("\n### mmvq_bench: the ring's head (copy %.0f GB/s)\n\n", copy);
  std::printf(
      "| round | ring | head | shape | us / launch | of copy | copies alone us | p50 issued | p50 "
      "staged | p50 first bytes | p50 pass 1 | p50 tail | span p50 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  // Rings: the default (16 warps x 3 stages for these shapes), 16 x 2 and 12 x 4.
  const int rings[][2] = {{0, 0}, {16, 2}, {12, 4}};
  for (int round = 1; round <= 2; ++round) {
    for (const auto& ring : rings) {
      cuda::set_mmvq_stream_shape(ring[0], ring[1]);
      const std::string rn =
          ring[0] == 0 ? "default" : std::to_string(ring[0]) + "x" + std::to_string(ring[1]);
      for (int head : {8, 0, 1, 2}) {
        cuda::set_mmvq_stream_head(head);
        for (const Shape& sh : shapes) {
          auto run = [&](const uint8_t** tab, cudaStream_t st) {
            cuda::mmvq_experts(sh.t, tab + sh.off, sh.m, sh.a, sh.per_expert, y, sh.R, sh.K, 8, st);
          };
          MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
          run(d_tab, s);
          MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
          const std::vector<float>& want = sh.t == GgmlType::kQ2K ? want_gu : want_d;
          bench::require_emu_bits(std::string("head ") + std::to_string(head) + ", " + sh.what, y,
                                  std::vector<float>(want.begin(), want.begin() + sh.m * sh.R));
          const double us =
              bench::graph_us([&](int i, cudaStream_t st) { run(table(i), st); }, n, s);
          const double frac = sh.bytes / us * 1e-3 / copy;
          std::printf("| %d | %s | %d | %s | %.2f | %.0f%% |", round, rn.c_str(), head, sh.what, us,
                      100 * frac);
          if (!sh.record) {
            std::printf(" | | | | | | |\n");
            continue;
          }
          MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
          cuda::set_mmvq_stream_diagnostic(2, buf, cap);
          const double alone =
              bench::graph_us([&](int i, cudaStream_t st) { run(table(i), st); }, n, s);
          const tl::Pool P = tl::record([&](int64_t i, cudaStream_t st) { run(table(i), st); }, 1,
                                        buf, cap, reps, s);
          std::printf(" %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", alone,
                      tl::pct(P.issued, 0.5), tl::pct(P.staged, 0.5), tl::pct(P.first, 0.5),
                      tl::pct(P.pass1, 0.5), tl::pct(P.tail, 0.5), tl::pct(P.spans, 0.5));
        }
      }
    }
  }
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  cuda::set_mmvq_stream_head(-1);
  cuda::set_mmvq_stream_shape(0, 0);
  MOECHECK_CUDA_CHECK(cudaFree(buf));
}

// The one-token form against the layer's groups form at many matrices (docs/performance.md,
// thirty-second session: the T = 8 layer's gate / up launch reads about 90 gate-shaped matrices
// and is slower than the one-token form's fit over 2 - 12 matrices predicts). m gate-shaped Q2_K
// matrices (m = 12, 24, 48, 90), each read once a launch: (a) the plain one-token form
// (cuda::mmvq_experts, one activation row); (b) the groups form, one group a matrix holding one
// token of a batch of 8 (cuda::mmvq_groups, max_n 8 and layer_tokens 8: the pass a T = 8 layer
// takes, but sized by n_groups x max_n pairs, which at 90 groups leaves no room for double steps);
// (c) the same groups at max_n 1; (d) the same groups in the layer's own form (added in the
// thirty-third session: cuda::mmvq_groups_planned, two projections at the plan's stride of 48
// pairs, live counts m / 2 read from the device, so the launch has the T = 8 layer's geometry).
// Each launch shape is first checked bitwise against the emulation (one emulation of the 90
// matrices per form, compared by prefix). Up to 48 matrices the launches rotate over disjoint sets
// of the pool's 96; at 90 every launch reads the same 348 MB, several times L2.
void many_section(const uint8_t* gate_pool, int64_t gate_stride, int64_t pool_mats, int64_t inter,
                  int64_t dim, double copy, cudaStream_t s) {
  constexpr int64_t kMost = 90, kTokens = 8, kTopk = 6;
  if (pool_mats < kMost) {
    std::fprintf(stderr, "bench: the many-matrix rows need %lld matrices, the pool has %lld\n",
                 static_cast<long long>(kMost), static_cast<long long>(pool_mats));
    std::exit(1);
  }
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
  std::vector<const uint8_t*> tab;
  for (int64_t j = 0; j < pool_mats; ++j) tab.push_back(gate_pool + j * gate_stride);
  const uint8_t** d_tab = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_tab, tab.size() * sizeof(void*)));
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(d_tab, tab.data(), tab.size() * sizeof(void*), cudaMemcpyHostToDevice));
  std::vector<MmvqGroup> groups(static_cast<size_t>(kMost));
  for (int64_t j = 0; j < kMost; ++j) {
    groups[j].slot = static_cast<int32_t>(j);
    groups[j].n = 1;
    groups[j].a_row[0] = static_cast<int32_t>(j % kTokens);
    groups[j].y_row[0] = static_cast<int32_t>(j);
  }
  MmvqGroup* d_groups = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_groups, groups.size() * sizeof(MmvqGroup)));
  MOECHECK_CUDA_CHECK(cudaMemcpy(d_groups, groups.data(), groups.size() * sizeof(MmvqGroup),
                                 cudaMemcpyHostToDevice));
  // The layer's own form at T = 8 (cuda/moe_layer_route.cu): the plan's two projections (gate,
  // up) at a stride of its capacity P = 48 pairs, each projection's live count read from the
  // device, so the launch sizes itself by 2 x 48 pairs, not by n_groups x max_n (the groups
  // form's bound above: 720 pairs at 90 groups). Projection j holds groups j m / 2 .. of the
  // list above, so the outputs are the groups form's.
  constexpr int64_t kPlanPairs = kTokens * kTopk;
  MmvqGroup* d_planned = nullptr;
  int32_t* d_count = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_planned, 2 * kPlanPairs * sizeof(MmvqGroup)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_count, sizeof(int32_t)));
  auto plan_for = [&](int64_t m) {
    std::vector<MmvqGroup> pg(static_cast<size_t>(2 * kPlanPairs));
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t g = 0; g < m / 2; ++g) pg[j * kPlanPairs + g] = groups[j * (m / 2) + g];
    const int32_t live = static_cast<int32_t>(m / 2);
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(d_planned, pg.data(), pg.size() * sizeof(MmvqGroup), cudaMemcpyHostToDevice));
    MOECHECK_CUDA_CHECK(cudaMemcpy(d_count, &live, sizeof live, cudaMemcpyHostToDevice));
  };
  BlockQ8_1* x8 = nullptr;
  float* y = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&x8, kTokens * dim / 32 * sizeof(BlockQ8_1)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&y, kMost * inter * sizeof(float)));
  bench::fill_q8_1(x8, kTokens, dim, 21);
  std::vector<float> want_plain(static_cast<size_t>(kMost * inter)),
      want_groups(static_cast<size_t>(kMost * inter));
  {
    const auto w = bench::to_host<uint8_t>(gate_pool, kMost * gate_stride);
    const auto hx = bench::to_host<BlockQ8_1>(x8, kTokens * dim / 32);
    std::vector<const uint8_t*> hp;
    for (int64_t j = 0; j < kMost; ++j) hp.push_back(w.data() + j * gate_stride);
    emu::mmvq_experts(GgmlType::kQ2K, hp.data(), kMost, hx.data(), false, want_plain.data(), inter,
                      dim);
    emu::mmvq_groups(GgmlType::kQ2K, hp.data(), groups.data(), kMost, hx.data(), want_groups.data(),
                     inter, dim);
  }
  // Form f (0: one-token, 1: groups max_n 8, 2: groups max_n 1, 3: the layer's planned groups,
  // plan_for(m) first) over m matrices from table t.
  auto launch = [&](int f, int64_t m, const uint8_t* const* t, cudaStream_t st) {
    if (f == 0) cuda::mmvq_experts(GgmlType::kQ2K, t, m, x8, false, y, inter, dim, 8, st);
    else if (f == 3)
      cuda::mmvq_groups_planned(GgmlType::kQ2K, t, d_planned, d_count, 2, kPlanPairs, 8, x8, y,
                                inter, dim, 8, st, kTokens);
    else
      cuda::mmvq_groups(GgmlType::kQ2K, t, d_groups, m, f == 1 ? 8 : 1, x8, y, inter, dim, 8, st,
                        kTokens);
  };
  const char* names[] = {"one-token form", "groups form (max_n 8)", "groups form (max_n 1)",
                         "the layer's planned form (2 x 48 pairs)"};
  std::printf("\n### mmvq_bench: the one-token form against the groups form (copy %.0f GB/s)\n\n",
              copy);
  std::printf(
      "| Q2_K [2304, 5120] matrices | %s us (of copy) | %s us (of copy) | %s us (of copy) | %s us "
      "(of copy) |\n"
      "|---|---|---|---|---|\n",
      names[0], names[1], names[2], names[3]);
  for (const int64_t m : {int64_t{12}, int64_t{24}, int64_t{48}, kMost}) {
    const double b = static_cast<double>(m * gate_stride);
    const int64_t rot = m <= pool_mats / 2 ? pool_mats / m : 1;
    plan_for(m);
    double us[4];
    for (int f = 0; f < 4; ++f) {
      MOECHECK_CUDA_CHECK(cudaMemset(y, 0, kMost * inter * sizeof(float)));
      launch(f, m, d_tab, s);
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      const std::vector<float>& want = f == 0 ? want_plain : want_groups;
      bench::require_emu_bits(std::string(names[f]) + ", " + std::to_string(m) + " matrices", y,
                              std::vector<float>(want.begin(), want.begin() + m * inter));
      us[f] =
          graph_us([&](int i, cudaStream_t st) { launch(f, m, d_tab + (i % rot) * m, st); }, 16, s);
    }
    // The row after every check of it (each check prints its own line).
    std::printf("| %lld |", static_cast<long long>(m));
    for (const double u : us) std::printf(" %.2f (%.1f %%) |", u, 100.0 * b / u * 1e-3 / copy);
    std::printf("\n");
  }
  MOECHECK_CUDA_CHECK(cudaFree(d_tab));
  MOECHECK_CUDA_CHECK(cudaFree(d_groups));
  MOECHECK_CUDA_CHECK(cudaFree(d_planned));
  MOECHECK_CUDA_CHECK(cudaFree(d_count));
  MOECHECK_CUDA_CHECK(cudaFree(x8));
  MOECHECK_CUDA_CHECK(cudaFree(y));
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a failed check's exit(1) keeps every line printed
  const double copy = bench::copy_bandwidth_gbs();
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);
  std::printf(
      "device-to-device copy on an idle stream (the figures before 2026-12-05): %.0f GB/s\n",
      bench::copy_bandwidth_gbs(bench::Submit::kIdle));
  cudaStream_t s;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t dim = 5120, inter = 2304, nsel = 6, sets = 8;
  const int64_t gate_stride = inter * row_bytes(GgmlType::kQ2K, dim);  // 3,870,720 B
  const int64_t down_stride = dim * row_bytes(GgmlType::kQ3K, inter);  // 5,068,800 B
  // 2 * sets * 6 gate-shaped experts (gate and up) and sets * 6 down experts: 371 + 243 MB.
  uint8_t *gate_pool = nullptr, *down_pool = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&gate_pool, 2 * sets * nsel * gate_stride));
  MOECHECK_CUDA_CHECK(cudaMalloc(&down_pool, sets * nsel * down_stride));
  bench::fill_random(gate_pool, 2 * sets * nsel * gate_stride, 1);
  bench::fill_random(down_pool, sets * nsel * down_stride, 2);
  // Slot tables: set i's gate (6), gate+up (12), down (6).
  std::vector<const uint8_t*> tab;
  for (int64_t i = 0; i < sets; ++i) {
    for (int64_t e = 0; e < 2 * nsel; ++e)
      tab.push_back(gate_pool + (2 * i * nsel + e) * gate_stride);
    for (int64_t e = 0; e < nsel; ++e) tab.push_back(down_pool + (i * nsel + e) * down_stride);
  }
  const uint8_t** d_tab = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d_tab, tab.size() * sizeof(void*)));
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(d_tab, tab.data(), tab.size() * sizeof(void*), cudaMemcpyHostToDevice));
  BlockQ8_1 *x_q8 = nullptr, *h_q8 = nullptr;
  float* y = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&x_q8, dim / 32 * sizeof(BlockQ8_1)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&h_q8, nsel * inter / 32 * sizeof(BlockQ8_1)));
  MOECHECK_CUDA_CHECK(cudaMalloc(&y, 2 * nsel * dim * sizeof(float)));
  bench::fill_q8_1(x_q8, 1, dim, 3);
  bench::fill_q8_1(h_q8, nsel, inter, 4);

  // Before any timing: set 0 of every MMVQ form, at every warp count, against the emulation
  // (want_gu, want_d also check the fixed-cost sweep's launches below).
  std::vector<float> want_gu(static_cast<size_t>(2 * nsel * inter)),
      want_d(static_cast<size_t>(nsel * dim));
  // Set 0's gate + up and down launches under the engine now set, at `warps`, bitwise against
  // the emulation (exit 1 naming the launch and `tag` if not).
  auto check_set0 = [&](int warps, const std::string& tag) {
    cuda::mmvq_experts(GgmlType::kQ2K, d_tab, 2 * nsel, x_q8, false, y, inter, dim, warps, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    bench::require_emu_bits("mmvq_experts Q2_K gate+up" + tag, y, want_gu);
    cuda::mmvq_experts(GgmlType::kQ3K, d_tab + 2 * nsel, nsel, h_q8, true, y, dim, inter, warps, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    bench::require_emu_bits("mmvq_experts Q3_K down" + tag, y, want_d);
  };
  {
    const auto gates = bench::to_host<uint8_t>(gate_pool, 2 * nsel * gate_stride);
    const auto downs = bench::to_host<uint8_t>(down_pool, nsel * down_stride);
    const auto xq = bench::to_host<BlockQ8_1>(x_q8, dim / 32),
               hq = bench::to_host<BlockQ8_1>(h_q8, nsel * inter / 32);
    std::vector<const uint8_t*> hg, hd;
    for (int64_t e = 0; e < 2 * nsel; ++e) hg.push_back(gates.data() + e * gate_stride);
    for (int64_t e = 0; e < nsel; ++e) hd.push_back(downs.data() + e * down_stride);
    emu::mmvq_experts(GgmlType::kQ2K, hg.data(), 2 * nsel, xq.data(), false, want_gu.data(), inter,
                      dim);
    emu::mmvq_experts(GgmlType::kQ3K, hd.data(), nsel, hq.data(), true, want_d.data(), dim, inter);
    for (const Engine& eng : kEngines) {
      if (eng.diagnostic) continue;
      cuda::set_mmvq_engine(eng.e, eng.stages, eng.mode);
      cuda::set_mmvq_stream_shape(eng.sb_warps, eng.sb_stages);
      cuda::set_mmvq_stream_step(eng.sb_step);
      check_set0(eng.warps, std::string(" (") + eng.name + ")");
    }
  }

  std::vector<Row> rows;
  const int n = 4 * static_cast<int>(sets);  // launches per graph, rotating the sets
  auto table = [&](int i) { return d_tab + (i % sets) * 3 * nsel; };
  for (const Engine& eng : kEngines) {
    cuda::set_mmvq_engine(eng.e, eng.stages, eng.mode);
    cuda::set_mmvq_stream_shape(eng.sb_warps, eng.sb_stages);
    cuda::set_mmvq_stream_step(eng.sb_step);
    const int warps = eng.warps;
    double us = graph_us(
        [&](int i, cudaStream_t st) {
          cuda::mmvq_experts(GgmlType::kQ2K, table(i), nsel, x_q8, false, y, inter, dim, warps, st);
        },
        n, s);
    double b = static_cast<double>(nsel * gate_stride);
    rows.push_back({"mmvq_experts Q2_K gate", "6 x [2304, 5120]", eng.name, us, b / us * 1e-3,
                    b / us * 1e-3 / copy});
    us = graph_us(
        [&](int i, cudaStream_t st) {
          cuda::mmvq_experts(GgmlType::kQ2K, table(i), 2 * nsel, x_q8, false, y, inter, dim, warps,
                             st);
        },
        n, s);
    b = static_cast<double>(2 * nsel * gate_stride);
    rows.push_back({"mmvq_experts Q2_K gate+up", "12 x [2304, 5120]", eng.name, us, b / us * 1e-3,
                    b / us * 1e-3 / copy});
    us = graph_us(
        [&](int i, cudaStream_t st) {
          cuda::mmvq_experts(GgmlType::kQ3K, table(i) + 2 * nsel, nsel, h_q8, true, y, dim, inter,
                             warps, st);
        },
        n, s);
    b = static_cast<double>(nsel * down_stride);
    rows.push_back({"mmvq_experts Q3_K down", "6 x [5120, 2304]", eng.name, us, b / us * 1e-3,
                    b / us * 1e-3 / copy});
  }
  cuda::set_mmvq_stream_shape(0, 0);
  cuda::set_mmvq_stream_step(0);
  // The timing method (bench::Submit): the default engine's gate + up and down launches' graphs
  // replayed queued behind a hold (every figure of this benchmark) and on an idle stream (the
  // figures before 2026-12-05, whose spans held the host's submission of the graph), alternating,
  // twice; set 0 of each first bitwise equal to the emulation under the default engine (the loop
  // above leaves the last engine of its table set).
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
  check_set0(8, " (timing method)");
  for (int round = 1; round <= 2; ++round)
    for (const bench::Submit how : {bench::Submit::kQueued, bench::Submit::kIdle}) {
      const char* hn = how == bench::Submit::kQueued ? "queued" : "idle stream";
      const double gu = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::mmvq_experts(GgmlType::kQ2K, table(i), 2 * nsel, x_q8, false, y, inter, dim, 8,
                               st);
          },
          n, s, 3, 20, how);
      const double dn = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::mmvq_experts(GgmlType::kQ3K, table(i) + 2 * nsel, nsel, h_q8, true, y, dim, inter,
                               8, st);
          },
          n, s, 3, 20, how);
      std::printf(
          "timing method, round %d, %s: gate+up 12 x Q2_K %.2f us (%.1f %% of copy), down 6 x "
          "Q3_K %.2f us (%.1f %%), %d launches a graph\n",
          round, hn, gu, 100.0 * 2 * nsel * gate_stride / gu * 1e-3 / copy, dn,
          100.0 * nsel * down_stride / dn * 1e-3 / copy, n);
    }
  // The one-token launch's fixed cost: the streamed engine (the default) and the dp4a kernel over
  // m = 2 .. 12 gate-shaped and 1 .. 6 down matrices (each launch shape first checked on set 0
  // against the emulation); time = fixed + m x per matrix, fitted by least squares. Then the
  // dp4a kernel's six-expert launches with its persistent grid capped at two blocks per SM (16
  // warps instead of 24).
  for (cuda::MmvqEngine fe : {cuda::MmvqEngine::kStreamed, cuda::MmvqEngine::kDp4a}) {
    cuda::set_mmvq_engine(fe);
    const char* en = fe == cuda::MmvqEngine::kStreamed ? "streamed" : "dp4a";
    auto fit = [&](const char* what, GgmlType t, int off, const std::vector<int>& ms, int64_t R,
                   int64_t K, const BlockQ8_1* a, bool per_expert, double bytes_each) {
      std::vector<double> xs, ys;
      const std::vector<float>& want = t == GgmlType::kQ2K ? want_gu : want_d;
      for (int m : ms) {
        // Set 0's first m matrices: the emulation's first m R outputs, bit for bit.
        cuda::mmvq_experts(t, d_tab + off, m, a, per_expert, y, R, K, 8, s);
        MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
        bench::require_emu_bits(
            std::string(en) + " " + what + ", " + std::to_string(m) + " matrices", y,
            std::vector<float>(want.begin(), want.begin() + m * R));
        const double us = graph_us(
            [&](int i, cudaStream_t st) {
              cuda::mmvq_experts(t, table(i) + off, m, a, per_expert, y, R, K, 8, st);
            },
            n, s);
        xs.push_back(m);
        ys.push_back(us);
        std::printf("fixed-cost sweep (%s): %s, %d matrices: %.2f us\n", en, what, m, us);
      }
      print_fit(std::string("fixed-cost fit (") + en + "): " + what, xs, ys, bytes_each, copy);
    };
    fit("Q2_K [2304, 5120]", GgmlType::kQ2K, 0, {2, 4, 6, 8, 10, 12}, inter, dim, x_q8, false,
        static_cast<double>(gate_stride));
    fit("Q3_K [5120, 2304]", GgmlType::kQ3K, static_cast<int>(2 * nsel), {1, 2, 3, 4, 5, 6}, dim,
        inter, h_q8, true, static_cast<double>(down_stride));
    if (fe != cuda::MmvqEngine::kDp4a) continue;
    cuda::set_mmvq_blocks_per_sm(2);
    check_set0(8, ", 2 blocks per SM");
    double us = graph_us(
        [&](int i, cudaStream_t st) {
          cuda::mmvq_experts(GgmlType::kQ2K, table(i), 2 * nsel, x_q8, false, y, inter, dim, 8, st);
        },
        n, s);
    double b = static_cast<double>(2 * nsel * gate_stride);
    rows.push_back({"mmvq_experts Q2_K gate+up, 2 blocks per SM", "12 x [2304, 5120]", "dp4a",
                    us, b / us * 1e-3, b / us * 1e-3 / copy});
    us = graph_us(
        [&](int i, cudaStream_t st) {
          cuda::mmvq_experts(GgmlType::kQ3K, table(i) + 2 * nsel, nsel, h_q8, true, y, dim, inter,
                             8, st);
        },
        n, s);
    b = static_cast<double>(nsel * down_stride);
    rows.push_back({"mmvq_experts Q3_K down, 2 blocks per SM", "6 x [5120, 2304]", "dp4a", us,
                    b / us * 1e-3, b / us * 1e-3 / copy});
    cuda::set_mmvq_blocks_per_sm(0);
  }
  cuda::set_mmvq_engine(cuda::MmvqEngine::kStreamed);
  // Size-matched baselines of the one-token launches: the bytes of m gate-shaped (m = 2 .. 12)
  // or down (1 .. 6) matrices, rotating over the sets as the launches do, moved by a
  // graph-replayed cudaMemcpyAsync (read and written: traffic twice the bytes) and read by
  // read_words_kernel (sms x 4 blocks of 512 threads), each first checked (the copy's bytes, the
  // read's xor-fold against the host's), then fitted fixed + per matrix as above. The read at 12
  // gate matrices is what one launch takes to read the gate+up bytes with no arithmetic: the part
  // of "75 % of copy" a launch of this size can reach at all.
  {
    int sms = 0, dev = 0;
    MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
    MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int grid = 4 * sms;
    uint8_t* dst = nullptr;
    uint32_t* sink = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&dst, 2 * nsel * gate_stride));
    MOECHECK_CUDA_CHECK(cudaMalloc(&sink, grid * sizeof(uint32_t)));
    struct Shape {
      const char* what;
      const uint8_t* pool;
      int64_t set_bytes, each;
      std::vector<int> ms;
    };
    const Shape shapes[] = {{"Q2_K [2304, 5120] bytes",
                             gate_pool,
                             2 * nsel * gate_stride,
                             gate_stride,
                             {2, 4, 6, 8, 10, 12}},
                            {"Q3_K [5120, 2304] bytes",
                             down_pool,
                             nsel * down_stride,
                             down_stride,
                             {1, 2, 3, 4, 5, 6}}};
    for (const Shape& sh : shapes) {
      const int mmax = sh.ms.back();
      const size_t bytes = static_cast<size_t>(mmax * sh.each);
      // Checks on set 0: the copy's destination equals its source, the read's folds the host's.
      MOECHECK_CUDA_CHECK(cudaMemcpyAsync(dst, sh.pool, bytes, cudaMemcpyDeviceToDevice, s));
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      if (bench::to_host<uint32_t>(dst, bytes / 4) !=
          bench::to_host<uint32_t>(sh.pool, bytes / 4)) {
        std::fprintf(stderr, "bench: the memcpy of %d x %s differs from its source\n", mmax,
                     sh.what);
        return 1;
      }
      if (!read_folds_to_host(sh.pool, bytes, grid, sink, s,
                              std::to_string(mmax) + " x " + sh.what))
        return 1;
      for (int kind = 0; kind < 2; ++kind) {
        const char* kn = kind == 0 ? "memcpy" : "read kernel";
        std::vector<double> xs, ys;
        for (int m : sh.ms) {
          const size_t b = static_cast<size_t>(m * sh.each);
          const double us = graph_us(
              [&](int i, cudaStream_t st) {
                const uint8_t* src = sh.pool + (i % sets) * sh.set_bytes;
                if (kind == 0) {
                  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, st));
                } else {
                  read_words_kernel<4><<<grid, 512, 0, st>>>(reinterpret_cast<const uint4*>(src),
                                                             static_cast<int64_t>(b / 16), sink);
                  MOECHECK_CUDA_CHECK(cudaGetLastError());
                }
              },
              n, s);
          xs.push_back(m);
          ys.push_back(us);
          std::printf("size-matched sweep (%s): %s, %d matrices: %.2f us\n", kn, sh.what, m, us);
          if (m == mmax) {
            // The bytes moved a microsecond: the copy's traffic is twice what it reads.
            const double traffic = (kind == 0 ? 2.0 : 1.0) * static_cast<double>(b);
            rows.push_back({std::string(kn) + " of " + sh.what +
                                (kind == 0 ? " (GB/s: read + written)" : " (GB/s: read)"),
                            std::to_string(m) + " matrices", "-", us, traffic / us * 1e-3,
                            traffic / us * 1e-3 / copy});
          }
        }
        const double per = (kind == 0 ? 2.0 : 1.0) * static_cast<double>(sh.each);
        print_fit(std::string("size-matched fit (") + kn + "): " + sh.what, xs, ys, per, copy);
      }
    }
    MOECHECK_CUDA_CHECK(cudaFree(dst));
    MOECHECK_CUDA_CHECK(cudaFree(sink));
  }
  // Stream launches (no graph) of the gate+up form (the default engine), for the launch overhead.
  {
    int i = 0;
    const double ms = time_ms(
        [&] {
          cuda::mmvq_experts(GgmlType::kQ2K, table(i++), 2 * nsel, x_q8, false, y, inter, dim, 8,
                             s);
        },
        5, 50, s);
    const double b = static_cast<double>(2 * nsel * gate_stride);
    rows.push_back({"mmvq_experts Q2_K gate+up (stream, events)", "12 x [2304, 5120]", "default",
                    ms * 1e3, b / (ms * 1e3) * 1e-3, b / (ms * 1e3) * 1e-3 / copy});
  }
  // Router [384, 5120] bf16 (16 copies rotate: 63 MB) and the shared expert's bf16 GEMVs.
  {
    const int64_t nr = 384, ncopy = 16, rb = nr * dim * 2;
    uint8_t* rpool = nullptr;
    uint16_t* x = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&rpool, ncopy * rb));
    MOECHECK_CUDA_CHECK(cudaMalloc(&x, 8 * dim * 2));
    bench::fill_random(rpool, ncopy * rb, 5);
    bench::fill_random(x, 8 * dim * 2, 6);
    const auto hr = bench::to_host<uint16_t>(rpool, nr * dim),
               hx = bench::to_host<uint16_t>(x, dim);
    for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
      std::vector<float> want(static_cast<size_t>(nr));
      emu::router_gemv(v, hr.data(), hx.data(), want.data(), nr, dim, 1);
      cuda::router_gemv(v, reinterpret_cast<const uint16_t*>(rpool), x, y, nr, dim, 1, s);
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      bench::require_emu_bits(
          v == RouterVariant::kPlain ? "router_gemv plain" : "router_gemv staged", y, want);
    }
    for (RouterVariant v : {RouterVariant::kPlain, RouterVariant::kStaged}) {
      const double us = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::router_gemv(v, reinterpret_cast<const uint16_t*>(rpool + (i % ncopy) * rb), x, y,
                              nr, dim, 1, st);
          },
          n, s);
      rows.push_back({v == RouterVariant::kPlain ? "router_gemv plain" : "router_gemv staged",
                      "[384, 5120] T=1", "-", us, rb / us * 1e-3, rb / us * 1e-3 / copy});
    }
    const int64_t sb = inter * dim * 2, nsh = 4;  // 4 copies of (gate, up, down): 283 MB
    uint8_t* spool = nullptr;
    uint16_t* hb = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&spool, 3 * nsh * sb));
    MOECHECK_CUDA_CHECK(cudaMalloc(&hb, 8 * inter * 2));
    bench::fill_random(spool, 3 * nsh * sb, 7);
    bench::fill_random(hb, 8 * inter * 2, 8);
    auto mat = [&](int i, int k) {
      return reinterpret_cast<const uint16_t*>(spool + ((i % nsh) * 3 + k) * sb);
    };
    const auto hs = bench::to_host<uint16_t>(spool, 3 * inter * dim),
               hh = bench::to_host<uint16_t>(hb, inter);
    std::vector<float> want_g(static_cast<size_t>(inter)), want_u(want_g.size()),
        want_d(static_cast<size_t>(dim));
    emu::bf16_gemv_pair(hs.data(), hs.data() + inter * dim, hx.data(), want_g.data(), want_u.data(),
                        inter, dim, 1);
    emu::bf16_gemv(hs.data() + 2 * inter * dim, hh.data(), want_d.data(), dim, inter, 1);
    want_g.insert(want_g.end(), want_u.begin(), want_u.end());
    // The bulk-copy streaming kernel (the default) and the register-staged one (before), each
    // checked against the emulation before it is timed.
    // The streaming kernel's default shape (4 warps x 2 stages), the register-staged kernel,
    // the shape before (8 warps; 2 stages for the pair, 5 for down: as many as fit 200 KB) and
    // others, each checked against the emulation before it is timed.
    struct Shape {
      int warps, pair_stages, down_stages;
      const char* tag;
    };
    const Shape shapes[] = {{0, 0, 0, ""},
                            {-1, 0, 0, " (register-staged, before)"},
                            {8, 2, 5, " (streaming, 8 warps x 2 / 5 stages, before)"},
                            {8, 2, 2, " (streaming, 8 warps x 2 stages)"},
                            {4, 4, 4, " (streaming, 4 warps x 4 stages)"},
                            {2, 2, 2, " (streaming, 2 warps x 2 stages)"}};
    for (const Shape& sh : shapes) {
      const bool streamed = sh.warps >= 0;
      cuda::set_bf16_gemv_stream(streamed);
      cuda::set_bf16_gemv_stream_shape(streamed ? sh.warps : 0, sh.pair_stages, 2);
      cuda::set_bf16_gemv_stream_shape(streamed ? sh.warps : 0, sh.down_stages, 1);
      const std::string tag = sh.tag;
      cuda::bf16_gemv_pair(mat(0, 0), mat(0, 1), x, y, y + inter, inter, dim, 1, s);
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      bench::require_emu_bits("bf16_gemv_pair shared gate+up" + tag, y, want_g);
      cuda::bf16_gemv(mat(0, 2), hb, y, dim, inter, 1, s);
      MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
      bench::require_emu_bits("bf16_gemv shared down" + tag, y, want_d);
      double us = graph_us(
          [&](int i, cudaStream_t st) {
            cuda::bf16_gemv_pair(mat(i, 0), mat(i, 1), x, y, y + inter, inter, dim, 1, st);
          },
          n, s);
      rows.push_back({"bf16_gemv_pair shared gate+up" + tag, "2 x [2304, 5120] T=1", "-", us,
                      2.0 * sb / us * 1e-3, 2.0 * sb / us * 1e-3 / copy});
      us = graph_us(
          [&](int i, cudaStream_t st) { cuda::bf16_gemv(mat(i, 2), hb, y, dim, inter, 1, st); }, n,
          s);
      rows.push_back({"bf16_gemv shared down" + tag, "[5120, 2304] T=1", "-", us, sb / us * 1e-3,
                      sb / us * 1e-3 / copy});
    }
    cuda::set_bf16_gemv_stream(true);
    cuda::set_bf16_gemv_stream_shape(0, 0);
    // The same bytes read by read_words_kernel, rotating as the GEMVs do: what one launch of
    // the shared GEMVs' size reaches with no arithmetic (their "75 % of copy" bound). Checked
    // first: the read's xor-fold of copy 0 against the host's.
    {
      int sms = 0, dev = 0;
      MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
      MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      const int grid = 4 * sms;
      uint32_t* sink = nullptr;
      MOECHECK_CUDA_CHECK(cudaMalloc(&sink, grid * sizeof(uint32_t)));
      for (const int k : {0, 2}) {  // gate + up (two matrices, contiguous), down
        const int64_t bytes = (k == 0 ? 2 : 1) * sb;
        const char* what = k == 0 ? "the shared gate+up bytes" : "the shared down bytes";
        if (!read_folds_to_host(reinterpret_cast<const uint8_t*>(mat(0, k)),
                                static_cast<size_t>(bytes), grid, sink, s, what))
          return 1;
        const double us = graph_us(
            [&](int i, cudaStream_t st) {
              read_words_kernel<4><<<grid, 512, 0, st>>>(reinterpret_cast<const uint4*>(mat(i, k)),
                                                         bytes / 16, sink);
              MOECHECK_CUDA_CHECK(cudaGetLastError());
            },
            n, s);
        rows.push_back({std::string("read kernel of ") + what + " (GB/s: read)",
                        k == 0 ? "2 x [2304, 5120] bf16" : "[5120, 2304] bf16", "-", us,
                        static_cast<double>(bytes) / us * 1e-3,
                        static_cast<double>(bytes) / us * 1e-3 / copy});
      }
      MOECHECK_CUDA_CHECK(cudaFree(sink));
    }
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("\n### mmvq_bench: %s, %s, copy %.0f GB/s\n\n", bench::gpu_name().c_str(), date,
              copy);
  std::printf(
      "| kernel | shape | engine | us / launch | weight GB/s | of copy "
      "|\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %.2f | %.0f | %.0f%% |\n", r.kernel.c_str(), r.shape.c_str(),
                r.engine.c_str(), r.us, r.gbs, 100.0 * r.frac);
  // After the table, so that a fault here leaves every figure above printed.
  timeline_section(d_tab, gate_stride, down_stride, x_q8, h_q8, y, want_gu, want_d, inter, dim,
                   sets, copy, s);
  head_section(d_tab, x_q8, h_q8, y, want_gu, want_d, inter, dim, sets, copy,
               static_cast<double>(gate_stride), static_cast<double>(down_stride), s);
  many_section(gate_pool, gate_stride, 2 * sets * nsel, inter, dim, copy, s);
  std::printf(
      "\nqueued spans submitted after their hold ended (their start waited on the host): %d\n",
      bench::late_spans());
  return 0;
}
