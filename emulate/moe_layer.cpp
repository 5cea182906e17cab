// The emulation's layer driver: replays the CUDA token path stage by stage with the emulation
// twins (router_gemv, route_from_logits, quantize_q8_1, mmvq, swiglu_q8, bf16_gemv, accumulate,
// finish). Contract: docs/numerics.md. Host threads split the output rows of a projection;
// every (row, token) result is computed by one call on its own, so neither the thread count
// nor the grouping of tokens per expert changes a bit.
#include "emulate/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "emulate/accumulate.h"
#include "emulate/bf16_gemv.h"
#include "core/error.h"
#include "emulate/mmvq.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "emulate/quantize_q8_1.h"
#include "core/routing.h"
#include "emulate/swiglu_q8.h"

namespace moecheck::emu {

struct MoeLayer::Impl {
  int threads = 1;

  // fn(r0, r1, buf) computes rows [r0, r1) of a [T, rows] output as [T, r1 - r0] into buf;
  // the pieces are scattered into y. Rows are cut into one contiguous range per thread.
  template <class F>
  void split_rows(int64_t rows, int64_t T, float* y, F fn) const {
    const int64_t n = std::min<int64_t>(threads, std::max<int64_t>(rows / 64, 1));
    auto piece = [&](int64_t i) {
      const int64_t r0 = rows * i / n, r1 = rows * (i + 1) / n;
      std::vector<float> buf(static_cast<size_t>(T * (r1 - r0)));
      fn(r0, r1, buf.data());
      for (int64_t k = 0; k < T; ++k) {
        std::copy(buf.begin() + k * (r1 - r0), buf.begin() + (k + 1) * (r1 - r0),
                  y + k * rows + r0);
      }
    };
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < n; ++i) pool.emplace_back(piece, i);
    piece(0);
    for (auto& th : pool) th.join();
  }

  // K-quant projection: w [rows, K] rows of blocks, a [T, K / 32] -> y [T, rows].
  void quant(GgmlType t, const uint8_t* w, int64_t rows, int64_t K, const BlockQ8_1* a,
             int64_t T, float* y) const {
    const int64_t rb = row_bytes(t, K);
    split_rows(rows, T, y, [&](int64_t r0, int64_t r1, float* buf) {
      mmvq(t, w + r0 * rb, a, buf, r1 - r0, K, T);
    });
  }

  // bf16 GEMV in a given schedule: w [rows, K], x [T, K] -> y [T, rows].
  void dense(RouterVariant v, const uint16_t* w, int64_t rows, int64_t K, const uint16_t* x,
             int64_t T, float* y) const {
    split_rows(rows, T, y, [&](int64_t r0, int64_t r1, float* buf) {
      router_gemv(v, w + r0 * K, x, buf, r1 - r0, K, T);
    });
  }
};

namespace {

std::string where(const LayerWeights& w, const std::string& tensor) {
  return "emu::MoeLayer: layer " + std::to_string(w.layer) + ", " + tensor;
}

void check_shape(const LayerWeights& w, const std::string& tensor, bool quant_ok, GgmlType type,
                 const uint8_t* data, int64_t rows, int64_t cols, int64_t want_rows,
                 int64_t want_cols) {
  const bool type_ok = quant_ok ? (type == GgmlType::kQ2K || type == GgmlType::kQ3K)
                                : type == GgmlType::kBF16;
  if (!type_ok || data == nullptr || rows != want_rows || cols != want_cols) {
    throw InputError(where(w, tensor) + ": expected " + (quant_ok ? "Q2_K/Q3_K" : "BF16") + " [" +
                     std::to_string(want_rows) + ", " + std::to_string(want_cols) +
                     "], found type " + std::to_string(static_cast<uint32_t>(type)) + " [" +
                     std::to_string(rows) + ", " + std::to_string(cols) + "]" +
                     (data == nullptr ? " with no data" : ""));
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

MoeLayer::MoeLayer(const LayerWeights& w, LayerOptions o) : w_(w), o_(o), impl_(new Impl) {
  const MoeConfig& c = w.config;
  c.validate(where(w, "config"));
  if (!expert_warps_allowed(o.expert_warps)) {
    throw InputError(where(w, "options") + ": expert_warps must be 2, 4 or 8, found " +
                     std::to_string(o.expert_warps));
  }
  if (w.router == nullptr) throw InputError(where(w, "ffn_gate_inp.weight") + ": missing");
  if (w.bias == nullptr) throw InputError(where(w, "exp_probs_b.bias") + ": missing");
  for (const auto* s : {&w.gate_exps, &w.up_exps, &w.down_exps}) {
    const bool down = s == &w.down_exps;
    const std::string name = down ? "ffn_down_exps" : (s == &w.gate_exps ? "ffn_gate_exps"
                                                                          : "ffn_up_exps");
    check_shape(w, name, true, s->type, s->data, s->rows, s->cols, down ? c.dim : c.inter,
                down ? c.inter : c.dim);
    if (s->n_experts < c.n_routed) {
      throw InputError(where(w, name) + ": expected " + std::to_string(c.n_routed) +
                       " experts, found " + std::to_string(s->n_experts));
    }
  }
  const bool dense = w.shared_gate.type == GgmlType::kBF16;
  check_shape(w, "ffn_gate_shexp", !dense, w.shared_gate.type, w.shared_gate.data,
              w.shared_gate.rows, w.shared_gate.cols, c.inter, c.dim);
  check_shape(w, "ffn_up_shexp", !dense, w.shared_up.type, w.shared_up.data, w.shared_up.rows,
              w.shared_up.cols, c.inter, c.dim);
  check_shape(w, "ffn_down_shexp", !dense, w.shared_down.type, w.shared_down.data,
              w.shared_down.rows, w.shared_down.cols, c.dim, c.inter);
  const unsigned hw = std::thread::hardware_concurrency();
  impl_->threads = o.threads > 0 ? o.threads : static_cast<int>(std::clamp(hw, 1u, 8u));
}

MoeLayer::~MoeLayer() = default;

std::vector<uint16_t> MoeLayer::forward(const uint16_t* x, int64_t T, LayerTaps* taps,
                                        LayerTiming* timing) const {
  const MoeConfig& c = w_.config;
  const int64_t dim = c.dim, inter = c.inter, E = c.n_routed, K = c.topk;
  if (T < 0) throw InputError(where(w_, "input") + ": negative token count");
  const auto t0 = std::chrono::steady_clock::now();
  if (taps != nullptr) taps->experts.clear();

  // Router logits and host routing.
  std::vector<float> logits(static_cast<size_t>(T * E));
  impl_->dense(o_.router, w_.router, E, dim, x, T, logits.data());
  const Routing rt = route_from_logits(logits.data(), T, w_.bias, c, w_.layer);
  const double route_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();

  // x to q8_1 (bf16 widens exactly).
  std::vector<float> xf(static_cast<size_t>(T * dim));
  for (int64_t i = 0; i < T * dim; ++i) xf[i] = bf16_to_f32(x[i]);
  std::vector<BlockQ8_1> xq(static_cast<size_t>(T * dim / kQK8_1));
  quantize_q8_1(xf.data(), xq.data(), T, dim);

  // Routed experts in ascending id; each expert's tokens ascending, in groups of <= 8 rows.
  std::vector<std::vector<int64_t>> picks(static_cast<size_t>(E));  // pick slots t * K + k
  for (int64_t i = 0; i < T * K; ++i) picks[rt.ids[i]].push_back(i);
  std::vector<float> down_all(static_cast<size_t>(T * K * dim));
  std::vector<float> g, u, h, d;
  std::vector<BlockQ8_1> a, hq;
  for (int64_t e = 0; e < E; ++e) {
    if (picks[e].empty()) continue;
    ExpertTaps* et = nullptr;
    if (taps != nullptr) {
      et = &taps->experts.emplace_back();
      et->expert = static_cast<int32_t>(e);
    }
    const int64_t n_e = static_cast<int64_t>(picks[e].size());
    for (int64_t p0 = 0; p0 < n_e; p0 += kMaxGroupRows) {
      const int64_t gn = std::min<int64_t>(kMaxGroupRows, n_e - p0);
      a.resize(static_cast<size_t>(gn * dim / kQK8_1));
      for (int64_t r = 0; r < gn; ++r) {
        const int64_t t = picks[e][p0 + r] / K;
        std::copy_n(xq.begin() + t * dim / kQK8_1, dim / kQK8_1, a.begin() + r * dim / kQK8_1);
      }
      g.resize(static_cast<size_t>(gn * inter));
      u.resize(g.size());
      h.resize(g.size());
      hq.resize(static_cast<size_t>(gn * inter / kQK8_1));
      d.resize(static_cast<size_t>(gn * dim));
      impl_->quant(w_.gate_exps.type, w_.gate_exps.expert(e).data, inter, dim, a.data(), gn,
                   g.data());
      impl_->quant(w_.up_exps.type, w_.up_exps.expert(e).data, inter, dim, a.data(), gn, u.data());
      swiglu_q8(g.data(), u.data(), h.data(), hq.data(), gn, inter, c.swiglu_limit);
      impl_->quant(w_.down_exps.type, w_.down_exps.expert(e).data, dim, inter, hq.data(), gn,
                   d.data());
      for (int64_t r = 0; r < gn; ++r) {
        std::copy_n(d.begin() + r * dim, dim, down_all.begin() + picks[e][p0 + r] * dim);
      }
      if (et != nullptr) {
        for (int64_t r = 0; r < gn; ++r) {
          et->tokens.push_back(static_cast<int32_t>(picks[e][p0 + r] / K));
          et->weights.push_back(rt.weights[picks[e][p0 + r]]);
        }
        et->gate.insert(et->gate.end(), g.begin(), g.end());
        et->up.insert(et->up.end(), u.begin(), u.end());
        et->h.insert(et->h.end(), h.begin(), h.end());
        et->h_q8.insert(et->h_q8.end(), hq.begin(), hq.end());
        et->down.insert(et->down.end(), d.begin(), d.end());
      }
    }
  }

  // Shared expert on all tokens.
  std::vector<float> sg(static_cast<size_t>(T * inter)), su(sg.size()), sh(sg.size());
  std::vector<float> sd(static_cast<size_t>(T * dim));
  std::vector<BlockQ8_1> shq;
  if (w_.shared_gate.type == GgmlType::kBF16) {
    const auto* wg = reinterpret_cast<const uint16_t*>(w_.shared_gate.data);
    const auto* wu = reinterpret_cast<const uint16_t*>(w_.shared_up.data);
    const auto* wd = reinterpret_cast<const uint16_t*>(w_.shared_down.data);
    impl_->dense(RouterVariant::kPlain, wg, inter, dim, x, T, sg.data());
    impl_->dense(RouterVariant::kPlain, wu, inter, dim, x, T, su.data());
    swiglu_q8(sg.data(), su.data(), sh.data(), nullptr, T, inter, c.swiglu_limit);
    std::vector<uint16_t> hb(sh.size());  // model.py's x.to(dtype) before w2
    for (size_t i = 0; i < sh.size(); ++i) hb[i] = f32_to_bf16(sh[i]);
    impl_->dense(RouterVariant::kPlain, wd, dim, inter, hb.data(), T, sd.data());
  } else {
    shq.resize(static_cast<size_t>(T * inter / kQK8_1));
    impl_->quant(w_.shared_gate.type, w_.shared_gate.data, inter, dim, xq.data(), T, sg.data());
    impl_->quant(w_.shared_up.type, w_.shared_up.data, inter, dim, xq.data(), T, su.data());
    swiglu_q8(sg.data(), su.data(), sh.data(), shq.data(), T, inter, c.swiglu_limit);
    impl_->quant(w_.shared_down.type, w_.shared_down.data, dim, inter, shq.data(), T, sd.data());
  }

  std::vector<float> acc(static_cast<size_t>(T * dim));
  accumulate(rt.ids.data(), rt.weights.data(), down_all.data(), sd.data(), acc.data(), T, K, dim);
  std::vector<uint16_t> y(static_cast<size_t>(T * dim));
  finish(acc.data(), y.data(), T * dim);

  if (timing != nullptr) {
    timing->route_ms += route_ms;
    timing->compute_ms += ms_since(t1);
  }
  if (taps != nullptr) {
    taps->layer = w_.layer;
    taps->tokens = T;
    taps->input.assign(x, x + T * dim);
    taps->router_logits = std::move(logits);
    taps->topk_ids = rt.ids;
    taps->topk_weights = rt.weights;
    taps->x_q8 = std::move(xq);
    ExpertTaps& s = taps->shared;
    s.expert = -1;
    s.tokens.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) s.tokens[t] = static_cast<int32_t>(t);
    s.weights.assign(static_cast<size_t>(T), 1.0f);
    s.gate = std::move(sg);
    s.up = std::move(su);
    s.h = std::move(sh);
    s.h_q8 = std::move(shq);
    s.down = std::move(sd);
    taps->acc = std::move(acc);
    taps->output = y;
  }
  return y;
}

}  // namespace moecheck::emu
