// The whole-layer check of the GPU tests (tests/gpu/moe_layer_test.cu,
// moe_layer_batched_test.cu): cuda::MoeLayer vs emu::MoeLayer bitwise in the output and every
// LayerTaps stage, each forward twice, over launch variants (warps, router, side stream, graphs,
// route, the MMVQ / MMQ split). Failures print the stage, token, column and a repro line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/moe_layer.h"
#include "emulate/moe_layer.h"
#include "golden/generator.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck::gputest {

inline ::testing::AssertionResult same_expert(const std::string& name, const ExpertTaps& got,
                                              const ExpertTaps& want, int64_t dim, int64_t inter,
                                              const std::string& r) {
  if (got.expert != want.expert || got.tokens != want.tokens)
    return ::testing::AssertionFailure()
           << name << ": expert / token lists differ (cuda expert " << got.expert << ", "
           << got.tokens.size() << " tokens; emu expert " << want.expert << ", "
           << want.tokens.size() << " tokens)\n  repro: " << r;
  const std::string n = name + " (expert " + std::to_string(want.expert) + ")";
  for (auto res :
       {same_f32(n + " weights", got.weights, want.weights, 1, r),
        same_f32(n + " gate", got.gate, want.gate, inter, r),
        same_f32(n + " up", got.up, want.up, inter, r), same_f32(n + " h", got.h, want.h, inter, r),
        same_q8(n + " h_q8", got.h_q8, want.h_q8, inter / kQK8_1, r),
        same_f32(n + " down", got.down, want.down, dim, r)})
    if (!res) return res;
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_taps(const LayerTaps& got, const LayerTaps& want,
                                            const MoeConfig& c, const std::string& r) {
  const int64_t dim = c.dim, inter = c.inter;
  if (got.topk_ids != want.topk_ids)
    return ::testing::AssertionFailure() << "topk_ids differ\n  repro: " << r;
  if (got.image_mask != want.image_mask)
    return ::testing::AssertionFailure() << "image_mask taps differ\n  repro: " << r;
  for (auto res : {same_f32("router_logits", got.router_logits, want.router_logits, c.n_routed, r),
                   same_f32("topk_weights", got.topk_weights, want.topk_weights, c.topk, r),
                   same_q8("x_q8", got.x_q8, want.x_q8, dim / kQK8_1, r)})
    if (!res) return res;
  if (got.experts.size() != want.experts.size())
    return ::testing::AssertionFailure() << "expert count " << got.experts.size() << " vs emu "
                                         << want.experts.size() << "\n  repro: " << r;
  for (size_t i = 0; i < want.experts.size(); ++i) {
    auto res = same_expert("routed", got.experts[i], want.experts[i], dim, inter, r);
    if (!res) return res;
  }
  for (auto res : {same_expert("shared", got.shared, want.shared, dim, inter, r),
                   same_f32("acc", got.acc, want.acc, dim, r),
                   gputest::same_u16("output", got.output, want.output, dim, r)})
    if (!res) return res;
  return ::testing::AssertionSuccess();
}

struct Variant {
  int warps;
  RouterVariant router;
  bool side;
  bool graphs;
  RoutePlace route = RoutePlace::kHost;
  // LayerOptions::mmvq_max_rows (default: the layer's own, kMmvqRowsAuto); 0: every routed expert
  // (and the K-quant shared) on MMQ
  int mmvq_max_rows = cuda::kMmvqRowsAuto;
  bool programmatic = false;          // LayerOptions::programmatic_launch
  int fork = -1;  // -1: the default fork points; else the SharedFork for every T
  int gu_warps = 0, down_warps = 0;  // LayerOptions::gate_up_stream_warps, down_stream_warps
  bool prefetch_plan = true;         // LayerOptions::prefetch_plan
  int mmq_beside = cuda::kMmqBesideAuto;  // LayerOptions::mmq_beside
  std::string name() const {
    std::string s = "W";  // appended step by step: GCC 12 warns falsely (-Wrestrict) on a + chain
    s += std::to_string(warps);
    s += router == RouterVariant::kPlain ? "_plain" : "_staged";
    s += side ? "_side" : "_noside";
    s += graphs ? "_graph" : "";
    s += route == RoutePlace::kDevice ? "_devroute" : "";
    if (mmvq_max_rows != cuda::kMmvqRowsAuto) {
      s += "_mmvqmax";
      s += std::to_string(mmvq_max_rows);
    }
    if (programmatic) s += "_prog";
    if (fork >= 0) {
      s += "_fork";
      s += std::to_string(fork);
    }
    if (gu_warps != 0 || down_warps != 0) {
      s += "_sbwarps";
      s += std::to_string(gu_warps);
      s += "x";
      s += std::to_string(down_warps);
    }
    if (!prefetch_plan) s += "_noplanprefetch";
    if (mmq_beside != cuda::kMmqBesideAuto) {
      s += "_mmqbeside";
      s += std::to_string(mmq_beside);
    }
    return s;
  }
};

// A vision bias that picks differently from bias: bias permuted and shifted.
inline std::vector<float> vision_bias(const LayerWeights& w) {
  const int64_t E = w.config.n_routed;
  std::vector<float> b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    b[e] = w.bias[(e * 7 + 3) % E] + 0.0625f * static_cast<float>(e % 5);
  return b;
}

// The mask of T tokens: tokens 1, 2, 4, 5, 7, ... (t % 3 != 0) inside an image span.
inline std::vector<uint8_t> image_mask_of(int64_t T) {
  std::vector<uint8_t> m(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) m[t] = t % 3 != 0;
  return m;
}

// emu once per (router variant, T); every CUDA variant against it, each forward twice. masked:
// the layer gets a bias_vl and every forward an image mask.
inline void run_layer_weights(const LayerWeights& w, const GenOptions& o,
                              const std::vector<int64_t>& Ts, const std::vector<Variant>& variants,
                              uint64_t input_seed, bool masked = false) {
  std::vector<std::unique_ptr<cuda::MoeLayer>> layers;
  for (const Variant& v : variants) {
    cuda::LayerOptions co;
    co.expert_warps = v.warps;
    co.router = v.router;
    co.shared_side_stream = v.side;
    co.use_graphs = v.graphs;
    co.route = v.route;
    co.mmvq_max_rows = v.mmvq_max_rows;
    co.programmatic_launch = v.programmatic;
    co.gate_up_stream_warps = v.gu_warps;
    co.down_stream_warps = v.down_warps;
    co.prefetch_plan = v.prefetch_plan;
    co.mmq_beside = v.mmq_beside;
    if (v.fork >= 0) cuda::set_shared_fork_everywhere(co, static_cast<cuda::SharedFork>(v.fork));
    layers.push_back(std::make_unique<cuda::MoeLayer>(w, co));
  }
  for (RouterVariant rv : {RouterVariant::kPlain, RouterVariant::kStaged}) {
    bool used = false;  // no emulation for a router variant no CUDA variant runs
    for (const Variant& v : variants) used |= v.router == rv;
    if (!used) continue;
    emu::LayerOptions eo;
    eo.router = rv;
    const emu::MoeLayer ref(w, eo);
    for (int64_t T : Ts) {
      const auto x = generate_input(input_seed + static_cast<uint64_t>(T), T, o.config.dim);
      const std::vector<uint8_t> mask = image_mask_of(T);
      const uint8_t* m = masked ? mask.data() : nullptr;
      LayerTaps want;
      const auto y_want = ref.forward(x.data(), T, &want, nullptr, m);
      for (size_t i = 0; i < variants.size(); ++i) {
        if (variants[i].router != rv) continue;
        const std::string r =
            gputest::repro(input_seed + static_cast<uint64_t>(T),
                           "preset " + o.preset + " T=" + std::to_string(T) + " " +
                               variants[i].name() + (masked ? " image mask t%3!=0" : ""));
        for (int run = 0; run < 2; ++run) {
          LayerTaps got;
          const auto y = layers[i]->forward(x.data(), T, &got, nullptr, m);
          ASSERT_TRUE(gputest::same_u16(run == 0 ? "output" : "output (second run)", y, y_want,
                                        o.config.dim, r));
          ASSERT_TRUE(same_taps(got, want, o.config, r));
        }
      }
    }
  }
}

// run_layer_weights on layer `layer` of the preset; masked: the layer gets a bias_vl.
inline void run_layer(const GenOptions& o, const std::vector<int64_t>& Ts,
                      const std::vector<Variant>& variants, uint64_t input_seed,
                      bool masked = false, int layer = 0) {
  LayerWeights w = generate_layer(o, layer);
  const std::vector<float> bvl = vision_bias(w);
  if (masked) w.bias_vl = bvl.data();
  run_layer_weights(w, o, Ts, variants, input_seed, masked);
}

}  // namespace moecheck::gputest
