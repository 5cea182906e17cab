// Synthetic dumps for dump_test and diff_test: every stage filled from a small seeded
// generator (values, token lists and picks consistent with each other), no model involved.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/numfmt.h"
#include "golden/dump.h"

namespace moecheck::testing {

// splitmix64: a portable stream for test data.
class TestRng {
 public:
  explicit TestRng(uint64_t s) : s_(s) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) with 24 bits: exact in f32.
  float value() {
    return static_cast<float>(static_cast<int32_t>(next() >> 40) - (1 << 23)) /
           static_cast<float>(1 << 23);
  }

 private:
  uint64_t s_;
};

inline MoeConfig small_config(int64_t n_routed = 8, int64_t topk = 2) {
  MoeConfig c;
  c.dim = 256;
  c.inter = 256;
  c.n_routed = n_routed;
  c.topk = topk;
  c.route_scale = 1.5f;
  c.swiglu_limit = 10.0f;
  return c;
}

inline ExpertTaps make_expert(const MoeConfig& c, int32_t id, std::vector<int32_t> tokens,
                              TestRng& r, bool q8) {
  ExpertTaps e;
  e.expert = id;
  e.tokens = std::move(tokens);
  const size_t n = e.tokens.size();
  for (size_t i = 0; i < n; ++i) e.weights.push_back(0.25f + 0.5f * std::abs(r.value()));
  auto fill = [&](std::vector<float>& v, int64_t cols) {
    v.resize(n * static_cast<size_t>(cols));
    for (float& x : v) x = r.value();
  };
  fill(e.gate, c.inter);
  fill(e.up, c.inter);
  fill(e.h, c.inter);
  fill(e.down, c.dim);
  if (q8) {
    e.h_q8.resize(n * static_cast<size_t>(c.inter / 32));
    for (BlockQ8_1& b : e.h_q8) {
      b.d = static_cast<uint16_t>(r.next() & 0x3BFF);
      b.s = static_cast<uint16_t>(r.next() & 0x3BFF);
      for (int8_t& q : b.qs) q = static_cast<int8_t>(static_cast<int>(r.next() % 255) - 127);
    }
  }
  return e;
}

// A dump whose routing picks experts (t + j) % n_routed for token t (distinct, j < topk), with
// router logits that make those the top-k in that order (margin 1 between ranks).
inline Dump make_dump(const MoeConfig& c, int64_t T, std::vector<int32_t> layers, uint64_t seed,
                      bool taps, const std::string& impl = "emu") {
  Dump d;
  d.path = impl + "_synthetic";
  DumpMeta& m = d.meta;
  m.tool_version = "test";
  m.git_commit = "unknown";
  m.implementation = impl;
  m.variant = "router=staged expert_warps=8";
  m.knobs = {{"router", "staged"}, {"expert_warps", "8"}};
  m.device = "cpu";
  m.model_file = "synthetic.gguf";
  m.model_sha256 = std::string(64, 'a');
  m.config = c;
  m.has_model_seed = true;
  m.model_seed = 7;
  m.input_source = "seed";
  m.input_seed = seed;
  m.tokens = T;
  m.layers = layers;
  m.taps = taps;
  m.routing_weight_at = impl == "ref" ? "h" : "accumulate";
  for (int32_t L : layers) {
    TestRng r(seed * 1000 + static_cast<uint64_t>(L));
    LayerTaps t;
    t.layer = L;
    t.tokens = T;
    const size_t td = static_cast<size_t>(T * c.dim);
    for (size_t i = 0; i < td; ++i) t.input.push_back(f32_to_bf16(r.value()));
    for (size_t i = 0; i < td; ++i) t.output.push_back(f32_to_bf16(r.value()));
    t.router_logits.assign(static_cast<size_t>(T * c.n_routed), -10.0f);
    std::vector<std::vector<int32_t>> tok_of(static_cast<size_t>(c.n_routed));
    for (int64_t tok = 0; tok < T; ++tok)
      for (int64_t j = 0; j < c.topk; ++j) {
        const int32_t e = static_cast<int32_t>((tok + j) % c.n_routed);
        t.topk_ids.push_back(e);
        t.topk_weights.push_back(c.route_scale / static_cast<float>(c.topk));
        t.router_logits[static_cast<size_t>(tok * c.n_routed + e)] = static_cast<float>(c.topk - j);
        tok_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(tok));
      }
    if (taps) {
      t.x_q8.resize(static_cast<size_t>(T * c.dim / 32));
      for (BlockQ8_1& b : t.x_q8) {
        b.d = static_cast<uint16_t>(r.next() & 0x3BFF);
        b.s = 0;
        for (int8_t& q : b.qs) q = static_cast<int8_t>(static_cast<int>(r.next() % 255) - 127);
      }
      for (int32_t e = 0; e < c.n_routed; ++e)
        if (!tok_of[static_cast<size_t>(e)].empty())
          t.experts.push_back(make_expert(c, e, tok_of[static_cast<size_t>(e)], r, true));
      std::vector<int32_t> all(static_cast<size_t>(T));
      std::iota(all.begin(), all.end(), 0);
      t.shared = make_expert(c, -1, all, r, false);
      for (float& w : t.shared.weights) w = 1.0f;
      t.acc.resize(td);
      for (float& v : t.acc) v = r.value();
    }
    d.layers.push_back(std::move(t));
  }
  return d;
}

}  // namespace moecheck::testing
