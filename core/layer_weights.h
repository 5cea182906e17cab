// One MoE layer's weights as every implementation reads them: non-owning views of the raw
// GGUF bytes (router bf16, bias f32, stacked Q2_K / Q3_K experts, shared expert). The owner (a
// mapped GGUF file, a generator's buffers, later an expert cache) keeps the bytes alive through
// `keep_alive`. Expert e of a stacked tensor starts at byte e * expert_stride (llama.cpp layout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/blocks.h"
#include "core/config.h"

namespace moecheck {

// "Q2_K", "BF16", ... (ggml's names); "unknown" for any other value.
const char* ggml_type_name(GgmlType t);

// A row-major matrix [rows, cols] of one type; each row holds `cols` values (ggml ne0 = cols).
struct MatView {
  GgmlType type = GgmlType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;

  int64_t row_stride() const { return row_bytes(type, cols); }
  const uint8_t* row(int64_t r) const { return data + r * row_stride(); }
};

// A stack of n_experts matrices [rows, cols] of one type (ggml ne = [cols, rows, n_experts]).
struct ExpertStackView {
  GgmlType type = GgmlType::kQ2K;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t n_experts = 0;
  const uint8_t* data = nullptr;

  int64_t expert_stride() const { return rows * row_bytes(type, cols); }
  MatView expert(int64_t e) const { return MatView{type, rows, cols, data + e * expert_stride()}; }
};

struct LayerWeights {
  int layer = 0;
  MoeConfig config;
  const uint16_t* router = nullptr;  // [n_routed, dim] of router_type (blk.N.ffn_gate_inp.weight)
  // BF16 (moecheck's files) or F16 (the deepseek4 / deepseek41 conventions' routers); both widen
  // to f32 exactly, so every implementation computes the same products (docs/numerics.md
  // "router_gemv").
  GgmlType router_type = GgmlType::kBF16;
  const float* bias = nullptr;  // f32 [n_routed]         (blk.N.exp_probs_b.bias)
  // model.py Gate.bias_vl: the selection bias of image-span tokens, f32 [n_routed]
  // (blk.N.exp_probs_b_vl.bias; docs/gguf.md), or nullptr when the model has none.
  const float* bias_vl = nullptr;
  ExpertStackView gate_exps;  // Q2_K [n_routed][inter, dim]  w1
  ExpertStackView up_exps;    // Q2_K [n_routed][inter, dim]  w3
  ExpertStackView down_exps;  // Q3_K [n_routed][dim, inter]  w2
  MatView shared_gate;        // [inter, dim]  bf16, or K-quant (gate/up Q2_K, down Q3_K)
  MatView shared_up;          // [inter, dim]
  MatView shared_down;        // [dim, inter]
  std::shared_ptr<const void> keep_alive;
};

// Router weight i (row-major [n_routed, dim]) as f32, exactly: bf16 or f16 by w.router_type.
float router_weight(const LayerWeights& w, int64_t i);

// Which weight types a reader accepts. kKernel: what the emulation and the CUDA kernels read in
// place (routed stacks Q2_K or Q3_K; the shared expert all BF16 or all Q2_K / Q3_K). kDequantized:
// what the reference dequantises (F32, F16, BF16, Q2_K, Q3_K anywhere). kStreamed: kKernel's
// types, but the routed stacks may have no bytes (data nullptr: the experts come through an
// ExpertSource, core/expert_source.h); their types and shapes are still checked.
enum class WeightTypes { kKernel, kDequantized, kStreamed };

// The one validator every implementation calls before it reads a layer: the config can work
// (MoeConfig::validate), the router and bias are present, each routed stack holds n_routed or
// more experts of [inter, dim] (down [dim, inter]) and the shared expert the same shapes, with
// the router BF16 or F16 (either reader),
// data, in types `types` accepts. Throws InputError "<who>: layer L: tensor blk.L.<name>:
// expected ..., found ..." (who names the caller: a file, "emu::MoeLayer", ...).
void validate_layer_weights(const LayerWeights& w, const std::string& who,
                            WeightTypes types = WeightTypes::kKernel);

}  // namespace moecheck
