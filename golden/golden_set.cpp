// The golden set's manifest (golden/data/manifest.txt) and comparison policy.
// Contract: docs/golden-format.md "Golden set".
#include "golden/golden_set.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"

namespace moecheck {
namespace {

uint64_t parse_u64(const std::string& v, const std::string& where) {
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
    throw InputError(where + ": expected an unsigned integer, found \"" + v + "\"");
  return std::stoull(v);
}

}  // namespace

GoldenManifest read_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open the golden manifest");
  GoldenManifest m;
  m.format = 0;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string at = path + ":" + std::to_string(n);
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "format") {
      std::string v;
      ls >> v;
      m.format = static_cast<int>(parse_u64(v, at + " format"));
      if (m.format != 1) throw InputError(at + ": format: this tool reads 1, found " + v);
      continue;
    }
    if (kind != "model")
      throw InputError(at + ": expected \"format\" or \"model\", found \"" + kind + "\"");
    std::map<std::string, std::string> kv;
    std::string tok;
    while (ls >> tok) {
      const size_t eq = tok.find('=');
      if (eq == std::string::npos)
        throw InputError(at + ": expected key=value, found \"" + tok + "\"");
      kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    auto get = [&](const char* k) {
      auto it = kv.find(k);
      if (it == kv.end()) throw InputError(at + ": missing field " + k);
      return it->second;
    };
    GoldenModel g;
    g.name = get("name");
    if (g.name.empty() || g.name.find_first_of("/\\. ") != std::string::npos)
      throw InputError(at + ": field name: \"" + g.name + "\" is not a plain file stem");
    g.preset = get("preset");
    g.layers = static_cast<int>(parse_u64(get("layers"), at + " field layers"));
    g.seed = parse_u64(get("seed"), at + " field seed");
    g.tokens = static_cast<int64_t>(parse_u64(get("tokens"), at + " field tokens"));
    g.input_seed = parse_u64(get("input_seed"), at + " field input_seed");
    g.gguf_sha256 = get("gguf_sha256");
    if (g.layers <= 0 || g.tokens <= 0)
      throw InputError(at + ": fields layers and tokens must be positive");
    if (g.gguf_sha256.size() != 64 ||
        g.gguf_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw InputError(at + ": field gguf_sha256: expected 64 lower-case hex digits");
    m.models.push_back(std::move(g));
  }
  if (m.format != 1) throw InputError(path + ": missing \"format 1\" line");
  if (m.models.empty()) throw InputError(path + ": no \"model\" lines");
  return m;
}

void write_manifest(const std::string& path, const GoldenManifest& m) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << "# moecheck golden set. The models are regenerated from these seeds (gguf_sha256 "
           "detects a\n"
           "# generator change); <name>_ref.h5 and <name>_emu.h5 are their dumps (moecheck run "
           "--taps).\n"
           "# Written by `moecheck golden update`; checked by `moecheck golden verify`.\n";
    out << "format " << m.format << "\n";
    for (const GoldenModel& g : m.models)
      out << "model name=" << g.name << " preset=" << g.preset << " layers=" << g.layers
          << " seed=" << g.seed << " tokens=" << g.tokens << " input_seed=" << g.input_seed
          << " gguf_sha256=" << g.gguf_sha256 << "\n";
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw InputError(path + ": cannot write the golden manifest");
    }
  }
  std::filesystem::rename(tmp, path);
}

GoldenManifest default_manifest() {
  GoldenManifest m;
  m.models.push_back(GoldenModel{"tiny", "tiny", 2, 1, 4, 1, ""});
  m.models.push_back(GoldenModel{"small", "small", 1, 1, 2, 1, ""});
  return m;
}

std::string golden_dump_name(const GoldenModel& g, const std::string& impl) {
  return g.name + "_" + impl + ".h5";
}

}  // namespace moecheck
