// ModelFile: a validated GGUF model file's config and per-layer views of its tensors.
// Contract: docs/gguf.md "Metadata keys" (exact types, which keys are required) and "Tensors"
// (names, ggml ne order, types). Every message names the file and the key or tensor, with what
// was expected and what was found.
#include "golden/model_file.h"

#include <limits>

#include "core/error.h"
#include "golden/expert_sources.h"
#include "golden/synthetic_model.h"

namespace moecheck {

namespace {

using gguf::Value;
using gguf::ValueType;

const char* ggml_name(uint32_t t) {
  const char* n = gguf::type_traits(t).name;
  return n ? n : "unknown";
}

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

Value count_value(int64_t v, const char* key) {
  if (v < 0 || v > std::numeric_limits<uint32_t>::max())
    throw InputError(std::string("model metadata: ") + key + " = " + std::to_string(v) +
                     " does not fit uint32");
  return gguf::make_uint32(static_cast<uint32_t>(v));
}

const char* tensor_suffix(LayerTensor t) {
  switch (t) {
    case LayerTensor::kRouter: return "ffn_gate_inp.weight";
    case LayerTensor::kBias: return "exp_probs_b.bias";
    case LayerTensor::kGateExps: return "ffn_gate_exps.weight";
    case LayerTensor::kUpExps: return "ffn_up_exps.weight";
    case LayerTensor::kDownExps: return "ffn_down_exps.weight";
    case LayerTensor::kGateShexp: return "ffn_gate_shexp.weight";
    case LayerTensor::kUpShexp: return "ffn_up_shexp.weight";
    case LayerTensor::kDownShexp: return "ffn_down_shexp.weight";
    case LayerTensor::kBiasVl: return "exp_probs_b_vl.bias";
  }
  return "?";
}

bool is_shared(LayerTensor t) {
  return t == LayerTensor::kGateShexp || t == LayerTensor::kUpShexp || t == LayerTensor::kDownShexp;
}

}  // namespace

LayerTensor stack_tensor(Proj p) {
  return p == Proj::kGate ? LayerTensor::kGateExps
         : p == Proj::kUp ? LayerTensor::kUpExps
                          : LayerTensor::kDownExps;
}

std::string tensor_name(int layer, LayerTensor t) {
  return "blk." + std::to_string(layer) + "." + tensor_suffix(t);
}

std::string hash_table_name(int layer) {
  return "blk." + std::to_string(layer) + ".ffn_gate_tid2eid.weight";
}

TensorShape expected_tensor(const MoeConfig& c, LayerTensor t, SharedExpertType shared) {
  const bool kq = shared == SharedExpertType::kKQuant;
  const int64_t shared_inter = c.inter * c.n_shared;  // llama.cpp: n_ff_exp * n_expert_shared
  switch (t) {
    case LayerTensor::kRouter: return {GgmlType::kBF16, {c.dim, c.n_routed}};
    case LayerTensor::kBias:
    case LayerTensor::kBiasVl: return {GgmlType::kF32, {c.n_routed}};
    case LayerTensor::kGateExps:
    case LayerTensor::kUpExps: return {GgmlType::kQ2K, {c.dim, c.inter, c.n_routed}};
    case LayerTensor::kDownExps: return {GgmlType::kQ3K, {c.inter, c.dim, c.n_routed}};
    case LayerTensor::kGateShexp:
    case LayerTensor::kUpShexp:
      return {kq ? GgmlType::kQ2K : GgmlType::kBF16, {c.dim, shared_inter}};
    case LayerTensor::kDownShexp:
      return {kq ? GgmlType::kQ3K : GgmlType::kBF16, {shared_inter, c.dim}};
  }
  return {};
}

void add_config_metadata(gguf::Writer& w, const MoeConfig& c, int n_layers) {
  w.set(keys::kArchitecture, gguf::make_string(kArchitectureName));
  w.set(keys::kQuantVersion, gguf::make_uint32(2));
  w.set(keys::kBlockCount, count_value(n_layers, keys::kBlockCount));
  w.set(keys::kDim, count_value(c.dim, keys::kDim));
  w.set(keys::kInter, count_value(c.inter, keys::kInter));
  w.set(keys::kNRouted, count_value(c.n_routed, keys::kNRouted));
  w.set(keys::kTopk, count_value(c.topk, keys::kTopk));
  w.set(keys::kNShared, count_value(c.n_shared, keys::kNShared));
  w.set(keys::kRouteScale, gguf::make_float32(c.route_scale));
  w.set(keys::kNormTopk, gguf::make_bool(c.norm_topk_prob));
  // llama.cpp's gating ids (1 softmax, 2 sigmoid) have no sqrtsoftplus; the moecheck key is the
  // one this project reads, the llama.cpp one is written where it exists for other tools.
  if (c.score_func == ScoreFunc::kSoftmax) w.set(keys::kGatingFunc, gguf::make_uint32(1));
  if (c.score_func == ScoreFunc::kSigmoid) w.set(keys::kGatingFunc, gguf::make_uint32(2));
  w.set(keys::kGateTemp, gguf::make_float32(c.gate_temp));
  w.set(keys::kScoreFunc, gguf::make_string(to_string(c.score_func)));
  w.set(keys::kSwigluLimit, gguf::make_float32(c.swiglu_limit));
  if (c.swiglu_limit_shared)
    w.set(keys::kSwigluLimitShared, gguf::make_float32(*c.swiglu_limit_shared));
}

ModelFile ModelFile::open(const std::string& path, gguf::MapMode mode) {
  if (is_synthetic_spec(path)) return open_synthetic(path, mode);
  return from_gguf(gguf::Reader::open(path, mode));
}

ModelFile ModelFile::from_gguf(gguf::Reader reader) {
  ModelFile m;
  m.gguf_ = std::move(reader);
  const gguf::Reader& r = m.gguf_;
  read_model_metadata(r, m.config_, m.layout_);
  m.n_layers_ = m.layout_.n_layers;

  if (r.find(keys::kGenSeed)) {
    GeneratorProvenance p;
    p.seed = metadata_value(r, keys::kGenSeed, ValueType::kUint64, true)->as_uint();
    p.preset = metadata_value(r, keys::kGenPreset, ValueType::kString, true)->str;
    p.version = static_cast<uint32_t>(
        metadata_value(r, keys::kGenVersion, ValueType::kUint32, true)->as_uint());
    p.fast_blocks = metadata_value(r, keys::kGenFastBlocks, ValueType::kBool, true)->as_bool();
    m.provenance_ = p;
  }
  return m;
}

bool ModelFile::has_tensor(int L, LayerTensor t) const {
  return gguf_.find_tensor(tensor_name(L, t)) != nullptr;
}

bool ModelFile::hash_routed(int L) const {
  return L < layout_.hash_layers || gguf_.find_tensor(hash_table_name(L)) != nullptr;
}

MoeConfig ModelFile::layer_config(int L) const { return layout_.layer_config(config_, L); }

namespace {

// The refusal of a tensor whose type moecheck cannot run: what was found, what is expected.
std::string unsupported_type(LayerTensor t, const char* found, GgmlType want) {
  const std::string f = std::string("type ") + found;
  switch (t) {
    case LayerTensor::kGateExps:
    case LayerTensor::kUpExps:
    case LayerTensor::kDownExps:
      return f + ", expected " + ggml_name(static_cast<uint32_t>(want)) +
             ": routed experts of other types are not supported (moecheck runs Q2_K gate / up "
             "and Q3_K down experts)";
    case LayerTensor::kRouter: return f + ", expected BF16 or F16 (the router)";
    default: return f + ", expected " + ggml_name(static_cast<uint32_t>(want));
  }
}

}  // namespace

void ModelFile::check_layer(int L) const {
  const std::string& file = gguf_.name();
  if (L < 0 || L >= n_layers_)
    throw InputError(file + ": layer " + std::to_string(L) + " out of range: the file has " +
                     std::to_string(n_layers_) + " MoE layers" +
                     (layout_.nextn_layers ? " (and " + std::to_string(layout_.nextn_layers) +
                                                 " MTP blocks after them, not addressed)"
                                           : std::string()));
  if (hash_routed(L))
    throw InputError(file + ": layer " + std::to_string(L) + " is hash-routed (tensor \"" +
                     hash_table_name(L) + "\", " + architecture_name(layout_.convention) +
                     ".hash_layer_count " + std::to_string(layout_.hash_layers) +
                     "): its experts are picked from the token id, which no moecheck input "
                     "carries; choose layers from " +
                     std::to_string(layout_.hash_layers) + " on (--layers)");
}

namespace {

// The checked address of one of layer L's tensors in the reader's bytes (nothing is read): the
// tensor exists, has a type moecheck runs and the shape of `c`, and is aligned for its views.
const uint8_t* tensor_view(const gguf::Reader& r, int L, const MoeConfig& c, LayerTensor which) {
  const std::string name = tensor_name(L, which);
  const gguf::TensorInfo* t = r.find_tensor(name);
  if (!t)
    throw InputError(r.name() + ": layer " + std::to_string(L) + ": tensor \"" + name +
                     "\" is missing");
  const std::string where = r.name() + ": layer " + std::to_string(L) + ": tensor \"" + name + "\"";
  TensorShape want = expected_tensor(c, which, SharedExpertType::kBF16);
  if (which == LayerTensor::kRouter && t->type == static_cast<uint32_t>(GgmlType::kF16))
    want.type = GgmlType::kF16;
  if (is_shared(which) && t->type != static_cast<uint32_t>(GgmlType::kBF16)) {
    const TensorShape kq = expected_tensor(c, which, SharedExpertType::kKQuant);
    if (t->type != static_cast<uint32_t>(kq.type))
      throw InputError(where + ": type " + ggml_name(t->type) + ", expected BF16 or " +
                       ggml_name(static_cast<uint32_t>(kq.type)) + " (K-quant shared expert)");
    want = kq;
  }
  if (t->type != static_cast<uint32_t>(want.type))
    throw InputError(where + ": " + unsupported_type(which, ggml_name(t->type), want.type));
  const std::vector<int64_t> ne(t->ne.begin(), t->ne.begin() + t->n_dims);
  if (ne != want.ne)
    throw InputError(where + ": ne " + ne_string(ne) + " (ggml order), expected " +
                     ne_string(want.ne) + " for dim " + std::to_string(c.dim) + ", inter " +
                     std::to_string(c.inter) + ", n_routed " + std::to_string(c.n_routed));
  // Views are read as uint16 / float / block structs, which need 2- or 4-byte alignment.
  const uint8_t* p = r.data(*t);
  const uintptr_t need = want.type == GgmlType::kF32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(p) % need != 0)
    throw InputError(where + ": data at file offset " +
                     std::to_string(r.data_offset() + t->offset) + " is not " +
                     std::to_string(need) + "-byte aligned (general.alignment " +
                     std::to_string(r.alignment()) + ")");
  return p;
}

GgmlType tensor_type(const gguf::Reader& r, int L, LayerTensor which) {
  return static_cast<GgmlType>(r.find_tensor(tensor_name(L, which))->type);
}

}  // namespace

LayerWeights ModelFile::views(int L) const {
  check_layer(L);
  const MoeConfig c = layer_config(L);
  auto view = [&](LayerTensor which) { return tensor_view(gguf_, L, c, which); };
  LayerWeights w;
  w.layer = L;
  w.config = c;
  w.router = reinterpret_cast<const uint16_t*>(view(LayerTensor::kRouter));
  w.router_type = tensor_type(gguf_, L, LayerTensor::kRouter);
  w.bias = reinterpret_cast<const float*>(view(LayerTensor::kBias));
  if (has_tensor(L, LayerTensor::kBiasVl))  // optional: model.py's Gate.bias_vl
    w.bias_vl = reinterpret_cast<const float*>(view(LayerTensor::kBiasVl));
  w.gate_exps =
      ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, view(LayerTensor::kGateExps)};
  w.up_exps =
      ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, view(LayerTensor::kUpExps)};
  w.down_exps =
      ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, view(LayerTensor::kDownExps)};
  auto shared = [&](LayerTensor which, int64_t rows, int64_t cols) {
    const uint8_t* p = view(which);
    return MatView{tensor_type(gguf_, L, which), rows, cols, p};
  };
  w.shared_gate = shared(LayerTensor::kGateShexp, c.inter, c.dim);
  w.shared_up = shared(LayerTensor::kUpShexp, c.inter, c.dim);
  w.shared_down = shared(LayerTensor::kDownShexp, c.dim, c.inter);
  w.keep_alive = gguf_.owner();
  validate_layer_weights(w, gguf_.name());  // on addresses only: no tensor byte is read
  return w;
}

LayerWeights ModelFile::layer(int L) const {
  LayerWeights w = views(L);
  if (synthetic_) w.keep_alive = synthetic_->hold(L, true);
  return w;
}

LayerWeights ModelFile::resident_layer(int L) const {
  LayerWeights w = views(L);
  w.gate_exps.data = w.up_exps.data = w.down_exps.data = nullptr;
  if (synthetic_) w.keep_alive = synthetic_->hold(L, false);
  return w;
}

std::shared_ptr<const ExpertSource> ModelFile::expert_source() const {
  if (synthetic_) return std::make_shared<SyntheticExpertSource>(synthetic_->options());
  return std::make_shared<FileExpertSource>(*this);
}

std::string ModelFile::sha256() const {
  return synthetic_ ? synthetic_->sha256() : sha256_file(gguf_.name());
}

}  // namespace moecheck
