// `moecheck sensitivity`: how small a bug the check catches. Perturbations of growing size are
// planted in what the implementation under test reads (one expert's scales, sub-block fields,
// row addressing and quants: golden/perturb.h; the routing weights' scale and the SwiGLU clamp
// through its config), while the reference and every leg read the unperturbed model. Per
// perturbation class and tensor: the smallest size any leg catches, which leg and stage caught it
// first, each leg's own smallest, and what an NMSE <= 5e-4 rule on the output (ggml's
// test-backend-ops) would have said. Contract: docs/detection.md, docs/cli.md "sensitivity".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/layer_weights.h"
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck {

enum class PerturbClass {
  kScale,       // every super-block's d of the expert's matrix x (1 + eps)
  kSwap,        // sub-block 0's scale and min swapped (Q3_K: scales of sub-blocks 0 and 1), n rows
  kOffset,      // n rows read one super-block off
  kQuants,      // n rows' quant bytes of super-block 0 read one byte off
  kRouteScale,  // the implementation's route_scale x (1 + eps)
  kClamp,       // the implementation's swiglu_limit set to 0 (both clamps off)
};
inline constexpr PerturbClass kAllPerturbClasses[] = {
    PerturbClass::kScale,  PerturbClass::kSwap,       PerturbClass::kOffset,
    PerturbClass::kQuants, PerturbClass::kRouteScale, PerturbClass::kClamp};
// "scale", "swap", "offset", "quants", "route-scale", "clamp".
const char* perturb_class_name(PerturbClass c);
// The inverse; InputError naming `where` for an unknown name.
PerturbClass parse_perturb_class(const std::string& s, const std::string& where);

// The NMSE rule shown beside the legs: the output NMSE against the reference (model precision)
// above 5e-4 fails (ggml's tests/test-backend-ops.cpp default max_nmse_err).
inline constexpr double kNmseRule = 5e-4;

// One leg's verdict on one step: caught, and the first stage (pipeline order) that failed.
struct LegCatch {
  bool caught = false;
  Stage stage = Stage::kOutput;
};

struct SensitivityStep {
  double size = 0;  // as asked: eps (scale, route-scale), rows (swap, offset, quants), 1 (clamp)
  double effective = 0;  // what changed: mean |relative change| of d, rows changed, eps, 1
  LegCatch bounds, stat, local;
  bool judged_bounds = false, judged_stat = false, judged_local = false;  // legs that had caught
                                                                          // earlier are skipped
  bool no_effect = false;  // the implementation's taps equal the baseline's: nothing to catch
  double output_nmse = 0;  // the implementation's output against the reference's (model precision)
};

struct SensitivityRow {
  std::string tensor;  // "ffn_gate_exps[E]", "ffn_up_exps[E]", "ffn_down_exps[E]", "config"
  PerturbClass cls = PerturbClass::kScale;
  std::vector<SensitivityStep> steps;  // ascending; stops once every leg and the rule caught
  // Derived from the steps: the smallest step caught by any leg (-1: none), the leg and stage that
  // caught it first ("local experts.gate"), and each leg's / the rule's smallest step (-1: none).
  int first = -1;
  std::string first_by;
  int first_bounds = -1, first_stat = -1, first_local = -1, first_rule = -1;
  bool no_effect = false;  // no step changed anything the implementation computed
};

struct SensitivityReport {
  int layer = 0;
  int64_t tokens = 0;
  int expert = -1;            // the perturbed routed expert
  int64_t expert_tokens = 0;  // tokens that picked it (baseline routing)
  // The unperturbed implementation: every leg must agree, or no step means anything.
  LegCatch base_bounds, base_stat, base_local;
  double base_nmse = 0;
  std::vector<SensitivityRow> rows;
  bool baseline_clean() const {
    return !base_bounds.caught && !base_stat.caught && !base_local.caught;
  }
  // Every row caught by at least one reference leg (a row with no effect at any size is not a
  // miss: e.g. disabling a clamp no value reached).
  bool all_caught() const;
};

struct SensitivitySetup {
  LayerWeights truth;  // what the reference and every leg read
  LayerWeights impl;   // the same tensors at writable addresses (what the implementation reads)
  std::function<uint8_t*(const void* p, size_t n)> writable;  // impl bytes -> writable address
  // Runs the implementation under test on weights w, every stage tapped.
  std::function<LayerTaps(const LayerWeights& w, const std::vector<uint16_t>& x, int64_t T)> run;
  std::vector<uint16_t> x;  // [T, dim]
  int64_t T = 0;
  // [T] or empty: the image mask `run` routes with (bias_vl where set); the reference's output,
  // against which the NMSE rule is measured, routes with it too (the legs read it from the taps).
  std::vector<uint8_t> image_mask;
  RouterVariant router = RouterVariant::kStaged;  // the variant `run` uses
  int expert = -1;                                // -1: the expert the most tokens picked
  std::vector<PerturbClass> classes{std::begin(kAllPerturbClasses), std::end(kAllPerturbClasses)};
  std::function<void(const std::string&)> on_step;  // progress (may be empty)
};

SensitivityReport run_sensitivity(const SensitivitySetup& s);

}  // namespace moecheck
