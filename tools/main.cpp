// moecheck: the command line. Subcommands gen, run, diff, check, golden, inspect (one file
// each); exit codes 0 same, 1 differs, 2 error. Every error is one line on stderr naming the
// file and the field. Contract: docs/cli.md.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/commands.h"
#include "tools/json.h"

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

namespace {

using namespace moecheck::cli;

#ifndef MOECHECK_GIT_COMMIT
#define MOECHECK_GIT_COMMIT "unknown"
#endif

// The version line: the project version and the git commit `git describe` gave at configure time
// (the same string every dump records as git_commit).
constexpr const char* kVersionLine = "moecheck " MOECHECK_VERSION " (git " MOECHECK_GIT_COMMIT ")";

// The command the leading words name ("moecheck golden verify"), and in `unknown` the first word
// where a command is expected that names none, with the commands there (empty when all do).
std::string command_path(CLI::App& app, int argc, char** argv, std::string* unknown) {
  CLI::App* at = &app;
  std::string path = "moecheck";
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::vector<CLI::App*> subs = at->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) break;  // this command takes positional arguments
    CLI::App* next = nullptr;
    for (CLI::App* c : subs)
      if (c->check_name(argv[i])) next = c;
    if (next == nullptr) {
      std::string known;
      for (const CLI::App* c : subs) known += (known.empty() ? "" : ", ") + c->get_name();
      *unknown = "unknown command \"" + std::string(argv[i]) + "\" for " + path +
                 " (commands: " + known + "; see " + path + " --help)";
      break;
    }
    at = next;
    path += " " + next->get_name();
  }
  return path;
}

// --json anywhere on the command line: the error goes to stdout as JSON too.
bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i)
    if (std::string(argv[i]) == "--json") return true;
  return false;
}

// One error: `moecheck: error: <message>` on stderr, and {"error": ..., "exit": 2} on stdout
// with --json. Returns the exit code.
int fail(const std::string& message, bool json) {
  std::fprintf(stderr, "moecheck: error: %s\n", message.c_str());
  if (json) {
    Json j;
    j.begin_object().kv("error", message).kv("exit", kExitError).end_object();
    std::printf("%s\n", j.str().c_str());
  }
  return kExitError;
}

}  // namespace

int main(int argc, char** argv) {
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
  app.set_version_flag("--version", kVersionLine, "print the version and the git commit, and exit");
  app.require_subcommand(1);
  int rc = kExitSame;
  add_gen(app, rc);
  add_run(app, rc);
  add_diff(app, rc);
  add_check(app, rc);
  add_golden(app, rc);
  add_inspect(app, rc);
  add_sensitivity(app, rc);
  add_import(app, rc);
  add_export(app, rc);
  add_cache(app, rc);
  const bool json = wants_json(argc, argv);
  std::string unknown;
  const std::string command = command_path(app, argc, argv, &unknown);
  if (!unknown.empty()) return fail(unknown, json);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version: printed by CLI11, exit 0
    return app.exit(e) == 0 ? kExitSame : kExitError;
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see " + command + " --help)", json);
  } catch (const std::exception& e) {  // InputError and every other failure: exit 2
    return fail(e.what(), json);
  }
  return rc;
}
