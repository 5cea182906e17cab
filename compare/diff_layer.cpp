// The per-kind differs of one layer (compare/diff_layer.h): every stage compared on the tokens
// whose routing agrees (input and logits on all tokens), expert stages on the (expert, token)
// rows both sides computed. Contract: docs/cli.md "diff".
#include "compare/diff_layer.h"

#include <algorithm>

#include "compare/dump_diff_where.h"
#include "compare/stage_acc.h"

namespace moecheck::diff_detail {
namespace {

const char* absent_status(bool any_a, bool any_b) {
  if (!any_a && !any_b) return "absent";
  return any_a ? "only in A" : "only in B";
}

// The row of token t in an expert's token list, or -1.
int64_t row_of(const std::vector<int32_t>& tokens, int32_t t) {
  auto it = std::find(tokens.begin(), tokens.end(), t);
  return it == tokens.end() ? -1 : static_cast<int64_t>(it - tokens.begin());
}

const std::vector<float>& field_of(const ExpertTaps& x, ExpertField f) {
  switch (f) {
    case ExpertField::kWeights: return x.weights;
    case ExpertField::kGate: return x.gate;
    case ExpertField::kUp: return x.up;
    case ExpertField::kH: return x.h;
    case ExpertField::kHQ8:
    case ExpertField::kDown: break;
  }
  return x.down;
}

}  // namespace

LayerDiffer::LayerDiffer(const LayerTaps& a, const LayerTaps& b, const MoeConfig& c,
                         const DiffOptions& o, const std::vector<bool>& agree, Rescale rescale)
    : a_(a), b_(b), c_(c), o_(o), agree_(agree), rescale_(rescale) {}

StageDiff& LayerDiffer::add_stage(Stage s, const std::string& dtype) {
  st_.push_back(StageDiff{});
  st_.back().stage = s;
  st_.back().dtype = dtype;
  return st_.back();
}

const Tolerance& LayerDiffer::tol_for(Stage s) const {
  auto it = o_.stage_tolerance.find(s);
  return it != o_.stage_tolerance.end() ? it->second : o_.tolerance;
}

Mismatch LayerDiffer::loc(Stage s, int64_t t, int32_t expert, int64_t i) const {
  Mismatch m;
  m.layer = a_.layer;
  m.stage = s;
  m.token = t;
  m.expert = expert;
  m.index = i;
  return m;
}

void LayerDiffer::token_rows(Stage s, bool bf16, const void* pa, const void* pb, int64_t cols,
                             bool all_tokens) {
  StageDiff& sd = add_stage(s, bf16 ? "bfloat16" : "float32");
  StageAcc acc(sd, tol_for(s));
  auto where = [&](int64_t j) {
    if (s == Stage::kInput) return where_input_element(c_, j);
    if (s == Stage::kRouterLogits) return where_router_row(j);
    return where_output_column(j);
  };
  for (int64_t t = 0; t < a_.tokens; ++t) {
    if (!all_tokens && !agree_[t]) {
      ++sd.skipped_tokens;
      continue;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = t * cols + j;
      const Elem e =
          bf16 ? bf16_pair(static_cast<const uint16_t*>(pa)[i], static_cast<const uint16_t*>(pb)[i])
               : f32_pair(static_cast<const float*>(pa)[i], static_cast<const float*>(pb)[i]);
      acc.add(e, loc(s, t, -1, j), [&] { return where(j); });
    }
  }
  acc.finish(false);
}

int64_t LayerDiffer::image_mask() {
  auto bit = [](const std::vector<uint8_t>& m, int64_t t) { return m.empty() ? 0 : m[t] != 0; };
  int64_t n = 0, first = -1;
  for (int64_t t = 0; t < a_.tokens; ++t) {
    if (bit(a_.image_mask, t) == bit(b_.image_mask, t)) continue;
    if (n++ == 0) first = t;
  }
  if (n == 0) return 0;
  auto in = std::find_if(st_.begin(), st_.end(),
                         [](const StageDiff& s) { return s.stage == Stage::kInput; });
  if (in == st_.end()) return n;
  in->pass = false;
  in->out_of_tol += n;
  const std::string note = "image_mask differs on " + std::to_string(n) + " token(s), first " +
                           std::to_string(first) + ": A " +
                           std::to_string(bit(a_.image_mask, first)) + ", B " +
                           std::to_string(bit(b_.image_mask, first));
  in->note = in->note.empty() ? note : in->note + "; " + note;
  return n;
}

void LayerDiffer::topk(const RoutingDiff& r) {
  const int64_t k = c_.topk;
  StageDiff& ids = add_stage(Stage::kTopkIds, "int32");
  ids.compared = a_.tokens * k;
  ids.out_of_tol = r.flips;
  ids.pass = r.flips == 0;
  StageDiff& w = add_stage(Stage::kTopkWeights, "float32");
  StageAcc acc(w, tol_for(Stage::kTopkWeights));
  for (int64_t t = 0; t < a_.tokens; ++t) {
    if (!agree_[t]) {
      ++w.skipped_tokens;
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {  // B's weight of the same expert (the sets agree)
      const int32_t e = a_.topk_ids[t * k + j];
      int64_t jb = 0;
      while (b_.topk_ids[t * k + jb] != e) ++jb;
      acc.add(f32_pair(a_.topk_weights[t * k + j], b_.topk_weights[t * k + jb]),
              loc(Stage::kTopkWeights, t, e, e),
              [&] { return "routing weight of expert " + std::to_string(e); });
    }
  }
  acc.finish(false);
}

void LayerDiffer::q8_rows(StageAcc& acc, StageDiff& s, const std::vector<BlockQ8_1>& qa,
                          const std::vector<BlockQ8_1>& qb, const std::vector<int32_t>& toks_a,
                          const std::vector<int32_t>& toks_b, int64_t K, int32_t expert,
                          bool down_input) {
  const int64_t nb = K / kQK8_1;
  for (size_t ra = 0; ra < toks_a.size(); ++ra) {
    const int32_t t = toks_a[ra];
    const int64_t rb = row_of(toks_b, t);
    if (rb < 0)
      continue;  // (x_q8 of any token, h_q8 of a pair both sides computed: no
                 // dependence on the token's other picks, so flipped tokens count)
    for (int64_t g = 0; g < nb; ++g)
      acc.add_q8(qa[ra * nb + g], qb[rb * nb + g], loc(s.stage, t, expert, g),
                 [&] { return where_q8_block(c_, g, down_input, expert); });
  }
}

void LayerDiffer::x_q8() {
  StageDiff& s = add_stage(Stage::kXQ8, "block_q8_1");
  if (a_.x_q8.empty() || b_.x_q8.empty()) {
    s.status = absent_status(!a_.x_q8.empty(), !b_.x_q8.empty());
    return;
  }
  std::vector<int32_t> all(static_cast<size_t>(a_.tokens));
  for (int64_t t = 0; t < a_.tokens; ++t) all[t] = static_cast<int32_t>(t);
  StageAcc acc(s, tol_for(s.stage));
  q8_rows(acc, s, a_.x_q8, b_.x_q8, all, all, c_.dim, -1, false);
  acc.finish(true);
}

void LayerDiffer::expert_q8(Stage st, const std::vector<const ExpertTaps*>& ea,
                            const std::vector<const ExpertTaps*>& eb) {
  StageDiff& s = add_stage(st, "block_q8_1");
  StageAcc acc(s, tol_for(st));
  bool any_a = false, any_b = false;
  for (size_t i = 0; i < ea.size(); ++i) {
    any_a = any_a || !ea[i]->h_q8.empty();
    any_b = any_b || !eb[i]->h_q8.empty();
    if (ea[i]->h_q8.empty() || eb[i]->h_q8.empty()) continue;
    q8_rows(acc, s, ea[i]->h_q8, eb[i]->h_q8, ea[i]->tokens, eb[i]->tokens, c_.inter, ea[i]->expert,
            true);
  }
  if (!any_a || !any_b) s.status = absent_status(any_a, any_b);
  else acc.finish(true);
}

void LayerDiffer::expert_f32(Stage st, const std::vector<const ExpertTaps*>& ea,
                             const std::vector<const ExpertTaps*>& eb) {
  StageDiff& s = add_stage(st, "float32");
  StageAcc acc(s, tol_for(st));
  const ExpertField f = stage_field(st);
  // One side weighted h before w2 (model.py), the other applies the weight in the accumulation:
  // the unweighted side's h / down are scaled by its own routing weight.
  const bool scaled =
      rescale_.active && is_routed_stage(st) && (f == ExpertField::kH || f == ExpertField::kDown);
  if (scaled)
    s.note = std::string(rescale_.a_weighted ? "B" : "A") +
             " scaled by its routing weight (model.py weights h before w2)";
  bool any_a = false, any_b = false;
  for (size_t i = 0; i < ea.size(); ++i) {
    const ExpertTaps& xa = *ea[i];
    const ExpertTaps& xb = *eb[i];
    const std::vector<float>& va = field_of(xa, f);
    const std::vector<float>& vb = field_of(xb, f);
    any_a = any_a || !va.empty();
    any_b = any_b || !vb.empty();
    if (va.empty() || vb.empty() || xa.tokens.empty()) continue;
    const int64_t cols = static_cast<int64_t>(va.size() / xa.tokens.size());
    for (size_t ra = 0; ra < xa.tokens.size(); ++ra) {
      const int32_t t = xa.tokens[ra];
      const int64_t rb = row_of(xb.tokens, t);
      if (rb < 0) continue;
      // A pair both sides computed: gate, up, h and down depend on (expert, token) only, so a
      // flipped token still counts; its routing weight, and an h or down scaled by it, depend on
      // the token's other picks (the renormalisation).
      if (!agree_[t] && (f == ExpertField::kWeights || scaled) && is_routed_stage(st)) {
        ++s.skipped_tokens;
        continue;
      }
      const float sa = scaled && !rescale_.a_weighted ? xa.weights[ra] : 1.0f;
      const float sb = scaled && rescale_.a_weighted ? xb.weights[rb] : 1.0f;
      for (int64_t j = 0; j < cols; ++j)
        acc.add(f32_pair(sa * va[ra * cols + j], sb * vb[rb * cols + j]), loc(st, t, xa.expert, j),
                [&] { return where_expert_element(c_, f, xa.expert, j); });
    }
  }
  if (!any_a || !any_b) s.status = absent_status(any_a, any_b);
  else acc.finish(false);
}

void LayerDiffer::experts(bool shared) {
  std::vector<const ExpertTaps*> ea, eb;
  if (shared) {
    if (!a_.shared.tokens.empty() && !b_.shared.tokens.empty()) {
      ea.push_back(&a_.shared);
      eb.push_back(&b_.shared);
    }
  } else {
    for (const ExpertTaps& x : a_.experts)
      for (const ExpertTaps& y : b_.experts)
        if (x.expert == y.expert) {
          ea.push_back(&x);
          eb.push_back(&y);
        }
  }
  for (int f = 0; f < kExpertFieldCount; ++f) {
    const Stage st = expert_stage(shared, static_cast<ExpertField>(f));
    if (static_cast<ExpertField>(f) == ExpertField::kHQ8) expert_q8(st, ea, eb);
    else expert_f32(st, ea, eb);
  }
}

void LayerDiffer::acc() {
  if (a_.acc.empty() || b_.acc.empty()) {
    add_stage(Stage::kAcc, "float32").status = absent_status(!a_.acc.empty(), !b_.acc.empty());
    return;
  }
  token_rows(Stage::kAcc, false, a_.acc.data(), b_.acc.data(), c_.dim, false);
}

void LayerDiffer::verdict(LayerDiff& out) {
  for (StageDiff& s : st_) {
    // A stage on one side only fails unless informational; absent is neutral. q8_1 blocks exist
    // only where activations are quantised (not in the reference): one side only is reported.
    const bool info = std::find(o_.informational.begin(), o_.informational.end(), s.stage) !=
                          o_.informational.end() ||
                      (s.dtype == "block_q8_1" && !s.status.empty());
    if (s.status == "absent") s.pass = true;
    else if (!s.status.empty()) s.pass = info;
    else if (info) s.pass = true;
    if (!s.pass && out.pass) {
      out.pass = false;
      out.first_failing = s.stage;
    }
  }
  out.stages.assign(st_.begin(), st_.end());
}

}  // namespace moecheck::diff_detail
