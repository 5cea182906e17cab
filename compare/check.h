// The verdict of `moecheck check` as a value: which implementations ran, each leg's comparison
// per layer (ref ~ emu by the derived bounds, emu = cuda bit for bit), the routing histogram and
// the output norms. The command line runs the implementations, calls judge_check, then renders
// the result as text or JSON (tools/check_render.h); no verdict is decided while printing.
// Contract: docs/cli.md "check", compare/check_policy.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compare/bounds.h"
#include "compare/dump_diff.h"
#include "core/layer_weights.h"
#include "golden/dump.h"

namespace moecheck {

// The kinds of leg `check` runs (docs/cli.md "check").
enum class LegKind {
  kBounds,  // ref ~ impl: accumulated bounds and consistency checks against the Exact reference
  kStat,    // ref ~ impl: z-scores against the noise the formats predict (compare/stat_noise.h)
  kLocal,   // impl alone: every stage from its own inputs (compare/local_leg.h)
  kExact,   // emu = cuda: bit for bit
};

struct CheckLeg {
  std::string name;  // "ref~emu", "emu local", "emu=cuda"
  LegKind kind = LegKind::kBounds;
  DiffReport report;  // kBounds: the NMSE comparison (information); kExact: the verdict
  std::vector<LegReport> reports;    // kBounds, kLocal: the verdict, per layer
  std::vector<bool> pass;            // per layer
  std::vector<Stage> first_failing;  // per layer, meaningful where !pass
  bool routing_judged = true;        // false: topk_ids was not judged (an import without routing)
  bool same() const;
};

struct CheckLayer {
  int layer = 0;
  // What the adversarial tokens exercised, measured on the main dump (one line each).
  std::vector<std::string> edge_cases;
  std::vector<int64_t> tokens_per_expert;                 // of the main dump's routing
  std::vector<std::pair<std::string, double>> output_l2;  // each implementation, then "ref-exact"
};

struct CheckResult {
  std::string model;  // what the user asked for: a path, or the embedded default's description
  std::string model_sha256;  // identity of the model file as the dumps record it (may be empty)
  MoeConfig config;
  uint64_t input_seed = 0;
  std::vector<std::pair<std::string, std::string>> ran;  // implementation, its variant line
  std::map<std::string, std::string> not_run;            // implementation -> why
  std::string routing_of;                                // implementation whose routing is shown
  int64_t tokens = 0;                                    // per layer, adversarial ones included
  int64_t adversarial_tokens = 0;  // the last ones of `tokens` (golden/adversarial.h)
  int64_t image_tokens = 0;  // tokens in image spans (routed with bias_vl), in the first layer
  std::string route;  // the cuda run's route knob ("host" / "device"), "" when cuda did not run
  std::vector<CheckLeg> legs;
  // Legs or stages that could not run, each "<leg>: <why>" or "<leg> <stage>: <why>" (an
  // imported dump without taps: compare/import_check.h).
  std::vector<std::string> legs_not_run;
  std::vector<CheckLayer> layers;
  bool pass = true;
};

struct CheckInputs {
  // The dumps of every implementation that ran, keyed "ref", "emu", "cuda"; all with taps.
  std::map<std::string, Dump> dumps;
  std::map<std::string, std::string> not_run;
  // Layer L's weights (the model the dumps ran on).
  std::function<LayerWeights(int)> layer;
  RouterVariant router = RouterVariant::kStaged;  // the emu / cuda router variant that ran
  bool ref_exact = false;                         // the ref dump already is Exact mode
  // The index of the first adversarial token (golden/adversarial.h), or -1 when there are none.
  int64_t adversarial_from = -1;
  // Called after each layer's bounds check (progress), with the layer id.
  std::function<void(int)> on_bounds_layer;
};

CheckResult judge_check(const CheckInputs& in);

// sqrt(sum y^2) of a bf16 output.
double output_l2(const std::vector<uint16_t>& y);

}  // namespace moecheck
