// Golden-set tolerances and verification. Contract: docs/golden-format.md "Golden set".
#include "compare/golden_verify.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moecheck {

Tolerance golden_tolerance(const std::string& impl) {
  Tolerance t;
  if (impl == "emu") return t;  // kExact
  // The reference is plain Eigen: another compiler or Eigen version may reorder an f32 sum
  // (relative error well under 1e-5 at these sizes) and so move a bf16-rounded value by one bf16
  // ulp (at most 2^-7 relative); cancellation near zero is covered by atol 1e-4.
  t.mode = ToleranceMode::kAbsRel;
  t.rtol = 1.0 / 128.0;
  t.atol = 1e-4;
  return t;
}

DiffReport verify_golden_dump(const Dump& golden, const Dump& fresh, const std::string& impl) {
  DiffOptions o;
  o.tolerance = golden_tolerance(impl);
  return diff_dumps(golden, fresh, o);
}

namespace {

bool same_slices(const std::vector<std::vector<SliceHash>>& a,
                 const std::vector<std::vector<SliceHash>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t l = 0; l < a.size(); ++l) {
    if (a[l].size() != b[l].size()) return false;
    for (size_t i = 0; i < a[l].size(); ++i)
      if (!a[l][i].same_slice(b[l][i]) || a[l][i].sha256 != b[l][i].sha256) return false;
  }
  return true;
}

// Knobs as a set: a dump read back lists its knob.* attributes in the file's order, not the run's.
bool same_knobs(std::vector<std::pair<std::string, std::string>> a,
                std::vector<std::pair<std::string, std::string>> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

bool same_meta(const DumpMeta& a, const DumpMeta& b) {
  return a.format_version == b.format_version && a.implementation == b.implementation &&
         same_knobs(a.knobs, b.knobs) && a.variant == b.variant && a.model_file == b.model_file &&
         a.model_sha256 == b.model_sha256 && a.model_header_sha256 == b.model_header_sha256 &&
         a.has_model_seed == b.has_model_seed && a.model_seed == b.model_seed &&
         a.input_source == b.input_source && a.input_seed == b.input_seed && a.tokens == b.tokens &&
         a.layers == b.layers && a.taps == b.taps && a.routing_weight_at == b.routing_weight_at;
}

}  // namespace

bool same_golden_content(const Dump& committed, const Dump& fresh) {
  if (!same_meta(committed.meta, fresh.meta) || !same_slices(committed.slices, fresh.slices))
    return false;
  try {
    return diff_dumps(committed, fresh, DiffOptions{}).same;  // kExact: every stage's bits
  } catch (const InputError&) {  // a config or weights that differ: not comparable
    return false;
  }
}

}  // namespace moecheck
