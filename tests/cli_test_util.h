// Shared by the tests that drive the built `moecheck` binary (tests/cli_input_test.cpp,
// tests/cli_output_test.cpp): a private directory with a tiny model, a runner that captures the
// exit code, stdout and stderr (with an environment and a working directory when asked), and
// expectations that print the failing command line as a repro.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moecheck::testing {

namespace fs = std::filesystem;

inline const std::string kCliBinary = MOECHECK_BINARY_DIR "/tools/moecheck";

struct CliResult {
  int code = -1;
  std::string out, err, cmd;
};

inline std::string slurp_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A test suite with its own directory (removed at the end) holding tiny.gguf (tiny, 2 layers,
// seed 1). `run` is one moecheck command line; `run_with` puts `env` ("NAME=value ...") before it
// and runs it from `cwd` when given.
class CliFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moecheck_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kCliBinary)) << kCliBinary << " is not built";
    const CliResult g = run("gen --preset tiny --layers 2 --seed 1 -o " + p("tiny.gguf"));
    ASSERT_EQ(g.code, 0) << g.cmd << "\n" << g.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string p(const std::string& name) { return (dir_ / name).string(); }

  static CliResult run(const std::string& args) { return run_with("", args, ""); }

  static CliResult run_with(const std::string& env, const std::string& args,
                            const std::string& cwd) {
    CliResult r;
    const fs::path out = dir_ / ".stdout", err = dir_ / ".stderr";
    r.cmd = (cwd.empty() ? "" : "cd " + cwd + " && ") + env + (env.empty() ? "" : " ") +
            kCliBinary + " " + args;
    const std::string sh = r.cmd + " >" + out.string() + " 2>" + err.string();
    const int st = std::system(sh.c_str());
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp_file(out);
    r.err = slurp_file(err);
    return r;
  }

  static fs::path dir_;
};
inline fs::path CliFixture::dir_;

}  // namespace moecheck::testing

#define EXPECT_EXIT_CODE(res, want)                                      \
  EXPECT_EQ((res).code, want) << "repro: " << (res).cmd << "\nstdout:\n" \
                              << (res).out << "\nstderr:\n"              \
                              << (res).err
#define EXPECT_CONTAINS(res_text, needle, res)                                   \
  EXPECT_NE((res_text).find(needle), std::string::npos)                          \
      << "missing \"" << (needle) << "\"\nrepro: " << (res).cmd << "\nstdout:\n" \
      << (res).out << "\nstderr:\n"                                              \
      << (res).err
