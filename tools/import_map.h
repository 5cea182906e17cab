// `moecheck import`'s conversion of another engine's tensors into one layer of a moecheck dump,
// and `moecheck export`'s inverse (the same layout): stage by stage, shapes checked against the
// model config. Layouts (row-major, T tokens; a leading axis of 1 is dropped): input, output, acc
// [T, dim]; router_logits [T, n_routed]; topk_ids, topk_weights [T, topk]; x_q8 [T, dim/32, 36]
// u8; experts.gate, up, h [T, topk, inter] and experts.down [T, topk, dim], slot k being the
// expert topk_ids[t, k]; experts.h_q8 [T, topk, inter/32, 36] u8; shared.gate, up, h [T, inter],
// shared.down [T, dim], shared.h_q8 [T, inter/32, 36] u8. With `transpose`, 2-D tensors come
// [cols, T]. Contract: docs/cli.md "import", docs/golden-format.md "Imported dumps".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/taps.h"
#include "golden/tensor_file.h"

namespace moecheck::cli {

// One stage's tensor and where it came from ("engine.npz:output").
struct MappedTensor {
  HostTensor tensor;
  std::string source;
};

// Builds layer L from the mapped stages (input among them, every tap stage or none). InputError
// naming the stage, its source and the field (shape, dtype, a non-finite routing weight, an
// expert id out of range or repeated in a token, an input value that is not bf16).
LayerTaps import_layer(const MoeConfig& c, int L, const std::map<Stage, MappedTensor>& m,
                       bool transpose, bool shared_q8);

// The stages a layer holds as tensors of the import layout (its routed taps by topk slot).
std::map<std::string, HostTensor> export_layer(const MoeConfig& c, const LayerTaps& t);

}  // namespace moecheck::cli
