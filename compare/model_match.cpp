// check_comparable (compare/dump_diff.h): two dumps are compared only when they ran the same
// config, token count and layers on the same weights, where "the same weights" means equal
// digests on every tensor and expert slice both recorded (golden/provenance.h), or equal
// whole-file digests. Contract: docs/cli.md "diff" (what is compared), docs/golden-format.md.
#include <cstdio>
#include <map>
#include <tuple>

#include "compare/dump_diff.h"
#include "core/error.h"

namespace moecheck {
namespace {

std::string fmt_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

std::string layer_list(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// Config, token count and layer list must agree.
void check_shapes(const DumpMeta& a, const DumpMeta& b, const std::string& both) {
  const MoeConfig &x = a.config, &y = b.config;
  auto field = [&](const char* f, const std::string& u, const std::string& v) {
    if (u != v)
      throw InputError(both + "different configs: attribute config." + f + " is " + u + " vs " + v);
  };
  field("dim", std::to_string(x.dim), std::to_string(y.dim));
  field("inter", std::to_string(x.inter), std::to_string(y.inter));
  field("n_routed", std::to_string(x.n_routed), std::to_string(y.n_routed));
  field("topk", std::to_string(x.topk), std::to_string(y.topk));
  field("n_shared", std::to_string(x.n_shared), std::to_string(y.n_shared));
  field("score_func", to_string(x.score_func), to_string(y.score_func));
  field("route_scale", fmt_float(x.route_scale), fmt_float(y.route_scale));
  field("swiglu_limit", fmt_float(x.swiglu_limit), fmt_float(y.swiglu_limit));
  field("swiglu_limit_shared", fmt_float(x.shared_swiglu_limit()),
        fmt_float(y.shared_swiglu_limit()));
  field("gate_temp", fmt_float(x.gate_temp), fmt_float(y.gate_temp));
  field("norm_topk_prob", std::to_string(x.norm_topk_prob), std::to_string(y.norm_topk_prob));
  if (a.tokens != b.tokens)
    throw InputError(both + "different token counts (attribute tokens): " +
                     std::to_string(a.tokens) + " vs " + std::to_string(b.tokens));
  if (a.layers != b.layers)
    throw InputError(both + "different layer lists (attribute layers): " + layer_list(a.layers) +
                     " vs " + layer_list(b.layers));
  for (int32_t L : a.layers) {
    const auto clamps = [L](const DumpMeta& m) {
      const auto it = m.layer_clamps.find(L);
      return it != m.layer_clamps.end()
                 ? it->second
                 : std::pair{m.config.swiglu_limit, m.config.shared_swiglu_limit()};
    };
    const auto [ca, cb] = std::pair{clamps(a), clamps(b)};
    if (ca != cb)
      throw InputError(both + "layer " + std::to_string(L) +
                       ": different SwiGLU clamps (routed / shared): " + fmt_float(ca.first) +
                       " / " + fmt_float(ca.second) + " vs " + fmt_float(cb.first) + " / " +
                       fmt_float(cb.second));
  }
}

// Slices of both dumps layer by layer: equal digests where both recorded one, the rest listed.
void match_slices(const Dump& a, const Dump& b, const std::string& both, ModelMatch& m) {
  for (size_t li = 0; li < a.slices.size(); ++li) {
    const int L = a.meta.layers[li];
    std::map<std::pair<int32_t, int32_t>, const SliceHash*> in_b;
    for (const SliceHash& h : b.slices[li]) in_b[{tensor_code(h.tensor), h.expert}] = &h;
    for (const SliceHash& h : a.slices[li]) {
      auto it = in_b.find({tensor_code(h.tensor), h.expert});
      if (it == in_b.end()) {
        m.only_a.push_back(slice_name(L, h.tensor, h.expert));
        continue;
      }
      if (it->second->sha256 != h.sha256)
        throw InputError(both + "different weights: " + slice_name(L, h.tensor, h.expert) +
                         " has sha256 " + h.sha256 + " in A, " + it->second->sha256 + " in B");
      ++m.common;
      in_b.erase(it);
    }
    for (const auto& kv : in_b)
      m.only_b.push_back(slice_name(L, kv.second->tensor, kv.second->expert));
  }
}

std::string recorded(const Dump& d) {
  if (!d.slices.empty())
    return d.meta.model_sha256.empty() ? "slice digests" : "slice and whole-file digests";
  return d.meta.model_sha256.empty() ? "no digests" : "the whole-file digest only";
}

}  // namespace

ModelMatch check_comparable(const Dump& a, const Dump& b) {
  const std::string both = a.path + " vs " + b.path + ": ";
  check_shapes(a.meta, b.meta, both);
  ModelMatch m;
  const bool files = !a.meta.model_sha256.empty() && !b.meta.model_sha256.empty();
  const bool slices = !a.slices.empty() && !b.slices.empty();
  if (files && a.meta.model_sha256 == b.meta.model_sha256) {
    m.kind = "file";
    m.note = "same model file (whole-file sha256 " + a.meta.model_sha256 + ")";
    return m;
  }
  if (!slices) {
    if (files)
      throw InputError(
          both + "different model files (attribute model_sha256): " + a.meta.model_file + " " +
          a.meta.model_sha256 + " vs " + b.meta.model_file + " " + b.meta.model_sha256);
    m.kind = "unverified";
    m.note = "model identity not checked: A records " + recorded(a) + ", B " + recorded(b) +
             " (run both with --hash-file, or both with this version, to compare them)";
    return m;
  }
  match_slices(a, b, both, m);
  m.kind = "slices";
  m.header_differs = !a.meta.model_header_sha256.empty() && !b.meta.model_header_sha256.empty() &&
                     a.meta.model_header_sha256 != b.meta.model_header_sha256;
  m.note = "same tensors: " + std::to_string(m.common) +
           " tensor / expert slice(s) both read have equal sha256";
  if (!m.only_a.empty() || !m.only_b.empty())
    m.note += "; " + std::to_string(m.only_a.size()) + " read by A only, " +
              std::to_string(m.only_b.size()) + " by B only";
  if (m.header_differs) m.note += "; the GGUF headers differ (metadata or tensor layout)";
  return m;
}

}  // namespace moecheck
