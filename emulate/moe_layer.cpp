// The emulation's layer driver: replays the CUDA token path stage by stage with the emulation
// twins (router_gemv, route_from_logits, the plan of core/layer_plan.h, quantize_q8_1_bf16,
// mmvq_groups, swiglu_q8, bf16_gemv_pair / swiglu_bf16 / bf16_gemv or mmvq for the shared
// expert, accumulate). Contract: docs/numerics.md. Host threads split the output rows of a
// projection; every (row, token) result is computed by one call on its own, so neither the
// thread count nor the grouping of tokens per expert changes a bit.
#include "emulate/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/layer_plan.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "emulate/accumulate.h"
#include "emulate/bf16_gemv.h"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"
#include "emulate/swiglu_q8.h"

namespace moecheck::emu {

namespace {

// Host threads over the output rows of one projection.
struct RowSplitter {
  int threads = 1;

  // fn(r0, r1) for one contiguous row range per thread (at least 64 rows a range).
  template <class F>
  void for_row_ranges(int64_t rows, F fn) const {
    const int64_t n = std::min<int64_t>(threads, std::max<int64_t>(rows / 64, 1));
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < n; ++i)
      pool.emplace_back([&, i] { fn(rows * i / n, rows * (i + 1) / n); });
    fn(int64_t{0}, rows / n);
    for (auto& th : pool) th.join();
  }

  // fn(r0, r1, buf) computes rows [r0, r1) of a [T, rows] output as [T, r1 - r0] into buf; the
  // pieces are scattered into y.
  template <class F>
  void split_rows(int64_t rows, int64_t T, float* y, F fn) const {
    for_row_ranges(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(static_cast<size_t>(T * (r1 - r0)));
      fn(r0, r1, buf.data());
      for (int64_t k = 0; k < T; ++k)
        std::copy(buf.begin() + k * (r1 - r0), buf.begin() + (k + 1) * (r1 - r0),
                  y + k * rows + r0);
    });
  }
};

// The routed experts' pair-row buffers (core/layer_plan.h): gu [2P, inter], h [P, inter],
// hq [P, inter / 32], down [P, dim].
struct RoutedOut {
  std::vector<float> gu, h, down;
  std::vector<BlockQ8_1> hq;
};

// The shared expert on all tokens: gate, up, h [T, inter], hq (K-quant only), down [T, dim].
struct SharedOut {
  std::vector<float> gate, up, h, down;
  std::vector<BlockQ8_1> hq;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const uint16_t* bf16_data(const MatView& m) { return reinterpret_cast<const uint16_t*>(m.data); }

}  // namespace

struct MoeLayer::Impl {
  RowSplitter rows;
};

MoeLayer::MoeLayer(const LayerWeights& w, LayerOptions o) : w_(w), o_(o), impl_(new Impl) {
  validate_layer_weights(w, "emu::MoeLayer");
  if (!expert_warps_allowed(o.expert_warps)) {
    throw InputError("emu::MoeLayer: layer " + std::to_string(w.layer) +
                     ", options: expert_warps must be 2, 4 or 8, found " +
                     std::to_string(o.expert_warps));
  }
  if (o.max_tokens < 0)
    throw InputError("emu::MoeLayer: layer " + std::to_string(w.layer) +
                     ", options: max_tokens must be >= 0, found " + std::to_string(o.max_tokens));
  const unsigned hw = std::thread::hardware_concurrency();
  impl_->rows.threads = o.threads > 0 ? o.threads : static_cast<int>(std::clamp(hw, 1u, 8u));
}

MoeLayer::~MoeLayer() = default;

namespace {

// Gate and up of every group, the SwiGLU + q8_1 of every pair row, down of every group.
RoutedOut run_routed(const RowSplitter& m, const LayerWeights& w, const LayerPlan& p,
                     const std::vector<BlockQ8_1>& xq) {
  const MoeConfig& c = w.config;
  const int64_t P = p.pairs(), n = p.n_proj_groups;
  const std::vector<const uint8_t*> slots =
      plan_slots(p, w.gate_exps.data, w.gate_exps.expert_stride(), w.up_exps.data,
                 w.up_exps.expert_stride(), w.down_exps.data, w.down_exps.expert_stride());
  RoutedOut r;
  r.gu.resize(static_cast<size_t>(2 * P * c.inter));
  r.h.resize(static_cast<size_t>(P * c.inter));
  r.hq.resize(static_cast<size_t>(P * c.inter / kQK8_1));
  r.down.resize(static_cast<size_t>(P * c.dim));
  m.for_row_ranges(c.inter, [&](int64_t r0, int64_t r1) {
    mmvq_groups(w.gate_exps.type, slots.data(), p.gate_groups(), n, xq.data(), r.gu.data(), c.inter,
                c.dim, r0, r1);
    mmvq_groups(w.up_exps.type, slots.data(), p.up_groups(), n, xq.data(), r.gu.data(), c.inter,
                c.dim, r0, r1);
  });
  swiglu_q8(r.gu.data(), r.gu.data() + P * c.inter, r.h.data(), r.hq.data(), P, c.inter,
            c.swiglu_limit);
  m.for_row_ranges(c.dim, [&](int64_t r0, int64_t r1) {
    mmvq_groups(w.down_exps.type, slots.data(), p.down_groups(), n, r.hq.data(), r.down.data(),
                c.dim, c.inter, r0, r1);
  });
  return r;
}

// The shared expert: bf16 (bf16_gemv_pair, swiglu_bf16, bf16_gemv) or K-quant (mmvq on x_q8,
// swiglu_q8, mmvq on h_q8), as cuda::MoeLayer runs it.
SharedOut run_shared(const RowSplitter& m, const LayerWeights& w, const uint16_t* x,
                     const std::vector<BlockQ8_1>& xq, int64_t T) {
  const MoeConfig& c = w.config;
  const int64_t inter = c.inter, dim = c.dim;
  SharedOut s;
  s.gate.resize(static_cast<size_t>(T * inter));
  s.up.resize(s.gate.size());
  s.h.resize(s.gate.size());
  s.down.resize(static_cast<size_t>(T * dim));
  if (w.shared_gate.type == GgmlType::kBF16) {
    const uint16_t *wg = bf16_data(w.shared_gate), *wu = bf16_data(w.shared_up),
                   *wd = bf16_data(w.shared_down);
    m.for_row_ranges(inter, [&](int64_t r0, int64_t r1) {
      std::vector<float> g(static_cast<size_t>(T * (r1 - r0))), u(g.size());
      bf16_gemv_pair(wg + r0 * dim, wu + r0 * dim, x, g.data(), u.data(), r1 - r0, dim, T);
      for (int64_t k = 0; k < T; ++k) {
        std::copy_n(g.begin() + k * (r1 - r0), r1 - r0, s.gate.begin() + k * inter + r0);
        std::copy_n(u.begin() + k * (r1 - r0), r1 - r0, s.up.begin() + k * inter + r0);
      }
    });
    std::vector<uint16_t> hb(s.h.size());
    swiglu_bf16(s.gate.data(), s.up.data(), s.h.data(), hb.data(), T, inter,
                c.shared_swiglu_limit());
    m.split_rows(dim, T, s.down.data(), [&](int64_t r0, int64_t r1, float* buf) {
      bf16_gemv(wd + r0 * inter, hb.data(), buf, r1 - r0, inter, T);
    });
    return s;
  }
  auto quant = [&](const MatView& mv, int64_t rows, int64_t K, const BlockQ8_1* a, float* y) {
    m.split_rows(rows, T, y, [&](int64_t r0, int64_t r1, float* buf) {
      mmvq(mv.type, mv.data + r0 * mv.row_stride(), a, buf, r1 - r0, K, T);
    });
  };
  s.hq.resize(static_cast<size_t>(T * inter / kQK8_1));
  quant(w.shared_gate, inter, dim, xq.data(), s.gate.data());
  quant(w.shared_up, inter, dim, xq.data(), s.up.data());
  swiglu_q8(s.gate.data(), s.up.data(), s.h.data(), s.hq.data(), T, inter, c.shared_swiglu_limit());
  quant(w.shared_down, dim, inter, s.hq.data(), s.down.data());
  return s;
}

void fill_taps(LayerTaps& taps, const LayerWeights& w, const uint16_t* x, const uint8_t* image_mask,
               int64_t T, std::vector<float>&& logits, const Routing& rt, const LayerPlan& p,
               std::vector<BlockQ8_1>&& xq, const RoutedOut& r, SharedOut&& s,
               std::vector<float>&& acc, const std::vector<uint16_t>& y) {
  const MoeConfig& c = w.config;
  taps.layer = w.layer;
  taps.tokens = T;
  taps.input.assign(x, x + T * c.dim);
  if (image_mask != nullptr) taps.image_mask.assign(image_mask, image_mask + T);
  else taps.image_mask.clear();
  taps.router_logits = std::move(logits);
  taps.topk_ids = rt.ids;
  taps.topk_weights = rt.weights;
  taps.x_q8 = std::move(xq);
  fold_routed_taps(p, r.gu.data(), r.h.data(), r.hq.data(), r.down.data(), c.inter, c.dim,
                   taps.experts);
  fill_shared_taps(taps.shared, T);
  taps.shared.gate = std::move(s.gate);
  taps.shared.up = std::move(s.up);
  taps.shared.h = std::move(s.h);
  taps.shared.h_q8 = std::move(s.hq);
  taps.shared.down = std::move(s.down);
  taps.acc = std::move(acc);
  taps.output = y;
}

}  // namespace

std::vector<uint16_t> MoeLayer::forward(const uint16_t* x, int64_t T, LayerTaps* taps,
                                        LayerTiming* timing, const uint8_t* image_mask) const {
  const MoeConfig& c = w_.config;
  const int64_t dim = c.dim, E = c.n_routed;
  if (T < 0)
    throw InputError("emu::MoeLayer: layer " + std::to_string(w_.layer) +
                     ", input: negative token count");
  if (o_.max_tokens > 0 && T > o_.max_tokens)
    throw InputError("emu::MoeLayer: layer " + std::to_string(w_.layer) +
                     ", input: T=" + std::to_string(T) +
                     " exceeds LayerOptions::max_tokens=" + std::to_string(o_.max_tokens));
  const auto t0 = std::chrono::steady_clock::now();

  // Router logits, host routing and the plan.
  std::vector<float> logits(static_cast<size_t>(T * E));
  impl_->rows.split_rows(E, T, logits.data(), [&](int64_t r0, int64_t r1, float* buf) {
    router_gemv(o_.router, w_.router + r0 * dim, x, buf, r1 - r0, dim, T, w_.router_type);
  });
  const Routing rt =
      route_from_logits(logits.data(), T, RouteBias{w_.bias, w_.bias_vl, image_mask}, c, w_.layer);
  const LayerPlan plan = build_layer_plan(rt, E);
  const double route_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();

  std::vector<BlockQ8_1> xq(static_cast<size_t>(T * dim / kQK8_1));
  quantize_q8_1_bf16(x, xq.data(), T, dim);
  const RoutedOut routed = run_routed(impl_->rows, w_, plan, xq);
  SharedOut shared = run_shared(impl_->rows, w_, x, xq, T);
  std::vector<float> acc(static_cast<size_t>(T * dim));
  std::vector<uint16_t> y(static_cast<size_t>(T * dim));
  accumulate(plan.acc_rows.data(), plan.acc_weights.data(), c.topk, routed.down.data(),
             shared.down.data(), acc.data(), y.data(), T, dim);

  if (timing != nullptr) {
    timing->route_ms += route_ms;
    timing->compute_ms += ms_since(t1);
  }
  if (taps != nullptr)
    fill_taps(*taps, w_, x, image_mask, T, std::move(logits), rt, plan, std::move(xq), routed,
              std::move(shared), std::move(acc), y);
  return y;
}

}  // namespace moecheck::emu
