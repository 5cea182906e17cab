// Stage-by-stage comparison of two dumps: statistics, tolerance verdicts and located
// mismatches. Routing first (sets per token), then every stage on the tokens whose routing
// agrees. Contract: docs/cli.md "diff" (the rules and the statistics' definitions).
#include "compare/dump_diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/numfmt.h"
#include "core/routing.h"
#include "compare/dump_diff_where.h"

namespace moecheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One element pair, already in f32 / bf16 bit form.
struct Elem {
  float a, b;
  uint32_t a_bits, b_bits;
  uint64_t ulp;
};

class StageAcc {
 public:
  StageAcc(StageDiff& s, const Tolerance& tol) : s_(s), tol_(tol) {}

  // Returns whether the pair is within the tolerance's per-element rule.
  void add(const Elem& e, const Mismatch& loc, const std::function<std::string()>& where) {
    ++s_.compared;
    const bool na = std::isnan(e.a), nb = std::isnan(e.b);
    bool ok = false;
    if (na || nb) {
      ok = na && nb && tol_.nan_equal && (tol_.mode != ToleranceMode::kExact || e.a_bits == e.b_bits);
      if (!ok) ++s_.nan_mismatch;
    } else {
      const double a = e.a, b = e.b;
      const double d = a == b ? 0.0 : std::fabs(a - b);
      const double rel = d == 0.0 ? 0.0 : (a == 0.0 ? kInf : d / std::fabs(a));
      s_.max_abs = std::max(s_.max_abs, d);
      s_.max_rel = std::max(s_.max_rel, rel);
      s_.max_ulp = std::max(s_.max_ulp, e.ulp);
      s_.sum_sq_a += a * a;
      s_.sum_sq_diff += d * d;
      switch (tol_.mode) {
        case ToleranceMode::kExact: ok = e.a_bits == e.b_bits; break;
        case ToleranceMode::kUlp: ok = e.ulp <= tol_.ulp; break;
        case ToleranceMode::kAbsRel: ok = d <= tol_.atol + tol_.rtol * std::fabs(a); break;
        case ToleranceMode::kNmse: ok = e.a_bits == e.b_bits; break;
      }
    }
    if (!ok) {
      ++s_.out_of_tol;
      if (s_.first.size() < kMaxMismatches) {
        Mismatch m = loc;
        m.a = e.a;
        m.b = e.b;
        m.a_bits = e.a_bits;
        m.b_bits = e.b_bits;
        m.ulp = e.ulp;
        m.where = where();
        s_.first.push_back(std::move(m));
      }
    }
  }

  // q8_1 blocks: bytes compared exactly in every mode (ref has none; emu and cuda must agree).
  void add_q8(const BlockQ8_1& a, const BlockQ8_1& b, const Mismatch& loc, const std::function<std::string()>& where) {
    const auto* pa = reinterpret_cast<const uint8_t*>(&a);
    const auto* pb = reinterpret_cast<const uint8_t*>(&b);
    s_.compared += static_cast<int64_t>(sizeof(BlockQ8_1));
    for (size_t i = 0; i < sizeof(BlockQ8_1); ++i) {
      if (pa[i] == pb[i]) continue;
      ++s_.out_of_tol;
      s_.max_abs = std::max(s_.max_abs, std::fabs(double(pa[i]) - double(pb[i])));
      if (s_.first.size() < kMaxMismatches) {
        Mismatch m = loc;
        m.a = pa[i];
        m.b = pb[i];
        m.a_bits = pa[i];
        m.b_bits = pb[i];
        m.where = where() + ", byte " + std::to_string(i) + " (" + q8_field_name(static_cast<int>(i)) + ")";
        s_.first.push_back(std::move(m));
      }
    }
  }

  void finish(bool q8) {
    if (s_.sum_sq_a > 0) s_.nmse = s_.sum_sq_diff / s_.sum_sq_a;
    else s_.nmse = s_.sum_sq_diff > 0 ? kInf : 0.0;
    if (tol_.mode == ToleranceMode::kNmse && !q8) s_.pass = s_.nmse <= tol_.nmse && s_.nan_mismatch == 0;
    else s_.pass = s_.out_of_tol == 0;
  }

 private:
  StageDiff& s_;
  const Tolerance& tol_;
};

Elem f32_pair(float a, float b) {
  const uint32_t x = f32_bits(a), y = f32_bits(b);
  return Elem{a, b, x, y, ulp_distance_f32(x, y)};
}
Elem bf16_pair(uint16_t a, uint16_t b) {
  return Elem{bf16_to_f32(a), bf16_to_f32(b), a, b, ulp_distance_bf16(a, b)};
}

std::set<int32_t> pick_set(const std::vector<int32_t>& ids, int64_t t, int64_t k) {
  return std::set<int32_t>(ids.begin() + t * k, ids.begin() + (t + 1) * k);
}

// k-th key minus (k+1)-th key of one token, keys sorted descending with ties to the lower id.
double token_margin(const float* logits, int64_t t, const MoeConfig& c, const float* bias, int layer) {
  const int64_t n = c.n_routed, k = c.topk;
  if (k >= n) return kInf;
  std::vector<float> keys(static_cast<size_t>(n));
  if (bias != nullptr) {
    try {
      const Routing r = route_from_logits(logits + t * n, 1, bias, c, layer);
      for (int64_t e = 0; e < n; ++e) keys[e] = r.scores[e] + bias[e];
    } catch (const InputError&) {
      return std::numeric_limits<double>::quiet_NaN();
    }
  } else {
    for (int64_t e = 0; e < n; ++e) keys[e] = logits[t * n + e];
  }
  std::sort(keys.begin(), keys.end(), [](float x, float y) { return x > y; });
  return static_cast<double>(keys[k - 1]) - static_cast<double>(keys[k]);
}

RoutingDiff diff_routing(const LayerTaps& a, const LayerTaps& b, const MoeConfig& c, const float* bias,
                         std::vector<bool>& agree) {
  RoutingDiff r;
  r.margin_kind = bias != nullptr ? "key (score + bias)" : "logit";
  const int64_t T = a.tokens, k = c.topk;
  r.hist_a.assign(static_cast<size_t>(c.n_routed), 0);
  r.hist_b.assign(static_cast<size_t>(c.n_routed), 0);
  agree.assign(static_cast<size_t>(T), true);
  for (int64_t t = 0; t < T; ++t) {
    const auto sa = pick_set(a.topk_ids, t, k), sb = pick_set(b.topk_ids, t, k);
    for (int32_t e : sa) ++r.hist_a[e];
    for (int32_t e : sb) ++r.hist_b[e];
    if (sa == sb) continue;
    agree[t] = false;
    ++r.tokens_differ;
    RoutingFlip f;
    f.token = t;
    std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(f.only_a));
    std::set_difference(sb.begin(), sb.end(), sa.begin(), sa.end(), std::back_inserter(f.only_b));
    f.margin_a = token_margin(a.router_logits.data(), t, c, bias, a.layer);
    f.margin_b = token_margin(b.router_logits.data(), t, c, bias, b.layer);
    r.flips += static_cast<int64_t>(f.only_a.size());
    r.flip_list.push_back(std::move(f));
  }
  return r;
}

}  // namespace

uint64_t ulp_distance_f32(uint32_t a, uint32_t b) {
  auto ord = [](uint32_t u) -> int64_t {
    return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
  };
  const int64_t d = ord(a) - ord(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

uint64_t ulp_distance_bf16(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t u) -> int64_t {
    return (u & 0x8000u) ? -static_cast<int64_t>(u & 0x7FFFu) : static_cast<int64_t>(u);
  };
  const int64_t d = ord(a) - ord(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

std::string Tolerance::describe() const {
  std::string s;
  char buf[96];
  switch (mode) {
    case ToleranceMode::kExact: s = "exact (bit for bit)"; break;
    case ToleranceMode::kUlp: s = "ulp <= " + std::to_string(ulp); break;
    case ToleranceMode::kAbsRel:
      std::snprintf(buf, sizeof buf, "|a-b| <= %g + %g*|a|", atol, rtol);
      s = buf;
      break;
    case ToleranceMode::kNmse:
      std::snprintf(buf, sizeof buf, "NMSE <= %g", nmse);
      s = buf;
      break;
  }
  return s + (nan_equal ? ", NaN == NaN" : "");
}

void check_comparable(const DumpMeta& a, const std::string& ap, const DumpMeta& b, const std::string& bp) {
  const std::string both = ap + " vs " + bp + ": ";
  if (a.model_sha256 != b.model_sha256)
    throw InputError(both + "different model files (attribute model_sha256): " + a.model_file + " " +
                     a.model_sha256 + " vs " + b.model_file + " " + b.model_sha256);
  const MoeConfig &x = a.config, &y = b.config;
  auto field = [&](const char* f, const std::string& u, const std::string& v) {
    if (u != v) throw InputError(both + "different configs: attribute config." + f + " is " + u + " vs " + v);
  };
  auto fs = [](float v) { char buf[32]; std::snprintf(buf, sizeof buf, "%.9g", double(v)); return std::string(buf); };
  field("dim", std::to_string(x.dim), std::to_string(y.dim));
  field("inter", std::to_string(x.inter), std::to_string(y.inter));
  field("n_routed", std::to_string(x.n_routed), std::to_string(y.n_routed));
  field("topk", std::to_string(x.topk), std::to_string(y.topk));
  field("n_shared", std::to_string(x.n_shared), std::to_string(y.n_shared));
  field("score_func", to_string(x.score_func), to_string(y.score_func));
  field("route_scale", fs(x.route_scale), fs(y.route_scale));
  field("swiglu_limit", fs(x.swiglu_limit), fs(y.swiglu_limit));
  field("gate_temp", fs(x.gate_temp), fs(y.gate_temp));
  field("norm_topk_prob", std::to_string(x.norm_topk_prob), std::to_string(y.norm_topk_prob));
  if (a.tokens != b.tokens)
    throw InputError(both + "different token counts (attribute tokens): " + std::to_string(a.tokens) +
                     " vs " + std::to_string(b.tokens));
  if (a.layers != b.layers) {
    auto ls = [](const std::vector<int32_t>& v) {
      std::string s;
      for (int32_t l : v) {
        if (!s.empty()) s += ",";
        s += std::to_string(l);
      }
      return "[" + s + "]";
    };
    throw InputError(both + "different layer lists (attribute layers): " + ls(a.layers) + " vs " + ls(b.layers));
  }
}

int64_t explain_flips(LayerDiff& l, double gate_temp) {
  if (l.routing.flip_list.empty()) return 0;
  double max_logit = 0;
  for (const StageDiff& s : l.stages)
    if (s.stage == "router_logits") max_logit = s.max_abs;
  // Every score function's slope is at most 1 per unit of logit / gate_temp (sqrtsoftplus < 0.5,
  // sigmoid 0.25, softmax 0.5 summed over all logits), so each key moves by at most delta =
  // max_logit / gate_temp (logit margins: max_logit) and a flip that the logit difference
  // explains has its margin within 2 delta on both sides.
  const double bound = l.routing.margin_kind == "logit" ? 2.0 * max_logit : 2.0 * max_logit / gate_temp;
  int64_t explained = 0;
  for (const RoutingFlip& f : l.routing.flip_list)
    if (f.margin_a <= bound && f.margin_b <= bound) explained += static_cast<int64_t>(f.only_a.size());
  if (explained != l.routing.flips) return explained;
  l.pass = true;
  l.first_failing.clear();
  for (StageDiff& s : l.stages) {
    if (s.stage == "topk_ids") s.pass = true;
    if (!s.pass && l.pass) {
      l.pass = false;
      l.first_failing = s.stage;
    }
  }
  return explained;
}

DiffReport diff_dumps(const Dump& A, const Dump& B, const DiffOptions& o) {
  check_comparable(A.meta, A.path, B.meta, B.path);
  DiffReport rep;
  rep.a_path = A.path;
  rep.b_path = B.path;
  rep.tolerance = o.tolerance;
  const MoeConfig& c = A.meta.config;
  const int64_t T = A.meta.tokens, dim = c.dim, inter = c.inter, k = c.topk;
  auto tol_for = [&](const std::string& s) -> const Tolerance& {
    auto it = o.stage_tolerance.find(s);
    return it != o.stage_tolerance.end() ? it->second : o.tolerance;
  };

  if (A.meta.taps != B.meta.taps)
    rep.note = std::string("tap stages not compared: only ") + (A.meta.taps ? "A" : "B") + " was run with --taps";
  const bool a_weighted = A.meta.routing_weight_at == "h";
  const bool rescale = a_weighted != (B.meta.routing_weight_at == "h");

  for (size_t li = 0; li < A.layers.size(); ++li) {
    const LayerTaps& a = A.layers[li];
    const LayerTaps& b = B.layers[li];
    const int L = a.layer;
    LayerDiff ld;
    ld.layer = L;
    std::vector<bool> agree;
    ld.routing = diff_routing(a, b, c, o.bias ? o.bias(L) : nullptr, agree);
    std::deque<StageDiff> st;  // references stay valid while stages are appended
    auto stage = [&](const std::string& name, const std::string& dtype) -> StageDiff& {
      st.push_back(StageDiff{});
      st.back().stage = name;
      st.back().dtype = dtype;
      return st.back();
    };
    auto loc = [&](const std::string& name, int64_t t, int32_t e, int64_t i) {
      Mismatch m;
      m.layer = L;
      m.stage = name;
      m.token = t;
      m.expert = e;
      m.index = i;
      return m;
    };
    // Token-row stages [T, cols] compared on agreeing tokens (input and logits on all tokens).
    auto token_rows = [&](const std::string& name, bool bf16, const void* pa, const void* pb, int64_t cols,
                          bool all_tokens, int32_t expert, auto where) {
      StageDiff& s = stage(name, bf16 ? "bfloat16" : "float32");
      StageAcc acc(s, tol_for(name));
      for (int64_t t = 0; t < T; ++t) {
        if (!all_tokens && !agree[t]) { ++s.skipped_tokens; continue; }
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t i = t * cols + j;
          const Elem e = bf16 ? bf16_pair(static_cast<const uint16_t*>(pa)[i], static_cast<const uint16_t*>(pb)[i])
                              : f32_pair(static_cast<const float*>(pa)[i], static_cast<const float*>(pb)[i]);
          acc.add(e, loc(name, t, expert, j), [&] { return where(j); });
        }
      }
      acc.finish(false);
    };

    token_rows("input", true, a.input.data(), b.input.data(), dim, true, -1,
               [&](int64_t j) { return where_input_element(c, j); });
    token_rows("router_logits", false, a.router_logits.data(), b.router_logits.data(), c.n_routed, true, -1,
               [&](int64_t j) { return where_router_row(j); });
    {
      StageDiff& s = stage("topk_ids", "int32");
      s.compared = T * k;
      s.out_of_tol = ld.routing.flips;
      s.pass = ld.routing.flips == 0;
      StageDiff& w = stage("topk_weights", "float32");
      StageAcc acc(w, tol_for("topk_weights"));
      for (int64_t t = 0; t < T; ++t) {
        if (!agree[t]) { ++w.skipped_tokens; continue; }
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = a.topk_ids[t * k + j];
          int64_t jb = 0;
          while (b.topk_ids[t * k + jb] != e) ++jb;
          acc.add(f32_pair(a.topk_weights[t * k + j], b.topk_weights[t * k + jb]), loc("topk_weights", t, e, e),
                  [&] { return "routing weight of expert " + std::to_string(e); });
        }
      }
      acc.finish(false);
    }
    auto q8_rows = [&](const std::string& name, const std::vector<BlockQ8_1>& qa, const std::vector<BlockQ8_1>& qb,
                       const std::vector<int32_t>& toks_a, const std::vector<int32_t>& toks_b, int64_t K, int32_t expert,
                       bool down_input) {
      StageDiff& s = stage(name, "block_q8_1");
      if (qa.empty() || qb.empty()) {
        s.status = qa.empty() && qb.empty() ? "absent" : (qa.empty() ? "only in B" : "only in A");
        return;
      }
      StageAcc acc(s, tol_for(name));
      const int64_t nb = K / kQK8_1;
      for (size_t ra = 0; ra < toks_a.size(); ++ra) {
        const int32_t t = toks_a[ra];
        auto it = std::find(toks_b.begin(), toks_b.end(), t);
        if (it == toks_b.end()) continue;
        if (!agree[t]) { ++s.skipped_tokens; continue; }
        const size_t rb = static_cast<size_t>(it - toks_b.begin());
        for (int64_t g = 0; g < nb; ++g)
          acc.add_q8(qa[ra * nb + g], qb[rb * nb + g], loc(name, t, expert, g),
                     [&] { return where_q8_block(c, g, down_input, expert); });
      }
      acc.finish(true);
    };
    std::vector<int32_t> all_tokens(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all_tokens[t] = static_cast<int32_t>(t);
    q8_rows("x_q8", a.x_q8, b.x_q8, all_tokens, all_tokens, dim, -1, false);

    // Expert stages: experts both sides ran, rows of tokens both sides routed there and agree on.
    const std::vector<std::string> ex_stages = {"weights", "gate", "up", "h", "h_q8", "down"};
    auto expert_group = [&](const std::string& prefix, const std::vector<const ExpertTaps*>& ea,
                            const std::vector<const ExpertTaps*>& eb) {
      for (const std::string& sn : ex_stages) {
        const std::string name = prefix + "." + sn;
        if (sn == "h_q8") {
          StageDiff& s = stage(name, "block_q8_1");
          StageAcc acc(s, tol_for(name));
          bool any_a = false, any_b = false;
          for (size_t i = 0; i < ea.size(); ++i) {
            any_a = any_a || !ea[i]->h_q8.empty();
            any_b = any_b || !eb[i]->h_q8.empty();
            if (ea[i]->h_q8.empty() || eb[i]->h_q8.empty()) continue;
            const int64_t nb = inter / kQK8_1;
            for (size_t ra = 0; ra < ea[i]->tokens.size(); ++ra) {
              const int32_t t = ea[i]->tokens[ra];
              auto it = std::find(eb[i]->tokens.begin(), eb[i]->tokens.end(), t);
              if (it == eb[i]->tokens.end()) continue;
              if (!agree[t]) { ++s.skipped_tokens; continue; }
              const size_t rb = static_cast<size_t>(it - eb[i]->tokens.begin());
              const int32_t ex = ea[i]->expert;
              for (int64_t g = 0; g < nb; ++g)
                acc.add_q8(ea[i]->h_q8[ra * nb + g], eb[i]->h_q8[rb * nb + g], loc(name, t, ex, g),
                           [&] { return where_q8_block(c, g, true, ex); });
            }
          }
          if (!any_a || !any_b) s.status = !any_a && !any_b ? "absent" : (!any_a ? "only in B" : "only in A");
          else acc.finish(true);
          continue;
        }
        StageDiff& s = stage(name, "float32");
        StageAcc acc(s, tol_for(name));
        const bool scaled = rescale && prefix == "experts" && (sn == "h" || sn == "down");
        if (scaled)
          s.note = std::string(a_weighted ? "B" : "A") + " scaled by its routing weight (model.py weights h before w2)";
        bool any_a = false, any_b = false;
        for (size_t i = 0; i < ea.size(); ++i) {
          const ExpertTaps& xa = *ea[i];
          const ExpertTaps& xb = *eb[i];
          auto pick = [&](const ExpertTaps& x) -> const std::vector<float>& {
            if (sn == "weights") return x.weights;
            if (sn == "gate") return x.gate;
            if (sn == "up") return x.up;
            if (sn == "h") return x.h;
            return x.down;
          };
          const std::vector<float>& va = pick(xa);
          const std::vector<float>& vb = pick(xb);
          any_a = any_a || !va.empty();
          any_b = any_b || !vb.empty();
          if (va.empty() || vb.empty() || xa.tokens.empty()) continue;
          const int64_t cols = static_cast<int64_t>(va.size() / xa.tokens.size());
          for (size_t ra = 0; ra < xa.tokens.size(); ++ra) {
            const int32_t t = xa.tokens[ra];
            auto it = std::find(xb.tokens.begin(), xb.tokens.end(), t);
            if (it == xb.tokens.end()) continue;
            if (!agree[t]) { ++s.skipped_tokens; continue; }
            const size_t rb = static_cast<size_t>(it - xb.tokens.begin());
            // One side weighted h before w2 (model.py), the other applies the weight in the
            // accumulation: scale the unweighted side's h / down by its own routing weight.
            float sa = 1.0f, sb = 1.0f;
            if (scaled) {
              if (a_weighted) sb = xb.weights[rb];
              else sa = xa.weights[ra];
            }
            for (int64_t j = 0; j < cols; ++j)
              acc.add(f32_pair(sa * va[ra * cols + j], sb * vb[rb * cols + j]), loc(name, t, xa.expert, j),
                      [&] { return where_expert_element(c, sn, xa.expert, j); });
          }
        }
        if (!any_a || !any_b) s.status = !any_a && !any_b ? "absent" : (!any_a ? "only in B" : "only in A");
        else acc.finish(false);
      }
    };
    if (A.meta.taps && B.meta.taps) {
      std::vector<const ExpertTaps*> ea, eb;
      for (const ExpertTaps& x : a.experts)
        for (const ExpertTaps& y : b.experts)
          if (x.expert == y.expert) {
            ea.push_back(&x);
            eb.push_back(&y);
          }
      expert_group("experts", ea, eb);
      std::vector<const ExpertTaps*> sa, sb;
      if (!a.shared.tokens.empty() && !b.shared.tokens.empty()) {
        sa.push_back(&a.shared);
        sb.push_back(&b.shared);
      }
      expert_group("shared", sa, sb);
      if (a.acc.empty() || b.acc.empty()) {
        StageDiff& s = stage("acc", "float32");
        s.status = a.acc.empty() && b.acc.empty() ? "absent" : (a.acc.empty() ? "only in B" : "only in A");
      } else {
        token_rows("acc", false, a.acc.data(), b.acc.data(), dim, false, -1,
                   [&](int64_t j) { return where_output_column(j); });
      }
    }
    token_rows("output", true, a.output.data(), b.output.data(), dim, false, -1,
               [&](int64_t j) { return where_output_column(j); });

    // Verdict: a stage present on one side only fails unless informational; absent is neutral.
    for (StageDiff& s : st) {
      // q8_1 blocks exist only where activations are quantised (not in the reference): a q8_1
      // stage on one side only is reported, never a failure.
      const bool info = std::find(o.informational.begin(), o.informational.end(), s.stage) != o.informational.end() ||
                        (s.dtype == "block_q8_1" && !s.status.empty());
      if (s.status == "absent") s.pass = true;
      else if (!s.status.empty()) s.pass = info;
      else if (info) s.pass = true;
      if (!s.pass && ld.pass) {
        ld.pass = false;
        ld.first_failing = s.stage;
      }
    }
    ld.stages.assign(st.begin(), st.end());
    rep.same = rep.same && ld.pass;
    rep.layers.push_back(std::move(ld));
  }
  return rep;
}

}  // namespace moecheck
