// Golden-set tolerances and verification. Contract: docs/golden-format.md "Golden set".
#include "compare/golden_verify.h"

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

}  // namespace moecheck
