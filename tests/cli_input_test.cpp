// The command line's refusals (docs/cli.md "Checks before any work", docs/reliability.md "Bad
// input (command line)"): each bad flag value is exit 2 before any work, with one line
// `moecheck: error: <flag> <value>: ...` on stderr, and nothing written. Also the parse errors,
// unknown commands, --version and the JSON form of an error.
// Repro: the failing command line is printed with every expectation.
#include <sys/stat.h>

#include <string>
#include <tuple>
#include <vector>

#include "cli_test_util.h"

namespace moecheck::testing {
namespace {

class CliInput : public CliFixture {};

// gen --alignment: a power of two in [8, 65536] (golden/generator.h: 1 and 2 write a model that
// `run` refuses; 2^31 pads each tensor to 2 GiB).
TEST_F(CliInput, GenAlignmentOutsidePowersOfTwo8To65536IsRefused) {
  for (const char* a : {"0", "1", "2", "4", "48", "131072", "2147483648"}) {
    const CliResult r =
        run(std::string("gen --preset tiny --alignment ") + a + " -o " + p("a.gguf"));
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err,
                    std::string("moecheck: error: --alignment ") + a +
                        ": expected a power of two in [8, 65536]",
                    r);
    EXPECT_FALSE(fs::exists(p("a.gguf"))) << r.cmd;
  }
  for (const char* a : {"8", "65536"}) {
    const CliResult g =
        run(std::string("gen --preset tiny --alignment ") + a + " -o " + p("a.gguf"));
    EXPECT_EXIT_CODE(g, 0);
    const CliResult r =
        run("run --impl emu --model " + p("a.gguf") + " --tokens 2 -o " + p("a.h5"));
    EXPECT_EXIT_CODE(r, 0);  // every alignment gen writes is one the loader runs
  }
}

// diff: a tolerance that is negative, NaN or infinite, a negative --ulp (CLI11 would wrap it to
// 2^64 - 1), and --rtol or --atol alone are refused before either dump is read.
TEST_F(CliInput, DiffToleranceNegativeNanInfOrAloneIsRefused) {
  const std::string dumps = "diff " + p("a.h5") + " " + p("b.h5") + " ";
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--rtol -0.1 --atol 0", "--rtol -0.1: expected a finite number >= 0"},
           {"--rtol 0 --atol nan", "--atol nan: expected a finite number >= 0"},
           {"--rtol inf --atol 0", "--rtol inf: expected a finite number >= 0"},
           {"--nmse -1", "--nmse -1: expected a finite number >= 0"},
           {"--ulp -1", "--ulp -1: expected a whole number >= 0"},
           {"--rtol 0.01", "--rtol 0.01: give --atol too"},
           {"--atol 1e-3", "--atol 1e-3: give --rtol too"}}) {
    const CliResult r = run(dumps + args);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "moecheck: error: " + msg, r);
  }
}

// A knob the chosen implementation does not have would be ignored: refused, as --route is.
TEST_F(CliInput, KnobsTheImplementationIgnoresAreRefused) {
  const std::string model = " --model " + p("tiny.gguf") + " -o " + p("k.h5");
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--impl ref --warps 4",
            "--warps 4: only the emu and cuda implementations have an expert-warps knob; --impl "
            "ref would ignore it"},
           {"--impl ref --router plain", "--router plain: only the emu and cuda implementations"},
           {"--impl ref --shared-side off",
            "--shared-side off: only the cuda implementation has a shared-side knob"},
           {"--impl emu --shared-side on", "--shared-side on: only the cuda implementation"},
           {"--impl emu --mmvq-max-rows 0",
            "--mmvq-max-rows 0: only the cuda implementation has a mmvq-max-rows knob"},
           {"--impl emu --precision exact",
            "--precision exact: only the ref implementation has a precision knob; --impl emu "
            "would ignore it"}}) {
    const CliResult r = run("run " + args + model);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "moecheck: error: " + msg, r);
    EXPECT_FALSE(fs::exists(p("k.h5"))) << r.cmd;
  }
  const CliResult c = run("check --model " + p("tiny.gguf") + " --impls emu --precision exact");
  EXPECT_EXIT_CODE(c, 2);
  EXPECT_CONTAINS(c.err,
                  "--precision exact: only the ref implementation has a precision knob; "
                  "--impls emu does not run it",
                  c);
  EXPECT_EXIT_CODE(run("run --impl emu --router plain --warps 4" + model), 0);
}

// --tokens: the memory estimate against MemAvailable ($MOECHECK_MEMINFO stands in for
// /proc/meminfo), named in the message with both numbers, before any work.
TEST_F(CliInput, TokensBeyondMemAvailableAreRefusedBeforeAnyWork) {
  std::ofstream(p("small_meminfo")) << "MemTotal:        2000 kB\nMemAvailable:    1000 kB\n";
  std::ofstream(p("large_meminfo")) << "MemAvailable:    1000000000 kB\n";
  const std::string small = "MOECHECK_MEMINFO=" + p("small_meminfo");
  for (const std::string& cmd :
       {"run --impl emu --model " + p("tiny.gguf") + " --tokens 64 -o " + p("m.h5"),
        "check --model " + p("tiny.gguf") + " --tokens 64 --keep " + p("kept"),
        "sensitivity --model " + p("tiny.gguf") + " --tokens 64"}) {
    const CliResult r = run_with(small, cmd, "");
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "moecheck: error: --tokens 64: needs about ", r);
    EXPECT_CONTAINS(r.err,
                    "more than the 1.02 MB this machine has available (MemAvailable in " +
                        p("small_meminfo") + ")",
                    r);
    EXPECT_EQ(r.out, "") << r.cmd;
    EXPECT_FALSE(fs::exists(p("m.h5")) || fs::exists(p("kept"))) << r.cmd;
  }
  // 64 tokens x 2 layers of tiny, with taps: 2 x 2 x 64 x 31.8 kB + 2 x 64 x 31.8 kB = 12.2 MB.
  const CliResult t = run_with(
      small, "run --impl emu --taps --model " + p("tiny.gguf") + " --tokens 64 -o " + p("m.h5"),
      "");
  EXPECT_CONTAINS(t.err, "needs about 12.2 MB of memory", t);
  const CliResult ok =
      run_with("MOECHECK_MEMINFO=" + p("large_meminfo"),
               "run --impl emu --model " + p("tiny.gguf") + " --tokens 64 -o " + p("m.h5"), "");
  EXPECT_EXIT_CODE(ok, 0);
}

// -o and --keep: a writable directory, not a directory itself, never one of the command's inputs
// (through a symlink or a hard link too). The model must survive the attempt.
TEST_F(CliInput, OutputThatIsAnInputOrUnwritableIsRefused) {
  const std::string model = p("tiny.gguf");
  const std::string before = slurp_file(model);
  fs::create_symlink(model, p("link.h5"));
  fs::create_hard_link(model, p("hard.h5"));
  ASSERT_EQ(run("run --impl emu --model " + model + " -o " + p("in.h5")).code, 0);
  fs::create_directories(p("keep"));
  fs::create_symlink(model, p("keep/emu.h5"));
  const std::string emu = "run --impl emu --model " + model;
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {emu + " -o " + model, "-o " + model + ": is the same file as --model " + model},
           {emu + " -o " + p("link.h5"), "-o " + p("link.h5") + ": is the same file as --model"},
           {emu + " -o " + p("hard.h5"), "-o " + p("hard.h5") + ": is the same file as --model"},
           {emu + " --input " + p("in.h5") + " -o " + p("in.h5"),
            "-o " + p("in.h5") + ": is the same file as --input " + p("in.h5")},
           {emu + " -o " + p("nodir/x.h5"),
            "-o " + p("nodir/x.h5") + ": directory " + p("nodir") + " does not exist"},
           {emu + " -o " + p("keep"), "-o " + p("keep") + ": is a directory"},
           {"gen --preset tiny -o " + p("nodir/m.gguf"),
            "-o " + p("nodir/m.gguf") + ": directory " + p("nodir") + " does not exist"},
           {"check --model " + model + " --keep " + p("keep"),
            "--keep " + p("keep") + ": " + p("keep/emu.h5") + " is the same file as --model"},
           {"check --model " + model + " --keep " + model,
            "--keep " + model + ": is not a directory"},
           {"golden update --data " + model, "--data " + model + ": is not a directory"}}) {
    const CliResult r = run(args);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "moecheck: error: " + msg, r);
  }
  EXPECT_EQ(slurp_file(model), before) << "the model was changed";
  EXPECT_TRUE(fs::is_symlink(p("keep/emu.h5")));
  {  // a read-only directory, injected by the shim (tests/shim/fail_io.c: root writes anywhere)
    fs::create_directories(p("ro"));
    const CliResult r = run_with("LD_PRELOAD=" MOECHECK_BINARY_DIR
                                 "/tests/fail_io_shim.so ASAN_OPTIONS=verify_asan_link_order=0 "
                                 "MOECHECK_SHIM_EROFS_DIR=" +
                                     p("ro"),
                                 emu + " -o " + p("ro/x.h5"), "");
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "directory " + p("ro") + " is not writable (Read-only file system)", r);
  }
}

// CLI11's own errors, an unknown command and --version in the `moecheck: error:` form.
TEST_F(CliInput, ParseErrorsUnknownCommandsAndVersion) {
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"frobnicate",
            "moecheck: error: unknown command \"frobnicate\" for moecheck (commands: "
            "gen, run, diff, check, golden, inspect, sensitivity"},
           {"golden frob",
            "unknown command \"frob\" for moecheck golden (commands: verify, update"},
           {"run --impl emu", "moecheck: error: --model is required (see moecheck run --help)"},
           {"run --impl gpu --model x", "moecheck: error: --impl: "},
           {"diff a.h5 b.h5 --bogus", "moecheck: error: "},
           {"", "moecheck: error: A subcommand is required"}}) {
    const CliResult r = run(args);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, msg, r);
  }
  const CliResult v = run("--version");
  EXPECT_EXIT_CODE(v, 0);
  EXPECT_EQ(v.out.rfind("moecheck " MOECHECK_VERSION " (git ", 0), 0u) << v.out;
}

// With --json an error is also one JSON object on stdout; the stderr line stays.
TEST_F(CliInput, JsonErrorsAreAJsonObjectOnStdout) {
  const CliResult r =
      run("run --impl ref --warps 2 --model " + p("tiny.gguf") + " -o " + p("j.h5") + " --json");
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_EQ(r.out,
            "{\"error\":\"--warps 2: only the emu and cuda implementations have an expert-warps "
            "knob; --impl ref would ignore it\",\"exit\":2}\n")
      << r.cmd;
  EXPECT_CONTAINS(r.err, "moecheck: error: --warps 2", r);
  const CliResult parse = run("diff " + p("a.h5") + " --json");
  EXPECT_EXIT_CODE(parse, 2);
  EXPECT_EQ(parse.out.rfind("{\"error\":\"B is required", 0), 0u) << parse.out;
  const CliResult missing = run("inspect " + p("absent.gguf") + " --json");
  EXPECT_EQ(missing.out,
            "{\"error\":\"" + p("absent.gguf") + ": file does not exist\",\"exit\":2}\n");
}

// golden --data defaults to golden/data of the tree around the current directory; outside any
// tree it is required.
TEST_F(CliInput, GoldenDataDefaultIsFoundFromTheCurrentDirectory) {
  fs::create_directories(p("tree/golden/data"));
  fs::create_directories(p("tree/a/b"));
  std::ofstream(p("tree/golden/data/manifest.txt")) << "format 1\n";  // found, then refused
  const CliResult found = run_with("", "golden verify", p("tree/a/b"));
  EXPECT_EXIT_CODE(found, 2);
  EXPECT_CONTAINS(found.err, p("tree/golden/data") + "/manifest.txt: no \"model\" lines", found);
  fs::create_directories(p("elsewhere"));
  const CliResult none = run_with("", "golden verify", p("elsewhere"));
  EXPECT_EXIT_CODE(none, 2);
  EXPECT_CONTAINS(none.err, "moecheck: error: --data: not given, and no golden/data/manifest.txt",
                  none);
}

}  // namespace
}  // namespace moecheck::testing
