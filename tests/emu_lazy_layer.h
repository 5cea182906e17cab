// A generated layer (golden/generator.h) whose routed expert stacks are zero pages from calloc
// (nothing touched until written) and whose experts are generated on request, so that a ds41
// layer (4.9 GB of stacks) costs only the experts a test routes to. Used by the emulation's
// ds41 tests and benchmark (tests/emu_moe_layer_test.cpp, tests/slow/emu_bench_test.cpp).
#pragma once

#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "core/layer_weights.h"
#include "golden/generator.h"

namespace moecheck::emutest {

class LazyLayer {
 public:
  LazyLayer(const GenOptions& o, int layer) : o_(o), layer_(layer) {
    const MoeConfig& c = o.config;
    router_.resize(static_cast<size_t>(c.n_routed * c.dim));
    bias_.resize(static_cast<size_t>(c.n_routed));
    generate_router(o, layer, router_.data());
    generate_bias(o, layer, bias_.data());
    const Proj projs[3] = {Proj::kGate, Proj::kUp, Proj::kDown};
    for (int i = 0; i < 3; ++i) {
      const size_t n = static_cast<size_t>(expert_bytes(o, projs[i]) * c.n_routed);
      stacks_[i].reset(static_cast<uint8_t*>(std::calloc(n, 1)));
      if (!stacks_[i]) throw std::bad_alloc();
      shared_[i].resize(static_cast<size_t>(shared_bytes(o, projs[i])));
      generate_shared(o, layer, projs[i], shared_[i].data());
    }
    const bool kq = o.shared == SharedExpertType::kKQuant;
    w_.layer = layer;
    w_.config = c;
    w_.router = router_.data();
    w_.bias = bias_.data();
    w_.gate_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, stacks_[0].get()};
    w_.up_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, stacks_[1].get()};
    w_.down_exps = ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, stacks_[2].get()};
    w_.shared_gate =
        MatView{kq ? GgmlType::kQ2K : GgmlType::kBF16, c.inter, c.dim, shared_[0].data()};
    w_.shared_up =
        MatView{kq ? GgmlType::kQ2K : GgmlType::kBF16, c.inter, c.dim, shared_[1].data()};
    w_.shared_down =
        MatView{kq ? GgmlType::kQ3K : GgmlType::kBF16, c.dim, c.inter, shared_[2].data()};
  }

  // Generates the blocks of these experts (once each) into the stacks.
  void fill(const std::vector<int32_t>& experts) {
    const Proj projs[3] = {Proj::kGate, Proj::kUp, Proj::kDown};
    for (int32_t e : experts) {
      if (!filled_.insert(e).second) continue;
      for (int i = 0; i < 3; ++i) {
        const int64_t eb = expert_bytes(o_, projs[i]);
        generate_expert_blocks(o_, layer_, projs[i], e, stacks_[i].get() + e * eb);
      }
    }
  }
  const std::set<int32_t>& filled() const { return filled_; }
  const LayerWeights& weights() const { return w_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  GenOptions o_;
  int layer_;
  std::vector<uint16_t> router_;
  std::vector<float> bias_;
  std::unique_ptr<uint8_t, Free> stacks_[3];
  std::vector<uint8_t> shared_[3];
  std::set<int32_t> filled_;
  LayerWeights w_;
};

}  // namespace moecheck::emutest
