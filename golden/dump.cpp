// Writer and validating reader of the HDF5 tensor dumps. Contract: docs/golden-format.md
// (root attributes, /layers/<L>/ datasets, per-expert tap groups, bf16 as uint16 with
// dtype = "bfloat16", q8_1 blocks as uint8 [n, K/32, 36] with dtype = "block_q8_1").
#include "golden/dump.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "core/error.h"
#include "golden/atomic_file.h"
#include "golden/dump_hdf5.h"
#include "golden/dump_slices.h"
#include "golden/probe.h"
#include "golden/sha256.h"

namespace moecheck {
namespace {

using h5::Elem;
constexpr int64_t kQ8Bytes = static_cast<int64_t>(sizeof(BlockQ8_1));

// ---- writing ----

void check_size(size_t got, int64_t want, const std::string& where) {
  if (static_cast<int64_t>(got) != want)
    throw InputError("dump " + where + ": expected " + std::to_string(want) + " values, found " +
                     std::to_string(got));
}

void put_bf16(hid_t g, const std::string& name, const std::vector<uint16_t>& v, int64_t T,
              int64_t dim) {
  h5::write_dataset(g, name, Elem::kU16, v.data(), {T, dim});
  h5::Handle ds(H5Dopen2(g, name.c_str(), H5P_DEFAULT), H5Dclose);
  h5::write_attr(ds.get(), "dtype", std::string("bfloat16"));
}

void put_q8(hid_t g, const std::string& name, const std::vector<BlockQ8_1>& v, int64_t rows,
            int64_t K) {
  h5::write_dataset(g, name, Elem::kU8, v.data(), {rows, K / kQK8_1, kQ8Bytes});
  h5::Handle ds(H5Dopen2(g, name.c_str(), H5P_DEFAULT), H5Dclose);
  h5::write_attr(ds.get(), "dtype", std::string("block_q8_1"));
}

void put_expert(hid_t parent, const std::string& name, const ExpertTaps& e, const MoeConfig& c,
                const std::string& where) {
  h5::Handle g = h5::create_group(parent, name, where);
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  h5::write_attr(g.get(), "expert", static_cast<int64_t>(e.expert));
  check_size(e.weights.size(), n, where + "/weights");
  h5::write_dataset(g.get(), "tokens", Elem::kI32, e.tokens.data(), {n});
  h5::write_dataset(g.get(), stage_dataset(Stage::kExpertsWeights), Elem::kF32, e.weights.data(),
                    {n});
  auto f32 = [&](const char* s, const std::vector<float>& v, int64_t cols) {
    if (v.empty()) return;
    check_size(v.size(), n * cols, where + "/" + s);
    h5::write_dataset(g.get(), s, Elem::kF32, v.data(), {n, cols});
  };
  f32(stage_dataset(Stage::kExpertsGate), e.gate, c.inter);
  f32(stage_dataset(Stage::kExpertsUp), e.up, c.inter);
  f32(stage_dataset(Stage::kExpertsH), e.h, c.inter);
  if (!e.h_q8.empty()) {
    check_size(e.h_q8.size(), n * c.inter / kQK8_1, where + "/h_q8");
    put_q8(g.get(), stage_dataset(Stage::kExpertsHQ8), e.h_q8, n, c.inter);
  }
  f32(stage_dataset(Stage::kExpertsDown), e.down, c.dim);
}

void put_layer(hid_t layers, const LayerTaps& t, const DumpMeta& m,
               const std::vector<SliceHash>* slices) {
  const MoeConfig& c = m.config;
  const int64_t T = m.tokens;
  const std::string where = "/layers/" + std::to_string(t.layer);
  const bool logits = dump_has_stage(m, Stage::kRouterLogits),
             routing = dump_has_stage(m, Stage::kTopkIds);
  check_size(t.input.size(), T * c.dim, where + "/input");
  check_size(t.output.size(), T * c.dim, where + "/output");
  check_size(t.router_logits.size(), logits ? T * c.n_routed : 0, where + "/router_logits");
  check_size(t.topk_ids.size(), routing ? T * c.topk : 0, where + "/topk_ids");
  check_size(t.topk_weights.size(), routing ? T * c.topk : 0, where + "/topk_weights");
  h5::Handle g = h5::create_group(layers, std::to_string(t.layer), where);
  h5::write_attr(g.get(), "layer", static_cast<int64_t>(t.layer));
  h5::write_attr(g.get(), "tokens", T);
  if (const auto it = m.layer_clamps.find(t.layer); it != m.layer_clamps.end()) {
    h5::write_attr(g.get(), "config.swiglu_limit", it->second.first);
    h5::write_attr(g.get(), "config.swiglu_limit_shared", it->second.second);
  }
  put_bf16(g.get(), stage_dataset(Stage::kInput), t.input, T, c.dim);
  put_bf16(g.get(), stage_dataset(Stage::kOutput), t.output, T, c.dim);
  if (logits)
    h5::write_dataset(g.get(), stage_dataset(Stage::kRouterLogits), Elem::kF32,
                      t.router_logits.data(), {T, c.n_routed});
  if (routing) {
    h5::write_dataset(g.get(), stage_dataset(Stage::kTopkIds), Elem::kI32, t.topk_ids.data(),
                      {T, c.topk});
    h5::write_dataset(g.get(), stage_dataset(Stage::kTopkWeights), Elem::kF32,
                      t.topk_weights.data(), {T, c.topk});
  }
  if (!t.image_mask.empty()) {  // an input of the routing: stored with or without taps
    check_size(t.image_mask.size(), T, where + "/image_mask");
    for (size_t i = 0; i < t.image_mask.size(); ++i)
      if (t.image_mask[i] > 1)
        throw InputError("dump " + where + "/image_mask: token " + std::to_string(i) +
                         ": expected 0 or 1, found " + std::to_string(t.image_mask[i]));
    h5::write_dataset(g.get(), "image_mask", Elem::kU8, t.image_mask.data(), {T});
  }
  if (slices != nullptr && !slices->empty()) dump_detail::put_slices(g.get(), *slices, where);
  if (!m.taps) return;
  if (!t.x_q8.empty()) {
    check_size(t.x_q8.size(), T * c.dim / kQK8_1, where + "/x_q8");
    put_q8(g.get(), stage_dataset(Stage::kXQ8), t.x_q8, T, c.dim);
  }
  if (!t.acc.empty()) {
    check_size(t.acc.size(), T * c.dim, where + "/acc");
    h5::write_dataset(g.get(), stage_dataset(Stage::kAcc), Elem::kF32, t.acc.data(), {T, c.dim});
  }
  h5::Handle ex = h5::create_group(g.get(), "experts", where + "/experts");
  for (const ExpertTaps& e : t.experts) {
    if (e.expert < 0 || e.expert >= c.n_routed)
      throw InputError("dump " + where + ": routed expert id " + std::to_string(e.expert) +
                       " out of range");
    put_expert(ex.get(), std::to_string(e.expert), e, c,
               where + "/experts/" + std::to_string(e.expert));
  }
  if (!t.shared.tokens.empty()) put_expert(g.get(), "shared", t.shared, c, where + "/shared");
}

std::vector<uint8_t> dump_image(const Dump& d) {
  const DumpMeta& m = d.meta;
  h5::Handle f = h5::create_image();
  const hid_t r = f.get();
  bool any_mask = false;
  for (const LayerTaps& t : d.layers) any_mask = any_mask || !t.image_mask.empty();
  h5::write_attr(r, "format_version", any_mask ? kDumpFormatVersionImageMask : kDumpFormatVersion);
  h5::write_attr(r, "tool_version", m.tool_version);
  h5::write_attr(r, "git_commit", m.git_commit);
  h5::write_attr(r, "implementation", m.implementation);
  h5::write_attr(r, "variant", m.variant);
  for (const auto& [k, v] : m.knobs) h5::write_attr(r, "knob." + k, v);
  h5::write_attr(r, "device", m.device);
  h5::write_attr(r, "model_file", m.model_file);
  h5::write_attr(r, "model_sha256", m.model_sha256);
  h5::write_attr(r, "model_header_sha256", m.model_header_sha256);
  const MoeConfig& c = m.config;
  h5::write_attr(r, "config.dim", c.dim);
  h5::write_attr(r, "config.inter", c.inter);
  h5::write_attr(r, "config.n_routed", c.n_routed);
  h5::write_attr(r, "config.topk", c.topk);
  h5::write_attr(r, "config.n_shared", c.n_shared);
  h5::write_attr(r, "config.score_func", to_string(c.score_func));
  h5::write_attr(r, "config.route_scale", c.route_scale);
  h5::write_attr(r, "config.swiglu_limit", c.swiglu_limit);
  if (c.swiglu_limit_shared)
    h5::write_attr(r, "config.swiglu_limit_shared", *c.swiglu_limit_shared);
  h5::write_attr(r, "config.gate_temp", c.gate_temp);
  h5::write_attr(r, "config.norm_topk_prob", static_cast<int64_t>(c.norm_topk_prob ? 1 : 0));
  if (m.has_model_seed) h5::write_attr(r, "model_seed", m.model_seed);
  h5::write_attr(r, "input_source", m.input_source);
  h5::write_attr(r, "input_seed", m.input_seed);
  h5::write_attr(r, "tokens", m.tokens);
  h5::write_attr(r, "layers", m.layers);
  h5::write_attr(r, "taps", static_cast<int64_t>(m.taps ? 1 : 0));
  h5::write_attr(r, "routing_weight_at", m.routing_weight_at);
  if (m.implementation == "import") h5::write_attr(r, "stages", join_stage_list(m.stages));
  h5::Handle layers = h5::create_group(r, "layers", "/layers");
  for (size_t i = 0; i < d.layers.size(); ++i)
    put_layer(layers.get(), d.layers[i], m, d.slices.empty() ? nullptr : &d.slices[i]);
  layers.reset();
  return h5::finish_image(f);
}

// ---- reading ----

ExpertTaps get_expert(const h5::Reader& rd, hid_t g, const std::string& path, const MoeConfig& c,
                      int64_t T, int32_t expert) {
  ExpertTaps e;
  e.expert = expert;
  std::vector<int64_t> dims;
  e.tokens = rd.read_dataset<int32_t>(g, path, "tokens", {-1}, &dims);
  const int64_t n = dims[0];
  for (int64_t i = 0; i < n; ++i) {
    const int32_t tok = e.tokens[static_cast<size_t>(i)];
    if (tok < 0 || tok >= T || (i > 0 && tok <= e.tokens[static_cast<size_t>(i - 1)]))
      rd.fail(path + "/tokens", "token ids must be ascending in [0, " + std::to_string(T) +
                                    "), found " + std::to_string(tok) + " at index " +
                                    std::to_string(i));
  }
  e.weights = rd.read_dataset<float>(g, path, stage_dataset(Stage::kExpertsWeights), {n});
  auto f32 = [&](const char* s, int64_t cols) {
    return rd.has_object(g, s) ? rd.read_dataset<float>(g, path, s, {n, cols})
                               : std::vector<float>{};
  };
  e.gate = f32(stage_dataset(Stage::kExpertsGate), c.inter);
  e.up = f32(stage_dataset(Stage::kExpertsUp), c.inter);
  e.h = f32(stage_dataset(Stage::kExpertsH), c.inter);
  if (rd.has_object(g, stage_dataset(Stage::kExpertsHQ8))) {
    const auto raw = rd.read_dataset<uint8_t>(g, path, stage_dataset(Stage::kExpertsHQ8),
                                              {n, c.inter / kQK8_1, kQ8Bytes});
    e.h_q8.resize(raw.size() / sizeof(BlockQ8_1));
    std::copy(raw.begin(), raw.end(), reinterpret_cast<uint8_t*>(e.h_q8.data()));
  }
  e.down = f32(stage_dataset(Stage::kExpertsDown), c.dim);
  return e;
}

void require_bf16_attr(const h5::Reader& rd, hid_t parent, const std::string& path,
                       const char* name) {
  h5::Handle ds(H5Dopen2(parent, name, H5P_DEFAULT), H5Dclose);
  const std::string full = path + "/" + name;
  const std::string dt = rd.attr_str(ds.get(), full, "dtype");
  if (dt != "bfloat16")
    rd.fail(full, "attribute dtype: expected \"bfloat16\", found \"" + dt + "\"");
}

// /layers/<L>/image_mask: uint8 [T] of 0 / 1 (version 3 only).
std::vector<uint8_t> get_image_mask(const h5::Reader& rd, hid_t g, const std::string& path,
                                    const DumpMeta& m) {
  if (m.format_version < kDumpFormatVersionImageMask)
    rd.fail(path + "/image_mask", "an image mask needs format_version " +
                                      std::to_string(kDumpFormatVersionImageMask) +
                                      ", the file says " + std::to_string(m.format_version));
  std::vector<uint8_t> mask = rd.read_dataset<uint8_t>(g, path, "image_mask", {m.tokens});
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] > 1)
      rd.fail(path + "/image_mask",
              "token " + std::to_string(i) + ": expected 0 or 1, found " + std::to_string(mask[i]));
  return mask;
}

// A layer group's own clamps (DumpMeta::layer_clamps), when it records them.
void read_layer_clamps(const h5::Reader& rd, hid_t layers, int32_t L, DumpMeta& m) {
  const std::string path = "/layers/" + std::to_string(L);
  h5::Handle g = rd.open_group(layers, "/layers", std::to_string(L));
  if (!rd.has_attr(g.get(), "config.swiglu_limit")) return;
  m.layer_clamps[L] = {rd.attr_f32(g.get(), path, "config.swiglu_limit"),
                       rd.attr_f32(g.get(), path, "config.swiglu_limit_shared")};
}

LayerTaps get_layer(const h5::Reader& rd, hid_t layers, const DumpMeta& m, int32_t L) {
  const MoeConfig& c = m.config;
  const int64_t T = m.tokens;
  const std::string path = "/layers/" + std::to_string(L);
  h5::Handle g = rd.open_group(layers, "/layers", std::to_string(L));
  LayerTaps t;
  t.layer = L;
  t.tokens = T;
  t.input = rd.read_dataset<uint16_t>(g.get(), path, stage_dataset(Stage::kInput), {T, c.dim});
  require_bf16_attr(rd, g.get(), path, stage_dataset(Stage::kInput));
  t.output = rd.read_dataset<uint16_t>(g.get(), path, stage_dataset(Stage::kOutput), {T, c.dim});
  require_bf16_attr(rd, g.get(), path, stage_dataset(Stage::kOutput));
  if (dump_has_stage(m, Stage::kRouterLogits))
    t.router_logits =
        rd.read_dataset<float>(g.get(), path, stage_dataset(Stage::kRouterLogits), {T, c.n_routed});
  if (dump_has_stage(m, Stage::kTopkIds))
    t.topk_ids =
        rd.read_dataset<int32_t>(g.get(), path, stage_dataset(Stage::kTopkIds), {T, c.topk});
  for (size_t i = 0; i < t.topk_ids.size(); ++i) {
    const int32_t id = t.topk_ids[i];
    if (id < 0 || id >= c.n_routed)
      rd.fail(path + "/topk_ids", "token " + std::to_string(i / static_cast<size_t>(c.topk)) +
                                      ": expert id " + std::to_string(id) + " outside [0, " +
                                      std::to_string(c.n_routed) + ")");
  }
  if (dump_has_stage(m, Stage::kTopkWeights))
    t.topk_weights =
        rd.read_dataset<float>(g.get(), path, stage_dataset(Stage::kTopkWeights), {T, c.topk});
  if (rd.has_object(g.get(), "image_mask")) t.image_mask = get_image_mask(rd, g.get(), path, m);
  if (!m.taps) return t;
  if (rd.has_object(g.get(), stage_dataset(Stage::kXQ8))) {
    const auto raw = rd.read_dataset<uint8_t>(g.get(), path, stage_dataset(Stage::kXQ8),
                                              {T, c.dim / kQK8_1, kQ8Bytes});
    t.x_q8.resize(raw.size() / sizeof(BlockQ8_1));
    std::copy(raw.begin(), raw.end(), reinterpret_cast<uint8_t*>(t.x_q8.data()));
  }
  if (rd.has_object(g.get(), stage_dataset(Stage::kAcc)))
    t.acc = rd.read_dataset<float>(g.get(), path, stage_dataset(Stage::kAcc), {T, c.dim});
  h5::Handle ex = rd.open_group(g.get(), path, "experts");
  std::vector<int32_t> ids;
  for (const std::string& name : rd.children(ex.get(), path + "/experts")) {
    char* end = nullptr;
    const long v = std::strtol(name.c_str(), &end, 10);
    if (name.empty() || *end != '\0' || v < 0 || v >= c.n_routed)
      rd.fail(path + "/experts/" + name,
              "expected a group named by an expert id in [0, " + std::to_string(c.n_routed) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  std::sort(ids.begin(), ids.end());
  for (int32_t e : ids) {
    const std::string ep = path + "/experts/" + std::to_string(e);
    h5::Handle eg = rd.open_group(ex.get(), path + "/experts", std::to_string(e));
    t.experts.push_back(get_expert(rd, eg.get(), ep, c, T, e));
  }
  if (rd.has_object(g.get(), "shared")) {
    h5::Handle sg = rd.open_group(g.get(), path, "shared");
    t.shared = get_expert(rd, sg.get(), path + "/shared", c, T, -1);
  }
  return t;
}

DumpMeta get_meta(const h5::Reader& rd) {
  const hid_t r = rd.root();
  const std::string p = "/";
  DumpMeta m;
  m.format_version = rd.attr_int(r, p, "format_version");
  if (m.format_version < 1 || m.format_version > kDumpFormatVersionImageMask)
    rd.fail(p, "attribute format_version: this tool reads versions 1 to " +
                   std::to_string(kDumpFormatVersionImageMask) + ", found " +
                   std::to_string(m.format_version));
  m.tool_version = rd.attr_str(r, p, "tool_version");
  m.git_commit = rd.attr_str(r, p, "git_commit");
  m.implementation = rd.attr_str(r, p, "implementation");
  if (m.implementation != "ref" && m.implementation != "emu" && m.implementation != "cuda" &&
      m.implementation != "import")
    rd.fail(p,
            "attribute implementation: expected \"ref\", \"emu\", \"cuda\" or \"import\", "
            "found \"" +
                m.implementation + "\"");
  m.variant = rd.attr_str(r, p, "variant");
  m.device = rd.attr_str(r, p, "device");
  m.model_file = rd.attr_str(r, p, "model_file");
  m.model_sha256 = rd.attr_str(r, p, "model_sha256");
  if (m.format_version >= 2) m.model_header_sha256 = rd.attr_str(r, p, "model_header_sha256");
  MoeConfig& c = m.config;
  c.dim = rd.attr_int(r, p, "config.dim");
  c.inter = rd.attr_int(r, p, "config.inter");
  c.n_routed = rd.attr_int(r, p, "config.n_routed");
  c.topk = rd.attr_int(r, p, "config.topk");
  c.n_shared = rd.attr_int(r, p, "config.n_shared");
  c.score_func = parse_score_func(rd.attr_str(r, p, "config.score_func"),
                                  rd.file() + ": / attribute config.score_func");
  c.route_scale = rd.attr_f32(r, p, "config.route_scale");
  c.swiglu_limit = rd.attr_f32(r, p, "config.swiglu_limit");
  if (rd.has_attr(r, "config.swiglu_limit_shared"))
    c.swiglu_limit_shared = rd.attr_f32(r, p, "config.swiglu_limit_shared");
  c.gate_temp = rd.attr_f32(r, p, "config.gate_temp");
  c.norm_topk_prob = rd.attr_int(r, p, "config.norm_topk_prob") != 0;
  c.validate(rd.file());
  m.has_model_seed = rd.has_attr(r, "model_seed");
  if (m.has_model_seed) m.model_seed = rd.attr_uint(r, p, "model_seed");
  m.input_source = rd.attr_str(r, p, "input_source");
  m.input_seed = rd.attr_uint(r, p, "input_seed");
  m.tokens = rd.attr_int(r, p, "tokens");
  if (m.tokens <= 0 || m.tokens > (int64_t{1} << 24))
    rd.fail(p,
            "attribute tokens: expected a positive token count, found " + std::to_string(m.tokens));
  m.layers = rd.attr_i32_array(r, p, "layers");
  for (size_t i = 0; i < m.layers.size(); ++i)
    if (m.layers[i] < 0 || (i > 0 && m.layers[i] <= m.layers[i - 1]))
      rd.fail(p, "attribute layers: expected ascending non-negative layer ids");
  m.taps = rd.attr_int(r, p, "taps") != 0;
  m.routing_weight_at = rd.attr_str(r, p, "routing_weight_at");
  if (m.routing_weight_at != "h" && m.routing_weight_at != "accumulate")
    rd.fail(p, "attribute routing_weight_at: expected \"h\" or \"accumulate\", found \"" +
                   m.routing_weight_at + "\"");
  if (m.implementation == "import") try {
      m.stages = parse_stage_list(rd.attr_str(r, p, "stages"), m.taps);
    } catch (const InputError& e) {
      rd.fail(p, std::string("attribute stages: ") + e.what());
    }
  for (const std::string& name : rd.attr_names(r, p))
    if (name.rfind("knob.", 0) == 0) m.knobs.emplace_back(name.substr(5), rd.attr_str(r, p, name));
  return m;
}

}  // namespace

void write_dump(const std::string& path, const Dump& d) {
  if (d.layers.size() != d.meta.layers.size())
    throw InputError("dump " + path + ": meta lists " + std::to_string(d.meta.layers.size()) +
                     " layers, " + std::to_string(d.layers.size()) + " given");
  if (!d.slices.empty() && d.slices.size() != d.layers.size())
    throw InputError("dump " + path + ": " + std::to_string(d.slices.size()) +
                     " provenance lists for " + std::to_string(d.layers.size()) + " layers");
  for (size_t i = 0; i < d.layers.size(); ++i)
    if (d.layers[i].layer != d.meta.layers[i])
      throw InputError("dump " + path + ": layer " + std::to_string(d.layers[i].layer) +
                       " out of order with meta.layers");
  // Built in memory and stamped (golden/dump_hdf5.h), then written whole or not at all.
  const std::vector<uint8_t> bytes = dump_image(d);
  write_file_atomic(path, bytes.data(), bytes.size());
}

namespace {

// A dump whose integrity stamp does not match (none, or not this file's) is read first in a probe
// process (golden/probe.h): a file that crashes libhdf5 becomes an InputError there, never a
// crash here.
DumpMeta& meta_of(DumpMeta& m) { return m; }
DumpMeta& meta_of(Dump& d) { return d.meta; }

template <class F>
auto read_guarded(const std::string& path, F read) {
  const h5::Stamp st = h5::verify_stamp(path);
  if (st != h5::Stamp::kMatch) probe_in_child(path, [&] { (void)read(); });
  auto r = read();
  DumpMeta& m = meta_of(r);
  m.integrity = st == h5::Stamp::kMatch  ? "stamp matches"
                : st == h5::Stamp::kNone ? "no stamp"
                                         : "stamp does not match: changed since written";
  return r;
}

DumpMeta read_meta_unguarded(const std::string& path) {
  h5::Reader rd(path);
  return get_meta(rd);
}

Dump read_dump_unguarded(const std::string& path);

}  // namespace

DumpMeta read_dump_meta(const std::string& path) {
  return read_guarded(path, [&] { return read_meta_unguarded(path); });
}

Dump read_dump(const std::string& path) {
  return read_guarded(path, [&] { return read_dump_unguarded(path); });
}

namespace {

Dump read_dump_unguarded(const std::string& path) {
  h5::Reader rd(path);
  Dump d;
  d.path = path;
  d.meta = get_meta(rd);
  h5::Handle layers = rd.open_group(rd.root(), "/", "layers");
  const std::vector<std::string> names = rd.children(layers.get(), "/layers");
  if (names.size() != d.meta.layers.size())
    rd.fail("/layers", "root attribute layers lists " + std::to_string(d.meta.layers.size()) +
                           " layers, the file holds " + std::to_string(names.size()) + " groups");
  bool any_slices = false;
  for (int32_t L : d.meta.layers) {
    d.layers.push_back(get_layer(rd, layers.get(), d.meta, L));
    read_layer_clamps(rd, layers.get(), L, d.meta);
    d.slices.push_back(dump_detail::get_slices(rd, layers.get(), L));
    any_slices = any_slices || !d.slices.back().empty();
  }
  if (!any_slices) d.slices.clear();
  return d;
}

}  // namespace

}  // namespace moecheck
