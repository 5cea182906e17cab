// cuda::MoeLayer's private state (cuda/moe_layer.h), shared by the driver's two files:
// cuda/moe_layer.cu (setup, the host route, the shared expert, taps, forward) and
// cuda/moe_layer_route.cu (the slot table and the device route). Not a public header.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/layer_plan.h"
#include "core/route_header.h"
#include "core/routing.h"
#include "cuda/check.h"
#include "cuda/device_buffers.cuh"
#include "cuda/expert_lru.h"
#include "cuda/kernels.h"
#include "cuda/moe_layer.h"

namespace moecheck::cuda {
namespace layer_detail {

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

template <class T>
void copy_back(std::vector<T>& v, const void* d, size_t n, cudaStream_t s) {
  v.resize(n);
  if (n > 0)
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
}

// Byte offsets of the packed plan: the slot table (3U pointers), the groups (gate, up, down),
// the accumulation rows and weights ([T, topk] each), for U experts, n_groups groups and P pairs
// (a plan of P pairs has at most P experts and 3P groups: PlanLayout(P, 3P, P) bounds it).
struct PlanLayout {
  size_t slots = 0, groups = 0, rows = 0, weights = 0, bytes = 0;
  PlanLayout(int64_t U, int64_t n_groups, int64_t P) {
    groups = align_up(static_cast<size_t>(3 * U) * sizeof(void*), 16);
    rows = align_up(groups + static_cast<size_t>(n_groups) * sizeof(MmvqGroup), 16);
    weights = align_up(rows + static_cast<size_t>(P) * 4, 16);
    bytes = weights + static_cast<size_t>(P) * 4;
  }
  explicit PlanLayout(const LayerPlan& p)
      : PlanLayout(p.n_experts(), static_cast<int64_t>(p.groups.size()), p.pairs()) {}
};

// From pre_route to the join, an error (host routing refuses the logits: a NaN key is an
// InputError naming the token; a cache read fails) would leave while the shared expert may still
// run on the side stream, reading x and writing its buffers: the fence waits for it first, so the
// next forward starts from idle streams.
struct SideFence {
  cudaStream_t side;
  bool use;
  bool armed = true;
  ~SideFence() {
    if (armed && use) (void)cudaStreamSynchronize(side);
  }
};

}  // namespace layer_detail

using layer_detail::copy_back;
using layer_detail::PlanLayout;
using layer_detail::SideFence;

struct MoeLayer::Impl {
  LayerWeights w;
  LayerOptions o;
  bool dense_shared = true;
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t ev_in = nullptr, ev_out = nullptr;
  // LayerOptions::mmq_beside: the MMQ launches' own stream, at the main stream's priority or the
  // side stream's, and its fork / join events (gate / up, down).
  cudaStream_t mmq_high = nullptr, mmq_low = nullptr;
  cudaEvent_t ev_mmq[4] = {};
  DevBuf router, gate_exps, up_exps, down_exps, sh_gate, sh_up, sh_down;
  // Scratch, sized for the largest T seen.
  DevBuf x, x_q8, logits, plan, gu, h, h_q8, down, sg, su, sh, shb, sh_q8, sd, acc, y;
  PinnedBuf h_x, h_logits, h_plan, h_y;
  // Routing data: the bias (and bias_vl) on the device, the slot table [kSlotTableLayers,
  // n_routed] and its host copy of this layer's row, the slot pointer arrays (gate, up, down of
  // slot s), the route headers [kSlotTableLayers] and the device plan; the image mask.
  DevBuf bias, bias_vl, slot_table, slot_ptrs, hdr, dplan, mask;
  PinnedBuf h_hdr, h_mask;
  std::vector<int32_t> slot_row;
  // Streaming: the cache the routed experts come from (null: resident stacks), the layer whose
  // experts the forward prefetches, its predicted logits.
  std::shared_ptr<ExpertLru> cache;
  const MoeLayer* next = nullptr;
  DevBuf pred_logits;
  PinnedBuf h_pred;
  cudaEvent_t ev_pred = nullptr;
  // The host route's stage in flight (stage() .. finish()).
  struct Pending {
    bool staged = false, launched = false;
    int64_t T = 0;
    std::vector<uint16_t> x;  // the input, for the taps
    std::vector<uint8_t> mask;
    LayerPlan plan;
    PlanLayout layout{0, 0, 0};
    bool leased = false;
    CacheLease lease;
    std::chrono::steady_clock::time_point t_start, t_launch;
  } pend;
  MoeStage stage_out;
  // Captured launch sequences keyed by (phase, shape...): 0 = before routing (T), 1 = shared
  // expert (T), 2 = routed experts (P, U and max group, G (P + 1) + Gs for the G groups per
  // projection of which Gs run on MMVQ, plan bytes), 5 = the whole
  // device-route forward from x on the device to y on the device (T, masked).
  using GraphKey = std::tuple<int, int64_t, int64_t, int64_t, size_t>;
  std::map<GraphKey, cudaGraphExec_t> graphs;

  ~Impl() {
    drop_graphs();
    if (ev_pred != nullptr) (void)cudaEventDestroy(ev_pred);
    if (ev_in != nullptr) (void)cudaEventDestroy(ev_in);
    if (ev_out != nullptr) (void)cudaEventDestroy(ev_out);
    for (cudaEvent_t e : ev_mmq)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (mmq_low != nullptr) (void)cudaStreamDestroy(mmq_low);
    if (mmq_high != nullptr) (void)cudaStreamDestroy(mmq_high);
    if (side != nullptr) (void)cudaStreamDestroy(side);
    if (main != nullptr) (void)cudaStreamDestroy(main);
  }

  void drop_graphs() {
    for (auto& kv : graphs) (void)cudaGraphExecDestroy(kv.second);
    graphs.clear();
  }

  // fn(s) launched directly, or (use_graphs) captured once per key and replayed.
  template <class F>
  void launch(const GraphKey& key, cudaStream_t s, F fn) {
    if (!o.use_graphs) {
      fn(s);
      return;
    }
    launch_graph(key, s, s, fn);
  }

  // fn(capture) captured on the stream `capture` once per key, replayed on `s`.
  template <class F>
  void launch_graph(const GraphKey& key, cudaStream_t capture, cudaStream_t s, F fn) {
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      cudaGraph_t g = nullptr;
      MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
      fn(capture);
      MOECHECK_CUDA_CHECK(cudaStreamEndCapture(capture, &g));
      cudaGraphExec_t ge = nullptr;
      MOECHECK_CUDA_CHECK(cudaGraphInstantiate(
          &ge, g, o.graph_node_priority ? cudaGraphInstantiateFlagUseNodePriority : 0));
      MOECHECK_CUDA_CHECK(cudaGraphDestroy(g));
      it = graphs.emplace(key, ge).first;
    }
    MOECHECK_CUDA_CHECK(cudaGraphLaunch(it->second, s));
  }

  // slack: zeroed bytes after the data (MMQ reads a row's last 16-byte chunk whole; see
  // cuda/kernels.h mmq).
  void upload(DevBuf& d, const void* src, size_t n, size_t slack = 0) {
    d.reserve(n + slack);
    MOECHECK_CUDA_CHECK(cudaMemcpy(d.p, src, n, cudaMemcpyHostToDevice));
    if (slack > 0) MOECHECK_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(d.p) + n, 0, slack));
  }

  void setup_device();
  void reserve_max();
  void upload_weights();
  void upload_slots();
  int64_t header_words(int64_t T) const { return RouteHeaderLayout{T, w.config.topk}.words(); }
  int32_t* layer_header(int64_t T) const { return hdr.as<int32_t>() + w.layer * header_words(T); }
  void check_resident(const Routing& rt) const;
  // The selection and plan, then `selected` (the side stream's fork when it is there), then the
  // routed experts.
  void device_routed(int64_t T, bool masked, const std::function<void()>& selected = {});
  void device_body(int64_t T, bool masked);
  void require_graph_route(int64_t T, const char* op);
  Routing header_routing(int64_t T, const uint8_t* image_mask);
  void reserve(int64_t T);
  void check_tokens(int64_t T, const char* op) const;
  void reserve_plan(size_t bytes);
  void pre_route(const uint16_t* xin, int64_t T, bool predicting);
  // programmatic: the bf16 shared expert's second and third launches as programmatic dependent
  // launches (cuda/pdl.cuh; the device route's side stream).
  void shared_expert(int64_t T, cudaStream_t s, bool programmatic = false);
  void pack_plan(const LayerPlan& p, const PlanLayout& L);
  void routed(const LayerPlan& p, const PlanLayout& L);
  void routed_gate_up(const LayerPlan& p, const uint8_t* const* slots, const MmvqGroup* groups);
  void enqueue_tail(const LayerPlan& p, const PlanLayout& L, int64_t T);
  void finish_device(int64_t T);
  uint64_t weight_bytes(const LayerPlan& p) const;
  // The slot table row of this layer and the slots' gate / up / down pointer arrays (the
  // resident stacks' or the cache's), and how many slots each array holds.
  const int32_t* table_row() const;
  const uint8_t* const* slot_array(int proj) const;
  // Host route (cuda/moe_layer_stage.cu): the three steps and the prefetch.
  void stage(const uint16_t* x, int64_t T, const uint8_t* image_mask);
  void launch_staged();
  std::vector<uint16_t> finish_staged(LayerTaps* taps, LayerTiming* timing);
  void predict_launch(int64_t T, cudaStream_t s);
  void prefetch_next(int64_t T, const uint8_t* image_mask);
  // Device route with a cache: run, read the misses when the header has any, run again.
  void forward_device_cached(int64_t T, bool masked, const uint8_t* image_mask, LayerTiming* tm);
  void device_pass(int64_t T, bool masked);
  void fold_taps(const uint16_t* xin, int64_t T, const Routing& rt, const LayerPlan& p,
                 LayerTaps& taps);
};

}  // namespace moecheck::cuda
