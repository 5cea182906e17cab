// The CUDA layer driver: one MoE layer forward on the GPU (router GEMV, host routing, q8_1,
// MMVQ gate/up over all selected experts in one launch, SwiGLU + q8_1, MMVQ down, shared expert
// on a side stream, accumulate + finish), equal to moecheck::emu::MoeLayer bit for bit in its
// output and every LayerTaps stage. Contract: docs/numerics.md. A plain C++ header (no CUDA
// types), so tools/ and .cpp tests can include it; built only when CUDA is on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/layer_weights.h"
#include "core/routing.h"
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck::cuda {

class ExpertLru;

// Where the top-k selection runs (core/routing.h): kHost (the seeds' default) downloads the logits
// and routes with route_from_logits; kDevice runs route_select on the device (cuda/route_select.cu:
// the slot table, the route header and the plan built there, no host round trip before the routed
// experts). The picks, weights and every stage are the same bits either way.
using RoutePlace = ::moecheck::RoutePlace;

// Device route with the side stream: where the shared expert forks from the main stream (its
// GEMVs then run beside the main stream's kernels; no bit depends on it).
enum class SharedFork {
  kInput,        // before q8_1 of x and the router (a K-quant shared expert: after q8_1 of x)
  kRouterStart,  // once all of the router launch's blocks have begun (a launch-completion
                 // dependency: a graph edge from the router node's launch-completion port, or
                 // cudaLaunchAttributeLaunchCompletionEvent outside graphs), so the router's
                 // blocks take their multiprocessors before the shared expert's do
  kRouter,       // after the router
  kSelection,    // after the selection and the device plan
};

// LayerOptions::mmvq_max_rows: the default, which picks the split by the forward's token count.
inline constexpr int kMmvqRowsAuto = -1;
// The split kMmvqRowsAuto takes above kMaxGroupRows tokens: experts of 5 - 8 pairs on MMQ.
inline constexpr int kBatchedMmvqMaxRows = 4;

// LayerOptions::mmq_beside: the default, which picks the MMQ launches' stream by the forward's
// token count (mmq_beside_at): beside the MMVQ launches at the side stream's priority (2) for
// kMmqBesideLowMinTokens .. kMmqBesideLowMaxTokens tokens, at the main stream's (1) above that up
// to kMmqBesideHighMaxTokens, after them on the main stream (0) elsewhere.
inline constexpr int kMmqBesideAuto = -1;
inline constexpr int64_t kMmqBesideLowMinTokens = 48;
inline constexpr int64_t kMmqBesideLowMaxTokens = 112;
inline constexpr int64_t kMmqBesideHighMaxTokens = 128;

struct LayerOptions {
  RouterVariant router = RouterVariant::kStaged;
  int expert_warps = kDefaultExpertWarps;  // 2, 4 or 8 warps per MMVQ block; no bit depends on it
  bool shared_side_stream = true;          // shared expert on a side stream; no bit depends on it
  // Device route with the side stream: where the shared expert forks, shared_fork_small for
  // forwards of up to shared_fork_max_tokens tokens; above that shared_fork_mid for forwards of
  // shared_fork_mid_min_tokens .. shared_fork_mid_max_tokens tokens and shared_fork_large for the
  // rest (defaults measured on the H200, docs/performance.md: after the selection at 17 - 128
  // tokens, where the shared GEMM's blocks would otherwise hold the multiprocessors while the
  // selection and the plan wait for one; after the router at one token, where the selection then
  // has the multiprocessors to itself: 2.3 us shorter than at the router's start, the H100 and
  // the H200 agreeing, 2026-12-05). No bit depends on them.
  int64_t shared_fork_max_tokens = 1;
  SharedFork shared_fork_small = SharedFork::kRouter;
  SharedFork shared_fork_large = SharedFork::kRouter;
  int64_t shared_fork_mid_min_tokens = 17;
  int64_t shared_fork_mid_max_tokens = 128;
  SharedFork shared_fork_mid = SharedFork::kSelection;
  // Device route: the launches of its chains (selection -> MMVQ -> SwiGLU -> MMVQ on the main
  // stream, the bf16 shared expert's SwiGLU -> GEMV on the side stream) made as programmatic
  // dependent launches (cuda/pdl.cuh), so each kernel starts while its predecessor finishes and
  // the down projections' first weight rows are in flight before their inputs are. Off by
  // default: measured on the H200 10 % slower at one token and 3 % slower at eight, where the
  // early blocks hold multiprocessors the other stream's kernels need (docs/performance.md). No
  // bit depends on it.
  bool programmatic_launch = false;
  // Device route: the streamed MMVQ engine's warps per block (0, 4, 8, 12, 14 or 16) for the gate
  // / up launch and for the down launch of layers of up to 8 tokens. 0: for gate / up 14 at one
  // token (cuda/mmvq_sb.cuh kOneTokenWarps: 2 stages) and the engine's 16 above, for down the
  // engine's 16. A 12- or 14-warp block leaves room on its multiprocessor for one of the shared
  // expert's GEMV blocks (measured on the H200: the one-token gate / up MMVQ then starts beside
  // the shared pair GEMV); 14 warps also take the one-token launch's 3456 passes at most two a
  // warp, where 12 leave some warps three (measured on the H100: the one-token layer 1.0 us
  // shorter, docs/performance.md, thirty-ninth session). No bit depends on them.
  int gate_up_stream_warps = 0;
  int down_stream_warps = 0;
  // Device route: the streamed MMVQ's blocks prefetch the device plan into L1 as they start
  // (mmvq_groups_planned's warm range), so that reading a group's count, entry and slot pointer
  // costs one round trip to L2 instead of three. No bit depends on it.
  bool prefetch_plan = true;
  bool use_graphs = false;  // replay the post-routing launches as a CUDA graph
  // Captured graphs run their kernels at the priorities of the streams they were captured on
  // (the main stream's above the side stream's: cudaGraphInstantiateFlagUseNodePriority), not
  // all at the priority of the stream they are replayed on, so the main stream's pending blocks
  // go first where both streams wait for a multiprocessor. Measured within the run-to-run spread
  // of the one-token and eight-token layers (docs/performance.md). No bit depends on it.
  bool graph_node_priority = true;
  int device = 0;
  RoutePlace route = RoutePlace::kHost;
  // Experts with at most this many pairs (0..8) run through MMVQ, one group each; the others
  // through MMQ (cuda/mmq.cu), as is the K-quant shared expert when T exceeds it. No bit depends
  // on it (docs/numerics.md "mmvq_q2k, mmvq_q3k"); 0 sends every expert through MMQ.
  // kMmvqRowsAuto (the default; mmvq_max_rows_at): kMaxGroupRows for forwards of up to 8 tokens
  // (no MMQ launch at all) and kBatchedMmvqMaxRows above (measured on the H200, two calls two days
  // apart: 6 % faster at T = 512, 1 % at T = 64, equal at 16 and 4096; docs/performance.md).
  int mmvq_max_rows = kMmvqRowsAuto;
  // Device route, forwards with MMQ launches (T above the split): 0 runs them after the MMVQ
  // launch of the same projection on the main stream; 1 on a stream of their own at the main
  // stream's priority, 2 at the side stream's, beside the MMVQ launch (two graph branches joined
  // before SwiGLU and before the accumulation), so their blocks can take the multiprocessors the
  // MMVQ launch's tail leaves. No bit depends on it. kMmqBesideAuto (the default; mmq_beside_at)
  // picks by T from the H100's sweeps (2026-12-05 and 06, batched_bench beside, five sweeps at
  // 64 tokens, two at 48 to 112): 2 was up to 2.5 % faster at 48 to 96 tokens (never slower) and
  // 4.7 to 6.9 % at 112, 1 was 0.4 to 1.9 % faster at 128; both were 1.6 to 3.6 % slower at 24 to
  // 40 tokens (the shared expert's GEMM then takes the multiprocessors before the MMVQ launch
  // does) and 0.3 to 3.2 % slower at 192 to 384. Not yet timed on an H200 (docs/performance.md,
  // twenty-seventh session).
  int mmq_beside = kMmqBesideAuto;
  // The largest T a forward takes (> 0: every scratch buffer is allocated for it at construction
  // and a larger T is refused with an InputError naming it; 0: buffers grow with the largest T
  // seen, which drops the captured graphs when they move).
  int64_t max_tokens = 0;
  // With an expert cache and a next layer (set_next): how many of the next layer's predicted
  // experts (its router on this layer's input, routed on the host with its bias, ranked by
  // core/routing_trace.h prefetch_order) start reading while this layer computes; 0: off. Needs
  // the cache's reader pool. No bit depends on it.
  int prefetch_k = 0;
};

// The warps the device route asks of the streamed engine for the gate / up launch of a forward
// of T tokens (LayerOptions::gate_up_stream_warps; 0: the engine's default).
inline int gate_up_stream_warps(const LayerOptions& o, int64_t T) {
  return o.gate_up_stream_warps != 0 ? o.gate_up_stream_warps : T == 1 ? 14 : 0;
}

// The MMVQ / MMQ split LayerOptions gives a forward of T tokens (LayerOptions::mmvq_max_rows).
inline int mmvq_max_rows_at(const LayerOptions& o, int64_t T) {
  if (o.mmvq_max_rows != kMmvqRowsAuto) return o.mmvq_max_rows;
  return T > kMaxGroupRows ? kBatchedMmvqMaxRows : kMaxGroupRows;
}

// Where LayerOptions puts the MMQ launches of a forward of T tokens (LayerOptions::mmq_beside):
// 0, 1 or 2 as that field describes.
inline int mmq_beside_at(const LayerOptions& o, int64_t T) {
  if (o.mmq_beside != kMmqBesideAuto) return o.mmq_beside;
  if (T >= kMmqBesideLowMinTokens && T <= kMmqBesideLowMaxTokens) return 2;
  if (T > kMmqBesideLowMaxTokens && T <= kMmqBesideHighMaxTokens) return 1;
  return 0;
}

// The fork point LayerOptions gives a forward of T tokens (the shared_fork_* fields above).
inline SharedFork shared_fork_at(const LayerOptions& o, int64_t T) {
  if (T <= o.shared_fork_max_tokens) return o.shared_fork_small;
  if (T >= o.shared_fork_mid_min_tokens && T <= o.shared_fork_mid_max_tokens)
    return o.shared_fork_mid;
  return o.shared_fork_large;
}

// One fork point for every T (benchmarks and tests that sweep it): all the shared_fork_* points.
inline void set_shared_fork_everywhere(LayerOptions& o, SharedFork at) {
  o.shared_fork_small = o.shared_fork_mid = o.shared_fork_large = at;
}

// What stage() leaves for launch() and finish() (the seeds' MoeV41Stage): the routing, the
// distinct expert count, and the timing of the host span so far (route_ms, fetch_ms, hits,
// misses, bytes_read).
struct MoeStage {
  int64_t tokens = 0;
  int64_t n_experts = 0;
  Routing routing;
  LayerTiming timing;
};

class MoeLayer {
 public:
  // Checks shapes and types against w.config (InputError naming the layer and tensor), then
  // uploads the router, every routed expert (resident; kernels read them through a device
  // table of slot pointers) and the shared expert to `o.device`.
  explicit MoeLayer(const LayerWeights& w, LayerOptions o = {});
  // The streamed layer: the router and the shared expert are uploaded; the routed experts are
  // read through `cache` (its slots, its slot table; misses from its source), never uploaded
  // from w, whose stacks need only their types and shapes (data may be nullptr: WeightTypes::
  // kStreamed). The cache may serve many layers; it must have the layer's expert shapes and
  // n_routed. Every output bit equals the resident layer's (docs/streaming.md).
  MoeLayer(const LayerWeights& w, std::shared_ptr<ExpertLru> cache, LayerOptions o = {});
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x bf16 [T, dim] (host) -> y bf16 [T, dim]. Any T >= 0. image_mask [T] (nullable): nonzero
  // tokens select with bias_vl (model.py Gate.forward), when the layer has one.
  std::vector<uint16_t> forward(const uint16_t* x, int64_t T, LayerTaps* taps = nullptr,
                                LayerTiming* timing = nullptr, const uint8_t* image_mask = nullptr);

  const LayerOptions& options() const;
  int layer() const;

  // The layer whose experts this layer's forward predicts and prefetches (options().prefetch_k >
  // 0): its router runs on this layer's input. Both layers must share the cache; nullptr: none.
  // `next` must outlive this layer's forwards.
  void set_next(const MoeLayer* next);

  // The host route's forward in three steps, for callers that pipeline layers (the seeds'
  // stage_m1 / compute_m1): stage() uploads x, runs q8_1 and the router, routes on the host,
  // acquires the experts from the cache (reading the misses), starts the shared expert on the
  // side stream and the prefetch of the next layer; launch() enqueues the routed experts, the join
  // and the accumulation without waiting; finish() waits, hands the experts back to the cache
  // and returns the output (taps and timing as forward()). forward() on the host route is the
  // three in a row. One stage per layer at a time (InputError otherwise); between a layer's
  // stage() and finish() other layers may stage, launch and finish: each layer has its own
  // buffers and streams. InputError on the device route.
  const MoeStage& stage(const uint16_t* x, int64_t T, const uint8_t* image_mask = nullptr);
  void launch();
  std::vector<uint16_t> finish(LayerTaps* taps = nullptr, LayerTiming* timing = nullptr);

  // The device-resident forward of the device route (route = kDevice; InputError otherwise): the
  // whole layer, q8_1 and router through the shared expert's join and the bf16 output, as one
  // CUDA graph (captured per T on first use, replayed after) from the layer's device input
  // buffer to its device output buffer, enqueued on `stream` (a cudaStream_t; nullptr: the
  // legacy default stream) with no host copy and no synchronisation. Write x (bf16 [T, dim])
  // to device_input(T), replay, then read device_output(). The pointers stay valid until a
  // forward with a larger T. After the stream has finished, device_routing(T) raises the route
  // header's status (NaN key, miss) as forward() does, else returns the picks and weights. With
  // an expert cache the replay reads whatever the slot table holds: a pick no slot holds is the
  // miss error of device_routing (forward() instead reads the misses and runs again).
  uint16_t* device_input(int64_t T);
  const uint16_t* device_output() const;
  void graph_forward(int64_t T, void* stream = nullptr);
  Routing device_routing(int64_t T);

  // The resident layer's slot table row: resident[e] != 0 keeps expert e in its slot, 0 marks it
  // not resident (-1), so a forward whose picks include it fails (InputError naming layer, token
  // and expert; on the device route through the route header's miss flag). Default: every
  // expert resident. Refused (InputError) for a streamed layer, whose cache owns the table.
  void set_resident(const std::vector<uint8_t>& resident);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when a CUDA device can be used; otherwise false with the reason in *why (if given).
bool device_available(std::string* why);
// cudaGetDeviceProperties' name of `device`, or "" when none.
std::string device_name(int device);

}  // namespace moecheck::cuda
