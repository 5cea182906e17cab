// The per-kind differs of one layer of two dumps (internal to compare/): token-row stages,
// routing weights, q8_1 block rows, per-expert stages, and the layer's verdict. diff_dumps
// (compare/dump_diff.cpp) runs them in pipeline order. Contract: docs/cli.md "diff".
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "compare/dump_diff.h"
#include "compare/stage_acc.h"

namespace moecheck::diff_detail {

// Routing of one layer compared as sets per token; agree[t] says whether token t's sets match.
// bias: the layer's router biases for key margins, each side's own image mask choosing bias or
// bias_vl per token (nullptr: logit margins).
RoutingDiff diff_routing(const LayerTaps& a, const LayerTaps& b, const MoeConfig& c,
                         const RouteBias* bias, std::vector<bool>& agree);

// Whether one side's expert h / down are scaled by the routing weight before comparing (one side
// ran model.py's weights-before-w2, the other weights-in-accumulate), and which.
struct Rescale {
  bool active = false;
  bool a_weighted = false;  // A applied the weight before w2 (so B is scaled)
};

class LayerDiffer {
 public:
  LayerDiffer(const LayerTaps& a, const LayerTaps& b, const MoeConfig& c, const DiffOptions& o,
              const std::vector<bool>& agree, Rescale rescale);

  // input, router_logits (all tokens); acc, output (tokens whose routing agrees).
  void token_rows(Stage s, bool bf16, const void* pa, const void* pb, int64_t cols,
                  bool all_tokens);
  // The image masks token by token (no mask = 0 everywhere), into the input stage (after it): a
  // differing token fails it with a note. Returns the number of differing tokens.
  int64_t image_mask();
  // topk_ids (the routing diff's flip count) and topk_weights matched by expert id.
  void topk(const RoutingDiff& r);
  // x_q8 of every token.
  void x_q8();
  // The six expert stages over experts both sides ran (routed), or the shared expert.
  void experts(bool shared);
  // acc, or its status when one side lacks it.
  void acc();
  // Per-stage pass and the layer's verdict into `out` (stages moved there).
  void verdict(LayerDiff& out);

 private:
  StageDiff& add_stage(Stage s, const std::string& dtype);
  const Tolerance& tol_for(Stage s) const;
  Mismatch loc(Stage s, int64_t t, int32_t expert, int64_t i) const;
  // One q8_1 row set into `acc`: rows of tokens toks_a / toks_b (matched by token id).
  void q8_rows(StageAcc& acc, StageDiff& s, const std::vector<BlockQ8_1>& qa,
               const std::vector<BlockQ8_1>& qb, const std::vector<int32_t>& toks_a,
               const std::vector<int32_t>& toks_b, int64_t K, int32_t expert, bool down_input);
  void expert_q8(Stage s, const std::vector<const ExpertTaps*>& ea,
                 const std::vector<const ExpertTaps*>& eb);
  void expert_f32(Stage s, const std::vector<const ExpertTaps*>& ea,
                  const std::vector<const ExpertTaps*>& eb);

  const LayerTaps& a_;
  const LayerTaps& b_;
  const MoeConfig& c_;
  const DiffOptions& o_;
  const std::vector<bool>& agree_;
  Rescale rescale_;
  std::deque<StageDiff> st_;  // references stay valid while stages are appended
};

}  // namespace moecheck::diff_detail
