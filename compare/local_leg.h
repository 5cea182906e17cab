// The stage-local leg (docs/numerics.md "Stage-local legs"): every stage of an implementation's
// taps recomputed in f64 from that implementation's own inputs of that stage, by the model's
// semantics (not the kernel's schedule), within that stage's own rounding only: router logits
// from x, routing from its own logits, x_q8 from x, gate / up from its own x_q8, h from its own
// gate and up, h_q8 from its own h, down from its own h_q8 (or bf16 h), acc from its own down,
// weights and shared output, output = bf16(acc). A bug in one stage shows as a violation by
// orders of magnitude there, whatever the other stages did; a legal reordering of a stage's
// float operations stays inside its bound. Applies to any taps that follow the emulation's
// contract (emu, or cuda).
#pragma once

#include "compare/leg_report.h"
#include "core/layer_weights.h"
#include "core/schedule.h"
#include "core/taps.h"

namespace moecheck {

// Throws InputError when the taps are missing or have the wrong shape (naming the layer and
// stage). `router`: the router variant the implementation ran (sets the logits' chain depth).
LegReport check_local(const LayerWeights& w, const LayerTaps& t, RouterVariant router);

}  // namespace moecheck
