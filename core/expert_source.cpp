// ExpertLayout and the host-memory source (core/expert_source.h).
#include "core/expert_source.h"

#include <cstring>

#include "core/error.h"

namespace moecheck {

const char* proj_name(Proj p) {
  switch (p) {
    case Proj::kGate: return "gate";
    case Proj::kUp: return "up";
    case Proj::kDown: return "down";
  }
  return "?";
}

const ExpertStackView& ExpertLayout::stack(Proj p) const {
  return p == Proj::kGate ? gate : p == Proj::kUp ? up : down;
}

bool ExpertLayout::same_shape(const ExpertLayout& o) const {
  for (Proj p : kAllProjs) {
    const ExpertStackView &a = stack(p), &b = o.stack(p);
    if (a.type != b.type || a.rows != b.rows || a.cols != b.cols) return false;
  }
  return true;
}

std::string ExpertLayout::describe() const {
  std::string s;
  for (Proj p : kAllProjs) {
    const ExpertStackView& v = stack(p);
    if (!s.empty()) s += ", ";
    s += std::string(proj_name(p)) + " " + ggml_type_name(v.type) + " [" + std::to_string(v.rows) +
         ", " + std::to_string(v.cols) + "]";
  }
  return s;
}

ExpertLayout expert_layout(const LayerWeights& w) {
  return ExpertLayout{w.gate_exps, w.up_exps, w.down_exps};
}

std::string stack_tensor_name(int layer, Proj p) {
  return "blk." + std::to_string(layer) + ".ffn_" + proj_name(p) + "_exps.weight";
}

HostExpertSource::HostExpertSource(const std::vector<LayerWeights>& layers, std::string name)
    : name_(std::move(name)) {
  for (const LayerWeights& w : layers) {
    for (Proj p : kAllProjs)
      if (expert_layout(w).stack(p).data == nullptr)
        throw InputError(name_ + ": layer " + std::to_string(w.layer) + " tensor " +
                         stack_tensor_name(w.layer, p) + " has no bytes in host memory");
    if (!layers_.emplace(w.layer, w).second)
      throw InputError(name_ + ": layer " + std::to_string(w.layer) + " given twice");
  }
}

const LayerWeights& HostExpertSource::find(int layer) const {
  auto it = layers_.find(layer);
  if (it == layers_.end())
    throw InputError(name_ + ": no layer " + std::to_string(layer) + " (it holds " +
                     std::to_string(layers_.size()) + " layer(s))");
  return it->second;
}

ExpertLayout HostExpertSource::layout(int layer) const { return expert_layout(find(layer)); }

void HostExpertSource::check_expert(const LayerWeights& w, int64_t expert, Proj p) const {
  const int64_t n = expert_layout(w).stack(p).n_experts;
  if (expert < 0 || expert >= n)
    throw InputError(name_ + ": tensor " + stack_tensor_name(w.layer, p) + " layer " +
                     std::to_string(w.layer) + " expert " + std::to_string(expert) +
                     ": outside the stack's " + std::to_string(n) + " experts");
}

const uint8_t* HostExpertSource::view(int layer, int64_t expert, Proj p) const {
  const LayerWeights& w = find(layer);
  check_expert(w, expert, p);
  return expert_layout(w).stack(p).expert(expert).data;
}

void HostExpertSource::read(int layer, int64_t expert, Proj p, uint8_t* dst) const {
  const uint8_t* src = view(layer, expert, p);
  std::memcpy(dst, src, static_cast<size_t>(layout(layer).bytes(p)));
}

}  // namespace moecheck
