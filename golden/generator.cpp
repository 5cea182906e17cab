// Synthetic MoE weights from a seed: presets, the portable PRNG, and every tensor's bytes as a
// function of (seed, layer, tensor, expert). Contract: docs/gguf.md "Synthetic models".
// Scales: router rows ~ N(0, s_e^2 / dim) with s_e in [0.85, 1.15) so logits spread; experts
// ~ N(0, 1 / fan_in) so that, for x ~ N(0, 1), gate/up/down outputs stay O(1).
#include "golden/generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/kquant.h"
#include "core/numfmt.h"

namespace moecheck {

namespace {

uint64_t splitmix64(uint64_t& x) {
  x += 0x9E3779B97F4A7C15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Stream ids: one per tensor kind, so no two tensors share a stream.
enum StreamId : uint64_t {
  kStreamRouter = 1,
  kStreamBias = 2,
  kStreamExperts = 3,
  kStreamShared = 6,
  kStreamInput = 9,
  kStreamBiasVl = 10,
};

uint64_t proj_index(Proj p) { return static_cast<uint64_t>(p); }

// Expert matrix geometry: gate/up [inter, dim] Q2_K, down [dim, inter] Q3_K.
struct Geometry {
  int64_t rows, cols;
  GgmlType kquant;
};
Geometry geometry(const MoeConfig& c, Proj p) {
  if (p == Proj::kDown) return {c.dim, c.inter, GgmlType::kQ3K};
  return {c.inter, c.dim, GgmlType::kQ2K};
}

float sigma_for(const Geometry& g) { return 1.0f / std::sqrt(static_cast<float>(g.cols)); }

void fill_random_bytes(Rng& rng, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(out + i, &r, std::min<size_t>(8, n - i));
  }
}

// A positive, finite, normal f16 near `value` times a factor in [0.5, 1.5).
uint16_t random_scale(Rng& rng, float value) {
  const float v = value * static_cast<float>(0.5 + rng.uniform());
  return f32_to_f16(std::max(v, 6.103515625e-05f));  // f16's smallest normal, 2^-14
}

// Random valid blocks. Element spread: Q2_K d*sc*q - dmin*m with sc, m, q uniform has a
// standard deviation near 14 d (dmin ~ 1.5 d centres it); Q3_K d*s*q near 43 d.
void random_valid_blocks(Rng& rng, const Geometry& g, uint8_t* out) {
  const int64_t nblocks = g.rows * (g.cols / kQK_K);
  const float sigma = sigma_for(g);
  if (g.kquant == GgmlType::kQ2K) {
    auto* b = reinterpret_cast<BlockQ2K*>(out);
    for (int64_t i = 0; i < nblocks; ++i) {
      fill_random_bytes(rng, b[i].scales, sizeof b[i].scales);
      fill_random_bytes(rng, b[i].qs, sizeof b[i].qs);
      b[i].d = random_scale(rng, sigma / 14.0f);
      b[i].dmin = random_scale(rng, 1.5f * sigma / 14.0f);
    }
  } else {
    auto* b = reinterpret_cast<BlockQ3K*>(out);
    for (int64_t i = 0; i < nblocks; ++i) {
      fill_random_bytes(rng, b[i].hmask, sizeof b[i].hmask);
      fill_random_bytes(rng, b[i].qs, sizeof b[i].qs);
      fill_random_bytes(rng, b[i].scales,
                        sizeof b[i].scales);  // every byte pattern is 16 valid 6-bit scales
      b[i].d = random_scale(rng, sigma / 43.0f);
    }
  }
}

void quantized_blocks(Rng& rng, const Geometry& g, uint8_t* out) {
  const float sigma = sigma_for(g);
  std::vector<float> row(static_cast<size_t>(g.cols));
  const int64_t rb = row_bytes(g.kquant, g.cols);
  for (int64_t r = 0; r < g.rows; ++r) {
    for (float& v : row) v = rng.normal() * sigma;
    uint8_t* dst = out + r * rb;
    if (g.kquant == GgmlType::kQ2K)
      quantize_row_q2_K_ref(row.data(), reinterpret_cast<BlockQ2K*>(dst), g.cols);
    else quantize_row_q3_K_ref(row.data(), reinterpret_cast<BlockQ3K*>(dst), g.cols);
  }
}

void kquant_blocks(const GenOptions& o, Rng& rng, const Geometry& g, uint8_t* out) {
  if (o.blocks == ExpertBlocks::kRandomValid) random_valid_blocks(rng, g, out);
  else quantized_blocks(rng, g, out);
}

}  // namespace

Rng::Rng(uint64_t key) {
  for (uint64_t& s : s_) s = splitmix64(key);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

float Rng::normal() {
  // Each 16-bit part is uniform on [0, 65535] (variance (2^32 - 1) / 12), so the centred sum of
  // twelve has variance 2^32 - 1; dividing by 2^16 is exact.
  int64_t sum = 0;
  for (int i = 0; i < 3; ++i) {
    const uint64_t r = next();
    for (int j = 0; j < 4; ++j) sum += static_cast<int64_t>((r >> (16 * j)) & 0xFFFF);
  }
  const int64_t centred2 = 2 * sum - 12 * 65535;  // twice the centred sum: an integer
  return static_cast<float>(static_cast<double>(centred2) * 0x1.0p-17);
}

uint64_t stream_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = seed;
  uint64_t h = splitmix64(x);
  for (const uint64_t v : {a, b, c}) {
    x = h ^ v;
    h = splitmix64(x);
  }
  return h;
}

void GenOptions::validate() const {
  const std::string where = "generator preset \"" + preset + "\"";
  config.validate(where);
  detail::validate_convention(*this, where);
  if (n_layers < 1)
    throw InputError(where + ": n_layers must be at least 1, found " + std::to_string(n_layers));
  if (alignment < kMinGenAlignment || alignment > kMaxGenAlignment ||
      (alignment & (alignment - 1)) != 0)
    throw InputError(where + ": alignment must be a power of two in [" +
                     std::to_string(kMinGenAlignment) + ", " + std::to_string(kMaxGenAlignment) +
                     "], found " + std::to_string(alignment));
}

ModelLayout GenOptions::layout() const {
  ModelLayout l;
  l.convention = convention;
  l.n_layers = n_layers;
  l.hash_layers = hash_layers;
  l.clamp_exp = swiglu_limits;
  l.clamp_shexp = swiglu_limits_shared;
  if (!l.clamp_exp.empty() && l.clamp_shexp.empty())
    l.clamp_shexp.assign(l.clamp_exp.size(), config.shared_swiglu_limit());
  if (l.clamp_exp.empty() && !l.clamp_shexp.empty())
    l.clamp_exp.assign(l.clamp_shexp.size(), config.swiglu_limit);
  return l;
}

GenOptions preset_options(const std::string& preset) {
  GenOptions o;
  o.preset = preset;
  MoeConfig& c = o.config;
  c = ds41_config();  // route_scale 1.5, swiglu_limit 10, sqrtsoftplus, gate_temp 1, norm
  if (preset == "tiny") {
    c.dim = 512, c.inter = 256, c.n_routed = 16, c.topk = 4;
  } else if (preset == "small") {
    c.dim = 1024, c.inter = 512, c.n_routed = 64, c.topk = 6;
  } else if (preset == "ds41") {
    o.blocks = ExpertBlocks::kRandomValid;
  } else {
    throw InputError("generator: unknown preset \"" + preset + "\" (known: tiny, small, ds41)");
  }
  return o;
}

GenOptions default_model_options() { return preset_options("tiny"); }

GenOptions options_from_model(const ModelFile& m) {
  if (!m.provenance())
    throw InputError(m.path() +
                     ": no moecheck.generator.* keys: not written by the synthetic generator");
  const GeneratorProvenance& p = *m.provenance();
  if (p.version != kGeneratorVersion)
    throw InputError(m.path() + ": generator version " + std::to_string(p.version) +
                     ", this build makes version " + std::to_string(kGeneratorVersion));
  GenOptions o;
  o.preset = p.preset;
  o.config = m.config();
  o.n_layers = m.n_layers();
  o.seed = p.seed;
  o.blocks = p.fast_blocks ? ExpertBlocks::kRandomValid : ExpertBlocks::kQuantized;
  o.alignment = m.gguf().alignment();
  o.vision = m.has_tensor(0, LayerTensor::kBiasVl);
  detail::conventions_from_model(m, o);
  const gguf::TensorInfo* t = m.gguf().find_tensor(tensor_name(0, LayerTensor::kGateShexp));
  o.shared = t && t->type != static_cast<uint32_t>(GgmlType::kBF16) ? SharedExpertType::kKQuant
                                                                    : SharedExpertType::kBF16;
  return o;
}

int64_t expert_bytes(const GenOptions& o, Proj p) {
  const Geometry g = geometry(o.config, p);
  return g.rows * row_bytes(g.kquant, g.cols);
}

void generate_expert_blocks(const GenOptions& o, int layer, Proj p, int64_t expert, uint8_t* out) {
  if (expert < 0 || expert >= o.config.n_routed)
    throw InputError("generator: expert " + std::to_string(expert) + " out of range [0, " +
                     std::to_string(o.config.n_routed) + ")");
  Rng rng(stream_key(o.seed, static_cast<uint64_t>(layer), kStreamExperts + proj_index(p),
                     static_cast<uint64_t>(expert)));
  kquant_blocks(o, rng, geometry(o.config, p), out);
}

void generate_router(const GenOptions& o, int layer, uint16_t* out) {
  const MoeConfig& c = o.config;
  for (int64_t e = 0; e < c.n_routed; ++e) {
    Rng rng(
        stream_key(o.seed, static_cast<uint64_t>(layer), kStreamRouter, static_cast<uint64_t>(e)));
    // Row norms vary by +-15% across experts, so logits (and scores) of different experts spread
    // differently; more would let a few large-norm experts win most top-k picks at 384 experts.
    const float scale =
        static_cast<float>(0.85 + 0.3 * rng.uniform()) / std::sqrt(static_cast<float>(c.dim));
    const bool f16 = o.router_type == GgmlType::kF16;
    for (int64_t k = 0; k < c.dim; ++k) {
      const float v = rng.normal() * scale;
      out[e * c.dim + k] = f16 ? f32_to_f16(v) : f32_to_bf16(v);
    }
  }
}

namespace {

// A selection bias drawn from `stream`: small noise everywhere (load balancing's residue); one
// expert in eight carries a bias comparable to the score spread (a hot or cold expert).
void draw_bias(const GenOptions& o, int layer, uint64_t stream, float* out) {
  const MoeConfig& c = o.config;
  // The typical spread of the scores, so the bias is realistic for each score function.
  float spread = 0.3f;
  if (c.score_func == ScoreFunc::kSigmoid) spread = 0.2f;
  if (c.score_func == ScoreFunc::kSoftmax) spread = 1.0f / static_cast<float>(c.n_routed);
  Rng rng(stream_key(o.seed, static_cast<uint64_t>(layer), stream, 0));
  for (int64_t e = 0; e < c.n_routed; ++e) {
    float b = 0.05f * spread * rng.normal();
    if (rng.uniform() < 0.125) b += spread * static_cast<float>(rng.uniform() - 0.5);
    out[e] = b;
  }
}

}  // namespace

void generate_bias_vl(const GenOptions& o, int layer, float* out) {
  draw_bias(o, layer, kStreamBiasVl, out);
}

void generate_bias(const GenOptions& o, int layer, float* out) {
  const MoeConfig& c = o.config;
  draw_bias(o, layer, kStreamBias, out);
  // An exact tie at the top-k boundary (version 2): the (topk + 1)-th largest bias becomes equal
  // to the topk-th, so a token whose logits are all equal (the zero token) has two equal keys
  // across the boundary and routing must send the tie to the lower expert id.
  if (c.topk < c.n_routed) {
    std::vector<int32_t> order(static_cast<size_t>(c.n_routed));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [out](int32_t a, int32_t b) { return out[a] > out[b]; });
    out[order[static_cast<size_t>(c.topk)]] = out[order[static_cast<size_t>(c.topk - 1)]];
  }
}

int64_t shared_bytes(const GenOptions& o, Proj p) {
  const Geometry g = geometry(o.config, p);
  if (o.shared == SharedExpertType::kBF16) return g.rows * g.cols * 2;
  return g.rows * row_bytes(g.kquant, g.cols);
}

void generate_shared(const GenOptions& o, int layer, Proj p, uint8_t* out) {
  const Geometry g = geometry(o.config, p);
  Rng rng(stream_key(o.seed, static_cast<uint64_t>(layer), kStreamShared + proj_index(p), 0));
  if (o.shared == SharedExpertType::kKQuant) {
    kquant_blocks(o, rng, g, out);
    return;
  }
  const float sigma = sigma_for(g);
  for (int64_t i = 0; i < g.rows * g.cols; ++i) {
    const uint16_t v = f32_to_bf16(rng.normal() * sigma);
    std::memcpy(out + 2 * i, &v, 2);
  }
}

LayerWeights generate_layer(const GenOptions& o, int layer) {
  o.validate();
  if (layer < o.hash_layers)
    throw InputError("generator: layer " + std::to_string(layer) + " is hash-routed (hash_layers " +
                     std::to_string(o.hash_layers) + "): moecheck cannot run it");
  const MoeConfig c = o.layout().layer_config(o.config, layer);
  struct Buffers {
    std::vector<uint16_t> router;
    std::vector<float> bias, bias_vl;
    std::vector<uint8_t> exps[3];
    std::vector<uint8_t> shared[3];
  };
  auto buf = std::make_shared<Buffers>();
  buf->router.resize(static_cast<size_t>(c.n_routed * c.dim));
  buf->bias.resize(static_cast<size_t>(c.n_routed));
  generate_router(o, layer, buf->router.data());
  generate_bias(o, layer, buf->bias.data());
  if (o.vision) {
    buf->bias_vl.resize(static_cast<size_t>(c.n_routed));
    generate_bias_vl(o, layer, buf->bias_vl.data());
  }
  const Proj projs[3] = {Proj::kGate, Proj::kUp, Proj::kDown};
  for (const Proj p : projs) {
    const int64_t eb = expert_bytes(o, p);
    auto& v = buf->exps[proj_index(p)];
    v.resize(static_cast<size_t>(eb * c.n_routed));
    for (int64_t e = 0; e < c.n_routed; ++e)
      generate_expert_blocks(o, layer, p, e, v.data() + e * eb);
    auto& s = buf->shared[proj_index(p)];
    s.resize(static_cast<size_t>(shared_bytes(o, p)));
    generate_shared(o, layer, p, s.data());
  }
  const bool kq = o.shared == SharedExpertType::kKQuant;
  LayerWeights w;
  w.layer = layer;
  w.config = c;
  w.router = buf->router.data();
  w.router_type = o.router_type;
  w.bias = buf->bias.data();
  w.bias_vl = o.vision ? buf->bias_vl.data() : nullptr;
  w.gate_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, buf->exps[0].data()};
  w.up_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, buf->exps[1].data()};
  w.down_exps = ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, buf->exps[2].data()};
  w.shared_gate =
      MatView{kq ? GgmlType::kQ2K : GgmlType::kBF16, c.inter, c.dim, buf->shared[0].data()};
  w.shared_up =
      MatView{kq ? GgmlType::kQ2K : GgmlType::kBF16, c.inter, c.dim, buf->shared[1].data()};
  w.shared_down =
      MatView{kq ? GgmlType::kQ3K : GgmlType::kBF16, c.dim, c.inter, buf->shared[2].data()};
  w.keep_alive = std::move(buf);
  return w;
}

gguf::Writer model_writer(const GenOptions& o, const FillCounter& counted) {
  o.validate();
  // The callbacks hold one copy of the options, so the writer may outlive the caller's.
  const auto opt = std::make_shared<const GenOptions>(o);
  const MoeConfig& c = opt->config;
  gguf::Writer w;
  w.set_alignment(o.alignment);
  w.set(keys::kName, gguf::make_string("moecheck synthetic " + o.preset));
  write_model_metadata(w, c, o.layout());
  w.set(keys::kGenSeed, gguf::make_uint64(o.seed));
  w.set(keys::kGenPreset, gguf::make_string(o.preset));
  w.set(keys::kGenVersion, gguf::make_uint32(kGeneratorVersion));
  w.set(keys::kGenFastBlocks, gguf::make_bool(o.blocks == ExpertBlocks::kRandomValid));
  auto add = [&](int L, LayerTensor t, uint64_t chunk, gguf::FillFn fill) {
    TensorShape s = expected_tensor(c, t, o.shared);
    if (t == LayerTensor::kRouter) s.type = o.router_type;
    if (counted)
      fill = [counted, f = std::move(fill)](uint64_t offset, uint8_t* out, uint64_t n) {
        f(offset, out, n);
        counted(n);
      };
    w.add_tensor(gguf::TensorSpec{tensor_name(L, t), static_cast<uint32_t>(s.type), s.ne, chunk,
                                  std::move(fill)});
  };
  const uint64_t router_bytes = static_cast<uint64_t>(c.n_routed * c.dim * 2);
  const uint64_t bias_bytes = static_cast<uint64_t>(c.n_routed * 4);
  for (int L = 0; L < o.n_layers; ++L) {
    // The router and bias are small (3.9 MB at ds41) and written in one piece.
    add(L, LayerTensor::kRouter, router_bytes, [opt, L](uint64_t, uint8_t* out, uint64_t) {
      generate_router(*opt, L, reinterpret_cast<uint16_t*>(out));
    });
    if (L < o.hash_layers) detail::add_hash_table(w, *opt, L);  // *opt: held by the router's fill
    else
      add(L, LayerTensor::kBias, bias_bytes, [opt, L](uint64_t, uint8_t* out, uint64_t) {
        generate_bias(*opt, L, reinterpret_cast<float*>(out));
      });
    if (o.vision)
      add(L, LayerTensor::kBiasVl, bias_bytes, [opt, L](uint64_t, uint8_t* out, uint64_t) {
        generate_bias_vl(*opt, L, reinterpret_cast<float*>(out));
      });
    const LayerTensor exps[3] = {LayerTensor::kGateExps, LayerTensor::kUpExps,
                                 LayerTensor::kDownExps};
    const LayerTensor shexp[3] = {LayerTensor::kGateShexp, LayerTensor::kUpShexp,
                                  LayerTensor::kDownShexp};
    for (const Proj p : {Proj::kGate, Proj::kUp, Proj::kDown}) {
      // One expert per chunk: the writer asks for exactly expert_bytes at multiples of it.
      const uint64_t eb = static_cast<uint64_t>(expert_bytes(o, p));
      add(L, exps[proj_index(p)], eb, [opt, L, p, eb](uint64_t offset, uint8_t* out, uint64_t) {
        generate_expert_blocks(*opt, L, p, static_cast<int64_t>(offset / eb), out);
      });
      add(L, shexp[proj_index(p)], static_cast<uint64_t>(shared_bytes(o, p)),
          [opt, L, p](uint64_t, uint8_t* out, uint64_t) { generate_shared(*opt, L, p, out); });
    }
  }
  return w;
}

std::string write_model(const GenOptions& o, const std::string& path,
                        const WriteProgress& progress) {
  uint64_t done = 0, total = 0;  // tensor bytes produced; the file's size (set before writing)
  const gguf::Writer w = model_writer(o, [&done, &total, &progress](uint64_t n) {
    done += n;
    if (progress) progress(done, total);
  });
  total = w.file_size();
  return w.write(path);
}

std::vector<uint16_t> generate_input(uint64_t seed, int64_t tokens, int64_t dim) {
  std::vector<uint16_t> x(static_cast<size_t>(tokens * dim));
  Rng rng(
      stream_key(seed, kStreamInput, static_cast<uint64_t>(tokens), static_cast<uint64_t>(dim)));
  for (uint16_t& v : x) v = f32_to_bf16(rng.normal());
  return x;
}

}  // namespace moecheck
