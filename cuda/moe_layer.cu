// cuda::MoeLayer: the token path of one MoE layer on the GPU (see cuda/moe_layer.h). The host
// route: the router logits come back, route_from_logits picks the experts, and one packed plan
// (slot table, MMVQ groups, accumulation rows and weights) goes up in one copy. Routed pairs
// (expert, token) are numbered p in ascending expert id, then ascending token, as the
// emulation's taps list them. Contract: docs/numerics.md; twin: emu::MoeLayer.
#include "cuda/moe_layer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "core/error.h"
#include "core/routing.h"

namespace moecheck::cuda {
namespace {

// A device allocation that grows on demand (contents not kept).
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  bool reserve(size_t n) {  // true when the buffer moved
    if (n <= bytes) return false;
    if (p != nullptr) MOECHECK_CUDA_CHECK(cudaFree(p));
    MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
    bytes = n;
    return true;
  }
  template <class T> T* as() const { return static_cast<T*>(p); }
  ~DevBuf() { if (p != nullptr) (void)cudaFree(p); }
};

struct PinnedBuf {
  void* p = nullptr;
  size_t bytes = 0;
  bool reserve(size_t n) {  // true when the buffer moved
    if (n <= bytes) return false;
    if (p != nullptr) MOECHECK_CUDA_CHECK(cudaFreeHost(p));
    MOECHECK_CUDA_CHECK(cudaMallocHost(&p, n));
    bytes = n;
    return true;
  }
  template <class T> T* as() const { return static_cast<T*>(p); }
  ~PinnedBuf() { if (p != nullptr) (void)cudaFreeHost(p); }
};

std::string where(const LayerWeights& w, const std::string& what) {
  return "cuda::MoeLayer: layer " + std::to_string(w.layer) + ", " + what;
}

void check_mat(const LayerWeights& w, const std::string& name, bool quant, GgmlType type, const void* data,
               int64_t rows, int64_t cols, int64_t want_rows, int64_t want_cols) {
  const bool type_ok = quant ? (type == GgmlType::kQ2K || type == GgmlType::kQ3K) : type == GgmlType::kBF16;
  if (!type_ok || data == nullptr || rows != want_rows || cols != want_cols)
    throw InputError(where(w, name) + ": expected " + (quant ? "Q2_K/Q3_K" : "BF16") + " [" +
                     std::to_string(want_rows) + ", " + std::to_string(want_cols) + "], found type " +
                     std::to_string(static_cast<uint32_t>(type)) + " [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]" + (data == nullptr ? " with no data" : ""));
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

template <class T>
void copy_back(std::vector<T>& v, const void* d, size_t n, cudaStream_t s) {
  v.resize(n);
  if (n > 0) MOECHECK_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
}

}  // namespace

struct MoeLayer::Impl {
  LayerWeights w;
  LayerOptions o;
  bool dense_shared = true;
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t ev_in = nullptr, ev_out = nullptr;
  DevBuf router, gate_exps, up_exps, down_exps, sh_gate, sh_up, sh_down;
  // Scratch, sized for the largest T seen.
  DevBuf x, x_q8, logits, plan, gu, h, h_q8, down, sg, su, sh, shb, sh_q8, sd, acc, y;
  PinnedBuf h_x, h_logits, h_plan, h_y;
  // Captured launch sequences keyed by (phase, shape...): 0 = before routing (T), 1 = shared
  // expert (T), 2 = routed experts (P, U and max group, groups, plan bytes).
  using GraphKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, size_t>;
  std::map<GraphKey, cudaGraphExec_t> graphs;

  // fn(s) launched directly, or (use_graphs) captured once per key and replayed.
  template <class F>
  void launch(const GraphKey& key, cudaStream_t s, F fn) {
    if (!o.use_graphs) {
      fn(s);
      return;
    }
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      cudaGraph_t g = nullptr;
      MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      fn(s);
      MOECHECK_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t ge = nullptr;
      MOECHECK_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      MOECHECK_CUDA_CHECK(cudaGraphDestroy(g));
      it = graphs.emplace(key, ge).first;
    }
    MOECHECK_CUDA_CHECK(cudaGraphLaunch(it->second, s));
  }

  void upload(DevBuf& d, const void* src, size_t n) {
    d.reserve(n);
    MOECHECK_CUDA_CHECK(cudaMemcpy(d.p, src, n, cudaMemcpyHostToDevice));
  }
  ~Impl() {
    for (auto& kv : graphs) (void)cudaGraphExecDestroy(kv.second);
    if (ev_in != nullptr) (void)cudaEventDestroy(ev_in);
    if (ev_out != nullptr) (void)cudaEventDestroy(ev_out);
    if (side != nullptr) (void)cudaStreamDestroy(side);
    if (main != nullptr) (void)cudaStreamDestroy(main);
  }

  void shared_expert(int64_t T, cudaStream_t s);
  void routed(int64_t P, int64_t n_gu, int64_t n_down, size_t plan_bytes, size_t off_slots,
              size_t off_groups, int64_t n_gate_groups, int max_n);
};

MoeLayer::MoeLayer(const LayerWeights& w, LayerOptions o) : impl_(new Impl) {
  Impl& m = *impl_;
  m.w = w;
  m.o = o;
  const MoeConfig& c = w.config;
  c.validate(where(w, "config"));
  if (!expert_warps_allowed(o.expert_warps))
    throw InputError(where(w, "options") + ": expert_warps must be 2, 4 or 8, found " + std::to_string(o.expert_warps));
  if (w.router == nullptr || w.bias == nullptr) throw InputError(where(w, "ffn_gate_inp / exp_probs_b") + ": missing");
  for (const ExpertStackView* s : {&w.gate_exps, &w.up_exps, &w.down_exps}) {
    const bool dn = s == &w.down_exps;
    const std::string name = dn ? "ffn_down_exps" : (s == &w.gate_exps ? "ffn_gate_exps" : "ffn_up_exps");
    check_mat(w, name, true, s->type, s->data, s->rows, s->cols, dn ? c.dim : c.inter, dn ? c.inter : c.dim);
    if (s->n_experts < c.n_routed)
      throw InputError(where(w, name) + ": expected " + std::to_string(c.n_routed) + " experts, found " +
                       std::to_string(s->n_experts));
  }
  m.dense_shared = w.shared_gate.type == GgmlType::kBF16;
  check_mat(w, "ffn_gate_shexp", !m.dense_shared, w.shared_gate.type, w.shared_gate.data, w.shared_gate.rows,
            w.shared_gate.cols, c.inter, c.dim);
  check_mat(w, "ffn_up_shexp", !m.dense_shared, w.shared_up.type, w.shared_up.data, w.shared_up.rows,
            w.shared_up.cols, c.inter, c.dim);
  check_mat(w, "ffn_down_shexp", !m.dense_shared, w.shared_down.type, w.shared_down.data, w.shared_down.rows,
            w.shared_down.cols, c.dim, c.inter);
  std::string why;
  if (!device_available(&why)) throw InputError(where(w, "device") + ": " + why);
  int n_dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDeviceCount(&n_dev));
  if (o.device < 0 || o.device >= n_dev)
    throw InputError(where(w, "options") + ": device " + std::to_string(o.device) + " not in [0, " +
                     std::to_string(n_dev) + ")");
  MOECHECK_CUDA_CHECK(cudaSetDevice(o.device));
  // The main stream (router, routed experts) outranks the side stream (shared expert): the
  // critical path gets the SMs first and the shared expert fills what is left.
  int prio_low = 0, prio_high = 0;
  MOECHECK_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&m.main, cudaStreamNonBlocking, prio_high));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&m.side, cudaStreamNonBlocking, prio_low));
  MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&m.ev_in, cudaEventDisableTiming));
  MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&m.ev_out, cudaEventDisableTiming));
  m.upload(m.router, w.router, static_cast<size_t>(c.n_routed * c.dim) * 2);
  // Only the first n_routed experts are read; each stack is one allocation here, but the
  // kernels see experts only through the slot table (the expert cache will hand out slots).
  for (auto [d, s] : {std::pair{&m.gate_exps, &w.gate_exps}, {&m.up_exps, &w.up_exps}, {&m.down_exps, &w.down_exps}})
    m.upload(*d, s->data, static_cast<size_t>(s->expert_stride() * c.n_routed));
  for (auto [d, s] : {std::pair{&m.sh_gate, &w.shared_gate}, {&m.sh_up, &w.shared_up}, {&m.sh_down, &w.shared_down}})
    m.upload(*d, s->data, static_cast<size_t>(s->rows * s->row_stride()));
}

MoeLayer::~MoeLayer() = default;

const LayerOptions& MoeLayer::options() const { return impl_->o; }

// The shared expert on all T tokens (stream s), reading x / x_q8, writing sd.
void MoeLayer::Impl::shared_expert(int64_t T, cudaStream_t s) {
  const MoeConfig& c = w.config;
  if (dense_shared) {
    bf16_gemv_pair(sh_gate.as<uint16_t>(), sh_up.as<uint16_t>(), x.as<uint16_t>(), sg.as<float>(), su.as<float>(),
                   c.inter, c.dim, T, s);
    swiglu_bf16(sg.as<float>(), su.as<float>(), sh.as<float>(), shb.as<uint16_t>(), T, c.inter, c.swiglu_limit, s);
    bf16_gemv(sh_down.as<uint16_t>(), shb.as<uint16_t>(), sd.as<float>(), c.dim, c.inter, T, s);
  } else {
    const int ew = o.expert_warps;
    mmvq(w.shared_gate.type, sh_gate.as<uint8_t>(), x_q8.as<BlockQ8_1>(), sg.as<float>(), c.inter, c.dim, T, ew, s);
    mmvq(w.shared_up.type, sh_up.as<uint8_t>(), x_q8.as<BlockQ8_1>(), su.as<float>(), c.inter, c.dim, T, ew, s);
    swiglu_q8(sg.as<float>(), su.as<float>(), sh.as<float>(), sh_q8.as<BlockQ8_1>(), T, c.inter, c.swiglu_limit, s);
    mmvq(w.shared_down.type, sh_down.as<uint8_t>(), sh_q8.as<BlockQ8_1>(), sd.as<float>(), c.dim, c.inter, T, ew, s);
  }
}

// Plan upload, gate/up MMVQ, SwiGLU + q8_1, down MMVQ on the main stream (graph-capturable).
void MoeLayer::Impl::routed(int64_t P, int64_t n_gu, int64_t n_down, size_t plan_bytes, size_t off_slots,
                            size_t off_groups, int64_t n_gate_groups, int max_n) {
  const MoeConfig& c = w.config;
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(plan.p, h_plan.p, plan_bytes, cudaMemcpyHostToDevice, main));
  const auto* slots = reinterpret_cast<const uint8_t* const*>(plan.as<uint8_t>() + off_slots);
  const auto* groups = reinterpret_cast<const MmvqGroup*>(plan.as<uint8_t>() + off_groups);
  const int ew = o.expert_warps;
  if (w.gate_exps.type == w.up_exps.type) {  // gate and up of every selected expert: one launch
    mmvq_groups(w.gate_exps.type, slots, groups, n_gu, max_n, x_q8.as<BlockQ8_1>(), gu.as<float>(), c.inter, c.dim, ew, main);
  } else {
    mmvq_groups(w.gate_exps.type, slots, groups, n_gate_groups, max_n, x_q8.as<BlockQ8_1>(), gu.as<float>(), c.inter,
                c.dim, ew, main);
    mmvq_groups(w.up_exps.type, slots, groups + n_gate_groups, n_gu - n_gate_groups, max_n, x_q8.as<BlockQ8_1>(),
                gu.as<float>(), c.inter, c.dim, ew, main);
  }
  swiglu_q8(gu.as<float>(), gu.as<float>() + P * c.inter, h.as<float>(), h_q8.as<BlockQ8_1>(), P, c.inter,
            c.swiglu_limit, main);
  mmvq_groups(w.down_exps.type, slots, groups + n_gu, n_down, max_n, h_q8.as<BlockQ8_1>(), down.as<float>(), c.dim,
              c.inter, ew, main);
}

std::vector<uint16_t> MoeLayer::forward(const uint16_t* xin, int64_t T, LayerTaps* taps, LayerTiming* timing) {
  Impl& m = *impl_;
  const MoeConfig& c = m.w.config;
  const int64_t dim = c.dim, inter = c.inter, E = c.n_routed, K = c.topk;
  if (T < 0) throw InputError(where(m.w, "input") + ": negative token count " + std::to_string(T));
  if (T == 0) return {};
  const auto t_start = std::chrono::steady_clock::now();
  MOECHECK_CUDA_CHECK(cudaSetDevice(m.o.device));
  const int64_t P = T * K;  // routed (expert, token) pairs: picks are distinct per token
  // Scratch (grows only; a move invalidates the captured graphs, which hold raw pointers).
  bool moved = false;
  auto need = [&moved](auto& buf, int64_t n) { moved |= buf.reserve(static_cast<size_t>(n)); };
  need(m.x, T * dim * 2);
  need(m.x_q8, T * dim / kQK8_1 * int64_t{sizeof(BlockQ8_1)});
  need(m.logits, T * E * 4);
  need(m.gu, 2 * P * inter * 4);
  need(m.h, P * inter * 4);
  need(m.h_q8, P * inter / kQK8_1 * int64_t{sizeof(BlockQ8_1)});
  need(m.down, P * dim * 4);
  for (DevBuf* b : {&m.sg, &m.su, &m.sh}) need(*b, T * inter * 4);
  need(m.shb, T * inter * 2);
  need(m.sh_q8, T * inter / kQK8_1 * int64_t{sizeof(BlockQ8_1)});
  for (DevBuf* b : {&m.sd, &m.acc}) need(*b, T * dim * 4);
  need(m.y, T * dim * 2);
  need(m.h_x, T * dim * 2);
  need(m.h_logits, T * E * 4);
  need(m.h_y, T * dim * 2);

  // 1. Input up, q8_1 of x, the router and the logits down on the main stream; then the shared
  // expert forks off to the side stream and runs while the host routes.
  std::memcpy(m.h_x.p, xin, T * dim * 2);
  m.launch({0, T, 0, 0, 0, 0}, m.main, [&](cudaStream_t s) {
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(m.x.p, m.h_x.p, T * dim * 2, cudaMemcpyHostToDevice, s));
    quantize_q8_1_bf16(m.x.as<uint16_t>(), m.x_q8.as<BlockQ8_1>(), T, dim, s);
    router_gemv(m.o.router, m.router.as<uint16_t>(), m.x.as<uint16_t>(), m.logits.as<float>(), E, dim, T, s);
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(m.h_logits.p, m.logits.p, T * E * 4, cudaMemcpyDeviceToHost, s));
  });
  if (m.o.shared_side_stream) {
    MOECHECK_CUDA_CHECK(cudaEventRecord(m.ev_in, m.main));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(m.side, m.ev_in, 0));
    m.launch({1, T, 0, 0, 0, 0}, m.side, [&](cudaStream_t s) { m.shared_expert(T, s); });
    MOECHECK_CUDA_CHECK(cudaEventRecord(m.ev_out, m.side));
  }
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(m.main));

  // 2. Host route and the plan.
  const Routing rt = route_from_logits(m.h_logits.as<float>(), T, m.w.bias, c, m.w.layer);
  std::vector<std::vector<int32_t>> tok_of(static_cast<size_t>(E));  // picks of expert e: tokens ascending
  for (int64_t i = 0; i < P; ++i) tok_of[rt.ids[i]].push_back(static_cast<int32_t>(i / K));
  std::vector<int32_t> used;  // experts in ascending id
  std::vector<int64_t> p_first(static_cast<size_t>(E), -1);
  int64_t p = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (tok_of[e].empty()) continue;
    used.push_back(static_cast<int32_t>(e));
    p_first[e] = p;
    p += static_cast<int64_t>(tok_of[e].size());
  }
  const int64_t U = static_cast<int64_t>(used.size());
  int max_n = 1;  // the largest group: sizes the MMVQ launches' shared memory
  for (int32_t e : used) max_n = std::max(max_n, static_cast<int>(std::min<size_t>(tok_of[e].size(), kMaxGroupRows)));
  std::vector<MmvqGroup> gate_g, up_g, down_g;
  for (int64_t u = 0; u < U; ++u) {
    const auto& toks = tok_of[used[u]];
    const int64_t n_e = static_cast<int64_t>(toks.size());
    for (int64_t s0 = 0; s0 < n_e; s0 += kMaxGroupRows) {
      MmvqGroup gg, ug, dg;
      gg.slot = static_cast<int32_t>(u);
      ug.slot = static_cast<int32_t>(U + u);
      dg.slot = static_cast<int32_t>(2 * U + u);
      gg.n = ug.n = dg.n = static_cast<int32_t>(std::min<int64_t>(kMaxGroupRows, n_e - s0));
      for (int32_t i = 0; i < gg.n; ++i) {
        const int32_t pp = static_cast<int32_t>(p_first[used[u]] + s0 + i);
        gg.a_row[i] = ug.a_row[i] = toks[s0 + i];
        gg.y_row[i] = pp;
        ug.y_row[i] = static_cast<int32_t>(P) + pp;
        dg.a_row[i] = dg.y_row[i] = pp;
      }
      gate_g.push_back(gg);
      up_g.push_back(ug);
      down_g.push_back(dg);
    }
  }
  // Accumulation: pick_row[t * K + k] is the pair row of pick k of token t; each token's
  // rows and weights are then listed in ascending expert id.
  std::vector<int32_t> pick_row(static_cast<size_t>(P)), acc_rows(static_cast<size_t>(P));
  std::vector<float> acc_w(static_cast<size_t>(P));
  std::vector<int64_t> cursor(p_first);
  for (int32_t e : used) {
    for (int32_t t : tok_of[e]) {
      int64_t k = 0;
      while (rt.ids[t * K + k] != e) ++k;
      pick_row[t * K + k] = static_cast<int32_t>(cursor[e]++);
    }
  }
  std::vector<int64_t> ord(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) ord[k] = k;
    std::sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return rt.ids[t * K + a] < rt.ids[t * K + b]; });
    for (int64_t k = 0; k < K; ++k) {
      acc_rows[t * K + k] = pick_row[t * K + ord[k]];
      acc_w[t * K + k] = rt.weights[t * K + ord[k]];
    }
  }
  const int64_t n_gate = static_cast<int64_t>(gate_g.size());
  const int64_t n_gu = 2 * n_gate, n_down = n_gate;
  const size_t off_slots = 0;
  const size_t off_groups = align_up(3 * U * sizeof(void*), 16);
  const size_t off_rows = align_up(off_groups + (n_gu + n_down) * sizeof(MmvqGroup), 16);
  const size_t off_w = align_up(off_rows + P * 4, 16);
  const size_t plan_bytes = off_w + P * 4;
  need(m.h_plan, static_cast<int64_t>(plan_bytes));
  need(m.plan, static_cast<int64_t>(plan_bytes));
  if (moved) {
    for (auto& kv : m.graphs) MOECHECK_CUDA_CHECK(cudaGraphExecDestroy(kv.second));
    m.graphs.clear();
  }
  auto* hp = m.h_plan.as<uint8_t>();
  auto* slots = reinterpret_cast<const uint8_t**>(hp + off_slots);
  for (int64_t u = 0; u < U; ++u) {
    slots[u] = m.gate_exps.as<uint8_t>() + used[u] * m.w.gate_exps.expert_stride();
    slots[U + u] = m.up_exps.as<uint8_t>() + used[u] * m.w.up_exps.expert_stride();
    slots[2 * U + u] = m.down_exps.as<uint8_t>() + used[u] * m.w.down_exps.expert_stride();
  }
  auto* gp = reinterpret_cast<MmvqGroup*>(hp + off_groups);
  std::copy(gate_g.begin(), gate_g.end(), gp);
  std::copy(up_g.begin(), up_g.end(), gp + n_gate);
  std::copy(down_g.begin(), down_g.end(), gp + n_gu);
  std::memcpy(hp + off_rows, acc_rows.data(), P * 4);
  std::memcpy(hp + off_w, acc_w.data(), P * 4);
  const auto t_routed = std::chrono::steady_clock::now();

  // 3. Routed experts, then (without the side stream) the shared expert, then the join.
  m.launch({2, P, U * kMaxGroupRows + max_n, n_gu, n_down, plan_bytes}, m.main, [&](cudaStream_t) {
    m.routed(P, n_gu, n_down, plan_bytes, off_slots, off_groups, n_gate, max_n);
  });
  if (m.o.shared_side_stream) {
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(m.main, m.ev_out, 0));
  } else {
    m.launch({1, T, 0, 0, 0, 0}, m.main, [&](cudaStream_t s) { m.shared_expert(T, s); });
  }
  accumulate(reinterpret_cast<const int32_t*>(m.plan.as<uint8_t>() + off_rows),
             reinterpret_cast<const float*>(m.plan.as<uint8_t>() + off_w), K, m.down.as<float>(), m.sd.as<float>(),
             m.acc.as<float>(), m.y.as<uint16_t>(), T, dim, m.main);
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(m.h_y.p, m.y.p, T * dim * 2, cudaMemcpyDeviceToHost, m.main));
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(m.main));
  std::vector<uint16_t> out(m.h_y.as<uint16_t>(), m.h_y.as<uint16_t>() + T * dim);
  const auto t_end = std::chrono::steady_clock::now();

  if (timing != nullptr) {
    timing->route_ms += std::chrono::duration<double, std::milli>(t_routed - t_start).count();
    timing->compute_ms += std::chrono::duration<double, std::milli>(t_end - t_routed).count();
    uint64_t bytes = static_cast<uint64_t>(E * dim * 2);
    bytes += static_cast<uint64_t>(U) * static_cast<uint64_t>(m.w.gate_exps.expert_stride() + m.w.up_exps.expert_stride() +
                                                              m.w.down_exps.expert_stride());
    for (const MatView* s : {&m.w.shared_gate, &m.w.shared_up, &m.w.shared_down})
      bytes += static_cast<uint64_t>(s->rows * s->row_stride());
    timing->bytes_read += bytes;
  }
  if (taps != nullptr) {
    cudaStream_t s = m.main;
    taps->layer = m.w.layer;
    taps->tokens = T;
    taps->input.assign(xin, xin + T * dim);
    taps->router_logits.assign(m.h_logits.as<float>(), m.h_logits.as<float>() + T * E);
    taps->topk_ids = rt.ids;
    taps->topk_weights = rt.weights;
    copy_back(taps->x_q8, m.x_q8.p, T * dim / kQK8_1, s);
    std::vector<float> gu_h, h_h, down_h;
    std::vector<BlockQ8_1> hq_h;
    copy_back(gu_h, m.gu.p, 2 * P * inter, s);
    copy_back(h_h, m.h.p, P * inter, s);
    copy_back(hq_h, m.h_q8.p, P * inter / kQK8_1, s);
    copy_back(down_h, m.down.p, P * dim, s);
    ExpertTaps& sh = taps->shared;
    copy_back(sh.gate, m.sg.p, T * inter, s);
    copy_back(sh.up, m.su.p, T * inter, s);
    copy_back(sh.h, m.sh.p, T * inter, s);
    if (m.dense_shared) sh.h_q8.clear();
    else copy_back(sh.h_q8, m.sh_q8.p, T * inter / kQK8_1, s);
    copy_back(sh.down, m.sd.p, T * dim, s);
    copy_back(taps->acc, m.acc.p, T * dim, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    sh.expert = -1;
    sh.tokens.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) sh.tokens[t] = static_cast<int32_t>(t);
    sh.weights.assign(static_cast<size_t>(T), 1.0f);
    taps->experts.clear();
    for (int64_t u = 0; u < U; ++u) {
      ExpertTaps& et = taps->experts.emplace_back();
      const int32_t e = used[u];
      const int64_t p0 = p_first[e], n_e = static_cast<int64_t>(tok_of[e].size());
      et.expert = e;
      et.tokens = tok_of[e];
      for (int32_t t : tok_of[e]) {
        int64_t k = 0;
        while (rt.ids[t * K + k] != e) ++k;
        et.weights.push_back(rt.weights[t * K + k]);
      }
      et.gate.assign(gu_h.begin() + p0 * inter, gu_h.begin() + (p0 + n_e) * inter);
      et.up.assign(gu_h.begin() + (P + p0) * inter, gu_h.begin() + (P + p0 + n_e) * inter);
      et.h.assign(h_h.begin() + p0 * inter, h_h.begin() + (p0 + n_e) * inter);
      et.h_q8.assign(hq_h.begin() + p0 * inter / kQK8_1, hq_h.begin() + (p0 + n_e) * inter / kQK8_1);
      et.down.assign(down_h.begin() + p0 * dim, down_h.begin() + (p0 + n_e) * dim);
    }
    taps->output = out;
  }
  return out;
}

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why != nullptr) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
                               cudaGetErrorString(err) + ")";
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device present (cudaGetDeviceCount returned 0)";
    return false;
  }
  return true;
}

std::string device_name(int device) {
  if (!device_available(nullptr)) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace moecheck::cuda
