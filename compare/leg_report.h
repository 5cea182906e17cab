// The verdict of one comparison leg on one layer, stage by stage, and the counter every leg uses
// to fill it. Legs: the accumulated bounds against the Exact reference (compare/bounds.h), the
// stage-local legs (compare/local_leg.h), the statistical leg (compare/stat_leg.h). Each stage
// says which kind of check it is, so a report never shows a consistency check as an accuracy
// ratio. Contract: docs/numerics.md "Error bounds vs the reference's Exact mode", "Stage-local
// legs", "Statistical leg".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/taps.h"

namespace moecheck {

enum class CheckKind {
  kAccumulated,  // |impl - exact reference| within a bound summed over the stage's whole input path
  kConsistency,  // within the measured input differences propagated plus the stage's own rounding:
                 // it can only fail for the stage itself, never for upstream reasons
  kLocal,        // the stage recomputed from the implementation's own inputs of the stage
  kStatistical,  // z-scores against the noise predicted from the formats
};
// "accumulated", "consistency", "local", "statistical".
const char* check_kind_name(CheckKind k);

struct StageCheck {
  Stage stage = Stage::kOutput;
  CheckKind kind = CheckKind::kAccumulated;
  int64_t checked = 0;     // values compared
  int64_t violations = 0;  // values over their bound (or NaN)
  double worst_ratio = 0;  // max |impl - expected| / bound (inf for a difference on a zero bound)
  std::string first_violation;  // layer, token, expert, row / column, both values and the bound
  // Statistical checks: values whose predicted noise is zero (a zero token, a clamped value),
  // reported as not applicable; the sum of squared z-scores and its limit
  // (Checker::set_chi2_limit).
  int64_t not_applicable = 0;
  double chi2 = 0;
  double chi2_limit = 0;
};

struct LegReport {
  int layer = 0;
  std::vector<StageCheck> stages;  // pipeline order
  int64_t flips = 0;  // (implementation-only, expected-only) expert pairs of flipped tokens
  int64_t unexplained_flips = 0;        // pairs the leg's key bound cannot explain
  std::vector<std::string> flip_lines;  // one line per pair: keys, margin, what the bound allows
  bool ok() const;
  // The first stage in pipeline order with a violation (or a statistical sum over its limit);
  // topk_ids when a flip is unexplained. Meaningful when !ok().
  Stage first_failing() const;
  const StageCheck* stage(Stage s) const;  // nullptr for a stage this leg does not judge
  bool stage_failed(const StageCheck& s) const;
  // The same stages (kinds kept) with every count zeroed: a part to fill on another thread.
  LegReport empty_like() const;
  // Adds a part's counts (checked, violations, not applicable, chi2; worst ratio as a max; the
  // first violation when this report has none yet). Merging parts in pipeline order gives the
  // report a sequential pass would have made.
  void merge(const LegReport& part);
};

// "%.9g".
std::string fmt_g9(double v);

// Counts one value against its bound in a stage of the report; `where` builds the location only
// for the first violation. The stages must be in the report (add_stage) before they are seen.
class Checker {
 public:
  explicit Checker(LegReport& r) : r_(r) {}
  void add_stage(Stage s, CheckKind k);
  // counted: false for a second check of a value already counted (output against its own acc).
  template <class Where>
  void see(Stage s, double impl, double expected, double bound, const Where& where,
           bool counted = true) {
    StageCheck& st = find(s);
    if (counted) ++st.checked;
    if (!record(st, impl, expected, bound)) return;
    if (st.violations == 1) st.first_violation = message(st, where(), impl, expected, bound);
  }
  // Statistical: z = (impl - expected) / max(sigma, floor); a violation when |z| > 6 (the ratio
  // is |z| / 6), or, given a `limit` (> 0), when |impl - expected| > max(limit, 6 floor) (a
  // stage whose noise is not Gaussian sets its own 6-sigma-equivalent limit); z^2 added to the
  // stage's chi2 and its limit kept at n + 6 sqrt(2n). A value whose predicted noise sigma is 0
  // (a zero token, a clamped value) is not applicable.
  template <class Where>
  void see_z(Stage s, double impl, double expected, double sigma, double floor, const Where& where,
             double limit = -1.0) {
    StageCheck& st = find(s);
    if (!(sigma > 0)) {
      ++st.not_applicable;
      return;
    }
    const double sd = sigma > floor ? sigma : floor;
    see(s, impl, expected, limit > 0 ? (limit > 6.0 * floor ? limit : 6.0 * floor) : 6.0 * sd,
        where);
    const double z = (impl - expected) / sd;
    st.chi2 += z * z;
  }
  // The stage's chi2 limit: n (1 + 6 sqrt(2 / min(n, sources))), where `sources` counts the
  // independent noise sources the stage's noise is made of (its rows share them: the realised
  // noise energy, which chi2 / n estimates, fluctuates as that count says, not as n).
  void set_chi2_limit(Stage s, int64_t sources);
  StageCheck& find(Stage s);
  LegReport& report() { return r_; }

 private:
  // Updates the worst ratio; true (and counts it) when |impl - expected| > bound or NaN.
  static bool record(StageCheck& st, double impl, double expected, double bound);
  std::string message(const StageCheck& st, const std::string& where, double impl, double expected,
                      double bound) const;

  LegReport& r_;
};

}  // namespace moecheck
