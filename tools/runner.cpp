// Runs ref / emu / cuda over a model's layers into a Dump. Each layer's forward is asked for
// every stage (LayerTaps); without --taps only the five basic datasets are kept. Contract:
// docs/cli.md "run".
#include "tools/runner.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "golden/sha256.h"
#include "tools/progress.h"

#include "emulate/moe_layer.h"
#include "reference/moe.h"
#if defined(MOECHECK_HAVE_CUDA)
#include "cuda/moe_layer.h"
#endif

#ifndef MOECHECK_GIT_COMMIT
#define MOECHECK_GIT_COMMIT "unknown"
#endif

namespace moecheck::cli {

std::string impl_name(Impl i) {
  switch (i) {
    case Impl::kRef: return "ref";
    case Impl::kEmu: return "emu";
    case Impl::kCuda: return "cuda";
  }
  return "?";
}

Impl parse_impl(const std::string& s, const std::string& where) {
  if (s == "ref") return Impl::kRef;
  if (s == "emu") return Impl::kEmu;
  if (s == "cuda") return Impl::kCuda;
  throw InputError(where + ": expected \"ref\", \"emu\" or \"cuda\", found \"" + s + "\"");
}

bool impl_available(Impl i, std::string* why) {
  switch (i) {
    case Impl::kRef:
    case Impl::kEmu: return true;
    case Impl::kCuda:
#if defined(MOECHECK_HAVE_CUDA)
      return moecheck::cuda::device_available(why);
#else
      if (why)
        *why =
            "cuda implementation not built (this build has no CUDA: nvcc not found or "
            "MOECHECK_ENABLE_CUDA=OFF)";
      return false;
#endif
  }
  return false;
}

LoadedModel load_model(const std::string& path, bool hash_file) {
  if (!std::filesystem::exists(path)) throw InputError(path + ": model file does not exist");
  LoadedModel m{path, ModelFile::open(path), hash_file ? sha256_file(path) : "", nullptr};
  m.hasher = std::make_unique<SliceHasher>(m.file);
  return m;
}

uint64_t input_layer_seed(uint64_t seed, int layer) {
  return stream_key(seed, static_cast<uint64_t>(layer), 0x696e707574ull, 0);
}

std::vector<int> parse_layer_list(const std::string& s) {
  std::vector<int> out;
  auto bad = [&](const std::string& why) -> void {
    throw InputError("--layers \"" + s + "\": " + why + " (expected e.g. 0,2-5)");
  };
  auto num = [&](const std::string& t) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos)
      bad("\"" + t + "\" is not a layer number");
    return std::stoi(t);
  };
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(num(item));
    } else {
      const int lo = num(item.substr(0, dash)), hi = num(item.substr(dash + 1));
      if (hi < lo) bad("range " + item + " is empty");
      for (int l = lo; l <= hi; ++l) out.push_back(l);
    }
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

std::string router_name(RouterVariant v) { return v == RouterVariant::kPlain ? "plain" : "staged"; }

}  // namespace

std::vector<uint16_t> forward_one(const RunSpec& spec, const LayerWeights& w,
                                  const std::vector<uint16_t>& x, int64_t T, LayerTaps* taps) {
  switch (spec.impl) {
    case Impl::kRef: {
      const ref::MoE moe(w, spec.knobs.precision == RefPrecision::kExact ? ref::Precision::kExact
                                                                         : ref::Precision::kModel);
      return moe.forward(x.data(), T, taps);
    }
    case Impl::kEmu: {
      emu::LayerOptions o;
      o.router = spec.knobs.router;
      o.expert_warps = spec.knobs.expert_warps;
      const emu::MoeLayer layer(w, o);
      return layer.forward(x.data(), T, taps);
    }
    case Impl::kCuda: {
#if defined(MOECHECK_HAVE_CUDA)
      moecheck::cuda::LayerOptions o;
      o.router = spec.knobs.router;
      o.expert_warps = spec.knobs.expert_warps;
      o.shared_side_stream = spec.knobs.shared_side_stream;
      moecheck::cuda::MoeLayer layer(w, o);
      return layer.forward(x.data(), T, taps);
#else
      break;
#endif
    }
  }
  std::string why;
  impl_available(spec.impl, &why);
  throw InputError(why);
}

namespace {

DumpMeta make_meta(const LoadedModel& m, const RunSpec& spec) {
  DumpMeta meta;
  meta.tool_version = MOECHECK_VERSION;
  meta.git_commit = MOECHECK_GIT_COMMIT;
  meta.implementation = impl_name(spec.impl);
  const ImplKnobs& k = spec.knobs;
  switch (spec.impl) {
    case Impl::kRef:
      meta.knobs = {{"precision", k.precision == RefPrecision::kExact ? "exact" : "model"}};
      meta.device = "cpu";
      break;
    case Impl::kEmu:
      meta.knobs = {{"router", router_name(k.router)},
                    {"expert_warps", std::to_string(k.expert_warps)}};
      meta.device = "cpu";
      break;
    case Impl::kCuda:
      meta.knobs = {{"router", router_name(k.router)},
                    {"expert_warps", std::to_string(k.expert_warps)},
                    {"shared_side_stream", k.shared_side_stream ? "on" : "off"}};
#if defined(MOECHECK_HAVE_CUDA)
      meta.device = moecheck::cuda::device_name(0);
#else
      meta.device = "none";
#endif
      break;
  }
  for (const auto& [name, value] : meta.knobs) {
    if (!meta.variant.empty()) meta.variant += " ";
    meta.variant += name + "=" + value;
  }
  meta.model_file = std::filesystem::path(m.path).filename().string();
  meta.model_sha256 = m.sha256;
  meta.model_header_sha256 = m.hasher->header();
  meta.config = m.file.config();
  if (m.file.provenance()) {
    meta.has_model_seed = true;
    meta.model_seed = m.file.provenance()->seed;
  }
  meta.taps = spec.taps;
  // model.py multiplies h by the routing weight before w2; the emulation and the kernels apply
  // it in the accumulation (docs/numerics.md "accumulate, finish").
  meta.routing_weight_at = spec.impl == Impl::kRef ? "h" : "accumulate";
  return meta;
}

}  // namespace

std::vector<uint16_t> seeded_layer_input(const RunSpec& spec, const LayerWeights& w, int L) {
  std::vector<uint16_t> x =
      generate_input(input_layer_seed(spec.input.seed, L), spec.tokens, w.config.dim);
  if (spec.input.adversarial)
    for (const AdversarialToken& a : adversarial_tokens(w, spec.input.seed))
      x.insert(x.end(), a.x.begin(), a.x.end());
  return x;
}

Dump run_layers(const LoadedModel& m, const RunSpec& spec, Progress* progress) {
  std::string why;
  if (!impl_available(spec.impl, &why)) throw InputError(why);
  const MoeConfig& c = m.file.config();
  std::vector<int> layers = spec.layers;
  if (layers.empty())
    for (int l = 0; l < m.file.n_layers(); ++l) layers.push_back(l);
  for (int l : layers)
    if (l >= m.file.n_layers())
      throw InputError("--layers: layer " + std::to_string(l) + " is not in " + m.path +
                       " (it has " + std::to_string(m.file.n_layers()) + " layers)");

  Dump d;
  d.meta = make_meta(m, spec);
  std::unique_ptr<Dump> in;
  if (!spec.input.dump_path.empty()) {
    in = std::make_unique<Dump>(read_dump(spec.input.dump_path));
    if (in->meta.config.dim != c.dim)
      throw InputError(spec.input.dump_path + ": attribute config.dim is " +
                       std::to_string(in->meta.config.dim) + ", the model " + m.path + " has dim " +
                       std::to_string(c.dim));
    d.meta.tokens = in->meta.tokens;
    d.meta.input_source = "dump:" + std::filesystem::path(spec.input.dump_path).filename().string();
  } else {
    if (spec.tokens <= 0)
      throw InputError("--tokens: expected a positive token count, found " +
                       std::to_string(spec.tokens));
    if (spec.input.adversarial && spec.input.chain)
      throw InputError(
          "--adversarial: adversarial tokens are made per layer from its weights; they cannot be "
          "chained");
    d.meta.tokens = spec.tokens + (spec.input.adversarial ? kAdversarialTokens : 0);
    d.meta.input_source = spec.input.chain         ? "seed+chain"
                          : spec.input.adversarial ? "seed+adversarial"
                                                   : "seed";
    d.meta.input_seed = spec.input.seed;
  }
  const int64_t T = d.meta.tokens;

  std::vector<uint16_t> carried;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int L = layers[i];
    const LayerWeights w = m.file.layer(L);
    std::vector<uint16_t> x;
    if (in) {
      auto it = std::find(in->meta.layers.begin(), in->meta.layers.end(), L);
      if (it == in->meta.layers.end())
        throw InputError(spec.input.dump_path + ": no /layers/" + std::to_string(L) +
                         " to take the input of layer " + std::to_string(L) + " from");
      x = in->layers[static_cast<size_t>(it - in->meta.layers.begin())].input;
    } else if (spec.input.chain && i > 0) {
      x = carried;
    } else {
      x = seeded_layer_input(spec, w, L);
    }
    LayerTaps taps;
    std::vector<uint16_t> y = forward_one(spec, w, x, T, &taps);
    taps.layer = L;
    taps.tokens = T;
    taps.input = x;
    taps.output = y;
    if (!spec.taps) {
      taps.x_q8.clear();
      taps.experts.clear();
      taps.shared = ExpertTaps{};
      taps.acc.clear();
    }
    d.slices.push_back(m.hasher->layer_slices(L, experts_used(taps.topk_ids)));
    carried = std::move(y);
    d.meta.layers.push_back(L);
    d.layers.push_back(std::move(taps));
    if (progress) progress->step("layer " + std::to_string(L) + " " + impl_name(spec.impl));
  }
  return d;
}

}  // namespace moecheck::cli
