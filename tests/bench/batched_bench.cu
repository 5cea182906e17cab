// The batched ds41 layer (T = 16, 64, 512, 4096 tokens) through the public cuda::MoeLayer API,
// beside its floor and beside the baseline a user would otherwise pick, all in one process:
//   floor     the distinct experts' bytes (gate + up Q2_K, down Q3_K) over the device-to-device
//             copy bandwidth measured first in this process; "layer floor" adds the router and
//             the bf16 shared expert;
//   ours      cuda::MoeLayer, device route, graph_forward (one CUDA graph from the device input
//             to the device output), event-timed; and the host route's synchronous forward
//             (upload, host routing, download included), host wall clock; medians;
//   baseline  tests/bench/cublas_baseline.cuh: the experts dequantised to bf16 once, then per
//             forward gather, grouped bf16 GEMMs through cuBLAS, SwiGLU, the shared expert's
//             GEMMs and the weighted sum; the same picks as ours; event-timed, median;
//   shared    bf16_gemv_pair + bf16_gemv on the layer's shared expert alone (the GEMM of
//             cuda/bf16_gemm.cu above 8 tokens), event-timed, against its 70.8 MB floor.
// Before anything is timed, both routes' outputs equal emu::MoeLayer's bit for bit at T = 16 and
// 64 (and 512 when the emulation's measured speed makes it take under 30 s; 4096 never: the
// output says so), and the baseline's output is within 10 % (relative L2) of ours (it rounds
// differently: bf16 activations, no q8_1). Routed TFLOP/s counts 2 T topk 3 dim inter.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/cublas_baseline.cuh"

using namespace moecheck;

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

template <class T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T) + 16));
  return p;
}

// Uploads one quantised stack and dequantises it into dst (rows row0 .. of each expert's
// dst_rows), then checks expert 0's first row and the last expert's last row against
// core/kquant.h's dequantiser (bitwise, after the bf16 rounding).
template <class Block>
void dequant_stack(const ExpertStackView& s, int64_t n_exp, uint16_t* dst, int64_t dst_rows,
                   int64_t row0) {
  const size_t bytes = static_cast<size_t>(s.expert_stride() * n_exp);
  uint8_t* q = dev_alloc<uint8_t>(bytes);
  MOECHECK_CUDA_CHECK(cudaMemcpy(q, s.data, bytes, cudaMemcpyHostToDevice));
  const int64_t bpr = s.cols / kQK_K, nb = n_exp * s.rows * bpr;
  bench::dequant_kernel<Block><<<static_cast<unsigned>((nb * 32 + 255) / 256), 256>>>(
      reinterpret_cast<const Block*>(q), dst, nb, s.rows, bpr, dst_rows, row0);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  MOECHECK_CUDA_CHECK(cudaFree(q));
  std::vector<float> f(static_cast<size_t>(s.cols));
  std::vector<uint16_t> want(f.size());
  for (const int64_t e : {int64_t{0}, n_exp - 1}) {
    const int64_t r = e == 0 ? 0 : s.rows - 1;
    dequantize_row(s.type, s.data + e * s.expert_stride() + r * row_bytes(s.type, s.cols), f.data(),
                   s.cols);
    for (size_t i = 0; i < f.size(); ++i) want[i] = f32_to_bf16(f[i]);
    bench::require_emu_bits(
        "baseline dequantised expert " + std::to_string(e) + " row " + std::to_string(r),
        bench::to_host<uint16_t>(dst + (e * dst_rows + row0 + r) * s.cols, f.size()), want);
  }
}

// The cuBLAS baseline for one layer: bf16 weights resident, buffers per T, one forward enqueued.
class Baseline {
 public:
  explicit Baseline(const LayerWeights& w) : c_(w.config) {
    const int64_t E = c_.n_routed, D = c_.dim, I = c_.inter;
    gu_ = dev_alloc<uint16_t>(static_cast<size_t>(E * 2 * I * D));
    down_ = dev_alloc<uint16_t>(static_cast<size_t>(E * D * I));
    dequant_stack<BlockQ2K>(w.gate_exps, E, gu_, 2 * I, 0);
    dequant_stack<BlockQ2K>(w.up_exps, E, gu_, 2 * I, I);
    dequant_stack<BlockQ3K>(w.down_exps, E, down_, D, 0);
    sgu_ = dev_alloc<uint16_t>(static_cast<size_t>(2 * I * D));
    sdown_ = dev_alloc<uint16_t>(static_cast<size_t>(D * I));
    MOECHECK_CUDA_CHECK(cudaMemcpy(sgu_, w.shared_gate.data, I * D * 2, cudaMemcpyHostToDevice));
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(sgu_ + I * D, w.shared_up.data, I * D * 2, cudaMemcpyHostToDevice));
    MOECHECK_CUDA_CHECK(cudaMemcpy(sdown_, w.shared_down.data, D * I * 2, cudaMemcpyHostToDevice));
    BENCH_CUBLAS_CHECK(cublasCreate(&h_));
    MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    BENCH_CUBLAS_CHECK(cublasSetStream(h_, s_));
  }
  ~Baseline() {
    free_buffers();
    for (void* p : {static_cast<void*>(gu_), static_cast<void*>(down_), static_cast<void*>(sgu_),
                    static_cast<void*>(sdown_)})
      MOECHECK_CUDA_CHECK(cudaFree(p));
    (void)cublasDestroy(h_);
    (void)cudaStreamDestroy(s_);
  }
  Baseline(const Baseline&) = delete;
  Baseline& operator=(const Baseline&) = delete;

  cudaStream_t stream() const { return s_; }
  bool grouped() const { return gemm_gu_.grouped && gemm_down_.grouped; }
  const uint16_t* shared_gate_up() const { return sgu_; }
  const uint16_t* shared_down() const { return sdown_; }

  // Buffers and GEMM lists for the picks of rt (T tokens) on the bf16 input x (host).
  void prepare(const Routing& rt, const std::vector<uint16_t>& x);

  // One forward: with_shared false leaves the shared expert's GEMMs out (the routed part).
  void forward(bool with_shared) {
    const int64_t D = c_.dim, I = c_.inter;
    bench::gather_rows_kernel<<<1024, 256, 0, s_>>>(x_, tok_, xg_, P_, D);
    gemm_gu_.run(h_);
    bench::swiglu_rows_kernel<<<1024, 256, 0, s_>>>(gu_out_, h_rows_, P_, I, c_.swiglu_limit);
    gemm_down_.run(h_);
    if (with_shared) {
      gemm_shared_gu_.run(h_);
      bench::swiglu_rows_kernel<<<1024, 256, 0, s_>>>(sgu_out_, sh_, T_, I,
                                                      c_.shared_swiglu_limit());
      gemm_shared_down_.run(h_);
    }
    bench::combine_kernel<<<1024, 256, 0, s_>>>(d_out_, s_out_, pos_, wts_, c_.topk, y_, T_, D);
    MOECHECK_CUDA_CHECK(cudaGetLastError());
  }
  std::vector<uint16_t> output() const {
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s_));
    return bench::to_host<uint16_t>(y_, static_cast<size_t>(T_ * c_.dim));
  }

 private:
  void free_buffers() {
    for (void* p : bufs_) MOECHECK_CUDA_CHECK(cudaFree(p));
    bufs_.clear();
  }
  template <class T>
  T* buf(int64_t n) {
    T* p = dev_alloc<T>(static_cast<size_t>(n));
    bufs_.push_back(p);
    return p;
  }

  MoeConfig c_;
  uint16_t *gu_ = nullptr, *down_ = nullptr, *sgu_ = nullptr, *sdown_ = nullptr;
  cublasHandle_t h_ = nullptr;
  cudaStream_t s_ = nullptr;
  std::vector<void*> bufs_;
  int64_t T_ = 0, P_ = 0;
  uint16_t *x_ = nullptr, *xg_ = nullptr, *gu_out_ = nullptr, *h_rows_ = nullptr;
  uint16_t *d_out_ = nullptr, *sgu_out_ = nullptr, *sh_ = nullptr, *s_out_ = nullptr;
  uint16_t* y_ = nullptr;
  int32_t *tok_ = nullptr, *pos_ = nullptr;
  float* wts_ = nullptr;
  bench::GemmList gemm_gu_, gemm_down_, gemm_shared_gu_, gemm_shared_down_;
};

void Baseline::prepare(const Routing& rt, const std::vector<uint16_t>& x) {
  const int64_t T = rt.tokens, K = rt.topk, E = c_.n_routed, D = c_.dim, I = c_.inter;
  free_buffers();
  T_ = T, P_ = T * K;
  // Pair rows sorted by expert, tokens ascending within an expert; pos[t][k] is the pair row of
  // the token's k-th pick.
  std::vector<std::vector<int32_t>> by_e(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) by_e[rt.ids[t * K + k]].push_back(static_cast<int32_t>(t));
  std::vector<int32_t> tok, pos(static_cast<size_t>(P_));
  std::vector<int64_t> first(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    first[e] = static_cast<int64_t>(tok.size());
    tok.insert(tok.end(), by_e[e].begin(), by_e[e].end());
  }
  std::vector<int64_t> seen(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = rt.ids[t * K + k];
      pos[t * K + k] = static_cast<int32_t>(first[e] + seen[e]++);
    }
  x_ = buf<uint16_t>(T * D), xg_ = buf<uint16_t>(P_ * D), gu_out_ = buf<uint16_t>(P_ * 2 * I);
  h_rows_ = buf<uint16_t>(P_ * I), d_out_ = buf<uint16_t>(P_ * D);
  sgu_out_ = buf<uint16_t>(T * 2 * I), sh_ = buf<uint16_t>(T * I), s_out_ = buf<uint16_t>(T * D);
  y_ = buf<uint16_t>(T * D), tok_ = buf<int32_t>(P_), pos_ = buf<int32_t>(P_);
  wts_ = buf<float>(P_);
  MOECHECK_CUDA_CHECK(cudaMemcpy(x_, x.data(), T * D * 2, cudaMemcpyHostToDevice));
  MOECHECK_CUDA_CHECK(cudaMemcpy(tok_, tok.data(), P_ * 4, cudaMemcpyHostToDevice));
  MOECHECK_CUDA_CHECK(cudaMemcpy(pos_, pos.data(), P_ * 4, cudaMemcpyHostToDevice));
  MOECHECK_CUDA_CHECK(cudaMemcpy(wts_, rt.weights.data(), P_ * 4, cudaMemcpyHostToDevice));
  std::vector<bench::GemmProblem> pg, pd;
  for (int64_t e = 0; e < E; ++e) {
    const int n = static_cast<int>(by_e[e].size());
    if (n == 0) continue;
    const int64_t f = first[e];
    pg.push_back({static_cast<int>(2 * I), n, static_cast<int>(D), gu_ + e * 2 * I * D, xg_ + f * D,
                  gu_out_ + f * 2 * I});
    pd.push_back({static_cast<int>(D), n, static_cast<int>(I), down_ + e * D * I, h_rows_ + f * I,
                  d_out_ + f * D});
  }
  gemm_gu_.set(pg);
  gemm_down_.set(pd);
  gemm_shared_gu_.set(
      {{static_cast<int>(2 * I), static_cast<int>(T), static_cast<int>(D), sgu_, x_, sgu_out_}});
  gemm_shared_down_.set(
      {{static_cast<int>(D), static_cast<int>(T), static_cast<int>(I), sdown_, sh_, s_out_}});
}

int64_t distinct_experts(const Routing& rt) {
  std::vector<int32_t> ids = rt.ids;
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

// Relative L2 distance of two bf16 vectors (a against b).
double rel_l2(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double{bf16_to_f32(a[i])} - double{bf16_to_f32(b[i])};
    num += d * d;
    den += double{bf16_to_f32(b[i])} * double{bf16_to_f32(b[i])};
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Row {
  int64_t T, U;
  double floor_us, layer_floor_us, dev_us, host_us, base_us, base_routed_us;
  double shared_us, shared_floor_us;
  std::string validated;
};

int reps_for(int64_t T) { return T <= 64 ? 50 : (T <= 512 ? 20 : 5); }

}  // namespace

namespace {

// Both routes' outputs against emu::MoeLayer, bitwise (exit 1 naming the first difference).
// Returns the emulation's wall time in seconds.
double validate(const LayerWeights& w, cuda::MoeLayer& dev, cuda::MoeLayer& host,
                const std::vector<uint16_t>& x, int64_t T) {
  const auto t0 = Clock::now();
  const std::vector<uint16_t> want = emu::MoeLayer(w).forward(x.data(), T);
  const double emu_s = secs(t0);
  const std::string at = " at T=" + std::to_string(T);
  bench::require_emu_bits("host-route layer output" + at, host.forward(x.data(), T), want);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(dev.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  dev.graph_forward(T, nullptr);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  bench::require_emu_bits("device-route graph output" + at, dev.device_output(), want);
  std::printf("  (emulation at T=%lld: %.1f s)\n", static_cast<long long>(T), emu_s);
  return emu_s;
}

// Ours: the device route's graph replay (events) and the host route's forward (wall clock).
void time_ours(cuda::MoeLayer& dev, cuda::MoeLayer& host, const std::vector<uint16_t>& x, int64_t T,
               Row& r) {
  const int reps = reps_for(T);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(dev.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  r.dev_us = 1e3 * bench::time_ms([&] { dev.graph_forward(T, nullptr); }, 2, reps, nullptr);
  for (int i = 0; i < 2; ++i) host.forward(x.data(), T);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    host.forward(x.data(), T);
    t.push_back(1e6 * secs(a));
  }
  r.host_us = bench::median(t);
}

// The shared expert alone: bf16_gemv_pair (gate, up) on x then bf16_gemv (down) on a bf16 h,
// event-timed on the baseline's copies of the layer's shared weights.
double time_shared(const Baseline& b, const MoeConfig& c, const std::vector<uint16_t>& x,
                   int64_t T) {
  const int64_t D = c.dim, I = c.inter;
  uint16_t* xd = dev_alloc<uint16_t>(x.size());
  uint16_t* hb = dev_alloc<uint16_t>(static_cast<size_t>(T * I));
  float* y = dev_alloc<float>(static_cast<size_t>(T * (2 * I + D)));
  MOECHECK_CUDA_CHECK(cudaMemcpy(xd, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  bench::fill_random(hb, static_cast<size_t>(T * I * 2), 99);
  // Random bits as bf16 include NaN / Inf: harmless for timing (no data-dependent branches).
  const double ms = bench::time_ms(
      [&] {
        cuda::bf16_gemv_pair(b.shared_gate_up(), b.shared_gate_up() + I * D, xd, y, y + T * I, I, D,
                             T, nullptr);
        cuda::bf16_gemv(b.shared_down(), hb, y + 2 * T * I, D, I, T, nullptr);
      },
      2, reps_for(T), nullptr);
  MOECHECK_CUDA_CHECK(cudaFree(xd));
  MOECHECK_CUDA_CHECK(cudaFree(hb));
  MOECHECK_CUDA_CHECK(cudaFree(y));
  return 1e3 * ms;
}

// The baseline at the layer's picks: its output near ours (else exit 1), then timed.
void time_baseline(Baseline& b, const Routing& rt, const std::vector<uint16_t>& x,
                   const std::vector<uint16_t>& ours, Row& r) {
  b.prepare(rt, x);
  b.forward(true);
  const double err = rel_l2(b.output(), ours);
  std::printf("  baseline vs ours at T=%lld: relative L2 %.3g (%s)\n", static_cast<long long>(r.T),
              err, b.grouped() ? "grouped GEMMs" : "GEMM loop");
  if (!(err < 0.1)) {
    std::fprintf(stderr, "bench: the cuBLAS baseline is not this layer (relative L2 %g)\n", err);
    std::exit(1);
  }
  const int reps = reps_for(r.T);
  r.base_us = 1e3 * bench::time_ms([&] { b.forward(true); }, 2, reps, b.stream());
  r.base_routed_us = 1e3 * bench::time_ms([&] { b.forward(false); }, 2, reps, b.stream());
}

double expert_bytes(const LayerWeights& w) {
  return static_cast<double>(w.gate_exps.expert_stride() + w.up_exps.expert_stride() +
                             w.down_exps.expert_stride());
}

double fixed_bytes(const LayerWeights& w) {  // router + shared expert
  double b = static_cast<double>(w.config.n_routed * w.config.dim * 2);
  for (const MatView* m : {&w.shared_gate, &w.shared_up, &w.shared_down})
    b += static_cast<double>(m->rows * m->row_stride());
  return b;
}

void print_table(const std::vector<Row>& rows, const MoeConfig& c, double copy, bool grouped) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("\n### batched_bench: ds41 layer, %s, %s, copy %.0f GB/s, baseline %s\n\n",
              bench::gpu_name().c_str(), date, copy,
              grouped ? "cublasGemmGroupedBatchedEx" : "cublasGemmEx loop");
  std::printf(
      "| T | distinct experts | floor us | layer floor us | ours device us | ours host us | "
      "ours / floor | baseline us | baseline routed us | baseline / ours | ours routed TFLOP/s | "
      "ours weight GB/s | shared GEMM us | shared floor us | validated |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double flops = 2.0 * r.T * c.topk * 3.0 * c.dim * c.inter;
    const double bytes = r.layer_floor_us * 1e-6 * copy * 1e9;  // the layer's weight bytes
    std::printf(
        "| %lld | %lld | %.1f | %.1f | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.1f | %.0f | "
        "%.1f | %.1f | %s |\n",
        static_cast<long long>(r.T), static_cast<long long>(r.U), r.floor_us, r.layer_floor_us,
        r.dev_us, r.host_us, r.dev_us / r.floor_us, r.base_us, r.base_routed_us,
        r.base_us / r.dev_us, flops / (r.dev_us * 1e-6) / 1e12, bytes / (r.dev_us * 1e-6) / 1e9,
        r.shared_us, r.shared_floor_us, r.validated.c_str());
  }
}

struct Ctx {
  const LayerWeights& w;
  cuda::MoeLayer &dev, &host;
  Baseline& base;
  double copy;
  Clock::time_point start;
};

// One token count: validation (when the emulation's estimated time allows), ours, the routing
// and floor, the baseline, the shared expert alone. emu_per_token_s: the emulation's measured
// seconds per token, updated by each validation.
Row run_tokens(Ctx& k, int64_t T, double& emu_per_token_s) {
  const MoeConfig& c = k.w.config;
  const std::vector<uint16_t> x = generate_input(static_cast<uint64_t>(3000 + T), T, c.dim);
  Row r{};
  r.T = T;
  const double emu_est = emu_per_token_s * static_cast<double>(T);
  if (T <= 64 || (T <= 512 && emu_est < 30.0)) {
    emu_per_token_s = validate(k.w, k.dev, k.host, x, T) / static_cast<double>(T);
    r.validated = "bitwise";
  } else {
    std::printf(
        "  T=%lld NOT validated against the emulation (estimated %.0f s on this host); "
        "timed only\n",
        static_cast<long long>(T), emu_est);
    r.validated = "no (emulation too slow)";
  }
  time_ours(k.dev, k.host, x, T, r);
  MOECHECK_CUDA_CHECK(
      cudaMemcpy(k.dev.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  k.dev.graph_forward(T, nullptr);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  const Routing rt = k.dev.device_routing(T);
  const std::vector<uint16_t> ours =
      bench::to_host<uint16_t>(k.dev.device_output(), static_cast<size_t>(T * c.dim));
  r.U = distinct_experts(rt);
  r.floor_us = static_cast<double>(r.U) * expert_bytes(k.w) / (k.copy * 1e9) * 1e6;
  r.layer_floor_us = r.floor_us + fixed_bytes(k.w) / (k.copy * 1e9) * 1e6;
  time_baseline(k.base, rt, x, ours, r);
  r.shared_us = time_shared(k.base, c, x, T);
  r.shared_floor_us =
      (fixed_bytes(k.w) - static_cast<double>(c.n_routed * c.dim * 2)) / (k.copy * 1e9) * 1e6;
  std::printf(
      "T=%lld: %lld distinct experts, floor %.1f us, ours %.1f us (device) %.1f us "
      "(host), baseline %.1f us (routed %.1f), shared GEMM %.1f us; at %.1f s\n",
      static_cast<long long>(T), static_cast<long long>(r.U), r.floor_us, r.dev_us, r.host_us,
      r.base_us, r.base_routed_us, r.shared_us, secs(k.start));
  return r;
}

// Layer settings swept at every T: device-route graph replays (events), each setting's output
// first required bitwise equal to the default layer's (`dev`; no bit depends on these settings;
// exit 1 if one does). The settings run in the order given, so a list that repeats one (A, B, A)
// shows the drift between them.
struct Setting {
  std::string name;
  cuda::LayerOptions lo;
  int router_resident = -1;  // cuda::set_router_gemm_resident before the layer (-1: leave it)
  int accumulate4 = -1;      // cuda::set_accumulate_vector before the layer (-1: leave it)
};

void sweep_settings(const LayerWeights& w, cuda::MoeLayer& dev, const std::vector<int64_t>& Ts,
                    const std::vector<Setting>& settings, const char* title) {
  std::vector<std::vector<double>> us;
  for (const Setting& st : settings) {
    // Read when the layer's graphs are captured (its first graph_forward at each T).
    if (st.router_resident >= 0) cuda::set_router_gemm_resident(st.router_resident != 0);
    if (st.accumulate4 >= 0) cuda::set_accumulate_vector(st.accumulate4 != 0);
    cuda::MoeLayer layer(w, st.lo);
    std::vector<double> row;
    for (const int64_t T : Ts) {
      const std::vector<uint16_t> x =
          generate_input(static_cast<uint64_t>(3000 + T), T, w.config.dim);
      const size_t n = static_cast<size_t>(T * w.config.dim);
      std::vector<uint16_t> got, want;
      for (cuda::MoeLayer* l : {&layer, &dev}) {
        MOECHECK_CUDA_CHECK(
            cudaMemcpy(l->device_input(T), x.data(), n * 2, cudaMemcpyHostToDevice));
        l->graph_forward(T, nullptr);
        MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
        (l == &layer ? got : want) = bench::to_host<uint16_t>(l->device_output(), n);
      }
      if (got != want) {
        std::fprintf(stderr, "bench: %s changes the output at T=%lld\n", st.name.c_str(),
                     static_cast<long long>(T));
        std::exit(1);
      }
      row.push_back(
          1e3 * bench::time_ms([&] { layer.graph_forward(T, nullptr); }, 2, reps_for(T), nullptr));
    }
    us.push_back(row);
    std::printf("%s: outputs equal to the default's at every T\n", st.name.c_str());
  }
  std::printf("\n### batched_bench: %s (device route, graph replay, us)\n\n| T |", title);
  for (const Setting& st : settings) std::printf(" %s |", st.name.c_str());
  std::printf("\n|---|");
  for (size_t j = 0; j < settings.size(); ++j) std::printf("---|");
  std::printf("\n");
  for (size_t i = 0; i < Ts.size(); ++i) {
    std::printf("| %lld |", static_cast<long long>(Ts[i]));
    for (size_t j = 0; j < us.size(); ++j) std::printf(" %.1f |", us[j][i]);
    std::printf("\n");
  }
}

// The MMVQ / MMQ split (cuda::LayerOptions::mmvq_max_rows: experts with at most that many pairs
// on MMVQ). -1 is the default (cuda::kMmvqRowsAuto: 8 up to 8 tokens, cuda::kBatchedMmvqMaxRows
// above).
void sweep_split(const LayerWeights& w, cuda::MoeLayer& dev, const std::vector<int64_t>& Ts,
                 const std::vector<int>& values) {
  std::vector<Setting> settings;
  for (const int mr : values) {
    Setting st{mr == cuda::kMmvqRowsAuto ? std::string("default (auto)")
                                         : "mmvq_max_rows " + std::to_string(mr),
               {}};
    st.lo.route = RoutePlace::kDevice;
    st.lo.mmvq_max_rows = mr;
    settings.push_back(st);
  }
  sweep_settings(w, dev, Ts, settings, "the MMVQ / MMQ split");
}

// The MMQ launches on a stream of their own beside the MMVQ launches
// (cuda::LayerOptions::mmq_beside 0 / 1 / 2), each in the order 0, 1, 2, 0, 1, 2.
void sweep_beside(const LayerWeights& w, cuda::MoeLayer& dev, const std::vector<int64_t>& Ts) {
  std::vector<Setting> settings;
  for (int pass = 0; pass < 2; ++pass)
    for (const int b : {0, 1, 2}) {
      Setting st{"mmq_beside " + std::to_string(b), {}};
      st.lo.route = RoutePlace::kDevice;
      st.lo.mmq_beside = b;
      settings.push_back(st);
    }
  sweep_settings(w, dev, Ts, settings, "the MMQ launches beside the MMVQ launches");
}

// The default layer's graph output bitwise equal to the emulation's (exit 1 otherwise) at each T
// of Ts up to max_T, on the inputs sweep_settings times (seed 3000 + T), before a sweep whose
// settings sweep_settings then requires equal to that layer; a T above max_T is named as compared
// with the default layer only (the emulation too slow there, as in the table's rows).
void require_default_equals_emu(const LayerWeights& w, cuda::MoeLayer& dev,
                                const std::vector<int64_t>& Ts, const char* sweep,
                                int64_t max_T = std::numeric_limits<int64_t>::max()) {
  const emu::MoeLayer ref(w);
  for (const int64_t T : Ts) {
    if (T > max_T) {
      std::printf(
          "  %s: T=%lld NOT validated against the emulation (too slow); its settings are "
          "compared with the default layer only\n",
          sweep, static_cast<long long>(T));
      continue;
    }
    const std::vector<uint16_t> x =
        generate_input(static_cast<uint64_t>(3000 + T), T, w.config.dim);
    const std::vector<uint16_t> want = ref.forward(x.data(), T);
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(dev.device_input(T), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    dev.graph_forward(T, nullptr);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
    bench::require_emu_bits(std::string(sweep) + ": default graph output at T=" + std::to_string(T),
                            dev.device_output(), want);
  }
}

// The thirty-fourth session's two launches against their former forms: the staged router's GEMM
// above 8 tokens in its persistent form (cuda::set_router_gemm_resident) and the accumulation
// four elements a thread (cuda::set_accumulate_vector), both on (the defaults), both off, the
// router's alone off; in the order on, off, router off, on, off. The default layer is first
// required equal to the emulation at every T.
void sweep_router(const LayerWeights& w, cuda::MoeLayer& dev, const std::vector<int64_t>& Ts) {
  require_default_equals_emu(w, dev, Ts, "router sweep");
  std::vector<Setting> settings;
  const struct {
    const char* name;
    int r, a;
  } forms[] = {{"both new (default)", 1, 1},
               {"both former", 0, 0},
               {"router GEMM a block a tile", 0, 1},
               {"both new (default)", 1, 1},
               {"both former", 0, 0}};
  for (const auto& f : forms) {
    Setting st{f.name, {}, f.r, f.a};
    st.lo.route = RoutePlace::kDevice;
    settings.push_back(st);
  }
  sweep_settings(w, dev, Ts, settings, "the router GEMM's and the accumulation's forms");
  cuda::set_router_gemm_resident(true);
  cuda::set_accumulate_vector(true);
}

// The engines of the batched layers' launches: the MMVQ groups on the dp4a kernel
// (cuda::set_mmvq_stream_layer_tokens(8)) or the streamed engine (the default), Q2_K's alone
// either way (the type-limited setter), the streamed passes of one or two tokens
// (cuda::set_mmvq_stream_pass_shape); device-route graph replays (events) at each T, each output
// first required bitwise equal to emu::MoeLayer's (exit 1 naming the first difference).
void sweep_stream_limit(const LayerWeights& w, const std::vector<int64_t>& Ts) {
  struct Config {
    const char* name;
    int64_t limit;      // cuda::set_mmvq_stream_layer_tokens, both types (0: the default)
    int64_t q2k_limit;  // then Q2_K's alone (-1: leave the default)
    int pass_tokens;
    bool whole_sm;
    int warps;  // cuda::set_mmvq_stream_shape (0: the default 16)
  };
  constexpr int64_t kEvery = std::numeric_limits<int64_t>::max();
  const Config configs[] = {{"dp4a kernel for every groups launch", 8, -1, 0, false, 0},
                            {"default", 0, -1, 0, false, 0},
                            {"Q2_K streamed at every T", 0, kEvery, 0, false, 0},
                            {"Q2_K on dp4a above 8 tokens", 0, 8, 0, false, 0},
                            {"Q2_K streamed up to 384 tokens", 0, 384, 0, false, 0},
                            {"streamed, 1 token a pass", 0, -1, 1, false, 0},
                            {"streamed, 2 tokens a pass", 0, -1, 2, false, 0}};
  std::vector<std::vector<uint16_t>> xs, wants;
  for (const int64_t T : Ts) {
    xs.push_back(generate_input(static_cast<uint64_t>(3000 + T), T, w.config.dim));
    const auto t0 = Clock::now();
    wants.push_back(emu::MoeLayer(w).forward(xs.back().data(), T));
    std::printf("  (emulation at T=%lld: %.1f s)\n", static_cast<long long>(T), secs(t0));
  }
  std::vector<std::vector<double>> us;
  for (const Config& cf : configs) {
    cuda::set_mmvq_stream_layer_tokens(cf.limit);
    if (cf.q2k_limit >= 0) cuda::set_mmvq_stream_layer_tokens(cf.q2k_limit, GgmlType::kQ2K);
    cuda::set_mmvq_stream_pass_shape(cf.pass_tokens, cf.whole_sm);
    cuda::set_mmvq_stream_shape(cf.warps, 0);
    std::vector<double> row;
    for (size_t i = 0; i < Ts.size(); ++i) {
      const int64_t T = Ts[i];
      // A new layer: graph_forward captures its graph once per T, with the engine of that time.
      cuda::LayerOptions lo;
      lo.route = RoutePlace::kDevice;
      cuda::MoeLayer layer(w, lo);
      MOECHECK_CUDA_CHECK(cudaMemcpy(layer.device_input(T), xs[i].data(), xs[i].size() * 2,
                                     cudaMemcpyHostToDevice));
      layer.graph_forward(T, nullptr);
      MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
      bench::require_emu_bits(std::string(cf.name) + " graph output at T=" + std::to_string(T),
                              layer.device_output(), wants[i]);
      row.push_back(
          1e3 * bench::time_ms([&] { layer.graph_forward(T, nullptr); }, 2, reps_for(T), nullptr));
      std::printf("%s, T=%lld: %.1f us (output bitwise equal to the emulation)\n", cf.name,
                  static_cast<long long>(T), row.back());
    }
    us.push_back(row);
  }
  cuda::set_mmvq_stream_layer_tokens(0);
  cuda::set_mmvq_stream_pass_shape(0, false);
  cuda::set_mmvq_stream_shape(0, 0);
  std::printf(
      "\n### batched_bench: the batched launches' engines (device route, graph replay, us)\n\n| T "
      "|");
  for (const Config& cf : configs) std::printf(" %s |", cf.name);
  std::printf("\n|---|");
  for (size_t j = 0; j < us.size(); ++j) std::printf("---|");
  std::printf("\n");
  for (size_t i = 0; i < Ts.size(); ++i) {
    std::printf("| %lld |", static_cast<long long>(Ts[i]));
    for (size_t j = 0; j < us.size(); ++j) std::printf(" %.1f |", us[j][i]);
    std::printf("\n");
  }
}

// The token counts after a mode's name (`batched_bench MODE [T ...]`), or `dflt` when none.
std::vector<int64_t> mode_tokens(int argc, char** argv, std::vector<int64_t> dflt) {
  std::vector<int64_t> Ts;
  for (int i = 2; i < argc; ++i) Ts.push_back(std::stoll(argv[i]));
  return Ts.empty() ? dflt : Ts;
}

}  // namespace

// `batched_bench`: the table and the split sweep; `batched_bench engine`: only the engine sweep
// (sweep_stream_limit) at T = 64, 128, 256, 512 and 4096, or at the T given after it;
// `batched_bench split [T ...]`: only the split sweep, every setting from 0 to 8 and the default,
// at T = 16, 64, 128, 256, 512 and 4096 or at the T given; `batched_bench beside [T ...]`: only
// the MMQ-beside sweep (sweep_beside), at T = 16, 64, 128, 256 and 512 or at the T given;
// `batched_bench router [T ...]`: only the router GEMM's and the accumulation's forms
// (sweep_router), at T = 16, 64 and 512 or at the T given. The three sweeps first require the
// default layer equal to the emulation (require_default_equals_emu; the default mode's split
// sweep follows the table, whose rows did that).
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a failed check's exit(1) keeps every line printed
  const auto start = Clock::now();
  const double copy = bench::copy_bandwidth_gbs();
  std::printf("GPU: %s\ndevice-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 25)\n",
              bench::gpu_name().c_str(), copy);
  const LayerWeights w = generate_layer(preset_options("ds41"), 0);
  const MoeConfig& c = w.config;
  std::printf("generated ds41 layer 0 (fast blocks) at %.1f s\n", secs(start));
  cuda::LayerOptions lo;
  if (argc > 1 && std::string(argv[1]) == "engine") {
    sweep_stream_limit(w, mode_tokens(argc, argv, {64, 128, 256, 512, 4096}));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "split") {
    const std::vector<int64_t> Ts = mode_tokens(argc, argv, {16, 64, 128, 256, 512, 4096});
    lo.route = RoutePlace::kDevice;
    cuda::MoeLayer dev(w, lo);
    require_default_equals_emu(w, dev, Ts, "split sweep", 512);
    sweep_split(w, dev, Ts, {cuda::kMmvqRowsAuto, 8, 7, 6, 5, 4, 3, 2, 1, 0});
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "beside") {
    const std::vector<int64_t> Ts = mode_tokens(argc, argv, {16, 64, 128, 256, 512});
    lo.route = RoutePlace::kDevice;
    cuda::MoeLayer dev(w, lo);
    require_default_equals_emu(w, dev, Ts, "beside sweep", 512);
    sweep_beside(w, dev, Ts);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "router") {
    const std::vector<int64_t> Ts = mode_tokens(argc, argv, {16, 64, 512});
    lo.route = RoutePlace::kDevice;
    cuda::MoeLayer dev(w, lo);
    sweep_router(w, dev, Ts);
    return 0;
  }
  cuda::MoeLayer host(w, lo);
  lo.route = RoutePlace::kDevice;
  cuda::MoeLayer dev(w, lo);
  Baseline base(w);
  std::printf(
      "baseline: bf16 experts (dequantised once, not timed), gather + cuBLAS GEMMs + "
      "SwiGLU + shared expert + weighted sum, the layer's picks; no router, no top-k\n");
  std::printf("uploaded two layers (host and device route), dequantised the baseline at %.1f s\n",
              secs(start));
  Ctx ctx{w, dev, host, base, copy, start};
  std::vector<Row> rows;
  double emu_per_token_s = 0;
  int rc = 0;
  for (const int64_t T : {16, 64, 512, 4096}) {
    try {
      rows.push_back(run_tokens(ctx, T, emu_per_token_s));
    } catch (const std::exception& e) {  // an InputError of the layer: report, keep the rest
      std::printf("T=%lld failed: %s\n", static_cast<long long>(T), e.what());
      rc = 1;
    }
  }
  print_table(rows, c, copy, base.grouped());
  sweep_split(w, dev, {16, 64, 512, 4096}, {cuda::kMmvqRowsAuto, 8, 4, 2, 1, 0});
  return rc;
}
