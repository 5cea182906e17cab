// moecheck: the command line. Subcommands gen, run, diff, check, golden, inspect (one file
// each); exit codes 0 same, 1 differs, 2 error. Every error is one line on stderr naming the
// file and the field. Contract: docs/cli.md.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "core/error.h"
#include "tools/commands.h"

namespace moecheck::cli {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr && *base ? base : "/tmp") + "/moecheck-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw InputError(tmpl + ": cannot create a temporary directory");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace moecheck::cli

int main(int argc, char** argv) {
  using namespace moecheck::cli;
  CLI::App app{
      "moecheck: one DeepSeek-V4.1 Flash MoE layer on still-quantised experts, in three\n"
      "implementations (ref, emu, cuda) compared per layer.",
      "moecheck"};
  app.footer(
      "Examples:\n"
      "  moecheck check                                  # embedded tiny model, every "
      "implementation\n"
      "  moecheck gen --preset small --layers 2 --seed 7 -o small.gguf\n"
      "  moecheck run --impl emu --model small.gguf --layers 0-1 --tokens 8 --taps -o emu.h5\n"
      "  moecheck diff emu.h5 cuda.h5 --exact\n"
      "  moecheck golden verify\n"
      "  moecheck inspect small.gguf\n"
      "Exit codes: 0 same (or done), 1 differs, 2 error (bad input: the message names the file and "
      "field).");
  app.require_subcommand(1);
  int rc = kExitSame;
  add_gen(app, rc);
  add_run(app, rc);
  add_diff(app, rc);
  add_check(app, rc);
  add_golden(app, rc);
  add_inspect(app, rc);
  add_sensitivity(app, rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitSame : kExitError;
  } catch (const moecheck::InputError& e) {
    std::fprintf(stderr, "moecheck: error: %s\n", e.what());
    return kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moecheck: error: %s\n", e.what());
    return kExitError;
  }
  return rc;
}
