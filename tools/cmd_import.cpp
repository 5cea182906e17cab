// `moecheck import`: another engine's tensors (.npy, .npz, safetensors) into a moecheck dump of
// one layer, and `moecheck export`: a dump's layer out as .npy / .npz in the same layout (to feed
// an engine moecheck's input, or to round-trip). Contract: docs/cli.md "import", "export".
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "golden/dump.h"
#include "golden/generator.h"
#include "golden/tensor_file.h"
#include "tools/commands.h"
#include "tools/import_map.h"
#include "tools/preflight.h"
#include "tools/runner.h"

namespace moecheck::cli {
namespace {

struct ImportArgs {
  std::string model, input, from, engine = "unknown", dtype, out;
  std::vector<std::string> maps;
  int layer = 0;
  bool transpose = false, seeded = false, adversarial = true;
  int64_t tokens = 8;
  uint64_t input_seed = 1;
};

// "file.npz:member" -> (file, member); a .npy has no member.
MappedTensor resolve(const std::string& src, const std::string& flag, U16As u16,
                     std::map<std::string, std::map<std::string, HostTensor>>& files) {
  const size_t c = src.rfind(':');
  const bool npy = src.size() >= 4 && src.compare(src.size() - 4, 4, ".npy") == 0;
  const std::string file = npy || c == std::string::npos ? src : src.substr(0, c);
  const std::string key = npy || c == std::string::npos ? "" : src.substr(c + 1);
  if (!npy && key.empty())
    throw InputError(flag + " " + src + ": name the member or tensor, e.g. engine.npz:output");
  if (files.count(file) == 0) files.emplace(file, read_tensor_file(file, u16));
  const auto& f = files.at(file);
  auto it = f.find(key);
  if (it == f.end()) {
    std::string have;
    for (const auto& [k, v] : f) have += (have.empty() ? "" : ", ") + k;
    throw InputError(flag + " " + src + ": " + file + " has no member or tensor \"" + key +
                     "\" (it has: " + have + ")");
  }
  return {it->second, src};
}

std::map<Stage, MappedTensor> mapping(const ImportArgs& a) {
  const U16As u16 = a.dtype == "bf16" ? U16As::kBF16 : U16As::kRefuse;
  std::map<std::string, std::map<std::string, HostTensor>> files;
  std::map<Stage, MappedTensor> m;
  if (!a.from.empty())
    for (const auto& [k, t] : read_tensor_file(a.from, u16)) {
      Stage s;
      if (parse_stage(k, &s)) m[s] = {t, a.from + ":" + k};
    }
  for (const std::string& mp : a.maps) {
    const size_t eq = mp.find('=');
    Stage s;
    if (eq == std::string::npos || !parse_stage(mp.substr(0, eq), &s))
      throw InputError("--map " + mp +
                       ": expected STAGE=FILE[:NAME] with a stage name such as "
                       "output, router_logits, topk_ids, experts.h");
    if (s == Stage::kInput) throw InputError("--map " + mp + ": give the input with --input");
    m[s] = resolve(mp.substr(eq + 1), "--map", u16, files);
  }
  if (!a.input.empty()) m[Stage::kInput] = resolve(a.input, "--input", u16, files);
  return m;
}

int run_import(const ImportArgs& a) {
  if (a.input.empty() == !a.seeded)
    throw InputError(
        "--input: give the input the engine consumed (--input FILE[:NAME]) or say "
        "it was moecheck's seeded input (--input-seed S); exactly one");
  require_output_file("-o", a.out, {{"--model", a.model}, {"--input", a.input}});
  std::unique_ptr<TempDir> tmp;
  std::string path = a.model;
  if (path.empty()) {
    tmp = std::make_unique<TempDir>();
    path = tmp->path() + "/default-" + default_model_options().preset + ".gguf";
    write_model(default_model_options(), path);
  }
  const LoadedModel m = load_model(path);
  if (a.layer < 0 || a.layer >= m.file.n_layers())
    throw InputError("--layer " + std::to_string(a.layer) + ": the model has layers 0 to " +
                     std::to_string(m.file.n_layers() - 1));
  const LayerWeights w = m.file.layer(a.layer);
  std::map<Stage, MappedTensor> mp = mapping(a);
  RunSpec spec;
  spec.impl = Impl::kEmu;
  spec.tokens = a.tokens;
  spec.input.seed = a.input_seed;
  spec.input.adversarial = a.adversarial;
  if (a.seeded) {
    HostTensor x;
    x.dtype = TensorDtype::kBF16;
    const std::vector<uint16_t> v = seeded_layer_input(spec, w, a.layer);
    x.shape = {static_cast<int64_t>(v.size()) / w.config.dim, w.config.dim};
    x.bytes.assign(reinterpret_cast<const uint8_t*>(v.data()),
                   reinterpret_cast<const uint8_t*>(v.data() + v.size()));
    mp[Stage::kInput] = {x, "--input-seed " + std::to_string(a.input_seed)};
  }
  Dump d;
  d.meta = make_meta(m, spec);
  d.layers.push_back(
      import_layer(w.config, a.layer, mp, a.transpose, w.shared_gate.type != GgmlType::kBF16));
  DumpMeta& meta = d.meta;
  meta.implementation = "import";
  std::string sources;
  for (const auto& [s, t] : mp) sources += (sources.empty() ? "" : " ") + t.source;
  meta.knobs = {{"engine", a.engine}, {"sources", sources}};
  meta.variant = "engine=" + a.engine;
  meta.device = "engine";
  meta.tokens = d.layers[0].tokens;
  meta.layers = {a.layer};
  meta.taps = !d.layers[0].acc.empty();
  meta.input_source = a.seeded ? (a.adversarial ? "seed+adversarial" : "seed") : "import";
  meta.input_seed = a.seeded ? a.input_seed : 0;
  for (Stage s : all_stages())
    if (mp.count(s) > 0 || (s == Stage::kExpertsWeights && meta.taps) ||
        (s == Stage::kSharedWeights && meta.taps))
      meta.stages.push_back(stage_name(s));
  write_dump(a.out, d);
  std::printf("wrote %s: layer %d, %lld token(s), stages %s (engine %s)\n", a.out.c_str(), a.layer,
              static_cast<long long>(meta.tokens), join_stage_list(meta.stages).c_str(),
              a.engine.c_str());
  return kExitSame;
}

}  // namespace

void add_import(CLI::App& app, int& rc) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* s = app.add_subcommand(
      "import", "Turn another engine's tensors (.npy, .npz, safetensors) into a moecheck dump");
  s->footer(
      "Examples:\n"
      "  moecheck import --model m.gguf --layer 0 --input x.npy --map output=y.npy -o eng.h5\n"
      "  moecheck import --model m.gguf --from engine.npz --input engine.npz:input -o eng.h5\n"
      "Then: moecheck check --model m.gguf --against eng.h5\n"
      "Exit codes: 0 written, 2 error (nothing written).");
  s->add_option("--model", a->model,
                "model GGUF file or synthetic spec (default: the embedded tiny model)");
  s->add_option("--layer", a->layer, "the layer the tensors are of")->capture_default_str();
  CLI::Option* in = s->add_option("--input", a->input,
                                  "the bf16 input [T, dim] the engine consumed: FILE.npy, "
                                  "FILE.npz:MEMBER or FILE.safetensors:TENSOR");
  CLI::Option* seed = s->add_option("--input-seed", a->input_seed,
                                    "the engine consumed moecheck's seeded input of this seed")
                          ->check(kNonNegative);
  s->add_option("--tokens", a->tokens, "with --input-seed: seeded tokens")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  std::string adv = "on";
  s->add_option("--adversarial", a->adversarial,
                "with --input-seed: the layer's 4 adversarial tokens follow (on|off)")
      ->transform(CLI::Transformer(std::map<std::string, bool>{{"on", true}, {"off", false}}))
      ->capture_default_str();
  s->add_option("--map", a->maps, "STAGE=FILE.npy | FILE.npz:MEMBER | FILE.safetensors:TENSOR")
      ->take_all();
  s->add_option("--from", a->from, ".npz / .safetensors whose members named after stages map");
  s->add_option("--dtype", a->dtype, "bf16: read '<u2' .npy arrays as bf16 bit patterns")
      ->check(CLI::IsMember({"bf16"}));
  s->add_flag("--transpose", a->transpose, "2-D tensors are [cols, T] (dim-major engines)");
  s->add_option("--engine", a->engine, "the engine's name, recorded as knob.engine");
  s->add_option("-o", a->out, "output dump")->required();
  s->callback([a, in, seed, &rc] {
    a->seeded = seed->count() > 0;
    (void)in;
    rc = run_import(*a);
  });
}

}  // namespace moecheck::cli
