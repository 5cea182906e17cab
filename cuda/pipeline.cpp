// forward_pipelined (cuda/pipeline.h): stage(i), launch(i), then finish(i - 1), so layer i's host
// span and its reads run while layer i - 1 computes.
#include "cuda/pipeline.h"

#include <string>

#include "core/error.h"
#include "core/expert_lru_policy.h"

namespace moecheck::cuda {

std::vector<std::vector<uint16_t>> forward_pipelined(
    const std::vector<MoeLayer*>& layers, const std::vector<const uint16_t*>& x, int64_t T,
    const std::vector<const uint8_t*>& masks, std::vector<LayerTaps>* taps,
    std::vector<LayerTiming>* timing, PipelineStats* stats) {
  const size_t n = layers.size();
  if (x.size() != n || (!masks.empty() && masks.size() != n))
    throw InputError("forward_pipelined: " + std::to_string(n) + " layers need as many inputs (" +
                     std::to_string(x.size()) + ") and masks (" + std::to_string(masks.size()) +
                     ", or none)");
  std::vector<std::vector<uint16_t>> out(n);
  if (taps != nullptr) taps->assign(n, LayerTaps{});
  if (timing != nullptr) timing->assign(n, LayerTiming{});
  auto finish = [&](size_t i) {
    out[i] = layers[i]->finish(taps != nullptr ? &(*taps)[i] : nullptr,
                               timing != nullptr ? &(*timing)[i] : nullptr);
  };
  bool open = false;  // layer i - 1 launched, not finished
  try {
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* mask = masks.empty() ? nullptr : masks[i];
      if (open && layers[i] == layers[i - 1]) {  // one stage per layer at a time
        finish(i - 1);
        open = false;
      }
      try {
        layers[i]->stage(x[i], T, mask);
      } catch (const CacheFullError&) {
        if (!open) throw;
        finish(i - 1);  // its pins were in the way: serialise this step
        open = false;
        if (stats != nullptr) ++stats->serialised;
        layers[i]->stage(x[i], T, mask);
      }
      layers[i]->launch();
      if (open) finish(i - 1);
      open = true;
    }
    if (open) finish(n - 1);
  } catch (...) {
    // Whatever failed, a staged layer hands its experts back before the error leaves (finish()
    // of a layer with nothing staged refuses at once).
    for (MoeLayer* l : layers) {
      try {
        (void)l->finish();
      } catch (...) {}
    }
    throw;
  }
  return out;
}

}  // namespace moecheck::cuda
