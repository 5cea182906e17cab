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
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck::cuda {

// Where the top-k selection runs. Only the host route exists so far (the seeds' default); device
// routing (route_select with the slot table, the next issue) adds kDevice and fills the
// LayerTiming fields that stay 0 today.
enum class RoutePlace { kHost };

struct LayerOptions {
  RouterVariant router = RouterVariant::kStaged;
  int expert_warps = kDefaultExpertWarps;  // 2, 4 or 8 warps per MMVQ block; no bit depends on it
  bool shared_side_stream = true;          // shared expert on a side stream; no bit depends on it
  bool use_graphs = false;                 // replay the post-routing launches as a CUDA graph
  int device = 0;
  RoutePlace route = RoutePlace::kHost;
};

class MoeLayer {
 public:
  // Checks shapes and types against w.config (InputError naming the layer and tensor), then
  // uploads the router, every routed expert (resident; kernels read them through a device
  // table of slot pointers) and the shared expert to `o.device`.
  explicit MoeLayer(const LayerWeights& w, LayerOptions o = {});
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x bf16 [T, dim] (host) -> y bf16 [T, dim]. Any T >= 0.
  std::vector<uint16_t> forward(const uint16_t* x, int64_t T, LayerTaps* taps = nullptr,
                                LayerTiming* timing = nullptr);

  const LayerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when a CUDA device can be used; otherwise false with the reason in *why (if given).
bool device_available(std::string* why);
// cudaGetDeviceProperties' name of `device`, or "" when none.
std::string device_name(int device);

}  // namespace moecheck::cuda
