// Several layers' forwards with the host span of one overlapping the device compute of the one
// before it (the seeds' stage_m1 / compute_m1 split): stage(i) (router, host routing, the cache's
// reads of its misses) runs while layer i-1 computes; the outputs are the bits of the layers run
// one after the other. For callers whose layer inputs are known up front (layer i's input does
// not depend on layer i-1's output: independent per-layer inputs, or micro-batches). Contract:
// docs/streaming.md "Pipelining". A plain C++ header (no CUDA types).
#pragma once

#include <cstdint>
#include <vector>

#include "core/taps.h"
#include "cuda/moe_layer.h"

namespace moecheck::cuda {

struct PipelineStats {
  int64_t serialised = 0;  // stages that had to wait for the layer before to finish (cache full)
};

// Runs layers[i] on x[i] (bf16 [T, dim], image mask masks[i] or nullptr) for every i, host
// route, pipelined; returns each output. taps / timing (nullable) get one entry per layer. When a
// stage cannot get its experts because the layer before still pins them (CacheFullError), that
// layer is finished first and the stage tried again (counted in stats->serialised).
std::vector<std::vector<uint16_t>> forward_pipelined(
    const std::vector<MoeLayer*>& layers, const std::vector<const uint16_t*>& x, int64_t T,
    const std::vector<const uint8_t*>& masks = {}, std::vector<LayerTaps>* taps = nullptr,
    std::vector<LayerTiming>* timing = nullptr, PipelineStats* stats = nullptr);

}  // namespace moecheck::cuda
