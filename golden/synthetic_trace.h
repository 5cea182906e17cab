// A synthetic skewed routing trace for cache sizing without a run (`moecheck cache
// --synthetic`): each layer's experts get Zipf(s) popularity over a seeded random permutation,
// each token draws topk distinct experts by it, and each predicted pick is the actual pick with
// probability `predict`, else another expert drawn the same way. Every draw comes from the
// project's portable PRNG (golden/generator.h Rng, stream_key) and the weights from basic IEEE
// double operations only (no libm), so a spec gives the same trace on every platform.
// Contract (the exact algorithm): docs/streaming.md "Cache simulation", synthetic traces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "golden/trace_file.h"

namespace moecheck {

struct SyntheticTraceSpec {
  int64_t layers = 40;
  int64_t tokens = 64;
  int64_t experts = 384;
  int64_t topk = 6;
  double zipf = 1.0;     // s >= 0: rank r (0-based) has weight (r + 1)^-s
  double predict = 0.7;  // probability a predicted pick equals the actual one
  uint64_t seed = 1;
  // Bytes of one expert for sizes in bytes: ds41's routed expert (gate and up Q2_K [2304, 5120],
  // down Q3_K [5120, 2304]) unless given; 0 = unknown.
  int64_t expert_bytes = -1;  // -1: the ds41 default
};

// Bytes of one ds41 routed expert: 12810240.
int64_t ds41_expert_bytes();

// "layers=40,tokens=64,experts=384,topk=6,zipf=1.0,predict=0.7,seed=1[,expert_bytes=N]": any
// subset of the keys, each at most once, the rest at their defaults. InputError naming `where`,
// the key and the value otherwise (unknown key, not a number, out of range, experts < 2 topk
// with predict < 1, too large a trace).
SyntheticTraceSpec parse_synthetic_spec(const std::string& s, const std::string& where);
// Every key with its value, in the order above (the trace's origin after "synthetic ").
std::string synthetic_spec_text(const SyntheticTraceSpec& s);

// The trace (layers 0 .. layers - 1; layer 0 without predictions) and its expert_bytes.
TraceFile synthetic_trace(const SyntheticTraceSpec& s);

// Layer `layer`'s experts by popularity rank (rank 0 most popular): the seeded permutation.
std::vector<int32_t> synthetic_ranking(uint64_t seed, int64_t layer, int64_t experts);
// (r + 1)^-s for r = 0 .. n - 1, computed as exp(-s ln(r + 1)) with the file's own ln and exp.
std::vector<double> zipf_weights(int64_t n, double s);

}  // namespace moecheck
