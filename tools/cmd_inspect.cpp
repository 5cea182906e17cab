// `moecheck inspect FILE`: a GGUF model (metadata, tensors, types, shapes, the config) or an
// HDF5 dump (root attributes, layers, stages and their shapes), validated as it is read.
// Contract: docs/cli.md "inspect".
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>

#include "core/error.h"
#include "golden/dump.h"
#include "golden/dump_hdf5.h"
#include "golden/gguf.h"
#include "golden/model_file.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/report.h"

namespace moecheck::cli {
namespace {

struct InspectArgs {
  std::string file;
  bool json = false;
};

std::string shape(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (int64_t x : d) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + "]";
}

Json& shape_json(Json& j, const std::vector<int64_t>& d) {
  j.begin_array();
  for (int64_t x : d) j.value(x);
  return j.end_array();
}

// Arrays in --json list at most this many elements (a tokenizer's vocabulary has 10^5).
constexpr size_t kMaxArrayValues = 64;

void scalar_json(Json& j, const gguf::Value& v) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::kString: j.value(v.str); break;
    case ValueType::kBool: j.value(v.as_bool()); break;
    case ValueType::kFloat32: j.value(static_cast<double>(v.as_f32())); break;
    case ValueType::kFloat64: j.value(v.as_f64()); break;
    case ValueType::kInt8:
    case ValueType::kInt16:
    case ValueType::kInt32:
    case ValueType::kInt64: j.value(v.as_int()); break;
    default: j.value(v.as_uint());
  }
}

// A metadata value as JSON: {"type", "value"} with the value a JSON number, string or bool;
// an array {"type": "array", "elem_type", "count", "values": the first kMaxArrayValues}.
void value_json(Json& j, const gguf::Value& v) {
  j.begin_object().kv("type", gguf::type_name(v.type));
  if (v.type != gguf::ValueType::kArray) {
    scalar_json(j.key("value"), v);
    j.end_object();
    return;
  }
  j.kv("elem_type", gguf::type_name(v.elem_type))
      .kv("count", static_cast<uint64_t>(v.items.size()));
  j.key("values").begin_array();
  for (size_t i = 0; i < v.items.size() && i < kMaxArrayValues; ++i) scalar_json(j, v.items[i]);
  j.end_array().end_object();
}

void config_lines(const MoeConfig& c, Json* j) {
  if (j != nullptr) {
    j->key("config")
        .begin_object()
        .kv("dim", c.dim)
        .kv("inter", c.inter)
        .kv("n_routed", c.n_routed)
        .kv("topk", c.topk);
    j->kv("n_shared", c.n_shared)
        .kv("score_func", to_string(c.score_func))
        .kv("route_scale", double(c.route_scale));
    j->kv("swiglu_limit", double(c.swiglu_limit))
        .kv("gate_temp", double(c.gate_temp))
        .kv("norm_topk_prob", c.norm_topk_prob);
    if (c.swiglu_limit_shared) j->kv("swiglu_limit_shared", double(*c.swiglu_limit_shared));
    j->end_object();
    return;
  }
  std::printf(
      "config: dim %lld, inter %lld, %lld routed experts, top %lld, %lld shared, %s, route_scale "
      "%.9g, swiglu_limit %.9g, gate_temp %.9g, norm_topk_prob %s\n",
      static_cast<long long>(c.dim), static_cast<long long>(c.inter),
      static_cast<long long>(c.n_routed), static_cast<long long>(c.topk),
      static_cast<long long>(c.n_shared), to_string(c.score_func).c_str(), double(c.route_scale),
      double(c.swiglu_limit), double(c.gate_temp), c.norm_topk_prob ? "true" : "false");
  if (c.swiglu_limit_shared)
    std::printf("shared expert: swiglu_limit %.9g\n", double(*c.swiglu_limit_shared));
}

// What a model file's convention adds to its config: the architecture, the router's type, the
// per-layer clamps, hash-routed and MTP layers, and the keys that took their defaults.
void layout_lines(const ModelFile& m, Json* j) {
  const ModelLayout& l = m.layout();
  const int first = std::min(l.hash_layers, m.n_layers() - 1);
  const gguf::TensorInfo* r = m.gguf().find_tensor(tensor_name(first, LayerTensor::kRouter));
  const char* router = r ? gguf::type_traits(r->type).name : nullptr;
  if (j != nullptr) {
    j->kv("convention", architecture_name(l.convention)).kv("router_type", router ? router : "?");
    j->kv("hash_layers", l.hash_layers).kv("mtp_layers", l.nextn_layers);
    j->key("swiglu_clamp_exp").begin_array();
    for (float v : l.clamp_exp) j->value(double(v));
    j->end_array().key("swiglu_clamp_shexp").begin_array();
    for (float v : l.clamp_shexp) j->value(double(v));
    j->end_array().key("defaulted").begin_object();
    for (const DefaultedKey& d : l.defaulted) j->kv(d.key, d.value);
    j->end_object();
    return;
  }
  std::printf("convention: %s, router %s", architecture_name(l.convention), router ? router : "?");
  if (l.hash_layers)
    std::printf(", hash-routed layers 0-%d (refused: they route by token id)", l.hash_layers - 1);
  if (l.nextn_layers) std::printf(", %d MTP block(s) after the main stack", l.nextn_layers);
  std::printf("\n");
  if (!l.clamp_exp.empty()) {
    std::printf("swiglu clamps per layer (routed / shared):");
    for (size_t L = 0; L < l.clamp_exp.size(); ++L)
      std::printf("%s %zu: %.9g / %.9g", L ? "," : "", L, double(l.clamp_exp[L]),
                  double(l.clamp_shexp[L]));
    std::printf("\n");
  }
  for (const DefaultedKey& d : l.defaulted)
    std::printf("defaulted: %s = %s (absent from the file)\n", d.key.c_str(), d.value.c_str());
}

int inspect_gguf(const InspectArgs& a) {
  // A synthetic spec: the header of the file `gen` would write, made in memory (no tensor is).
  std::unique_ptr<ModelFile> mf;
  if (is_synthetic_spec(a.file)) mf = std::make_unique<ModelFile>(ModelFile::open(a.file));
  const gguf::Reader r = mf ? mf->gguf() : gguf::Reader::open(a.file);
  std::string model_note;
  try {
    if (!mf) mf = std::make_unique<ModelFile>(ModelFile::from_gguf(r));
  } catch (const InputError& e) {
    model_note = e.what();
  }
  Json j;
  Json* jp = a.json ? &j : nullptr;
  if (a.json) {
    j.begin_object()
        .kv("file", a.file)
        .kv("kind", "gguf")
        .kv("version", static_cast<int64_t>(r.version()));
    j.kv("alignment", static_cast<int64_t>(r.alignment())).kv("file_size", r.file_size());
    j.key("metadata").begin_object();
    for (const gguf::KeyValue& kv : r.kvs()) value_json(j.key(kv.key), kv.value);
    j.end_object().key("tensors").begin_array();
    for (const gguf::TensorInfo& t : r.tensors()) {
      const gguf::TypeTraits tt = gguf::type_traits(t.type);
      j.begin_object().kv("name", t.name).kv("type", tt.name ? tt.name : "?");
      shape_json(j.key("shape"), std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
      j.kv("offset", t.offset).kv("bytes", t.nbytes).end_object();
    }
    j.end_array();
  } else {
    std::printf("%s: GGUF v%u, %llu bytes, alignment %u, %zu metadata keys, %zu tensors\n",
                a.file.c_str(), r.version(), static_cast<unsigned long long>(r.file_size()),
                r.alignment(), r.kvs().size(), r.tensors().size());
    std::printf("metadata:\n");
    for (const gguf::KeyValue& kv : r.kvs())
      std::printf("  %-40s %s\n", kv.key.c_str(), gguf::describe(kv.value).c_str());
    std::printf("tensors:\n");
    for (const gguf::TensorInfo& t : r.tensors()) {
      const gguf::TypeTraits tt = gguf::type_traits(t.type);
      std::printf("  %-32s %-5s %-20s offset %llu, %llu bytes\n", t.name.c_str(),
                  tt.name ? tt.name : "?", gguf::shape_string(t).c_str(),
                  static_cast<unsigned long long>(t.offset),
                  static_cast<unsigned long long>(t.nbytes));
    }
  }
  if (mf) {
    if (a.json) j.kv("layers", mf->n_layers());
    else std::printf("moecheck model: %d layer(s)\n", mf->n_layers());
    config_lines(mf->config(), jp);
    layout_lines(*mf, jp);
    if (mf->provenance()) {
      const GeneratorProvenance& p = *mf->provenance();
      if (a.json)
        j.key("generator").begin_object().kv("preset", p.preset).kv("seed", p.seed).end_object();
      else
        std::printf("generator: preset %s, seed %llu, version %u%s\n", p.preset.c_str(),
                    static_cast<unsigned long long>(p.seed), p.version,
                    p.fast_blocks ? ", random-valid blocks" : "");
    }
  } else {
    if (a.json) j.kv("not_a_moecheck_model", model_note);
    else std::printf("not a moecheck model: %s\n", model_note.c_str());
  }
  if (a.json) {
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  }
  return kExitSame;
}

// The dump's root attributes, as text or into the open JSON object.
void dump_header(const std::string& file, const DumpMeta& m, Json* j) {
  const int64_t T = m.tokens;
  if (j != nullptr) {
    j->begin_object().kv("file", file).kv("kind", "dump").kv("format_version", m.format_version);
    j->kv("tool_version", m.tool_version).kv("git_commit", m.git_commit);
    j->kv("integrity", m.integrity);
    j->kv("implementation", m.implementation).kv("variant", m.variant).kv("device", m.device);
    j->kv("model_file", m.model_file).kv("model_sha256", m.model_sha256);
    j->kv("model_header_sha256", m.model_header_sha256);
    if (m.has_model_seed) j->kv("model_seed", m.model_seed);
    j->kv("input_source", m.input_source).kv("input_seed", m.input_seed);
    j->kv("tokens", T).kv("taps", m.taps);
    config_lines(m.config, j);
    return;
  }
  std::printf("%s: moecheck dump format %lld, %s (%s) on %s, tool %s (%s)\n", file.c_str(),
              static_cast<long long>(m.format_version), m.implementation.c_str(), m.variant.c_str(),
              m.device.c_str(), m.tool_version.c_str(), m.git_commit.c_str());
  std::printf("integrity: %s (docs/golden-format.md \"Integrity stamp\")\n", m.integrity.c_str());
  std::printf("model: %s, whole-file sha256 %s, header sha256 %s%s\n", m.model_file.c_str(),
              m.model_sha256.empty() ? "(not recorded)" : m.model_sha256.c_str(),
              m.model_header_sha256.empty() ? "(not recorded)" : m.model_header_sha256.c_str(),
              m.has_model_seed ? (", generator seed " + std::to_string(m.model_seed)).c_str() : "");
  std::printf(
      "input: %s%s, %lld token(s), %s\n", m.input_source.c_str(),
      m.input_source.rfind("seed", 0) == 0 ? (" " + std::to_string(m.input_seed)).c_str() : "",
      static_cast<long long>(T), m.taps ? "every stage (taps)" : "basic stages");
  config_lines(m.config, nullptr);
}

// The image mask of a layer: how many tokens route with bias_vl, or that there is none.
std::string image_mask_text(const std::vector<uint8_t>& mask) {
  if (mask.empty()) return "none (every token routes with bias)";
  int64_t n = 0;
  for (uint8_t v : mask) n += v != 0;
  return shape({static_cast<int64_t>(mask.size())}) + " uint8: " + std::to_string(n) + " of " +
         std::to_string(mask.size()) + " token(s) in image spans (routed with bias_vl)";
}

// One dataset of a layer group: its shape and element type (text: "[8, 512] bfloat16").
struct Dataset {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
};

// The datasets before the experts (x_q8 only with taps) and after them (acc only with taps).
std::vector<Dataset> head_datasets(const MoeConfig& c, int64_t T, const LayerTaps& t) {
  std::vector<Dataset> st = {{"input", {T, c.dim}, "bfloat16"},
                             {"router_logits", {T, c.n_routed}, "float32"},
                             {"topk_ids", {T, c.topk}, "int32"},
                             {"topk_weights", {T, c.topk}, "float32"}};
  if (!t.x_q8.empty()) st.push_back({"x_q8", {T, c.dim / 32, 36}, "block_q8_1"});
  return st;
}
std::vector<Dataset> tail_datasets(const MoeConfig& c, int64_t T, const LayerTaps& t) {
  std::vector<Dataset> st;
  if (!t.acc.empty()) st.push_back({"acc", {T, c.dim}, "float32"});
  st.push_back({"output", {T, c.dim}, "bfloat16"});
  return st;
}

std::string expert_text(const MoeConfig& c, const ExpertTaps& e) {
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  return std::to_string(n) + " token(s): gate/up/h " + shape({n, c.inter}) + ", down " +
         shape({n, c.dim}) + (e.h_q8.empty() ? "" : ", h_q8");
}

// An expert's datasets in JSON: its tokens and the shape of each (h_q8 null when absent).
void expert_json(Json& j, const MoeConfig& c, const ExpertTaps& e) {
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  j.begin_object().kv("expert", static_cast<int64_t>(e.expert)).kv("tokens", n);
  for (const char* k : {"gate", "up", "h"}) shape_json(j.key(k), {n, c.inter});
  shape_json(j.key("down"), {n, c.dim});
  j.key("h_q8");
  e.h_q8.empty() ? j.null() : shape_json(j, {n, c.inter / 32, 36});
  j.end_object();
}

void slices_text(const LayerTaps& t, const std::vector<SliceHash>& slices) {
  if (!slices.empty()) std::printf("  tensors read (sha256):\n");
  for (const SliceHash& h : slices)
    std::printf("    %-44s %s\n", slice_name(t.layer, h.tensor, h.expert).c_str(),
                h.sha256.c_str());
}

// One layer as text: its datasets in storage order and the tensors its forward read.
void layer_text(const MoeConfig& c, int64_t T, const LayerTaps& t,
                const std::vector<SliceHash>& slices, const std::pair<float, float>* clamps) {
  std::printf("/layers/%d:\n", t.layer);
  auto line = [](const std::string& k, const std::string& v) {
    std::printf("  %-14s %s\n", k.c_str(), v.c_str());
  };
  if (clamps)
    line("clamps", "swiglu_limit " + fmt_num(clamps->first) + ", shared " +
                       fmt_num(clamps->second) + " (this layer's own)");
  for (const Dataset& d : head_datasets(c, T, t)) {
    line(d.name, shape(d.shape) + " " + d.dtype);
    if (d.name == "input") line("image_mask", image_mask_text(t.image_mask));
  }
  for (const ExpertTaps& e : t.experts)
    line("experts/" + std::to_string(e.expert), expert_text(c, e));
  if (!t.shared.tokens.empty())
    line("shared", "gate/up/h " + shape({T, c.inter}) + ", down " + shape({T, c.dim}));
  for (const Dataset& d : tail_datasets(c, T, t)) line(d.name, shape(d.shape) + " " + d.dtype);
  slices_text(t, slices);
}

// One layer as JSON: every dataset's shape (numbers) and dtype, the image mask, the experts and
// the shared expert, the tensors read.
void layer_json(Json& j, const MoeConfig& c, int64_t T, const LayerTaps& t,
                const std::vector<SliceHash>& slices, const std::pair<float, float>* clamps) {
  int64_t masked = 0;
  for (uint8_t v : t.image_mask) masked += v != 0;
  j.begin_object().kv("layer", t.layer).kv("image_mask", !t.image_mask.empty());
  if (clamps)
    j.kv("swiglu_limit", double(clamps->first)).kv("swiglu_limit_shared", double(clamps->second));
  j.kv("image_mask_tokens", masked).key("datasets").begin_object();
  std::vector<Dataset> all = head_datasets(c, T, t);
  if (!t.image_mask.empty()) all.push_back({"image_mask", {T}, "uint8"});
  for (const Dataset& d : tail_datasets(c, T, t)) all.push_back(d);
  for (const Dataset& d : all) {
    j.key(d.name).begin_object();
    shape_json(j.key("shape"), d.shape).kv("dtype", d.dtype).end_object();
  }
  j.end_object().key("experts").begin_array();
  for (const ExpertTaps& e : t.experts) expert_json(j, c, e);
  j.end_array().key("shared");
  if (t.shared.tokens.empty()) j.null();
  else expert_json(j, c, t.shared);
  j.key("tensors_read").begin_array();
  for (const SliceHash& h : slices)
    j.begin_object()
        .kv("tensor", slice_name(t.layer, h.tensor, h.expert))
        .kv("sha256", h.sha256)
        .end_object();
  j.end_array().end_object();
}

int inspect_dump(const InspectArgs& a) {
  const Dump d = read_dump(a.file);
  Json j;
  dump_header(a.file, d.meta, a.json ? &j : nullptr);
  if (a.json) j.key("layers").begin_array();
  const std::vector<SliceHash> none;
  for (size_t li = 0; li < d.layers.size(); ++li) {
    const std::vector<SliceHash>& sl = d.slices.empty() ? none : d.slices[li];
    const auto it = d.meta.layer_clamps.find(d.layers[li].layer);
    const std::pair<float, float>* cl = it == d.meta.layer_clamps.end() ? nullptr : &it->second;
    if (a.json) layer_json(j, d.meta.config, d.meta.tokens, d.layers[li], sl, cl);
    else layer_text(d.meta.config, d.meta.tokens, d.layers[li], sl, cl);
  }
  if (a.json) {
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
  }
  return kExitSame;
}

}  // namespace

void add_inspect(CLI::App& app, int& rc) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* s = app.add_subcommand("inspect", "Show a GGUF model or an HDF5 dump");
  s->footer(
      "Examples:\n  moecheck inspect tiny.gguf\n  moecheck inspect emu.h5 --json\n"
      "  moecheck inspect synthetic:ds41,layers=40   # a synthetic model: no file\n"
      "Exit codes: 0 shown, 2 error (missing, truncated or malformed file: the message names the "
      "field).");
  s->add_option("FILE", a->file,
                "a .gguf model, a .h5 dump, or a synthetic model spec (synthetic:PRESET[,...])")
      ->required();
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, &rc] {
    if (is_synthetic_spec(a->file)) {
      rc = inspect_gguf(*a);
      return;
    }
    if (!std::filesystem::exists(a->file)) throw InputError(a->file + ": file does not exist");
    rc = h5::has_hdf5_signature(a->file) ? inspect_dump(*a) : inspect_gguf(*a);
  });
}

}  // namespace moecheck::cli
