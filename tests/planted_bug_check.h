// The planted-bug suite's verdicts (tests/planted_pipeline.h): each planted bug run through the
// reference legs of `moecheck check` (bounds, statistical, stage-local) against the unplanted
// model must be caught, and attributed to its stage: the earliest stage any leg fails at. Each
// legal change must pass every leg while changing some bits (or it tests nothing). One table row
// per (size, bug) is printed; docs/detection.md quotes the tables.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compare/bounds.h"
#include "compare/local_leg.h"
#include "reference/moe.h"
#include "tests/planted_pipeline.h"

namespace moecheck::planted {

struct Verdict {
  bool bounds = false, stat = false, local = false;  // caught by
  Stage bounds_at = Stage::kOutput, stat_at = Stage::kOutput, local_at = Stage::kOutput;
  Stage earliest = Stage::kOutput;
  double nmse = 0;  // output against the reference in model precision
  bool caught() const { return bounds || stat || local; }
};

inline Verdict judge(const LayerWeights& w, const LayerTaps& t, RouterVariant v,
                     const std::vector<uint16_t>& ref_out) {
  Verdict r;
  LegReport stat;
  const LegReport b = check_emu_against_exact(w, t, v, nullptr, &stat);
  const LegReport l = check_local(w, t, v);
  r.bounds = !b.ok(), r.stat = !stat.ok(), r.local = !l.ok();
  if (r.bounds) r.bounds_at = b.first_failing();
  if (r.stat) r.stat_at = stat.first_failing();
  if (r.local) r.local_at = l.first_failing();
  r.earliest =
      std::min({r.bounds ? r.bounds_at : Stage::kOutput, r.stat ? r.stat_at : Stage::kOutput,
                r.local ? r.local_at : Stage::kOutput});
  double num = 0, den = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) {
    const double a = bf16_to_f32(ref_out[i]), d = bf16_to_f32(t.output[i]) - a;
    num += d * d;
    den += a * a;
  }
  r.nmse = den > 0 ? num / den : 0;
  return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline bool same_expert(const ExpertTaps& a, const ExpertTaps& b) {
  return a.expert == b.expert && a.tokens == b.tokens && same_bits(a.weights, b.weights) &&
         same_bits(a.gate, b.gate) && same_bits(a.up, b.up) && same_bits(a.h, b.h) &&
         same_bits(a.h_q8, b.h_q8) && same_bits(a.down, b.down);
}

// Every stage bit for bit; `what` names the first that differs.
inline bool same_taps(const LayerTaps& a, const LayerTaps& b, std::string* what) {
  auto fail = [&](const char* s) {
    *what = s;
    return false;
  };
  if (!same_bits(a.router_logits, b.router_logits)) return fail("router_logits");
  if (a.topk_ids != b.topk_ids) return fail("topk_ids");
  if (!same_bits(a.topk_weights, b.topk_weights)) return fail("topk_weights");
  if (!same_bits(a.x_q8, b.x_q8)) return fail("x_q8");
  if (a.experts.size() != b.experts.size()) return fail("experts (count)");
  for (size_t i = 0; i < a.experts.size(); ++i)
    if (!same_expert(a.experts[i], b.experts[i])) return fail("experts");
  if (!same_expert(a.shared, b.shared)) return fail("shared");
  if (!same_bits(a.acc, b.acc)) return fail("acc");
  if (a.output != b.output) return fail("output");
  return true;
}

inline const char* mark(bool caught) { return caught ? "caught" : "-"; }

// Every bug and legal change on one layer and input; `size` names the configuration.
inline void run_suite(const std::string& size, const LayerWeights& w,
                      const std::vector<uint16_t>& x, int64_t T, RouterVariant v) {
  ASSERT_GT(w.config.swiglu_limit, 0.0f) << size << ": the planted SwiGLU bugs assume a clamp";
  const std::vector<uint16_t> ref_out = ref::MoE(w, ref::Precision::kModel).forward(x.data(), T);
  const LayerTaps base = forward(w, x, T, v, Bug::kNone);
  const Verdict b0 = judge(w, base, v, ref_out);
  ASSERT_FALSE(b0.caught()) << size << ": the unplanted pipeline fails a leg at "
                            << stage_name(b0.earliest);
  std::printf(
      "| size | bug | kernel | stage | bounds | stat | local | attributed to | output NMSE (rule "
      "5e-4) |\n");
  for (const BugInfo& info : all_bugs()) {
    const LayerTaps t = forward(w, x, T, v, info.bug);
    const Verdict r = judge(w, t, v, ref_out);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %.2g %s |\n", size.c_str(), info.name,
                info.kernel, info.legal ? "(legal)" : stage_name(info.stage), mark(r.bounds),
                mark(r.stat), mark(r.local), r.caught() ? stage_name(r.earliest) : "-", r.nmse,
                r.nmse > 5e-4 ? "fails" : "passes");
    const std::string repro =
        size + ", bug \"" + info.name + "\" (repro: --gtest_filter=" +
        ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "." +
        ::testing::UnitTest::GetInstance()->current_test_info()->name() + ")";
    if (info.legal) {
      EXPECT_FALSE(r.caught()) << repro << ": a legal change flagged at " << stage_name(r.earliest);
      std::string what;
      EXPECT_FALSE(same_taps(t, base, &what))
          << repro << ": the legal change changed no bit (the case tests nothing)";
      continue;
    }
    EXPECT_TRUE(r.caught()) << repro << ": not caught by any leg";
    if (r.caught()) {
      EXPECT_EQ(stage_name(r.earliest), std::string(stage_name(info.stage)))
          << repro << ": attributed to the wrong stage";
    }
  }
}

}  // namespace moecheck::planted
