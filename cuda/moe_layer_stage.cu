// cuda::MoeLayer's host route in three steps (stage, launch, finish: the seeds' stage_m1 /
// compute_m1), the prefetch of the next layer's predicted experts, and the device route through
// an expert cache (run, read the misses the route header names, run again). Contract:
// docs/streaming.md "The layer with a cache"; the rest of the driver: cuda/moe_layer.cu,
// cuda/moe_layer_route.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/route_header.h"
#include "core/routing_trace.h"
#include "cuda/moe_layer_impl.cuh"

namespace moecheck::cuda {
namespace {

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string where_of(const LayerWeights& w, const char* op) {
  return "cuda::MoeLayer: layer " + std::to_string(w.layer) + ", " + op + ": ";
}

}  // namespace

const MoeStage& MoeLayer::stage(const uint16_t* x, int64_t T, const uint8_t* image_mask) {
  impl_->stage(x, T, image_mask);
  return impl_->stage_out;
}

void MoeLayer::launch() { impl_->launch_staged(); }

std::vector<uint16_t> MoeLayer::finish(LayerTaps* taps, LayerTiming* timing) {
  return impl_->finish_staged(taps, timing);
}

void MoeLayer::set_next(const MoeLayer* next) {
  Impl& m = *impl_;
  const std::string where = where_of(m.w, "set_next");
  if (next == this) throw InputError(where + "a layer cannot be its own next layer");
  if (next != nullptr && (!m.cache || next->impl_->cache != m.cache))
    throw InputError(where + "the next layer (" + std::to_string(next->layer()) +
                     ") must read its experts through the same expert cache");
  if (next != nullptr && next->impl_->w.config.dim != m.w.config.dim)
    throw InputError(where + "the next layer's dim " + std::to_string(next->impl_->w.config.dim) +
                     " differs from this layer's " + std::to_string(m.w.config.dim));
  m.next = next;
}

// The next layer's router on this layer's input x (already on the device), its logits down to
// h_pred, ev_pred recorded after them, on stream s.
void MoeLayer::Impl::predict_launch(int64_t T, cudaStream_t s) {
  const Impl& n = *next->impl_;
  const int64_t E = n.w.config.n_routed, dim = w.config.dim;
  pred_logits.reserve(static_cast<size_t>(T * E * 4));
  h_pred.reserve(static_cast<size_t>(T * E * 4));
  router_gemv(n.o.router, n.router.as<uint16_t>(), x.as<uint16_t>(), pred_logits.as<float>(), E,
              dim, T, s, n.w.router_type);
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(h_pred.p, pred_logits.p, static_cast<size_t>(T * E * 4),
                                      cudaMemcpyDeviceToHost, s));
  MOECHECK_CUDA_CHECK(cudaEventRecord(ev_pred, s));
}

// The predicted logits routed on the host with the next layer's bias (and this forward's image
// mask), ranked by prefetch_order; the first prefetch_k start reading. A prediction is a hint: a
// NaN key in it (InputError) prefetches nothing.
void MoeLayer::Impl::prefetch_next(int64_t T, const uint8_t* image_mask) {
  MOECHECK_CUDA_CHECK(cudaEventSynchronize(ev_pred));
  const Impl& n = *next->impl_;
  const MoeConfig& nc = n.w.config;
  Routing pr;
  try {
    pr = route_from_logits(h_pred.as<float>(), T, RouteBias{n.w.bias, n.w.bias_vl, image_mask}, nc,
                           n.w.layer);
  } catch (const InputError&) {
    return;
  }
  std::vector<int32_t> order = prefetch_order(pr.ids, T, nc.topk);
  if (static_cast<int64_t>(order.size()) > o.prefetch_k)
    order.resize(static_cast<size_t>(o.prefetch_k));
  cache->prefetch(n.w.layer, order);
}

void MoeLayer::Impl::stage(const uint16_t* xin, int64_t T, const uint8_t* image_mask) {
  const MoeConfig& c = w.config;
  const std::string where = where_of(w, "stage");
  if (o.route != RoutePlace::kHost)
    throw InputError(where +
                     "the stage / launch / finish split is the host route's "
                     "(LayerOptions::route = kHost)");
  if (pend.staged) throw InputError(where + "the previous stage has not been finished (finish())");
  check_tokens(T, "stage");
  if (T <= 0) throw InputError(where + "need T >= 1, found " + std::to_string(T));
  MOECHECK_CUDA_CHECK(cudaSetDevice(o.device));
  pend = Pending{};
  pend.t_start = std::chrono::steady_clock::now();
  reserve(T);
  const bool predicting = next != nullptr && o.prefetch_k > 0;
  SideFence fence{side, o.shared_side_stream};
  pre_route(xin, T, predicting);
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(main));
  Routing rt = route_from_logits(h_logits.as<float>(), T, RouteBias{w.bias, w.bias_vl, image_mask},
                                 c, w.layer);
  check_resident(rt);
  pend.plan = build_layer_plan(rt, c.n_routed, mmvq_max_rows_at(o, T));
  const auto t_routed = std::chrono::steady_clock::now();
  if (cache) {
    pend.lease = cache->acquire(w.layer, pend.plan.experts, main);
    pend.leased = true;
  }
  try {
    if (predicting) prefetch_next(T, image_mask);  // after this forward's own reads
    pend.layout = PlanLayout(pend.plan);
    reserve_plan(pend.layout.bytes);
    pack_plan(pend.plan, pend.layout);
  } catch (...) {
    if (pend.leased) {
      try {
        cache->release(pend.lease, main);
      } catch (...) {}
    }
    throw;
  }
  fence.armed = false;
  if (image_mask != nullptr) pend.mask.assign(image_mask, image_mask + T);
  pend.T = T;
  pend.staged = true;
  stage_out = MoeStage{};
  stage_out.tokens = T;
  stage_out.n_experts = pend.plan.n_experts();
  stage_out.routing = std::move(rt);
  stage_out.timing.route_ms = ms_between(pend.t_start, t_routed);
  stage_out.timing.fetch_ms = pend.lease.fetch_ms;
  stage_out.timing.hits = pend.lease.hits;
  stage_out.timing.misses = pend.lease.misses;
  stage_out.timing.bytes_read = pend.lease.bytes_read;
}

void MoeLayer::Impl::launch_staged() {
  if (!pend.staged || pend.launched)
    throw InputError(where_of(w, "launch") +
                     (pend.staged ? "already launched" : "nothing staged (stage())"));
  pend.t_launch = std::chrono::steady_clock::now();
  enqueue_tail(pend.plan, pend.layout, pend.T);
  pend.launched = true;
}

std::vector<uint16_t> MoeLayer::Impl::finish_staged(LayerTaps* taps, LayerTiming* timing) {
  if (!pend.staged) throw InputError(where_of(w, "finish") + "nothing staged (stage())");
  if (!pend.launched) launch_staged();
  struct Done {  // the stage ends whatever happens below
    Pending& p;
    ~Done() { p.staged = p.launched = false; }
  } done{pend};
  const MoeConfig& c = w.config;
  const int64_t T = pend.T;
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(main));
  if (pend.leased) {
    pend.leased = false;
    cache->release(pend.lease, main);
  }
  std::vector<uint16_t> out(h_y.as<uint16_t>(), h_y.as<uint16_t>() + T * c.dim);
  if (timing != nullptr) {
    LayerTiming tm = stage_out.timing;
    tm.compute_ms =
        ms_between(pend.t_start, std::chrono::steady_clock::now()) - tm.route_ms - tm.fetch_ms;
    tm.weight_bytes = weight_bytes(pend.plan);
    timing->add(tm);
  }
  if (taps != nullptr) {
    fold_taps(h_x.as<uint16_t>(), T, stage_out.routing, pend.plan, *taps);
    taps->image_mask = pend.mask;
  }
  return out;
}

// One device-route pass: the cache's table updates first, the body, then the layer's slots
// marked in use by it.
void MoeLayer::Impl::device_pass(int64_t T, bool masked) {
  if (cache) cache->fence(main);
  launch({5, T, masked ? 1 : 0, 0, 0}, main, [&](cudaStream_t) { device_body(T, masked); });
  if (cache) cache->layer_used(w.layer, main);
  finish_device(T);
}

// The device route through the cache: the pass reads what the slot table holds; when the header
// flags a miss, the picks' experts are acquired (the misses read) and the pass runs again, the
// same bits (the selection depends only on the logits). Then the picks count as the forward's
// hits and misses, the prefetch of the next layer starts, and the pins are dropped.
void MoeLayer::Impl::forward_device_cached(int64_t T, bool masked, const uint8_t* image_mask,
                                           LayerTiming* tm) {
  const MoeConfig& c = w.config;
  const bool predicting = next != nullptr && o.prefetch_k > 0;
  if (predicting) predict_launch(T, main);
  device_pass(T, masked);
  const int32_t* hd = h_hdr.as<int32_t>() + w.layer * header_words(T);
  const int32_t status = hd[RouteHeaderLayout::kStatus];
  if (status & kRouteNaN) return;  // header_routing raises it
  std::vector<int32_t> experts(hd + RouteHeaderLayout::kPicks,
                               hd + RouteHeaderLayout::kPicks + T * c.topk);
  std::sort(experts.begin(), experts.end());
  experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
  const CacheLease lease = cache->acquire(w.layer, experts, main);
  try {
    if (status & kRouteMiss) device_pass(T, masked);
    if (predicting) prefetch_next(T, image_mask);
  } catch (...) {
    try {
      cache->release(lease, main);
    } catch (...) {}
    throw;
  }
  cache->release(lease, main);
  tm->fetch_ms = lease.fetch_ms;
  tm->hits = lease.hits;
  tm->misses = lease.misses;
  tm->bytes_read = lease.bytes_read;
}

}  // namespace moecheck::cuda
