// validate_layer_weights: the shapes, types and presence every implementation needs before it
// reads a layer (core/layer_weights.h). Names follow llama.cpp's tensors (docs/gguf.md).
#include "core/layer_weights.h"

#include "core/error.h"
#include "core/numfmt.h"

namespace moecheck {

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ8_1: return "Q8_1";
    case GgmlType::kQ2K: return "Q2_K";
    case GgmlType::kQ3K: return "Q3_K";
    case GgmlType::kBF16: return "BF16";
  }
  return "unknown";
}

namespace {

std::string shape(int64_t rows, int64_t cols) {
  std::string s = "[";
  s += std::to_string(rows);
  s += ", ";
  s += std::to_string(cols);
  s += "]";
  return s;
}

bool k_quant(GgmlType t) { return t == GgmlType::kQ2K || t == GgmlType::kQ3K; }
bool dequantizable(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 || k_quant(t);
}

class Validator {
 public:
  Validator(const LayerWeights& w, const std::string& who, WeightTypes types)
      : w_(w),
        where_(who + ": layer " + std::to_string(w.layer)),
        kernel_(types != WeightTypes::kDequantized),
        streamed_(types == WeightTypes::kStreamed) {}

  [[noreturn]] void fail(const std::string& tensor, const std::string& msg) const {
    throw InputError(where_ + ": tensor blk." + std::to_string(w_.layer) + "." + tensor + ": " +
                     msg);
  }

  void stack(const std::string& name, const ExpertStackView& s, int64_t rows, int64_t cols) const {
    const MoeConfig& c = w_.config;
    if (s.data == nullptr && !streamed_) fail(name, "missing");
    const bool type_ok = kernel_ ? k_quant(s.type) : dequantizable(s.type);
    if (!type_ok || s.rows != rows || s.cols != cols || s.n_experts < c.n_routed)
      fail(name, "expected " + std::to_string(c.n_routed) + " experts of " + shape(rows, cols) +
                     " in " + (kernel_ ? "Q2_K or Q3_K" : "F32, F16, BF16, Q2_K or Q3_K") +
                     ", found " + std::to_string(s.n_experts) + " experts of " +
                     shape(s.rows, s.cols) + " in " + ggml_type_name(s.type));
  }

  void shared(const std::string& name, const MatView& m, bool dense, int64_t rows,
              int64_t cols) const {
    if (m.data == nullptr) fail(name, "missing");
    std::string want = "F32, F16, BF16, Q2_K or Q3_K ";
    bool type_ok = dequantizable(m.type);
    if (kernel_) {
      type_ok = dense ? m.type == GgmlType::kBF16 : k_quant(m.type);
      want = dense ? "BF16 " : "Q2_K or Q3_K ";
    }
    if (!type_ok || m.rows != rows || m.cols != cols)
      fail(name, "expected " + want + shape(rows, cols) +
                     (kernel_ ? " (the shared expert is all BF16 or all K-quant)" : "") +
                     ", found " + ggml_type_name(m.type) + " " + shape(m.rows, m.cols));
  }

  void run() const {
    const MoeConfig& c = w_.config;
    c.validate(where_);
    if (w_.router == nullptr) fail("ffn_gate_inp.weight", "missing");
    if (w_.router_type != GgmlType::kBF16 && w_.router_type != GgmlType::kF16)
      fail("ffn_gate_inp.weight",
           std::string("expected BF16 or F16, found ") + ggml_type_name(w_.router_type));
    if (w_.bias == nullptr) fail("exp_probs_b.bias", "missing");
    stack("ffn_gate_exps.weight", w_.gate_exps, c.inter, c.dim);
    stack("ffn_up_exps.weight", w_.up_exps, c.inter, c.dim);
    stack("ffn_down_exps.weight", w_.down_exps, c.dim, c.inter);
    const bool dense = w_.shared_gate.type == GgmlType::kBF16;
    shared("ffn_gate_shexp.weight", w_.shared_gate, dense, c.inter, c.dim);
    shared("ffn_up_shexp.weight", w_.shared_up, dense, c.inter, c.dim);
    shared("ffn_down_shexp.weight", w_.shared_down, dense, c.dim, c.inter);
  }

 private:
  const LayerWeights& w_;
  std::string where_;
  bool kernel_;
  bool streamed_;
};

}  // namespace

float router_weight(const LayerWeights& w, int64_t i) {
  return w.router_type == GgmlType::kF16 ? f16_to_f32(w.router[i]) : bf16_to_f32(w.router[i]);
}

void validate_layer_weights(const LayerWeights& w, const std::string& who, WeightTypes types) {
  Validator(w, who, types).run();
}

}  // namespace moecheck
