// libFuzzer target: the GGUF reader and the model loader on arbitrary bytes. Every input must end
// in a parsed model (each layer's views validated as every implementation validates them) or an
// InputError; any other exception, a crash, a leak or undefined behaviour (ASan + UBSan) is a
// finding. Run: .ci/fuzz (docs/reliability.md "Fuzzing").
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/layer_weights.h"
#include "golden/gguf.h"
#include "golden/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    moecheck::gguf::Reader r =
        moecheck::gguf::Reader::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    const moecheck::ModelFile m = moecheck::ModelFile::from_gguf(std::move(r));
    for (int L = 0; L < m.n_layers() && L < 4; ++L) {
      const moecheck::LayerWeights w = m.layer(L);
      moecheck::validate_layer_weights(w, "fuzz", moecheck::WeightTypes::kKernel);
    }
  } catch (const moecheck::InputError&) {}
  return 0;
}
