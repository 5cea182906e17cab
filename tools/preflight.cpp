// Checks before any work: output paths, ignored knobs, memory. Contract: docs/cli.md "Checks
// before any work".
#include "tools/preflight.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/blocks.h"
#include "core/error.h"
#include "golden/model_file.h"

namespace moecheck::cli {
namespace {

namespace fs = std::filesystem;

// The same file: one inode when both exist (symlinks and hard links seen through), else the same
// canonical path (the parts that exist resolved).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

// `dir` is an existing directory this process may create files in.
void require_writable_dir(const std::string& what, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw InputError(what + ": directory " + dir.string() + " does not exist");
  if (!fs::is_directory(dir, ec))
    throw InputError(what + ": " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(what + ": directory " + dir.string() + " is not writable (" +
                     std::strerror(errno) + ")");
}

// `what`: the flag and its value; `inside`: the file within a directory flag's value, or "".
void require_not_an_input(const std::string& what, const std::string& out,
                          const std::string& inside, const std::vector<NamedPath>& inputs) {
  for (const NamedPath& in : inputs)
    // A synthetic model spec names no file, so no output can replace it.
    if (!in.path.empty() && !is_synthetic_spec(in.path) && same_file(out, in.path))
      throw InputError(what + ": " + (inside.empty() ? "" : inside + " ") + "is the same file as " +
                       in.flag + " " + in.path + " (writing it would replace that input)");
}

}  // namespace

void require_output_file(const std::string& flag, const std::string& path,
                         const std::vector<NamedPath>& inputs) {
  const std::string what = flag + " " + path;
  if (path.empty()) throw InputError(flag + ": empty file name");
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw InputError(what + ": is a directory (expected the name of a file to write)");
  const fs::path parent = fs::path(path).parent_path();
  require_writable_dir(what, parent.empty() ? fs::path(".") : parent);
  require_not_an_input(what, path, "", inputs);
}

void require_output_dir(const std::string& flag, const std::string& dir,
                        const std::vector<std::string>& files,
                        const std::vector<NamedPath>& inputs) {
  const std::string what = flag + " " + dir;
  if (dir.empty()) throw InputError(flag + ": empty directory name");
  std::error_code ec;
  fs::path at(dir);
  if (fs::exists(at, ec) && !fs::is_directory(at, ec))
    throw InputError(what + ": is not a directory");
  // The nearest directory that exists: the files go there, or their directories are made there.
  while (!at.empty() && !fs::exists(at, ec)) at = at.parent_path();
  require_writable_dir(what, at.empty() ? fs::path(".") : at);
  for (const std::string& f : files) {
    const std::string out = (fs::path(dir) / f).string();
    require_not_an_input(what, out, out, inputs);
  }
}

void refuse_knob(const std::string& flag, const std::string& value, const std::string& owners,
                 const std::string& knob, const std::string& chosen) {
  const bool several = owners.find(" and ") != std::string::npos;
  const bool vowel = std::string("aeiou").find(knob.empty() ? 'x' : knob[0]) != std::string::npos;
  throw InputError(flag + " " + value + ": only the " + owners +
                   (several ? " implementations have " : " implementation has ") +
                   (vowel ? "an " : "a ") + knob + " knob; " + chosen);
}

uint64_t tap_bytes_per_token(const MoeConfig& c) {
  const uint64_t d = static_cast<uint64_t>(c.dim), i = static_cast<uint64_t>(c.inter);
  const uint64_t q8_bytes_d = d / kQK8_1 * sizeof(BlockQ8_1);
  const uint64_t q8_bytes_i = i / kQK8_1 * sizeof(BlockQ8_1);
  // One (expert, token) pair: token id, routing weight, gate / up / h (f32), h_q8, down (f32).
  const uint64_t pair = 4 + 4 + 3 * 4 * i + q8_bytes_i + 4 * d;
  const uint64_t pairs = static_cast<uint64_t>(c.topk + c.n_shared);
  return basic_bytes_per_token(c) + q8_bytes_d + pairs * pair + 4 * d /* acc */;
}

uint64_t basic_bytes_per_token(const MoeConfig& c) {
  const uint64_t d = static_cast<uint64_t>(c.dim);
  // input bf16, image mask, router logits f32, top-k ids and weights, output bf16
  return 2 * d + 1 + 4 * static_cast<uint64_t>(c.n_routed) + 8 * static_cast<uint64_t>(c.topk) +
         2 * d;
}

uint64_t mem_available(std::string* source) {
  const char* env = std::getenv("MOECHECK_MEMINFO");
  const std::string path = env != nullptr && *env ? env : "/proc/meminfo";
  if (source) *source = path;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t v = 0;
    std::string unit;
    if (!(in >> v)) return 0;
    in >> unit;
    return unit == "kB" ? v * 1024 : v;
  }
  return 0;
}

void require_memory(const std::string& flag, const std::string& value, const MemoryNeed& need) {
  std::string source;
  const uint64_t avail = mem_available(&source);
  if (avail == 0 || need.bytes <= avail) return;
  throw InputError(flag + " " + value + ": needs about " + bytes_text(need.bytes) + " of memory (" +
                   need.how + "), more than the " + bytes_text(avail) +
                   " this machine has available (MemAvailable in " + source +
                   "); use fewer tokens or layers (docs/cli.md \"Checks before any work\")");
}

uint64_t synthetic_layer_bytes(const ModelFile& m) {
  if (!m.synthetic()) return 0;
  uint64_t n = 0;  // every layer of a synthetic model has the same tensors: layer 0's
  for (const gguf::TensorInfo& t : m.gguf().tensors())
    if (t.name.rfind("blk.0.", 0) == 0) n += t.nbytes;
  return n;
}

std::string bytes_text(uint64_t n) {
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", v, kUnits[u]);
  return buf;
}

}  // namespace moecheck::cli
