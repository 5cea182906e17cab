// The subcommands of `moecheck`, one file each (cmd_<name>.cpp). Each registers itself on the
// CLI11 app and, when chosen, stores its exit code in `rc`: 0 same / done, 1 differs, 2 error
// (errors are thrown as InputError and mapped to 2 by main). Contract: docs/cli.md.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace moecheck::cli {

inline constexpr int kExitSame = 0;
inline constexpr int kExitDiffers = 1;
inline constexpr int kExitError = 2;

// For unsigned options: CLI11 reads "-1" into a uint64_t as 2^64 - 1; this refuses a leading '-'
// ("expected a whole number >= 0, found -1").
inline CLI::Validator kNonNegative(
    [](std::string& s) {
      return !s.empty() && s[0] == '-' ? "expected a whole number >= 0, found " + s : std::string();
    },
    "UINT");

void add_gen(CLI::App& app, int& rc);
void add_run(CLI::App& app, int& rc);
void add_diff(CLI::App& app, int& rc);
void add_check(CLI::App& app, int& rc);
void add_golden(CLI::App& app, int& rc);
void add_inspect(CLI::App& app, int& rc);
void add_sensitivity(CLI::App& app, int& rc);
void add_import(CLI::App& app, int& rc);
void add_export(CLI::App& app, int& rc);
void add_cache(CLI::App& app, int& rc);

// --image-tokens' value must name some token (an empty list would silently mean "no mask").
inline CLI::Validator image_tokens_validator() {
  return CLI::Validator(
      [](std::string& v) {
        return v.empty() ? std::string("expected token indices or ranges, e.g. 3-17,40-60")
                         : std::string();
      },
      "LIST");
}

// A fresh private directory under $TMPDIR (or /tmp), removed with everything in it on scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace moecheck::cli
