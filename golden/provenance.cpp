// Per-tensor and per-expert-slice SHA-256 of a model file (golden/provenance.h). A stacked
// tensor's expert e is the byte range [e * nbytes / n_experts, (e + 1) * nbytes / n_experts) of
// the tensor (llama.cpp's layout: ne[2] experts of ne[0] x ne[1]). The first read of each piece
// also refuses non-finite weights (golden/finite_check.h).
#include "golden/provenance.h"

#include <algorithm>
#include <array>
#include <exception>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "golden/finite_check.h"
#include "golden/sha256.h"
#include "golden/synthetic_model.h"

namespace moecheck {
namespace {

bool is_stack(LayerTensor t) {
  return t == LayerTensor::kGateExps || t == LayerTensor::kUpExps || t == LayerTensor::kDownExps;
}

}  // namespace

std::string slice_name(int layer, LayerTensor t, int32_t expert) {
  std::string s = tensor_name(layer, t);
  if (expert >= 0) s += "[expert " + std::to_string(expert) + "]";
  return s;
}

int32_t tensor_code(LayerTensor t) { return static_cast<int32_t>(t); }

bool tensor_from_code(int32_t code, LayerTensor* out) {
  auto find = [&](const auto& list) {
    for (LayerTensor t : list) {
      if (tensor_code(t) == code) {
        *out = t;
        return true;
      }
    }
    return false;
  };
  return find(kLayerTensors) || find(kOptionalLayerTensors);
}

std::string SliceHasher::header() {
  std::lock_guard<std::mutex> lock(mu_);
  if (header_.empty())
    header_ = sha256_hex(m_.gguf().header_bytes(), static_cast<size_t>(m_.gguf().data_offset()));
  return header_;
}

SliceHasher::SliceHasher(ModelFile m) : m_(std::move(m)) {
  if (m_.synthetic()) source_ = m_.expert_source();
}

std::vector<uint8_t> SliceHasher::read_expert(int layer, LayerTensor t, int32_t expert,
                                              uint64_t n) const {
  const Proj p = t == LayerTensor::kGateExps ? Proj::kGate
                 : t == LayerTensor::kUpExps ? Proj::kUp
                                             : Proj::kDown;
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  source_->read(layer, expert, p, buf.data());
  return buf;
}

std::string SliceHasher::slice(int layer, LayerTensor t, int32_t expert) {
  const auto key = std::make_tuple(layer, tensor_code(t), expert);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  const std::string name = tensor_name(layer, t);
  const gguf::TensorInfo* ti = m_.gguf().find_tensor(name);
  if (ti == nullptr) throw InputError(m_.path() + ": tensor \"" + name + "\" is missing");
  const uint8_t* p = m_.gguf().data(*ti);
  uint64_t n = ti->nbytes;
  std::vector<uint8_t> made;         // a synthetic model's expert, made for this hash
  std::shared_ptr<const void> held;  // a synthetic model's layer, filled while hashed
  if (expert >= 0) {
    const int64_t n_exp = ti->n_dims == 3 ? ti->ne[2] : 0;
    if (!is_stack(t) || expert >= n_exp)
      throw InputError(m_.path() + ": tensor \"" + name + "\" has no expert " +
                       std::to_string(expert));
    n = ti->nbytes / static_cast<uint64_t>(n_exp);
    p += static_cast<uint64_t>(expert) * n;
    // A synthetic layer someone holds filled is hashed in place (the same bytes, not made again).
    if (source_ && !(held = m_.synthetic_image()->held_now(layer, true))) {
      made = read_expert(layer, t, expert, n);
      p = made.data();
    }
  } else if (m_.synthetic()) {
    held = (is_stack(t) ? m_.layer(layer) : m_.resident_layer(layer)).keep_alive;
  }
  // The first read of this piece: its values must be finite (golden/finite_check.h).
  check_finite_slice(m_.path(), slice_name(layer, t, expert), ti->type, ti->ne[0], p, n);
  const std::string h = sha256_hex(p, static_cast<size_t>(n));
  std::lock_guard<std::mutex> lock(mu_);
  cache_[key] = h;
  return h;
}

void SliceHasher::record(int layer, LayerTensor t, int32_t expert, std::string sha256) {
  std::array<uint8_t, 32> bytes{};
  if (!from_hex(sha256, bytes) || to_hex(bytes) != sha256)
    throw std::invalid_argument("SliceHasher::record: " + slice_name(layer, t, expert) + ": \"" +
                                sha256 + "\" is not 64 lower-case hex digits");
  const auto key = std::make_tuple(layer, tensor_code(t), expert);
  std::lock_guard<std::mutex> lock(mu_);
  const auto [it, added] = cache_.emplace(key, sha256);
  if (!added && it->second != sha256)
    throw InputError(m_.path() + ": tensor " + slice_name(layer, t, expert) + " was hashed as " +
                     it->second + " and is now recorded as " + sha256 +
                     ": its bytes changed between two reads");
}

std::vector<SliceHash> SliceHasher::layer_slices(int layer, const std::vector<int32_t>& experts,
                                                 bool bias_vl) {
  std::vector<SliceHash> out;
  for (LayerTensor t : {LayerTensor::kRouter, LayerTensor::kBias, LayerTensor::kBiasVl,
                        LayerTensor::kGateShexp, LayerTensor::kUpShexp, LayerTensor::kDownShexp})
    if (t != LayerTensor::kBiasVl || bias_vl) out.push_back({t, -1, slice(layer, t, -1)});
  // The experts' slices (a ds41 layer at 512 tokens reads ~5 GB) are hashed by host threads,
  // each taking every nt-th slice; the list keeps its order, and of several failing slices the
  // first in that order is the one reported, as a serial loop would.
  const std::array<LayerTensor, 3> stacks = {LayerTensor::kGateExps, LayerTensor::kUpExps,
                                             LayerTensor::kDownExps};
  const size_t first = out.size(), n = experts.size() * stacks.size();
  for (size_t i = 0; i < n; ++i) out.push_back({stacks[i % 3], experts[i / 3], ""});
  std::vector<std::exception_ptr> errors(n);
  const size_t nt = std::min<size_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u), n);
  auto part = [&](size_t k) {
    for (size_t i = k; i < n; i += nt) {
      try {
        SliceHash& h = out[first + i];
        h.sha256 = slice(layer, h.tensor, h.expert);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t k = 1; k < nt; ++k) pool.emplace_back(part, k);
  if (nt > 0) part(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

std::vector<int32_t> experts_used(const std::vector<int32_t>& topk_ids) {
  std::vector<int32_t> e(topk_ids);
  std::sort(e.begin(), e.end());
  e.erase(std::unique(e.begin(), e.end()), e.end());
  return e;
}

}  // namespace moecheck
