// cuda::MoeLayer's slot table and device route (cuda/moe_layer.h): the slot table upload and
// set_resident, the host route's residency check, the device route's launches (route_select,
// route_plan, the planned MMVQ groups), its tail and the header read after the forward.
// Contract: docs/numerics.md "route_select"; the rest of the driver: cuda/moe_layer.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/numfmt.h"
#include "cuda/moe_layer_impl.cuh"
#include "cuda/pdl.cuh"

namespace moecheck::cuda {

void MoeLayer::set_resident(const std::vector<uint8_t>& resident) {
  Impl& m = *impl_;
  const int64_t E = m.w.config.n_routed;
  if (m.cache)
    throw InputError("cuda::MoeLayer: layer " + std::to_string(m.w.layer) +
                     ", set_resident: a streamed layer's slot table belongs to its expert cache");
  if (static_cast<int64_t>(resident.size()) != E)
    throw InputError("cuda::MoeLayer: layer " + std::to_string(m.w.layer) +
                     ", set_resident: need one flag per routed expert (" + std::to_string(E) +
                     "), found " + std::to_string(resident.size()));
  for (int64_t e = 0; e < E; ++e) m.slot_row[e] = resident[e] != 0 ? static_cast<int32_t>(e) : -1;
  m.upload_slots();
}

// The slot table: every row -1 but this layer's (expert e resident in slot e unless
// set_resident cleared it), and slot s's gate / up / down base pointers (the resident stacks).
void MoeLayer::Impl::upload_slots() {
  const int64_t E = w.config.n_routed;
  if (slot_row.empty()) {
    slot_row.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) slot_row[e] = static_cast<int32_t>(e);
  }
  std::vector<int32_t> table(static_cast<size_t>(kSlotTableLayers * E), -1);
  if (w.layer >= 0 && w.layer < kSlotTableLayers)
    std::copy(slot_row.begin(), slot_row.end(), table.begin() + w.layer * E);
  upload(slot_table, table.data(), table.size() * 4);
  std::vector<const uint8_t*> ptrs(static_cast<size_t>(3 * E));
  for (int64_t e = 0; e < E; ++e) {
    ptrs[e] = gate_exps.as<uint8_t>() + e * w.gate_exps.expert_stride();
    ptrs[E + e] = up_exps.as<uint8_t>() + e * w.up_exps.expert_stride();
    ptrs[2 * E + e] = down_exps.as<uint8_t>() + e * w.down_exps.expert_stride();
  }
  upload(slot_ptrs, ptrs.data(), ptrs.size() * sizeof(void*));
}

const int32_t* MoeLayer::Impl::table_row() const {
  const int64_t E = w.config.n_routed;
  return (cache ? cache->slot_table() : slot_table.as<int32_t>()) + w.layer * E;
}

const uint8_t* const* MoeLayer::Impl::slot_array(int proj) const {
  if (cache) return cache->slot_ptrs() + proj * cache->n_slots();
  return slot_ptrs.as<const uint8_t*>() + proj * w.config.n_routed;
}

// Host route of a resident layer: a pick whose slot is -1 fails as the device route's miss flag
// does (the lowest token, then its lowest such expert id). A streamed layer's cache reads it.
void MoeLayer::Impl::check_resident(const Routing& rt) const {
  if (cache) return;
  for (int64_t t = 0; t < rt.tokens; ++t) {
    int32_t worst = -1;
    for (int64_t j = 0; j < rt.topk; ++j) {
      const int32_t e = rt.ids[static_cast<size_t>(t * rt.topk + j)];
      if (slot_row[static_cast<size_t>(e)] < 0 && (worst < 0 || e < worst)) worst = e;
    }
    if (worst >= 0)
      throw InputError("cuda::MoeLayer: layer " + std::to_string(w.layer) + " token " +
                       std::to_string(t) + " expert " + std::to_string(worst) +
                       ": picked expert is not resident in the slot table (the route header's "
                       "miss flag)");
  }
}

// The device route's launches after the router (graph-capturable): route_select (the image mask
// already on the device) into this layer's header, route_plan, gate/up MMVQ over the planned
// groups, SwiGLU + q8_1 on all P pair rows (rows of unused pairs are never read), down MMVQ.
void MoeLayer::Impl::device_routed(int64_t T, bool masked, const std::function<void()>& selected) {
  const MoeConfig& c = w.config;
  const int64_t P = T * c.topk, E = c.n_routed;
  const DevicePlanLayout D(T, c.topk);
  const RouteParams rp{E,
                       c.topk,
                       c.gate_temp,
                       c.route_scale,
                       static_cast<int>(c.score_func),
                       c.norm_topk_prob,
                       mmvq_max_rows_at(o, T)};
  const int32_t* row = table_row();
  const float* bvl = w.bias_vl != nullptr ? bias_vl.as<float>() : nullptr;
  const uint8_t* mk = masked ? mask.as<uint8_t>() : nullptr;
  // Programmatic launches (cuda/pdl.cuh): the selection after the router, the gate / up MMVQ
  // after the plan (nothing read before its wait), SwiGLU, and the down MMVQ, whose plan was
  // complete before SwiGLU started (SwiGLU waits on the gate / up launches, which waited on the
  // plan), so its first weight rows stream before its wait.
  using pdl::Mode;
  const Mode launch_mode = o.programmatic_launch ? Mode::kLaunch : Mode::kOff;
  const Mode early_mode = o.programmatic_launch ? Mode::kEarlyReads : Mode::kOff;
  if (T == 1) {  // selection and plan in one launch
    const pdl::Scope sc(launch_mode);
    route_select_plan_one(logits.as<float>(), bias.as<float>(), bvl, mk, rp, row, layer_header(T),
                          slot_array(0), slot_array(1), slot_array(2), dplan.as<uint8_t>(), main);
  } else {
    const pdl::Scope sc(launch_mode);
    route_select(logits.as<float>(), T, bias.as<float>(), bvl, mk, rp, row, layer_header(T), main);
    route_plan(layer_header(T), T, rp, row, slot_array(0), slot_array(1), slot_array(2),
               dplan.as<uint8_t>(), main);
  }
  if (selected) selected();
  const auto* slots = reinterpret_cast<const uint8_t* const*>(dplan.as<uint8_t>() + D.slots);
  const auto* groups = reinterpret_cast<const MmvqGroup*>(dplan.as<uint8_t>() + D.groups);
  const auto* counts = reinterpret_cast<const int32_t*>(dplan.as<uint8_t>() + D.counts);
  const int ew = o.expert_warps, max_n = static_cast<int>(T < kMaxGroupRows ? T : kMaxGroupRows);
  const BlockQ8_1* xq = x_q8.as<BlockQ8_1>();
  // The plan up to its scratch (slot table, groups, rows, weights, counts), prefetched into L1 by
  // the streamed MMVQ's blocks as they start (mmvq_groups_planned's warm range).
  // The gate / up launch's warps (LayerOptions::gate_up_stream_warps; 0: 14 at one token, where a
  // shared GEMV block then fits beside each MMVQ block, else the engine's 16).
  const int gu_warps = gate_up_stream_warps(o, T);
  const uint8_t* warm = o.prefetch_plan ? dplan.as<uint8_t>() : nullptr;
  const auto warm_bytes = static_cast<int64_t>(o.prefetch_plan ? D.scratch : 0);
  // MMVQ over the Gs groups counts[3] of each projection, MMQ over [Gs, G) (counts[1]). The
  // MMVQ groups are one per expert of at most mmvq_max_rows pairs: at most n_routed a projection
  // (the streamed engine's group prefix is sized by this bound, not by the plan's capacity P).
  const int64_t mmvq_groups_bound = std::min<int64_t>(P, c.n_routed);
  // The MMQ launches (T above the split): after the MMVQ launches on the main stream, or
  // (LayerOptions::mmq_beside) on a stream of their own, forked from the main stream before the
  // MMVQ launch of the same projection and joined before the launch that reads both (SwiGLU, the
  // accumulation): in a graph, two branches. They write other rows of the same outputs.
  const bool mmq_on = T > mmvq_max_rows_at(o, T);
  const int beside_at = mmq_beside_at(o, T);
  const bool beside = mmq_on && beside_at != 0;
  cudaStream_t mq = !beside ? main : beside_at == 2 ? mmq_low : mmq_high;
  auto mmq_fork = [&](int i) {
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_mmq[2 * i], main));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(mq, ev_mmq[2 * i], 0));
  };
  auto mmq_join = [&](int i) {
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_mmq[2 * i + 1], mq));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(main, ev_mmq[2 * i + 1], 0));
  };
  if (beside) mmq_fork(0);
  if (w.gate_exps.type == w.up_exps.type) {
    {
      const pdl::Scope sc(launch_mode);
      mmvq_groups_planned(w.gate_exps.type, slots, groups, counts + 3, 2, P, max_n, xq,
                          gu.as<float>(), c.inter, c.dim, ew, main, T, gu_warps, warm, warm_bytes,
                          mmvq_groups_bound);
    }
    if (mmq_on)
      mmq_groups_planned(w.gate_exps.type, slots, groups, counts, 2, P, xq, gu.as<float>(), c.inter,
                         c.dim, mq);
  } else {
    for (int j = 0; j < 2; ++j) {
      const GgmlType t = j == 0 ? w.gate_exps.type : w.up_exps.type;
      {
        const pdl::Scope sc(launch_mode);
        mmvq_groups_planned(t, slots, groups + j * P, counts + 3, 1, P, max_n, xq, gu.as<float>(),
                            c.inter, c.dim, ew, main, T, gu_warps, warm, warm_bytes,
                            mmvq_groups_bound);
      }
      if (mmq_on)
        mmq_groups_planned(t, slots, groups + j * P, counts, 1, P, xq, gu.as<float>(), c.inter,
                           c.dim, mq);
    }
  }
  if (beside) mmq_join(0);
  {
    const pdl::Scope sc(launch_mode);
    swiglu_q8(gu.as<float>(), gu.as<float>() + P * c.inter, h.as<float>(), h_q8.as<BlockQ8_1>(),
              P, c.inter, c.swiglu_limit, main);
  }
  if (beside) mmq_fork(1);
  {
    const pdl::Scope sc(early_mode);
    mmvq_groups_planned(w.down_exps.type, slots, groups + 2 * P, counts + 3, 1, P, max_n,
                        h_q8.as<BlockQ8_1>(), down.as<float>(), c.dim, c.inter, ew, main, T,
                        o.down_stream_warps, warm, warm_bytes, mmvq_groups_bound);
  }
  if (mmq_on)
    mmq_groups_planned(w.down_exps.type, slots, groups + 2 * P, counts, 1, P, h_q8.as<BlockQ8_1>(),
                       down.as<float>(), c.dim, c.inter, mq);
  if (beside) mmq_join(1);
}

// After a device-routed forward: the header's status raised as the host route would (a NaN key:
// route_from_logits on the downloaded logits throws the host route's own message; a miss: the
// layer, token and expert), else the picks and weights as a Routing.
Routing MoeLayer::Impl::header_routing(int64_t T, const uint8_t* image_mask) {
  const MoeConfig& c = w.config;
  const RouteHeaderLayout L{T, c.topk};
  const int32_t* hd = h_hdr.as<int32_t>() + w.layer * header_words(T);
  const std::string where = "cuda::MoeLayer: layer " + std::to_string(w.layer);
  auto loc = [&](int64_t word) {
    uint64_t v;
    std::memcpy(&v, hd + word, sizeof v);
    return std::pair<int64_t, int64_t>(static_cast<int64_t>(v >> 32),
                                       static_cast<int64_t>(v & 0xFFFFFFFFu));
  };
  if (hd[RouteHeaderLayout::kStatus] & kRouteNaN) {
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(h_logits.p, logits.p, T * c.n_routed * 4, cudaMemcpyDeviceToHost));
    (void)route_from_logits(h_logits.as<float>(), T, RouteBias{w.bias, w.bias_vl, image_mask}, c,
                            w.layer);
    const auto [t, e] = loc(RouteHeaderLayout::kNaNLoc);
    throw InputError(where + " token " + std::to_string(t) + " expert " + std::to_string(e) +
                     ": routing key is NaN (device route)");
  }
  if (hd[RouteHeaderLayout::kStatus] & kRouteMiss) {
    const auto [t, e] = loc(RouteHeaderLayout::kMissLoc);
    throw InputError(where + " token " + std::to_string(t) + " expert " + std::to_string(e) +
                     ": picked expert is not resident in the slot table (the route header's "
                     "miss flag)");
  }
  Routing rt;
  rt.tokens = T;
  rt.topk = c.topk;
  rt.ids.assign(hd + RouteHeaderLayout::kPicks, hd + RouteHeaderLayout::kPicks + L.pairs());
  rt.weights.resize(static_cast<size_t>(L.pairs()));
  for (int64_t i = 0; i < L.pairs(); ++i)
    rt.weights[i] = bits_f32(static_cast<uint32_t>(hd[L.weights() + i]));
  return rt;
}

// The whole device-route forward on the main stream (graph-capturable: the shared expert forks
// to the side stream and joins by events): q8_1 of x and the router, the device route and the
// routed experts, the join, the accumulation over the device plan's rows and weights into y.
// x (and the image mask when masked) are already on the device.
void MoeLayer::Impl::device_body(int64_t T, bool masked) {
  const MoeConfig& c = w.config;
  const DevicePlanLayout D(T, c.topk);
  // The fork (LayerOptions::shared_fork_small / _mid / _large). q8_1 of x stays on the main stream
  // (measured: on the side stream ahead of the shared expert it made the one-token layer 2 us
  // slower, docs/performance.md), in the router's launch unless a K-quant shared expert, which
  // reads x_q8, forks before the router ends.
  const bool use_side = o.shared_side_stream;
  const SharedFork at = shared_fork_at(o, T);
  const bool early = at == SharedFork::kInput || at == SharedFork::kRouterStart;
  const bool q8_apart = use_side && !dense_shared && early;
  auto fork = [&] {
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_in, main));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(side, ev_in, 0));
  };
  auto shared_side = [&] {
    shared_expert(T, side, o.programmatic_launch);
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_out, side));
  };
  if (q8_apart) quantize_q8_1_bf16(x.as<uint16_t>(), x_q8.as<BlockQ8_1>(), T, c.dim, main);
  BlockQ8_1* router_q8 = q8_apart ? nullptr : x_q8.as<BlockQ8_1>();
  auto launch_router = [&] {
    router_gemv(o.router, router.as<uint16_t>(), x.as<uint16_t>(), logits.as<float>(), c.n_routed,
                c.dim, T, main, w.router_type, router_q8);
  };
  if (use_side && at == SharedFork::kInput) {
    fork();
    shared_side();
  }
  if (use_side && at == SharedFork::kRouterStart) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    MOECHECK_CUDA_CHECK(cudaStreamIsCapturing(main, &cs));
    if (cs == cudaStreamCaptureStatusActive) {
      // In a graph: the side stream's first node depends on the router node's launch-completion
      // port (all its blocks begun), not on its completion.
      launch_router();
      const cudaGraphNode_t* deps = nullptr;
      const cudaGraphEdgeData* edges = nullptr;
      size_t nd = 0;
      MOECHECK_CUDA_CHECK(cudaStreamGetCaptureInfo(main, &cs, nullptr, nullptr, &deps, &edges, &nd));
      if (nd != 1)
        throw std::logic_error("cuda::MoeLayer: the router is not the capture's one tail node");
      cudaGraphNode_t router_node = deps[0];
      fork();  // the side stream joins the capture, then depends on the router's start only
      cudaGraphEdgeData e{};
      e.from_port = cudaGraphKernelNodePortLaunchCompletion;
      e.type = cudaGraphDependencyTypeDefault;
      MOECHECK_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(side, &router_node, &e, 1,
                                                              cudaStreamSetCaptureDependencies));
      shared_side();
    } else {
      // Outside graphs: the router's launch records ev_in when its blocks have begun (a plain
      // router variant, launched without pdl::launch, records nothing: ev_in then marks the
      // input, recorded before the router is issued).
      MOECHECK_CUDA_CHECK(cudaEventRecord(ev_in, main));
      {
        const pdl::StartEvent se(ev_in);
        launch_router();
      }
      MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(side, ev_in, 0));
      shared_side();
    }
  } else {
    launch_router();
  }
  if (use_side && at == SharedFork::kRouter) {
    fork();
    shared_side();
  }
  device_routed(T, masked, [&] {
    if (use_side && at == SharedFork::kSelection) {
      fork();
      shared_side();
    }
  });
  if (use_side) MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(main, ev_out, 0));
  else shared_expert(T, main);
  accumulate(reinterpret_cast<const int32_t*>(dplan.as<uint8_t>() + D.rows),
             reinterpret_cast<const float*>(dplan.as<uint8_t>() + D.weights), c.topk,
             down.as<float>(), sd.as<float>(), acc.as<float>(), y.as<uint16_t>(), T, c.dim, main);
}

uint16_t* MoeLayer::device_input(int64_t T) {
  Impl& m = *impl_;
  m.require_graph_route(T, "device_input");
  return m.x.as<uint16_t>();
}

const uint16_t* MoeLayer::device_output() const { return impl_->y.as<uint16_t>(); }

void MoeLayer::graph_forward(int64_t T, void* stream) {
  Impl& m = *impl_;
  m.require_graph_route(T, "graph_forward");
  if (m.cache) m.cache->fence(stream);
  m.launch_graph({5, T, 0, 0, 0}, m.main, static_cast<cudaStream_t>(stream),
                 [&](cudaStream_t) { m.device_body(T, false); });
  if (m.cache) m.cache->layer_used(m.w.layer, stream);
}

Routing MoeLayer::device_routing(int64_t T) {
  Impl& m = *impl_;
  m.require_graph_route(T, "device_routing");
  const size_t words = static_cast<size_t>(m.header_words(T));
  MOECHECK_CUDA_CHECK(cudaMemcpy(m.h_hdr.as<int32_t>() + m.w.layer * words, m.layer_header(T),
                                 words * 4, cudaMemcpyDeviceToHost));
  return m.header_routing(T, nullptr);
}

// T against the options (InputError naming the layer, the operation and max_tokens).
void MoeLayer::Impl::check_tokens(int64_t T, const char* op) const {
  const std::string where = "cuda::MoeLayer: layer " + std::to_string(w.layer) + ", " + op + ": ";
  if (T < 0) throw InputError(where + "negative token count " + std::to_string(T));
  if (o.max_tokens > 0 && T > o.max_tokens)
    throw InputError(where + "T=" + std::to_string(T) +
                     " exceeds LayerOptions::max_tokens=" + std::to_string(o.max_tokens));
}

// The device-resident forward's preconditions, then scratch for T tokens.
void MoeLayer::Impl::require_graph_route(int64_t T, const char* op) {
  const std::string where = "cuda::MoeLayer: layer " + std::to_string(w.layer) + ", " + op + ": ";
  if (o.route != RoutePlace::kDevice)
    throw InputError(where + "needs the device route (LayerOptions::route = kDevice)");
  if (T <= 0) throw InputError(where + "need T >= 1, found " + std::to_string(T));
  check_tokens(T, op);
  MOECHECK_CUDA_CHECK(cudaSetDevice(o.device));
  reserve(T);
}

// The device route's tail: the output and the route headers down to the host.
void MoeLayer::Impl::finish_device(int64_t T) {
  const MoeConfig& c = w.config;
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(h_y.p, y.p, T * c.dim * 2, cudaMemcpyDeviceToHost, main));
  const size_t words = static_cast<size_t>(header_words(T));
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(h_hdr.as<int32_t>() + w.layer * words, layer_header(T),
                                      words * 4, cudaMemcpyDeviceToHost, main));
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(main));
}

}  // namespace moecheck::cuda
