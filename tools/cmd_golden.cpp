// `moecheck golden verify|update`: the committed golden set (golden/data/). verify regenerates
// each model from its seeds, checks the GGUF's SHA-256 against the manifest, reruns ref and emu
// and compares with the committed dumps: emu bit for bit, ref within golden_tolerance("ref").
// update rewrites the dumps and the manifest. Contract: docs/golden-format.md "Golden set".
#include <cstdio>
#include <filesystem>
#include <memory>

#include "compare/golden_verify.h"
#include "core/error.h"
#include "golden/generator.h"
#include "golden/golden_set.h"
#include "tools/commands.h"
#include "tools/preflight.h"
#include "tools/progress.h"
#include "tools/report.h"
#include "tools/runner.h"

namespace moecheck::cli {
namespace {

struct GoldenArgs {
  std::string data;  // empty: found at run time (golden_data_dir)
  bool json = false;
};

// --data, or the golden set of the source tree around the current directory: the first
// golden/data/manifest.txt in the current directory or a directory above it (as git finds .git).
// A build's own source path is not used: the binary may be run from another checkout or copied.
std::string golden_data_dir(const GoldenArgs& a) {
  if (!a.data.empty()) return a.data;
  namespace fs = std::filesystem;
  const fs::path cwd = fs::current_path();
  for (fs::path at = cwd;; at = at.parent_path()) {
    if (fs::exists(at / "golden" / "data" / kGoldenManifestName))
      return (at / "golden" / "data").string();
    if (at == at.parent_path()) break;
  }
  throw InputError(std::string("--data: not given, and no golden/data/") + kGoldenManifestName +
                   " in " + cwd.string() +
                   " or a directory above it; run inside the moecheck source tree or give "
                   "--data DIR");
}

RunSpec golden_spec(const GoldenModel& g, Impl impl) {
  RunSpec s;
  s.impl = impl;
  s.tokens = g.tokens;
  s.input.seed = g.input_seed;
  s.input.adversarial = true;
  s.taps = true;
  return s;  // default knobs: ref precision model; emu router staged, 8 warps
}

LoadedModel regenerate(const GoldenModel& g, const TempDir& tmp) {
  GenOptions o = preset_options(g.preset);
  o.n_layers = g.layers;
  o.seed = g.seed;
  o.validate();
  const std::string path = tmp.path() + "/" + g.name + ".gguf";
  const std::string sha = write_model(o, path);
  LoadedModel m = load_model(path);
  m.sha256 = sha;  // the whole file's SHA-256, computed as it was written: the manifest records it
  return m;
}

int golden_verify(const GoldenArgs& args) {
  GoldenArgs a = args;
  a.data = golden_data_dir(args);
  const std::string manifest_path = a.data + "/" + kGoldenManifestName;
  const GoldenManifest man = read_manifest(manifest_path);
  for (const char* impl : kGoldenImpls) {
    std::string why;
    if (!impl_available(parse_impl(impl, "golden"), &why)) throw InputError(why);
  }
  bool same = true;
  Json j;
  if (a.json) j.begin_object().kv("data", a.data).key("results").begin_array();
  Progress p("golden verify", static_cast<int64_t>(man.models.size() * 2), !a.json);
  for (const GoldenModel& g : man.models) {
    TempDir tmp;
    const LoadedModel m = regenerate(g, tmp);
    if (m.sha256 != g.gguf_sha256) {
      same = false;
      const std::string msg = "generator changed: regenerated " + g.name + ".gguf has sha256 " +
                              m.sha256 + ", " + manifest_path + " records " + g.gguf_sha256;
      if (a.json)
        j.begin_object().kv("model", g.name).kv("same", false).kv("error", msg).end_object();
      else std::printf("%s: FAIL %s\n", g.name.c_str(), msg.c_str());
      continue;
    }
    for (const char* impl : kGoldenImpls) {
      const Dump golden = read_dump(a.data + "/" + golden_dump_name(g, impl));
      Dump fresh = run_layers(m, golden_spec(g, parse_impl(impl, "golden")), nullptr);
      fresh.path = "regenerated " + std::string(impl);
      const DiffReport r = verify_golden_dump(golden, fresh, impl);
      same = same && r.same;
      p.step(g.name + " " + impl);
      if (a.json) {
        j.begin_object().kv("model", g.name).kv("impl", impl).kv("same", r.same).key("report");
        diff_json(j, r);
        j.end_object();
        continue;
      }
      std::printf("%s %s: %s (%s, %zu layer(s) x %lld seeded + %lld adversarial token(s))\n",
                  g.name.c_str(), impl, r.same ? "same" : "DIFFERS",
                  golden_tolerance(impl).describe().c_str(), r.layers.size(),
                  static_cast<long long>(g.tokens),
                  static_cast<long long>(golden.meta.tokens - g.tokens));
      if (!r.same) std::printf("%s", diff_text(r).c_str());
    }
  }
  if (a.json) {
    j.end_array().kv("same", same).end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("golden set %s: %s\n", a.data.c_str(), same ? "verified" : "DIFFERS");
  }
  return same ? kExitSame : kExitDiffers;
}

// Writes `fresh` to `out` unless the file already holds that content (same_golden_content: the
// build's commit and version are not content), so that an update rewrites only what changed.
// Returns whether it wrote.
bool update_dump(const std::string& out, const Dump& fresh) {
  if (std::filesystem::exists(out)) {
    try {
      if (same_golden_content(read_dump(out), fresh)) return false;
    } catch (const InputError&) {  // unreadable or malformed: replaced
    }
  }
  write_dump(out, fresh);
  return true;
}

bool same_manifest(const GoldenManifest& a, const GoldenManifest& b) {
  if (a.format != b.format || a.models.size() != b.models.size()) return false;
  for (size_t i = 0; i < a.models.size(); ++i) {
    const GoldenModel &x = a.models[i], &y = b.models[i];
    if (x.name != y.name || x.preset != y.preset || x.layers != y.layers || x.seed != y.seed ||
        x.tokens != y.tokens || x.input_seed != y.input_seed || x.gguf_sha256 != y.gguf_sha256)
      return false;
  }
  return true;
}

int golden_update(const GoldenArgs& args) {
  GoldenArgs a = args;
  a.data = golden_data_dir(args);
  const std::string manifest_path = a.data + "/" + kGoldenManifestName;
  const bool had_manifest = std::filesystem::exists(manifest_path);
  const GoldenManifest old = had_manifest ? read_manifest(manifest_path) : default_manifest();
  std::vector<std::string> targets = {kGoldenManifestName};
  for (const GoldenModel& g : old.models)
    for (const char* impl : kGoldenImpls) targets.push_back(golden_dump_name(g, impl));
  require_output_dir("--data", a.data, targets, {});
  std::filesystem::create_directories(a.data);
  GoldenManifest man = old;
  for (GoldenModel& g : man.models) {
    TempDir tmp;
    const LoadedModel m = regenerate(g, tmp);
    g.gguf_sha256 = m.sha256;
    for (const char* impl : kGoldenImpls) {
      const std::string out = a.data + "/" + golden_dump_name(g, impl);
      if (update_dump(out, run_layers(m, golden_spec(g, parse_impl(impl, "golden")), nullptr)))
        std::printf("wrote %s (%lld bytes)\n", out.c_str(),
                    static_cast<long long>(std::filesystem::file_size(out)));
      else std::printf("unchanged %s (same content; left untouched)\n", out.c_str());
    }
  }
  if (had_manifest && same_manifest(old, man)) {
    std::printf("unchanged %s\n", manifest_path.c_str());
    return kExitSame;
  }
  write_manifest(manifest_path, man);
  std::printf("wrote %s\n", manifest_path.c_str());
  return kExitSame;
}

}  // namespace

void add_golden(CLI::App& app, int& rc) {
  auto a = std::make_shared<GoldenArgs>();
  CLI::App* s =
      app.add_subcommand("golden", "Verify or update the committed golden set (golden/data/)");
  s->require_subcommand(1);
  s->footer(
      "Examples:\n  moecheck golden verify\n  moecheck golden update --data golden/data\n"
      "verify: emu dumps bit for bit, ref dumps within |a-b| <= 1e-4 + 2^-7 |a|, model SHA-256 as "
      "recorded.\n"
      "Exit codes: 0 verified / written, 1 differs, 2 error.");
  CLI::App* v = s->add_subcommand("verify", "Regenerate and compare with the committed dumps");
  const char* data_help =
      "golden set directory (default: golden/data of the source tree around the current "
      "directory)";
  v->add_option("--data", a->data, data_help);
  v->add_flag("--json", a->json, "machine-readable output");
  v->callback([a, &rc] { rc = golden_verify(*a); });
  CLI::App* u = s->add_subcommand("update", "Regenerate the dumps and the manifest's SHA-256");
  u->add_option("--data", a->data, data_help);
  u->callback([a, &rc] { rc = golden_update(*a); });
}

}  // namespace moecheck::cli
