// The committed golden set (golden/data/): a text manifest of generation seeds plus the ref and
// emu dumps of the tiny and small models. The GGUF files are not committed: `moecheck golden
// verify` regenerates them from the seeds (their SHA-256 in the manifest detects a generator
// change) and compares fresh dumps with the committed ones (compare/golden_verify.h: emu bit for
// bit, ref within a derived tolerance). Contract: docs/golden-format.md "Golden set".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck {

struct GoldenModel {
  std::string name;    // file stem: <name>.gguf, <name>_ref.h5, <name>_emu.h5
  std::string preset;  // generator preset
  int layers = 1;
  uint64_t seed = 1;  // generator seed
  int64_t tokens = 1;
  uint64_t input_seed = 1;
  std::string gguf_sha256;  // of the regenerated model file
};

struct GoldenManifest {
  int format = 1;
  std::vector<GoldenModel> models;
};

inline constexpr const char* kGoldenManifestName = "manifest.txt";
inline constexpr const char* kGoldenImpls[] = {"ref", "emu"};

// Parses the manifest; InputError naming the file, line and field for anything malformed.
GoldenManifest read_manifest(const std::string& path);
// Writes it atomically (temporary + rename).
void write_manifest(const std::string& path, const GoldenManifest& m);
// tiny: 2 layers x 4 tokens; small: 1 layer x 2 tokens; seeds 1 (sha256 filled by `update`).
GoldenManifest default_manifest();
std::string golden_dump_name(const GoldenModel& g, const std::string& impl);

}  // namespace moecheck
