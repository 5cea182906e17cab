// cuda::MoeLayer: the token path of one MoE layer on the GPU (see cuda/moe_layer.h). The host
// route: the router logits come back, route_from_logits picks the experts, build_layer_plan
// (core/layer_plan.h, the emulation's plan too) orders the work, and one packed copy of it
// (slot pointers, MMVQ groups, accumulation rows and weights) goes up. The device route:
// route_select writes the layer's route header and route_plan the same plan on the device
// (cuda/route_select.cu), and the whole forward is enqueued at once; the host reads the header's
// status after it. Both routes honour the slot table (kSlotTableLayers x n_routed, -1 = not
// resident). Contract: docs/numerics.md; twin: emu::MoeLayer.
#include "cuda/moe_layer.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>

#include "core/error.h"
#include "cuda/moe_layer_impl.cuh"
#include "cuda/pdl.cuh"

namespace moecheck::cuda {

namespace {

// The options and the device, checked before anything is allocated (InputError naming the layer
// and the option).
void check_options(const LayerWeights& w, const LayerOptions& o, const ExpertLru* cache) {
  const std::string where = "cuda::MoeLayer: layer " + std::to_string(w.layer) + ", ";
  if (!expert_warps_allowed(o.expert_warps))
    throw InputError(where + "options: expert_warps must be 2, 4 or 8, found " +
                     std::to_string(o.expert_warps));
  if (o.mmq_beside < kMmqBesideAuto || o.mmq_beside > 2)
    throw InputError(where + "options: mmq_beside must be 0, 1, 2 or -1 (auto), found " +
                     std::to_string(o.mmq_beside));
  if (o.mmvq_max_rows < kMmvqRowsAuto || o.mmvq_max_rows > kMaxGroupRows)
    throw InputError(where + "options: mmvq_max_rows must be in [0, 8] or -1 (auto), found " +
                     std::to_string(o.mmvq_max_rows));
  for (const int sw : {o.gate_up_stream_warps, o.down_stream_warps})
    if (!stream_warps_allowed(sw))
      throw InputError(where + "options: gate_up_stream_warps and down_stream_warps must be " +
                       kStreamWarpsAllowedText + ", found " + std::to_string(sw));
  if (o.max_tokens < 0 || o.max_tokens > (int64_t{1} << 24))
    throw InputError(where + "options: max_tokens must be in [0, 2^24], found " +
                     std::to_string(o.max_tokens));
  if (o.prefetch_k < 0 || o.prefetch_k > 4096)
    throw InputError(where + "options: prefetch_k must be in [0, 4096], found " +
                     std::to_string(o.prefetch_k));
  if (o.prefetch_k > 0 && (cache == nullptr || cache->options().reader_threads == 0))
    throw InputError(
        where + "options: prefetch_k " + std::to_string(o.prefetch_k) +
        " needs an expert cache with a reader pool (CacheOptions::reader_threads > 0)");
  std::string why;
  if (!device_available(&why)) throw InputError(where + "device: " + why);
  int n_dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDeviceCount(&n_dev));
  if (o.device < 0 || o.device >= n_dev)
    throw InputError(where + "options: device " + std::to_string(o.device) + " not in [0, " +
                     std::to_string(n_dev) + ")");
  if (cache != nullptr && cache->options().device != o.device)
    throw InputError(where + "options: device " + std::to_string(o.device) +
                     ", the expert cache's slots are on device " +
                     std::to_string(cache->options().device));
  const bool table = o.route == RoutePlace::kDevice || cache != nullptr;
  if (table && (w.layer < 0 || w.layer >= kSlotTableLayers))
    throw InputError(
        where + "options: the slot table (device route, expert cache) covers layers [0, " +
        std::to_string(kSlotTableLayers) + "), found layer " + std::to_string(w.layer));
  if (o.route == RoutePlace::kDevice && (w.config.n_routed > 2048 || w.config.topk > 64))
    throw InputError(where + "options: the device route needs n_routed <= 2048 and topk <= 64, " +
                     "found " + std::to_string(w.config.n_routed) + ", " +
                     std::to_string(w.config.topk));
  if (cache == nullptr) return;
  const ExpertLayout mine = expert_layout(w);
  if (!mine.same_shape(cache->layout()) || cache->n_routed() != w.config.n_routed)
    throw InputError(where + "expert cache: its slots hold " + cache->layout().describe() + " of " +
                     std::to_string(cache->n_routed()) + " routed experts, the layer has " +
                     mine.describe() + " of " + std::to_string(w.config.n_routed));
}

}  // namespace

MoeLayer::MoeLayer(const LayerWeights& w, LayerOptions o) : impl_(new Impl) {
  Impl& m = *impl_;
  m.w = w;
  m.o = o;
  validate_layer_weights(w, "cuda::MoeLayer");
  check_options(w, o, nullptr);
  m.dense_shared = w.shared_gate.type == GgmlType::kBF16;
  m.setup_device();
  m.upload_weights();
  m.upload_slots();
  m.reserve_max();
}

MoeLayer::MoeLayer(const LayerWeights& w, std::shared_ptr<ExpertLru> cache, LayerOptions o)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.w = w;
  m.o = o;
  if (!cache)
    throw InputError("cuda::MoeLayer: layer " + std::to_string(w.layer) + ": no expert cache");
  validate_layer_weights(w, "cuda::MoeLayer", WeightTypes::kStreamed);
  check_options(w, o, cache.get());
  m.cache = std::move(cache);
  m.dense_shared = w.shared_gate.type == GgmlType::kBF16;
  m.setup_device();
  m.upload_weights();
  m.reserve_max();
}

// With max_tokens, every buffer now: no allocation (and no graph drop) in a forward.
void MoeLayer::Impl::reserve_max() {
  if (o.max_tokens <= 0) return;
  reserve(o.max_tokens);
  const int64_t P = o.max_tokens * w.config.topk;
  reserve_plan(PlanLayout(P, 3 * P, P).bytes);
}

MoeLayer::~MoeLayer() = default;

const LayerOptions& MoeLayer::options() const { return impl_->o; }
int MoeLayer::layer() const { return impl_->w.layer; }

void MoeLayer::Impl::setup_device() {
  MOECHECK_CUDA_CHECK(cudaSetDevice(o.device));
  // The main stream (router, routed experts) outranks the side stream (shared expert): the
  // critical path gets the SMs first and the shared expert fills what is left.
  int prio_low = 0, prio_high = 0;
  MOECHECK_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&main, cudaStreamNonBlocking, prio_high));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, prio_low));
  MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&ev_in, cudaEventDisableTiming));
  MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&ev_out, cudaEventDisableTiming));
  MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&ev_pred, cudaEventDisableTiming));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&mmq_high, cudaStreamNonBlocking, prio_high));
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithPriority(&mmq_low, cudaStreamNonBlocking, prio_low));
  for (cudaEvent_t& e : ev_mmq)
    MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

// The router, every routed expert (resident: each stack is one allocation here, but the kernels
// see experts only through slot pointers; a streamed layer uploads none, its cache holds them)
// and the shared expert. Only the first n_routed experts of a stack are read.
void MoeLayer::Impl::upload_weights() {
  const MoeConfig& c = w.config;
  upload(router, w.router, static_cast<size_t>(c.n_routed * c.dim) * 2);
  upload(bias, w.bias, static_cast<size_t>(c.n_routed) * 4);
  if (w.bias_vl != nullptr) upload(bias_vl, w.bias_vl, static_cast<size_t>(c.n_routed) * 4);
  if (!cache)
    for (auto [d, s] :
         {std::pair{&gate_exps, &w.gate_exps}, {&up_exps, &w.up_exps}, {&down_exps, &w.down_exps}})
      upload(*d, s->data, static_cast<size_t>(s->expert_stride() * c.n_routed), 16);
  for (auto [d, s] :
       {std::pair{&sh_gate, &w.shared_gate}, {&sh_up, &w.shared_up}, {&sh_down, &w.shared_down}})
    upload(*d, s->data, static_cast<size_t>(s->rows * s->row_stride()), 16);
}

// Scratch for T tokens (grows only; a move drops the captured graphs, which hold raw pointers).
void MoeLayer::Impl::reserve(int64_t T) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, inter = c.inter, E = c.n_routed, P = T * c.topk;
  const int64_t q8 = static_cast<int64_t>(sizeof(BlockQ8_1));
  bool moved = false;
  auto need = [&moved](auto& buf, int64_t n) { moved |= buf.reserve(static_cast<size_t>(n)); };
  // The routed buffers start zeroed: when the device route finds a miss or a NaN key it plans no
  // group, and SwiGLU and the accumulation then read rows no MMVQ wrote (their results are
  // discarded; the host raises the error). compute-sanitizer initcheck found this.
  auto zeroed = [&moved](DevBuf& buf, int64_t n) {
    if (!buf.reserve(static_cast<size_t>(n))) return;
    moved = true;
    MOECHECK_CUDA_CHECK(cudaMemset(buf.p, 0, buf.bytes));
  };
  need(x, T * dim * 2);
  need(x_q8, T * dim / kQK8_1 * q8);
  need(logits, T * E * 4);
  zeroed(gu, 2 * P * inter * 4);
  zeroed(h, P * inter * 4);
  zeroed(h_q8, P * inter / kQK8_1 * q8);
  zeroed(down, P * dim * 4);
  for (DevBuf* b : {&sg, &su, &sh}) need(*b, T * inter * 4);
  need(shb, T * inter * 2);
  need(sh_q8, T * inter / kQK8_1 * q8);
  for (DevBuf* b : {&sd, &acc}) need(*b, T * dim * 4);
  need(y, T * dim * 2);
  need(h_x, T * dim * 2);
  need(h_logits, T * E * 4);
  need(h_y, T * dim * 2);
  const int64_t words = header_words(T) * kSlotTableLayers;
  need(hdr, words * 4);
  need(h_hdr, words * 4);
  need(dplan, static_cast<int64_t>(DevicePlanLayout(T, c.topk).bytes));
  need(mask, T);
  need(h_mask, T);
  if (moved) drop_graphs();
}

void MoeLayer::Impl::reserve_plan(size_t bytes) {
  const bool moved_h = h_plan.reserve(bytes);
  const bool moved_d = plan.reserve(bytes);
  if (moved_h || moved_d) drop_graphs();
}

// Input up, q8_1 of x, the router and the logits down on the main stream; then the shared
// expert forks off to the side stream and runs while the host routes. When predicting, the next
// layer's router on x runs first on the side stream (or after the logits on the main one).
void MoeLayer::Impl::pre_route(const uint16_t* xin, int64_t T, bool predicting) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, E = c.n_routed;
  std::memcpy(h_x.p, xin, static_cast<size_t>(T * dim * 2));
  launch({0, T, 0, 0, 0}, main, [&](cudaStream_t s) {
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(x.p, h_x.p, T * dim * 2, cudaMemcpyHostToDevice, s));
    quantize_q8_1_bf16(x.as<uint16_t>(), x_q8.as<BlockQ8_1>(), T, dim, s);
    router_gemv(o.router, router.as<uint16_t>(), x.as<uint16_t>(), logits.as<float>(), E, dim, T, s,
                w.router_type);
    MOECHECK_CUDA_CHECK(
        cudaMemcpyAsync(h_logits.p, logits.p, T * E * 4, cudaMemcpyDeviceToHost, s));
  });
  if (o.shared_side_stream) {
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_in, main));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(side, ev_in, 0));
    if (predicting) predict_launch(T, side);
    launch({1, T, 0, 0, 0}, side, [&](cudaStream_t s) { shared_expert(T, s); });
    MOECHECK_CUDA_CHECK(cudaEventRecord(ev_out, side));
  } else if (predicting) {
    predict_launch(T, main);
  }
}

// The shared expert on all T tokens (stream s), reading x / x_q8, writing sd.
void MoeLayer::Impl::shared_expert(int64_t T, cudaStream_t s, bool programmatic) {
  const MoeConfig& c = w.config;
  if (dense_shared) {
    using pdl::Mode;
    bf16_gemv_pair(sh_gate.as<uint16_t>(), sh_up.as<uint16_t>(), x.as<uint16_t>(), sg.as<float>(),
                   su.as<float>(), c.inter, c.dim, T, s);
    {
      const pdl::Scope sc(programmatic ? Mode::kLaunch : Mode::kOff);
      swiglu_bf16(sg.as<float>(), su.as<float>(), sh.as<float>(), shb.as<uint16_t>(), T, c.inter,
                  c.shared_swiglu_limit(), s);
    }
    // The down weights are constants: its first rows may stream before h is ready.
    const pdl::Scope sc(programmatic ? Mode::kEarlyReads : Mode::kOff);
    bf16_gemv(sh_down.as<uint16_t>(), shb.as<uint16_t>(), sd.as<float>(), c.dim, c.inter, T, s);
  } else {
    const int ew = o.expert_warps;
    const bool q = T > mmvq_max_rows_at(o, T);  // MMQ above the MMVQ rows, as the routed experts
    auto proj = [&](const MatView& m, const DevBuf& wb, const BlockQ8_1* a, DevBuf& y, int64_t rows,
                    int64_t K) {
      if (q) mmq(m.type, wb.as<uint8_t>(), a, y.as<float>(), rows, K, T, s);
      else mmvq(m.type, wb.as<uint8_t>(), a, y.as<float>(), rows, K, T, ew, s);
    };
    proj(w.shared_gate, sh_gate, x_q8.as<BlockQ8_1>(), sg, c.inter, c.dim);
    proj(w.shared_up, sh_up, x_q8.as<BlockQ8_1>(), su, c.inter, c.dim);
    swiglu_q8(sg.as<float>(), su.as<float>(), sh.as<float>(), sh_q8.as<BlockQ8_1>(), T, c.inter,
              c.shared_swiglu_limit(), s);
    proj(w.shared_down, sh_down, sh_q8.as<BlockQ8_1>(), sd, c.dim, c.inter);
  }
}

// The plan into pinned memory: device slot pointers of the used experts, groups, acc rows and
// weights.
void MoeLayer::Impl::pack_plan(const LayerPlan& p, const PlanLayout& L) {
  auto* hp = h_plan.as<uint8_t>();
  std::vector<const uint8_t*> slots;
  if (cache) {  // the lease's slots, in the plan's expert order (ascending id, as asked)
    const int64_t U = p.n_experts();
    slots.resize(static_cast<size_t>(3 * U));
    for (int64_t u = 0; u < U; ++u)
      for (int j = 0; j < 3; ++j)
        slots[static_cast<size_t>(j * U + u)] =
            cache->slot_data(pend.lease.slots[static_cast<size_t>(u)], kAllProjs[j]);
  } else {
    slots =
        plan_slots(p, gate_exps.as<uint8_t>(), w.gate_exps.expert_stride(), up_exps.as<uint8_t>(),
                   w.up_exps.expert_stride(), down_exps.as<uint8_t>(), w.down_exps.expert_stride());
  }
  std::memcpy(hp + L.slots, slots.data(), slots.size() * sizeof(void*));
  std::memcpy(hp + L.groups, p.groups.data(), p.groups.size() * sizeof(MmvqGroup));
  std::memcpy(hp + L.rows, p.acc_rows.data(), p.acc_rows.size() * 4);
  std::memcpy(hp + L.weights, p.acc_weights.data(), p.acc_weights.size() * 4);
}

// Gate and up of every selected expert: the MMVQ groups (one launch when every group is one,
// and gate and up share a type), then the MMQ groups of the experts with more pairs.
void MoeLayer::Impl::routed_gate_up(const LayerPlan& p, const uint8_t* const* slots,
                                    const MmvqGroup* groups) {
  const MoeConfig& c = w.config;
  const int64_t n = p.n_proj_groups, ns = p.n_mmvq_groups;
  const int ew = o.expert_warps, max_n = p.max_group_rows;
  const BlockQ8_1* xq = x_q8.as<BlockQ8_1>();
  if (w.gate_exps.type == w.up_exps.type && ns == n) {
    mmvq_groups(w.gate_exps.type, slots, groups, 2 * n, max_n, xq, gu.as<float>(), c.inter, c.dim,
                ew, main, p.tokens);
    return;
  }
  mmvq_groups(w.gate_exps.type, slots, groups, ns, max_n, xq, gu.as<float>(), c.inter, c.dim, ew,
              main, p.tokens);
  mmvq_groups(w.up_exps.type, slots, groups + n, ns, max_n, xq, gu.as<float>(), c.inter, c.dim, ew,
              main, p.tokens);
  if (ns == n) return;
  if (w.gate_exps.type == w.up_exps.type) {
    mmq_groups(w.gate_exps.type, slots, groups + ns, n - ns, 2, n, xq, gu.as<float>(), c.inter,
               c.dim, main);
  } else {
    mmq_groups(w.gate_exps.type, slots, groups + ns, n - ns, 1, n, xq, gu.as<float>(), c.inter,
               c.dim, main);
    mmq_groups(w.up_exps.type, slots, groups + n + ns, n - ns, 1, n, xq, gu.as<float>(), c.inter,
               c.dim, main);
  }
}

// Plan upload, gate/up, SwiGLU + q8_1, down on the main stream (graph-capturable): MMVQ for the
// plan's first n_mmvq_groups groups of each projection, MMQ for the rest.
void MoeLayer::Impl::routed(const LayerPlan& p, const PlanLayout& L) {
  const MoeConfig& c = w.config;
  const int64_t P = p.pairs(), n = p.n_proj_groups, ns = p.n_mmvq_groups;
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(plan.p, h_plan.p, L.bytes, cudaMemcpyHostToDevice, main));
  const auto* slots = reinterpret_cast<const uint8_t* const*>(plan.as<uint8_t>() + L.slots);
  const auto* groups = reinterpret_cast<const MmvqGroup*>(plan.as<uint8_t>() + L.groups);
  routed_gate_up(p, slots, groups);
  swiglu_q8(gu.as<float>(), gu.as<float>() + P * c.inter, h.as<float>(), h_q8.as<BlockQ8_1>(), P,
            c.inter, c.swiglu_limit, main);
  mmvq_groups(w.down_exps.type, slots, groups + 2 * n, ns, p.max_group_rows, h_q8.as<BlockQ8_1>(),
              down.as<float>(), c.dim, c.inter, o.expert_warps, main, p.tokens);
  mmq_groups(w.down_exps.type, slots, groups + 2 * n + ns, n - ns, 1, n, h_q8.as<BlockQ8_1>(),
             down.as<float>(), c.dim, c.inter, main);
}

// Routed experts, then (without the side stream) the shared expert, the join, the accumulation
// and the output down to the host, enqueued on the main stream (the caller synchronises).
void MoeLayer::Impl::enqueue_tail(const LayerPlan& p, const PlanLayout& L, int64_t T) {
  const MoeConfig& c = w.config;
  launch({2, p.pairs(), p.n_experts() * kMaxGroupRows + p.max_group_rows,
          p.n_proj_groups * (p.pairs() + 1) + p.n_mmvq_groups, L.bytes},
         main, [&](cudaStream_t) { routed(p, L); });
  if (o.shared_side_stream) {
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(main, ev_out, 0));
  } else {
    launch({1, T, 0, 0, 0}, main, [&](cudaStream_t s) { shared_expert(T, s); });
  }
  accumulate(reinterpret_cast<const int32_t*>(plan.as<uint8_t>() + L.rows),
             reinterpret_cast<const float*>(plan.as<uint8_t>() + L.weights), c.topk,
             down.as<float>(), sd.as<float>(), acc.as<float>(), y.as<uint16_t>(), T, c.dim, main);
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(h_y.p, y.p, T * c.dim * 2, cudaMemcpyDeviceToHost, main));
}

// Weight bytes the forward read: the router, the used experts and the shared expert.
uint64_t MoeLayer::Impl::weight_bytes(const LayerPlan& p) const {
  const MoeConfig& c = w.config;
  uint64_t bytes = static_cast<uint64_t>(c.n_routed * c.dim * 2);
  bytes += static_cast<uint64_t>(p.n_experts()) *
           static_cast<uint64_t>(w.gate_exps.expert_stride() + w.up_exps.expert_stride() +
                                 w.down_exps.expert_stride());
  for (const MatView* s : {&w.shared_gate, &w.shared_up, &w.shared_down})
    bytes += static_cast<uint64_t>(s->rows * s->row_stride());
  return bytes;
}

// Every stage back to the host, folded with the emulation's functions (core/layer_plan.h).
void MoeLayer::Impl::fold_taps(const uint16_t* xin, int64_t T, const Routing& rt,
                               const LayerPlan& p, LayerTaps& taps) {
  const MoeConfig& c = w.config;
  const int64_t dim = c.dim, inter = c.inter, P = p.pairs();
  cudaStream_t s = main;
  taps.layer = w.layer;
  taps.tokens = T;
  taps.input.assign(xin, xin + T * dim);
  taps.router_logits.assign(h_logits.as<float>(), h_logits.as<float>() + T * c.n_routed);
  taps.topk_ids = rt.ids;
  taps.topk_weights = rt.weights;
  copy_back(taps.x_q8, x_q8.p, T * dim / kQK8_1, s);
  std::vector<float> gu_h, h_h, down_h;
  std::vector<BlockQ8_1> hq_h;
  copy_back(gu_h, gu.p, 2 * P * inter, s);
  copy_back(h_h, h.p, P * inter, s);
  copy_back(hq_h, h_q8.p, P * inter / kQK8_1, s);
  copy_back(down_h, down.p, P * dim, s);
  ExpertTaps& sx = taps.shared;
  copy_back(sx.gate, sg.p, T * inter, s);
  copy_back(sx.up, su.p, T * inter, s);
  copy_back(sx.h, sh.p, T * inter, s);
  if (dense_shared) sx.h_q8.clear();
  else copy_back(sx.h_q8, sh_q8.p, T * inter / kQK8_1, s);
  copy_back(sx.down, sd.p, T * dim, s);
  copy_back(taps.acc, acc.p, T * dim, s);
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  fill_shared_taps(sx, T);
  fold_routed_taps(p, gu_h.data(), h_h.data(), hq_h.data(), down_h.data(), inter, dim,
                   taps.experts);
  taps.output.assign(h_y.as<uint16_t>(), h_y.as<uint16_t>() + T * dim);
}

std::vector<uint16_t> MoeLayer::forward(const uint16_t* xin, int64_t T, LayerTaps* taps,
                                        LayerTiming* timing, const uint8_t* image_mask) {
  Impl& m = *impl_;
  const MoeConfig& c = m.w.config;
  m.check_tokens(T, "forward");
  if (T == 0) return {};
  if (m.o.route == RoutePlace::kHost) {
    m.stage(xin, T, image_mask);
    m.launch_staged();
    return m.finish_staged(taps, timing);
  }
  const auto t_start = std::chrono::steady_clock::now();
  MOECHECK_CUDA_CHECK(cudaSetDevice(m.o.device));
  m.reserve(T);
  const bool masked = image_mask != nullptr && m.w.bias_vl != nullptr;
  SideFence fence{m.side, m.o.shared_side_stream};
  std::memcpy(m.h_x.p, xin, static_cast<size_t>(T * c.dim * 2));
  MOECHECK_CUDA_CHECK(
      cudaMemcpyAsync(m.x.p, m.h_x.p, T * c.dim * 2, cudaMemcpyHostToDevice, m.main));
  if (masked) {
    std::memcpy(m.h_mask.p, image_mask, static_cast<size_t>(T));
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(m.mask.p, m.h_mask.p, T, cudaMemcpyHostToDevice, m.main));
  }
  LayerTiming tm;
  if (m.cache) m.forward_device_cached(T, masked, image_mask, &tm);
  else m.device_pass(T, masked);
  fence.armed = false;  // finish_device joined the side stream
  const Routing rt = m.header_routing(T, image_mask);
  LayerPlan plan;
  if (taps != nullptr || timing != nullptr)
    plan = build_layer_plan(rt, c.n_routed, mmvq_max_rows_at(m.o, T));
  if (taps != nullptr)
    MOECHECK_CUDA_CHECK(
        cudaMemcpy(m.h_logits.p, m.logits.p, T * c.n_routed * 4, cudaMemcpyDeviceToHost));
  std::vector<uint16_t> out(m.h_y.as<uint16_t>(), m.h_y.as<uint16_t>() + T * c.dim);
  if (timing != nullptr) {
    // The selection runs inside the enqueued forward: route_ms stays 0, the rest is compute.
    const double total =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start)
            .count();
    tm.compute_ms = total - tm.fetch_ms;
    tm.weight_bytes = m.weight_bytes(plan);
    timing->add(tm);
  }
  if (taps != nullptr) {
    m.fold_taps(xin, T, rt, plan, *taps);
    if (image_mask != nullptr) taps->image_mask.assign(image_mask, image_mask + T);
    else taps->image_mask.clear();
  }
  return out;
}

}  // namespace moecheck::cuda
