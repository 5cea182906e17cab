// import_layer / export_layer (tools/import_map.h): the import layout to LayerTaps and back.
#include "tools/import_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/numfmt.h"

namespace moecheck::cli {
namespace {

constexpr int64_t kQ8 = static_cast<int64_t>(sizeof(BlockQ8_1));

std::string shape_text(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// The stage's tensor with its shape checked (a leading axis of 1 dropped; 2-D transposed when
// asked), as a copy whose shape is `want`.
HostTensor shaped(Stage s, const MappedTensor& m, const std::vector<int64_t>& want,
                  bool transpose) {
  HostTensor t = m.tensor;
  if (t.shape.size() == want.size() + 1 && t.shape[0] == 1) t.shape.erase(t.shape.begin());
  if (transpose && want.size() == 2 && t.shape.size() == 2) {
    const int64_t r = t.shape[0], c = t.shape[1];
    const size_t es = tensor_dtype_size(t.dtype);
    std::vector<uint8_t> b(t.bytes.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        std::memcpy(b.data() + (j * r + i) * es, t.bytes.data() + (i * c + j) * es, es);
    t.bytes = std::move(b);
    t.shape = {c, r};
  }
  if (t.shape != want)
    throw InputError(std::string("stage ") + stage_name(s) + " (" + m.source + "): shape " +
                     shape_text(m.tensor.shape) + ", expected " + shape_text(want) +
                     (transpose && want.size() == 2 ? " (after --transpose)" : "") +
                     " from the model config and the token count");
  return t;
}

std::vector<BlockQ8_1> q8_blocks(Stage s, const MappedTensor& m, const HostTensor& t) {
  if (t.dtype != TensorDtype::kU8)
    throw InputError(std::string("stage ") + stage_name(s) + " (" + m.source + "): dtype " +
                     tensor_dtype_name(t.dtype) + ", expected u8 (raw block_q8_1 bytes)");
  std::vector<BlockQ8_1> out(t.bytes.size() / sizeof(BlockQ8_1));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

class Importer {
 public:
  Importer(const MoeConfig& c, const std::map<Stage, MappedTensor>& m, bool transpose)
      : c_(c), m_(m), tr_(transpose) {}

  bool has(Stage s) const { return m_.count(s) > 0; }
  HostTensor get(Stage s, const std::vector<int64_t>& want) const {
    return shaped(s, m_.at(s), want, tr_);
  }
  std::string src(Stage s) const {
    return std::string("stage ") + stage_name(s) + " (" + m_.at(s).source + ")";
  }

  void input(LayerTaps& t) const {
    const HostTensor x = m_.at(Stage::kInput).tensor;
    const int64_t T = t.tokens;
    const HostTensor v = get(Stage::kInput, {T, c_.dim});
    if (v.dtype == TensorDtype::kBF16) {
      t.input = tensor_to_bf16(v);
      return;
    }
    const std::vector<float> f = tensor_to_f32(v);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t b = f32_to_bf16(f[i]);
      if (bf16_to_f32(b) != f[i] && !(std::isnan(f[i])))
        throw InputError(src(Stage::kInput) + ": token " + std::to_string(i / c_.dim) + " column " +
                         std::to_string(i % c_.dim) + ": " + fmt_value(f[i]) +
                         " is not a bf16 value; the layer's input is bf16 (model.py), give the "
                         "bf16 the engine consumed");
      t.input.push_back(b);
    }
  }

  void routing(LayerTaps& t) const {
    const int64_t T = t.tokens, K = c_.topk;
    t.topk_ids = tensor_to_i32(get(Stage::kTopkIds, {T, K}));
    t.topk_weights = tensor_to_f32(get(Stage::kTopkWeights, {T, K}));
    for (int64_t tok = 0; tok < T; ++tok)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = t.topk_ids[tok * K + k];
        const std::string at = " token " + std::to_string(tok) + " slot " + std::to_string(k);
        if (e < 0 || e >= c_.n_routed)
          throw InputError(src(Stage::kTopkIds) + ":" + at + ": expert id " + std::to_string(e) +
                           " outside [0, " + std::to_string(c_.n_routed) + ")");
        for (int64_t j = 0; j < k; ++j)
          if (t.topk_ids[tok * K + j] == e)
            throw InputError(src(Stage::kTopkIds) + ":" + at + ": expert " + std::to_string(e) +
                             " picked twice");
        if (!std::isfinite(t.topk_weights[tok * K + k]))
          throw InputError(src(Stage::kTopkWeights) + ":" + at + ": weight " +
                           fmt_value(t.topk_weights[tok * K + k]) +
                           " is not finite (a routing weight must be)");
      }
  }

  // Routed taps by slot: expert e gets the rows of the tokens that picked it, ascending.
  void routed(LayerTaps& t) const {
    const int64_t T = t.tokens, K = c_.topk, I = c_.inter, D = c_.dim;
    const std::vector<float> g = tensor_to_f32(get(Stage::kExpertsGate, {T, K, I}));
    const std::vector<float> u = tensor_to_f32(get(Stage::kExpertsUp, {T, K, I}));
    const std::vector<float> h = tensor_to_f32(get(Stage::kExpertsH, {T, K, I}));
    const std::vector<float> d = tensor_to_f32(get(Stage::kExpertsDown, {T, K, D}));
    const std::vector<BlockQ8_1> hq = q8_blocks(Stage::kExpertsHQ8, m_.at(Stage::kExpertsHQ8),
                                                get(Stage::kExpertsHQ8, {T, K, I / kQK8_1, kQ8}));
    std::map<int32_t, ExpertTaps> by;
    for (int64_t tok = 0; tok < T; ++tok)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t slot = tok * K + k;
        ExpertTaps& e = by[t.topk_ids[slot]];
        e.expert = t.topk_ids[slot];
        e.tokens.push_back(static_cast<int32_t>(tok));
        e.weights.push_back(t.topk_weights[slot]);
        e.gate.insert(e.gate.end(), g.begin() + slot * I, g.begin() + (slot + 1) * I);
        e.up.insert(e.up.end(), u.begin() + slot * I, u.begin() + (slot + 1) * I);
        e.h.insert(e.h.end(), h.begin() + slot * I, h.begin() + (slot + 1) * I);
        e.h_q8.insert(e.h_q8.end(), hq.begin() + slot * (I / kQK8_1),
                      hq.begin() + (slot + 1) * (I / kQK8_1));
        e.down.insert(e.down.end(), d.begin() + slot * D, d.begin() + (slot + 1) * D);
      }
    for (auto& [id, e] : by) t.experts.push_back(std::move(e));
  }

  void shared(LayerTaps& t, bool q8) const {
    const int64_t T = t.tokens, I = c_.inter, D = c_.dim;
    ExpertTaps& s = t.shared;
    s.expert = -1;
    for (int64_t tok = 0; tok < T; ++tok) s.tokens.push_back(static_cast<int32_t>(tok));
    s.weights.assign(static_cast<size_t>(T), 1.0f);
    s.gate = tensor_to_f32(get(Stage::kSharedGate, {T, I}));
    s.up = tensor_to_f32(get(Stage::kSharedUp, {T, I}));
    s.h = tensor_to_f32(get(Stage::kSharedH, {T, I}));
    s.down = tensor_to_f32(get(Stage::kSharedDown, {T, D}));
    if (q8)
      s.h_q8 = q8_blocks(Stage::kSharedHQ8, m_.at(Stage::kSharedHQ8),
                         get(Stage::kSharedHQ8, {T, I / kQK8_1, kQ8}));
  }

 private:
  static std::string fmt_value(float v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
    return b;
  }
  const MoeConfig& c_;
  const std::map<Stage, MappedTensor>& m_;
  bool tr_;
};

// The tap stages an import with taps needs (shared.h_q8 only for a K-quant shared expert).
std::vector<Stage> tap_stages(bool shared_q8) {
  std::vector<Stage> v = {Stage::kXQ8,        Stage::kExpertsGate, Stage::kExpertsUp,
                          Stage::kExpertsH,   Stage::kExpertsHQ8,  Stage::kExpertsDown,
                          Stage::kSharedGate, Stage::kSharedUp,    Stage::kSharedH,
                          Stage::kSharedDown, Stage::kAcc};
  if (shared_q8) v.push_back(Stage::kSharedHQ8);
  return v;
}

}  // namespace

LayerTaps import_layer(const MoeConfig& c, int L, const std::map<Stage, MappedTensor>& m,
                       bool transpose, bool shared_q8) {
  const Importer im(c, m, transpose);
  for (Stage s : {Stage::kInput, Stage::kOutput})
    if (!im.has(s)) throw InputError(std::string("stage ") + stage_name(s) + ": not mapped");
  if (im.has(Stage::kTopkIds) != im.has(Stage::kTopkWeights))
    throw InputError("stages topk_ids and topk_weights: map both or neither");
  bool any_tap = false;
  for (Stage s : tap_stages(true)) any_tap = any_tap || im.has(s);
  if (any_tap)
    for (Stage s : {Stage::kRouterLogits, Stage::kTopkIds})
      if (!im.has(s))
        throw InputError(std::string("stage ") + stage_name(s) +
                         ": not mapped; tap stages are imported with the routing and every other "
                         "tap stage (the legs that read taps need all of them)");
  if (any_tap)
    for (Stage s : tap_stages(shared_q8))
      if (!im.has(s))
        throw InputError(std::string("stage ") + stage_name(s) +
                         ": not mapped; tap stages are imported all or none");
  const HostTensor& x = m.at(Stage::kInput).tensor;
  LayerTaps t;
  t.layer = L;
  std::vector<int64_t> xs = x.shape;
  if (xs.size() == 3 && xs[0] == 1) xs.erase(xs.begin());
  if (xs.size() != 2)
    throw InputError(im.src(Stage::kInput) + ": rank " + std::to_string(xs.size()) +
                     ", expected 2 ([T, dim])");
  t.tokens = transpose ? xs[1] : xs[0];
  im.input(t);
  t.output = tensor_to_bf16(im.get(Stage::kOutput, {t.tokens, c.dim}));
  if (im.has(Stage::kRouterLogits))
    t.router_logits = tensor_to_f32(im.get(Stage::kRouterLogits, {t.tokens, c.n_routed}));
  if (im.has(Stage::kTopkIds)) im.routing(t);
  if (!any_tap) return t;
  t.x_q8 = q8_blocks(Stage::kXQ8, m.at(Stage::kXQ8),
                     im.get(Stage::kXQ8, {t.tokens, c.dim / kQK8_1, kQ8}));
  im.routed(t);
  im.shared(t, shared_q8);
  t.acc = tensor_to_f32(im.get(Stage::kAcc, {t.tokens, c.dim}));
  return t;
}

std::map<std::string, HostTensor> export_layer(const MoeConfig& c, const LayerTaps& t) {
  std::map<std::string, HostTensor> out;
  const int64_t T = t.tokens, K = c.topk, I = c.inter, D = c.dim;
  auto put = [&](Stage s, TensorDtype dt, const void* p, size_t bytes, std::vector<int64_t> shape) {
    HostTensor h;
    h.dtype = dt;
    h.shape = std::move(shape);
    h.bytes.assign(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + bytes);
    out.emplace(stage_name(s), std::move(h));
  };
  put(Stage::kInput, TensorDtype::kBF16, t.input.data(), t.input.size() * 2, {T, D});
  put(Stage::kOutput, TensorDtype::kBF16, t.output.data(), t.output.size() * 2, {T, D});
  if (!t.router_logits.empty())
    put(Stage::kRouterLogits, TensorDtype::kF32, t.router_logits.data(), t.router_logits.size() * 4,
        {T, c.n_routed});
  if (!t.topk_ids.empty()) {
    put(Stage::kTopkIds, TensorDtype::kI32, t.topk_ids.data(), t.topk_ids.size() * 4, {T, K});
    put(Stage::kTopkWeights, TensorDtype::kF32, t.topk_weights.data(), t.topk_weights.size() * 4,
        {T, K});
  }
  if (t.acc.empty() || t.x_q8.empty()) return out;
  put(Stage::kXQ8, TensorDtype::kU8, t.x_q8.data(), t.x_q8.size() * kQ8, {T, D / kQK8_1, kQ8});
  put(Stage::kAcc, TensorDtype::kF32, t.acc.data(), t.acc.size() * 4, {T, D});
  std::vector<float> g(T * K * I), u(T * K * I), h(T * K * I), d(T * K * D);
  std::vector<BlockQ8_1> hq(T * K * I / kQK8_1);
  for (const ExpertTaps& e : t.experts)
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      const int64_t tok = e.tokens[j];
      const int64_t k =
          std::find(t.topk_ids.begin() + tok * K, t.topk_ids.begin() + (tok + 1) * K, e.expert) -
          (t.topk_ids.begin() + tok * K);
      const int64_t slot = tok * K + k;
      std::copy_n(e.gate.begin() + j * I, I, g.begin() + slot * I);
      std::copy_n(e.up.begin() + j * I, I, u.begin() + slot * I);
      std::copy_n(e.h.begin() + j * I, I, h.begin() + slot * I);
      std::copy_n(e.down.begin() + j * D, D, d.begin() + slot * D);
      std::copy_n(e.h_q8.begin() + j * (I / kQK8_1), I / kQK8_1, hq.begin() + slot * (I / kQK8_1));
    }
  put(Stage::kExpertsGate, TensorDtype::kF32, g.data(), g.size() * 4, {T, K, I});
  put(Stage::kExpertsUp, TensorDtype::kF32, u.data(), u.size() * 4, {T, K, I});
  put(Stage::kExpertsH, TensorDtype::kF32, h.data(), h.size() * 4, {T, K, I});
  put(Stage::kExpertsDown, TensorDtype::kF32, d.data(), d.size() * 4, {T, K, D});
  put(Stage::kExpertsHQ8, TensorDtype::kU8, hq.data(), hq.size() * kQ8, {T, K, I / kQK8_1, kQ8});
  const ExpertTaps& s = t.shared;
  put(Stage::kSharedGate, TensorDtype::kF32, s.gate.data(), s.gate.size() * 4, {T, I});
  put(Stage::kSharedUp, TensorDtype::kF32, s.up.data(), s.up.size() * 4, {T, I});
  put(Stage::kSharedH, TensorDtype::kF32, s.h.data(), s.h.size() * 4, {T, I});
  put(Stage::kSharedDown, TensorDtype::kF32, s.down.data(), s.down.size() * 4, {T, D});
  if (!s.h_q8.empty())
    put(Stage::kSharedHQ8, TensorDtype::kU8, s.h_q8.data(), s.h_q8.size() * kQ8,
        {T, I / kQK8_1, kQ8});
  return out;
}

}  // namespace moecheck::cli
