// Helpers of the streaming GPU tests (tests/gpu/expert_lru_test.cu, moe_stream_test.cu): a
// source that fails on purpose (the n-th read, after writing part of the bytes), a source that
// counts its reads, generated layers, and the slot bytes read back from the device.
#pragma once

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/expert_source.h"
#include "cuda/expert_lru.h"
#include "golden/generator.h"
#include "tests/gpu/gpu_test_util.h"

namespace moecheck::gputest {

// Wraps a source; while armed, read number `fail_at` (1-based, counted over all threads) writes
// the first half of the bytes (or garbage: the whole buffer 0xA5) and throws the way a file
// source does on a short read, naming the tensor, layer and expert.
class FaultySource : public ExpertSource {
 public:
  enum class Mode { kShortRead, kGarbageThenError };
  explicit FaultySource(std::shared_ptr<const ExpertSource> inner) : inner_(std::move(inner)) {}
  void arm(int64_t fail_at, Mode m = Mode::kShortRead) {
    mode_ = m;
    reads_ = 0;
    fail_at_ = fail_at;
  }
  void disarm() { fail_at_ = 0; }
  int64_t reads() const { return reads_.load(); }
  std::string name() const override { return "faulty(" + inner_->name() + ")"; }
  ExpertLayout layout(int layer) const override { return inner_->layout(layer); }
  void read(int layer, int64_t expert, Proj p, uint8_t* dst) const override {
    const int64_t n = ++reads_;
    const int64_t bytes = layout(layer).bytes(p);
    if (fail_at_ > 0 && n == fail_at_) {
      if (mode_ == Mode::kShortRead) {
        inner_->read(layer, expert, p, dst);
        std::memset(dst + bytes / 2, 0, static_cast<size_t>(bytes - bytes / 2));
      } else {
        std::memset(dst, 0xA5, static_cast<size_t>(bytes));
      }
      throw InputError(name() + ": tensor blk." + std::to_string(layer) + ".ffn_" + proj_name(p) +
                       "_exps.weight layer " + std::to_string(layer) + " expert " +
                       std::to_string(expert) + ": short read: got " + std::to_string(bytes / 2) +
                       " of " + std::to_string(bytes) + " bytes (injected)");
    }
    inner_->read(layer, expert, p, dst);
  }

 private:
  std::shared_ptr<const ExpertSource> inner_;
  mutable std::atomic<int64_t> reads_{0};
  std::atomic<int64_t> fail_at_{0};
  Mode mode_ = Mode::kShortRead;
};

// Any expert's blocks made by the generator on demand (the bytes generate_layer holds).
class GeneratedSource : public ExpertSource {
 public:
  explicit GeneratedSource(GenOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "generated " + o_.preset; }
  ExpertLayout layout(int /*layer*/) const override {
    const MoeConfig& c = o_.config;
    ExpertLayout l;
    l.gate = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, nullptr};
    l.up = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, nullptr};
    l.down = ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, nullptr};
    return l;
  }
  void read(int layer, int64_t expert, Proj p, uint8_t* dst) const override {
    generate_expert_blocks(o_, layer, p, expert, dst);
  }

 private:
  GenOptions o_;
};

// Projection p of the expert in `slot`, read back from the device.
inline std::vector<uint8_t> slot_bytes(const cuda::ExpertLru& c, int32_t slot, Proj p) {
  std::vector<uint8_t> v(static_cast<size_t>(c.layout().bytes(p)));
  (void)cudaMemcpy(v.data(), c.slot_data(slot, p), v.size(), cudaMemcpyDeviceToHost);
  return v;
}

// The device slot table, read back.
inline std::vector<int32_t> slot_table(const cuda::ExpertLru& c) {
  (void)cudaDeviceSynchronize();
  std::vector<int32_t> t(static_cast<size_t>(64 * c.n_routed()));
  (void)cudaMemcpy(t.data(), c.slot_table(), t.size() * 4, cudaMemcpyDeviceToHost);
  return t;
}

// Layers 0..n-1 of preset options `o`, generated in memory.
inline std::vector<LayerWeights> generated_layers(const GenOptions& o, int n) {
  std::vector<LayerWeights> v;
  for (int l = 0; l < n; ++l) v.push_back(generate_layer(o, l));
  return v;
}

}  // namespace moecheck::gputest
