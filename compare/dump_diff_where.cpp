// Mismatch locations of `moecheck diff`. For an output column c of gate / up / down the weight
// row is c and its K-quant super-blocks span the whole input dimension; for an element k of an
// input dimension (x, h) the q8_1 block is k / 32, the super-block k / 256 and the sub-block
// (k % 256) / 16 of every weight row that reads it. Contract: docs/cli.md "diff".
#include "compare/dump_diff_where.h"

#include "core/blocks.h"

namespace moecheck {
namespace {

std::string input_element(int64_t k, const std::string& weights) {
  return "q8_1 block " + std::to_string(k / kQK8_1) + ", super-block " + std::to_string(k / kQK_K) +
         " sub-block " + std::to_string((k % kQK_K) / 16) + " of every " + weights + " row";
}

std::string expert_tensor(const char* stem, int32_t expert) {
  return expert < 0 ? std::string("ffn_") + stem + "_shexp"
                    : std::string("ffn_") + stem + "_exps[" + std::to_string(expert) + "]";
}

}  // namespace

std::string where_input_element(const MoeConfig&, int64_t k) {
  return "x element " + std::to_string(k) + ": " + input_element(k, "ffn_gate_exps / ffn_up_exps");
}

std::string where_router_row(int64_t e) {
  return "router row " + std::to_string(e) + " (ffn_gate_inp)";
}

std::string where_q8_block(const MoeConfig&, int64_t g, bool down_input, int32_t expert) {
  const std::string w =
      down_input ? expert_tensor("down", expert) : std::string("ffn_gate_exps / ffn_up_exps");
  return "q8_1 block " + std::to_string(g) + " (elements " + std::to_string(g * kQK8_1) + ".." +
         std::to_string(g * kQK8_1 + kQK8_1 - 1) + "), super-block " +
         std::to_string(g * kQK8_1 / kQK_K) + " sub-blocks " +
         std::to_string((g * kQK8_1 % kQK_K) / 16) + "-" +
         std::to_string((g * kQK8_1 % kQK_K) / 16 + 1) + " of every " + w + " row";
}

std::string where_expert_element(const MoeConfig& c, ExpertField f, int32_t expert, int64_t j) {
  const bool shared = expert < 0;
  if (f == ExpertField::kWeights) return "routing weight";
  if (f == ExpertField::kGate || f == ExpertField::kUp) {
    const std::string t = expert_tensor(f == ExpertField::kGate ? "gate" : "up", expert);
    return "weight row " + std::to_string(j) + " of " + t +
           (shared ? "" : " (Q2_K blocks 0.." + std::to_string(c.dim / kQK_K - 1) + ")");
  }
  if (f == ExpertField::kH)
    return "h element " + std::to_string(j) + ": " +
           input_element(j, expert_tensor("down", expert));
  return "weight row " + std::to_string(j) + " of " + expert_tensor("down", expert) +
         (shared ? "" : " (Q3_K blocks 0.." + std::to_string(c.inter / kQK_K - 1) + ")");
}

std::string where_output_column(int64_t j) {
  return "column " + std::to_string(j) + ": weight row " + std::to_string(j) +
         " of the picked ffn_down_exps and ffn_down_shexp";
}

std::string q8_field_name(int i) {
  if (i < 2) return "d";
  if (i < 4) return "s";
  return "qs[" + std::to_string(i - 4) + "]";
}

}  // namespace moecheck
