// The emulation's layer driver: one MoE layer forward on the CPU that replays the CUDA token
// path stage by stage (router GEMV, host routing, q8_1, MMVQ gate/up, SwiGLU + q8_1, MMVQ
// down, shared expert, accumulate, finish), equal to moecheck::cuda::MoeLayer bit for bit.
// Contract: docs/numerics.md (every section) and docs/emulation.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/layer_weights.h"
#include "core/schedule.h"
#include "core/taps.h"
#include "emulate/router_gemv.h"

namespace moecheck::emu {

struct LayerOptions {
  RouterVariant router = RouterVariant::kStaged;
  int expert_warps = kDefaultExpertWarps;  // 2, 4 or 8; no effect on any bit
  int threads = 0;                         // host threads (0: hardware); no effect on any bit
  // The largest T a forward takes (> 0: a larger T is refused with an InputError naming it;
  // 0: any T), as cuda::LayerOptions::max_tokens.
  int64_t max_tokens = 0;
};

class MoeLayer {
 public:
  // Checks the weights' shapes and types against w.config (InputError naming the layer and
  // tensor). The views must outlive the MoeLayer.
  explicit MoeLayer(const LayerWeights& w, LayerOptions o = {});
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x bf16 [T, dim] -> y bf16 [T, dim]. Any T; tokens are grouped per expert in groups of at
  // most kMaxGroupRows rows, and no (row, token) result depends on the grouping. image_mask [T]
  // (nullable): nonzero tokens select with bias_vl (model.py Gate.forward) when the layer has
  // one; the taps record a copy of it.
  std::vector<uint16_t> forward(const uint16_t* x, int64_t T, LayerTaps* taps = nullptr,
                                LayerTiming* timing = nullptr,
                                const uint8_t* image_mask = nullptr) const;

  const LayerWeights& weights() const { return w_; }
  const LayerOptions& options() const { return o_; }

 private:
  struct Impl;
  LayerWeights w_;
  LayerOptions o_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecheck::emu
