// Comparison of two tensor dumps (golden/dump.h), layer by layer and stage by stage: max abs,
// max rel, max ULP (bf16 ULPs for bf16 stages, f32 ULPs for f32 ones), NMSE against A's energy,
// out-of-tolerance counts and the first mismatches located down to the K-quant super-block and
// sub-block; routing compared as sets with each flip's score margin. What `moecheck diff`,
// `moecheck check` and `moecheck golden verify` report. Contract: docs/cli.md "diff".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/routing.h"
#include "core/taps.h"
#include "golden/dump.h"

namespace moecheck {

enum class ToleranceMode {
  kExact,   // bit for bit (q8_1 blocks byte for byte)
  kUlp,     // |ulp(a) - ulp(b)| <= ulp, in the stage's own format
  kAbsRel,  // |a - b| <= atol + rtol * |a|  (A is the expected side, as numpy.isclose)
  kNmse,    // the stage passes when sum (a-b)^2 / sum a^2 <= nmse; no per-element rule
};

struct Tolerance {
  ToleranceMode mode = ToleranceMode::kExact;
  uint64_t ulp = 0;
  double rtol = 0;
  double atol = 0;
  double nmse = 0;
  bool nan_equal = false;  // NaN equals NaN (never equals a number); off: NaN equals nothing

  std::string describe() const;
};

// One located mismatch.
struct Mismatch {
  int layer = 0;
  Stage stage = Stage::kOutput;
  int64_t token = -1;   // -1: not token-indexed
  int32_t expert = -1;  // routed expert id; -1 none (shared stages say "shared" in stage)
  int64_t index = 0;    // column (element within the token's row) or q8_1 block
  double a = 0, b = 0;  // values (q8_1: the differing byte)
  uint32_t a_bits = 0, b_bits = 0;
  uint64_t ulp = 0;
  std::string where;  // the weight row / q8_1 block / super-block and sub-block it maps to
};

struct StageDiff {
  Stage stage = Stage::kOutput;
  std::string dtype;           // "bfloat16", "float32", "int32", "block_q8_1"
  std::string status;          // "" compared; "only in A", "only in B", "absent"
  int64_t compared = 0;        // elements compared
  int64_t skipped_tokens = 0;  // token rows left out because the token's routing differs
  double max_abs = 0;          // over every non-NaN element
  // max_rel and max_ulp are over the elements where both sides are nonzero and of the same sign:
  // across zero the ULP distance counts every float between them (30,000 bf16 ULPs from -1e-30
  // to 1e-30) and the relative error of a zero is infinite, which would hide the useful numbers.
  double max_rel = 0;
  uint64_t max_ulp = 0;
  // Elements that differ across zero (one side zero, or opposite signs): left out of max_rel and
  // max_ulp, counted here.
  int64_t cross_zero = 0;
  // The elements of max_abs and max_ulp (has_worst_*: the stage has one, i.e. a nonzero max).
  Mismatch worst_abs, worst_ulp;
  bool has_worst_abs = false, has_worst_ulp = false;
  double sum_sq_a = 0;
  double sum_sq_diff = 0;
  double nmse = 0;           // sum_sq_diff / sum_sq_a (0 when both are 0, +inf when only A's is 0)
  int64_t nan_mismatch = 0;  // elements where either side is NaN and they do not count as equal
  int64_t out_of_tol = 0;    // elements outside the tolerance (kNmse: elements not bit-equal)
  bool pass = true;
  std::string note;             // e.g. "B scaled by its routing weight"
  std::vector<Mismatch> first;  // up to kMaxMismatches, in storage order
  // Up to kMaxMismatches out-of-tolerance elements with the largest |a - b| (NaNs left out),
  // largest first.
  std::vector<Mismatch> worst;
};

struct RoutingFlip {
  int64_t token = 0;
  std::vector<int32_t> only_a, only_b;  // experts picked by one side only
  // Key of the k-th pick minus the key of the (k+1)-th candidate, on each side's own logits.
  double margin_a = 0, margin_b = 0;
};

struct RoutingDiff {
  std::string margin_kind;  // "key (score + bias)" with a model, "logit" without
  int64_t tokens_differ = 0;
  int64_t flips = 0;  // sum over tokens of |only_a|
  std::vector<RoutingFlip> flip_list;
  std::vector<int64_t> hist_a, hist_b;  // tokens per expert
};

struct LayerDiff {
  int layer = 0;
  RoutingDiff routing;
  // Tokens whose image mask (an input: 1 = routed with bias_vl; no mask = 0) differs between A
  // and B; nonzero fails the input stage, as differing input bits do.
  int64_t image_mask_differ = 0;
  std::vector<StageDiff> stages;  // pipeline order
  bool pass = true;
  Stage first_failing = Stage::kInput;  // first stage in pipeline order that failed (when !pass)

  const StageDiff* stage(Stage s) const;  // nullptr when the stage was not compared
};

// What two dumps say about the weights they ran on (golden/provenance.h): the slices both
// recorded must have equal digests (else the dumps are not comparable); slices only one side
// read are listed; files that differ elsewhere are not refused.
struct ModelMatch {
  std::string kind;    // "slices", "file" (whole-file digests equal) or "unverified"
  int64_t common = 0;  // slices both recorded, all equal
  std::vector<std::string> only_a,
      only_b;                   // slices one side recorded ("blk.0.ffn_gate_exps.weight[expert 3]")
  bool header_differs = false;  // both recorded the GGUF header's digest and they differ
  std::string note;             // one line for the report
};

struct DiffReport {
  std::string a_path, b_path;
  ModelMatch model;
  Tolerance tolerance;
  std::vector<LayerDiff> layers;
  bool same = true;
  std::string note;  // e.g. which stages were not compared and why
};

inline constexpr size_t kMaxMismatches = 10;

struct DiffOptions {
  Tolerance tolerance;
  // Per-stage overrides, e.g. exact input bits in check's NMSE comparison.
  std::map<Stage, Tolerance> stage_tolerance;
  // Router biases of layer L for key margins: bias f32 [n_routed] and bias_vl (or nullptr), the
  // image_mask left null (each side's own taps.image_mask picks per token); empty: logit margins.
  std::function<RouteBias(int layer)> bias;
  // Stages left out of the verdict (still measured), e.g. x_q8 between ref and emu.
  std::vector<Stage> informational;
};

// Throws InputError (naming both files and the field or slice) when the dumps cannot be
// compared: a different config, token count or layer list; a tensor or expert slice both read
// with different digests; or different whole-file digests where neither records slices.
ModelMatch check_comparable(const Dump& a, const Dump& b);

DiffReport diff_dumps(const Dump& a, const Dump& b, const DiffOptions& o);

// Accepts routing flips that the router-logit difference explains: when every flipped token's
// margins (both sides) are <= 2 * max |logit difference| (/ gate_temp for key margins), topk_ids
// passes and the layer is re-judged. Returns the number of explained flips.
int64_t explain_flips(LayerDiff& l, double gate_temp);

// Text "ulp" distance of two f32 / bf16 bit patterns on the ordered integer line (+0 = -0).
uint64_t ulp_distance_f32(uint32_t a, uint32_t b);
uint64_t ulp_distance_bf16(uint16_t a, uint16_t b);

}  // namespace moecheck
