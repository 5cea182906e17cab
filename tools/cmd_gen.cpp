// `moecheck gen`: writes a seeded synthetic model (golden/generator.h) as a GGUF file.
// Contract: docs/cli.md "gen", docs/gguf.md "Synthetic models".
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden/generator.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/preflight.h"
#include "tools/progress.h"

namespace moecheck::cli {
namespace {

struct GenArgs {
  std::string preset = "tiny";
  int layers = 0;  // 0: the preset's
  uint64_t seed = 1;
  std::string out;
  std::string shared;  // bf16 | kquant; empty: preset's
  std::string blocks;  // quantized | random; empty: preset's
  uint32_t alignment = 32;
  bool vision = false;
  std::string convention = "deepseek2";
  std::string router;  // bf16 | f16; empty: bf16 for deepseek2, f16 for deepseek4 / deepseek41
  std::vector<float> limits, limits_shared;
  int hash_layers = 0;
  bool json = false;
};

// The convention options (docs/gguf.md "Conventions"); GenOptions::validate checks them.
void apply_convention(const GenArgs& a, GenOptions& o) {
  o.convention = parse_convention(a.convention, "--convention");
  const bool f16 = a.router.empty() ? o.convention != Convention::kMoecheck : a.router == "f16";
  o.router_type = f16 ? GgmlType::kF16 : GgmlType::kBF16;
  o.swiglu_limits = a.limits;
  o.swiglu_limits_shared = a.limits_shared;
  o.hash_layers = a.hash_layers;
}

// general.alignment: a power of two in the range the generator writes (golden/generator.h: the
// loader views tensors in place, so 1 and 2 make a model `run` refuses; 2^31 makes 2 GiB of
// padding per tensor).
void require_alignment(uint32_t a) {
  if (a >= kMinGenAlignment && a <= kMaxGenAlignment && (a & (a - 1)) == 0) return;
  throw InputError("--alignment " + std::to_string(a) + ": expected a power of two in [" +
                   std::to_string(kMinGenAlignment) + ", " + std::to_string(kMaxGenAlignment) +
                   "] (docs/gguf.md \"Synthetic models\")");
}

int run_gen(const GenArgs& a) {
  require_alignment(a.alignment);
  require_output_file("-o", a.out, {});
  GenOptions o = preset_options(a.preset);
  if (a.layers > 0) o.n_layers = a.layers;
  o.seed = a.seed;
  if (a.shared == "kquant") o.shared = SharedExpertType::kKQuant;
  else if (a.shared == "bf16") o.shared = SharedExpertType::kBF16;
  if (a.blocks == "random") o.blocks = ExpertBlocks::kRandomValid;
  else if (a.blocks == "quantized") o.blocks = ExpertBlocks::kQuantized;
  o.alignment = a.alignment;
  o.vision = a.vision;
  apply_convention(a, o);
  o.validate();
  std::string sha;
  {
    // Bytes as MiB: a ds41 layer is 4.9 GB and takes about 35 s on two cores.
    Progress p("gen " + o.preset, 0, !a.json);
    sha = write_model(o, a.out, [&p](uint64_t done, uint64_t total) {
      p.set_total(static_cast<int64_t>(total >> 20));
      p.update(static_cast<int64_t>(done >> 20), "MiB");
    });  // hashed as written: no second pass
  }
  const MoeConfig& c = o.config;
  if (a.json) {
    Json j;
    j.begin_object()
        .kv("file", a.out)
        .kv("preset", o.preset)
        .kv("layers", o.n_layers)
        .kv("seed", o.seed)
        .kv("vision", o.vision)
        .kv("convention", std::string(architecture_name(o.convention)))
        .kv("router", std::string(o.router_type == GgmlType::kF16 ? "F16" : "BF16"))
        .kv("hash_layers", o.hash_layers);
    j.kv("dim", c.dim)
        .kv("inter", c.inter)
        .kv("n_routed", c.n_routed)
        .kv("topk", c.topk)
        .kv("sha256", sha)
        .end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "wrote %s: preset %s, %d layer(s), seed %llu (dim %lld, inter %lld, %lld experts, top "
        "%lld)%s, %s convention, %s router, sha256 %s\n",
        a.out.c_str(), o.preset.c_str(), o.n_layers, static_cast<unsigned long long>(o.seed),
        static_cast<long long>(c.dim), static_cast<long long>(c.inter),
        static_cast<long long>(c.n_routed), static_cast<long long>(c.topk),
        o.vision ? ", with bias_vl" : "", architecture_name(o.convention),
        o.router_type == GgmlType::kF16 ? "F16" : "BF16", sha.c_str());
  }
  return kExitSame;
}

}  // namespace

void add_gen(CLI::App& app, int& rc) {
  auto a = std::make_shared<GenArgs>();
  CLI::App* s = app.add_subcommand("gen", "Write a seeded synthetic model (GGUF v3)");
  s->footer(
      "Examples:\n  moecheck gen --preset tiny --layers 2 --seed 1 -o tiny.gguf\n"
      "  moecheck gen --preset tiny --vision -o tiny-vl.gguf   # also bias_vl (--image-tokens)\n"
      "  moecheck gen --convention deepseek4 --layers 4 --hash-layers 1 \\\n"
      "      --swiglu-limits 10,10,7,5 --swiglu-limits-shared 10,8,8,6 -o v4.gguf\n"
      "Exit codes: 0 written, 2 error (nothing is left at -o on error).");
  s->add_option("--preset", a->preset, "tiny | small | ds41")
      ->check(CLI::IsMember({"tiny", "small", "ds41"}))
      ->capture_default_str();
  s->add_option("--layers", a->layers, "number of layers (default: the preset's, 2)")
      ->check(CLI::Range(1, 1000));
  s->add_option("--seed", a->seed, "generator seed")->check(kNonNegative)->capture_default_str();
  s->add_option("-o,--output", a->out, "output GGUF file")->required();
  s->add_option("--shared", a->shared, "shared expert storage: bf16 | kquant")
      ->check(CLI::IsMember({"bf16", "kquant"}));
  s->add_option("--blocks", a->blocks,
                "routed expert blocks: quantized (reference quantisers) | random (valid random "
                "blocks, fast)")
      ->check(CLI::IsMember({"quantized", "random"}));
  s->add_option("--alignment", a->alignment, "general.alignment: a power of two in [8, 65536]")
      ->capture_default_str();
  s->add_flag(
      "--vision", a->vision,
      "also write each layer's bias_vl (blk.N.exp_probs_b_vl.bias: model.py's Gate.bias_vl, "
      "the selection bias of image-span tokens; see run/check --image-tokens)");
  s->add_option("--convention", a->convention,
                "metadata convention: deepseek2 (moecheck's) | deepseek4 | deepseek41 (llama.cpp's "
                "DeepSeek-V4 / V4.1 keys; docs/gguf.md \"Conventions\")")
      ->check(CLI::IsMember({"deepseek2", "deepseek4", "deepseek41"}))
      ->capture_default_str();
  s->add_option("--router", a->router,
                "router weight type: bf16 | f16 (default bf16 for deepseek2, f16 otherwise)")
      ->check(CLI::IsMember({"bf16", "f16"}));
  s->add_option("--swiglu-limits", a->limits,
                "per-layer SwiGLU clamp of the routed experts, one per layer (deepseek4/41)")
      ->delimiter(',');
  s->add_option("--swiglu-limits-shared", a->limits_shared,
                "per-layer SwiGLU clamp of the shared expert, one per layer (deepseek4/41)")
      ->delimiter(',');
  s->add_option("--hash-layers", a->hash_layers,
                "deepseek4: write the first N layers hash-routed (token-id table, no bias), as "
                "V4's first layers are; moecheck refuses to run them")
      ->check(CLI::Range(0, 1000));
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, &rc] { rc = run_gen(*a); });
}

}  // namespace moecheck::cli
