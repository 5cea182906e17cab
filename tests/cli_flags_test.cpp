// Every flag of every command with a bad value: exit 2 before any work, one `moecheck: error:`
// line that names the flag (or the file it names). The table is docs/reliability.md "Bad input
// (every flag)"; the refusals with rules of their own (tolerances, knobs, memory, output paths)
// are tests/cli_input_test.cpp, the files tests/cli_io_test.cpp.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_test_util.h"

namespace moecheck::testing {
namespace {

class CliFlags : public CliFixture {};

// The expert cache's environment overrides are checked like flags (exit 2 naming the variable,
// nothing written), and a flag on the command line wins over them.
TEST_F(CliFlags, StreamEnvironmentOverridesAreCheckedAndFlagsWin) {
  const std::string o = p("env_out.h5");
  for (const char* env : {"MOECHECK_CACHE_SLOTS=abc", "MOECHECK_READER_THREADS=99",
                          "MOECHECK_PREFETCH_K=-1", "MOECHECK_CACHE_BYTES=7XB"}) {
    const CliResult r = run_with(env, "run --impl cuda --model " + p("tiny.gguf") + " -o " + o, "");
    EXPECT_EXIT_CODE(r, 2);
    const std::string name = std::string(env).substr(0, std::string(env).find('='));
    EXPECT_CONTAINS(r.err, "environment variable " + name, r);
    EXPECT_FALSE(fs::exists(o)) << r.cmd;
  }
  // --cache-slots given: MOECHECK_CACHE_BYTES is not applied on top of it (both sizes would be
  // refused), so the run goes on to the next refusal, the missing reader pool of --prefetch-k.
  const CliResult w = run_with(
      "MOECHECK_CACHE_BYTES=1GB",
      "run --impl cuda --model " + p("tiny.gguf") + " --cache-slots 8 --prefetch-k 2 -o " + o, "");
  EXPECT_EXIT_CODE(w, 2);
  EXPECT_CONTAINS(w.err, "--prefetch-k 2: prefetch reads in the reader pool", w);
  // An environment override that asks for prefetch without a reader pool is refused by name too.
  const CliResult e =
      run_with("MOECHECK_PREFETCH_K=3",
               "run --impl cuda --model " + p("tiny.gguf") + " --cache-slots 8 -o " + o, "");
  EXPECT_EXIT_CODE(e, 2);
  EXPECT_CONTAINS(e.err, "--prefetch-k 3: prefetch reads in the reader pool", e);
}

struct Case {
  std::string args;    // {m}: the tiny model, {d}: a dump of it, {x}: a text file, {o}: an output
  std::string needle;  // in the error line
};

std::string fill(std::string s, const std::string& key, const std::string& v) {
  for (size_t at; (at = s.find(key)) != std::string::npos;) s.replace(at, key.size(), v);
  return s;
}

TEST_F(CliFlags, EveryFlagsBadValueIsExit2NamingIt) {
  const CliResult d =
      run("run --impl emu --model " + p("tiny.gguf") + " --tokens 2 -o " + p("d.h5"));
  ASSERT_EQ(d.code, 0) << d.err;
  { std::ofstream(p("x.txt")) << "not a model\n"; }
  const std::vector<Case> cases = {
      {"gen --preset huge -o {o}", "--preset: huge not in {tiny,small,ds41}"},
      {"gen --layers 0 -o {o}", "--layers: Value 0 not in range"},
      {"gen --seed -1 -o {o}", "--seed: expected a whole number >= 0, found -1"},
      {"gen --preset tiny", "--output is required"},
      {"gen --shared x -o {o}", "--shared: x not in {bf16,kquant}"},
      {"gen --blocks x -o {o}", "--blocks: x not in {quantized,random}"},
      {"run --impl x --model {m} -o {o}", "--impl: x not in {ref,emu,cuda}"},
      {"run --impl emu --model missing.gguf -o {o}", "missing.gguf: model file does not exist"},
      {"run --impl emu --model {x} -o {o}", "magic: expected \"GGUF\""},
      {"run --impl emu --model {m} --layers 5 -o {o}", "--layers: layer 5 is not in"},
      {"run --impl emu --model {m} --layers a -o {o}", "\"a\" is not a layer number"},
      {"run --impl emu --model {m} --tokens 0 -o {o}", "--tokens: Value 0 not in range"},
      {"run --impl emu --model {m} --tokens -3 -o {o}", "--tokens: Value -3 not in range"},
      {"run --impl emu --model {m} --input-seed -1 -o {o}",
       "--input-seed: expected a whole number"},
      {"run --impl emu --model {m} --input missing.h5 -o {o}", "missing.h5: cannot open"},
      {"run --impl emu --model {m} --input {x} -o {o}", "not an HDF5 file"},
      {"run --impl emu --model {m} --input {d} --chain -o {o}", "it cannot be combined with"},
      {"run --impl ref --model {m} --precision x -o {o}", "--precision: x not in {model,exact}"},
      {"run --impl emu --model {m} --router x -o {o}", "--router: x not in {plain,staged}"},
      {"run --impl emu --model {m} --warps 3 -o {o}", "--warps: 3 not in {2,4,8}"},
      {"run --impl cuda --model {m} --shared-side x -o {o}", "--shared-side: x not in {on,off}"},
      {"run --impl cuda --model {m} --route x -o {o}", "--route: route must be host or device"},
      {"run --impl cuda --model {m} --mmvq-max-rows 9 -o {o}", "--mmvq-max-rows: Value 9 not in"},
      {"run --impl cuda --model {m} --mmvq-max-rows -2 -o {o}", "--mmvq-max-rows: Value -2 not in"},
      {"run --impl emu --model {m} --image-tokens 1 -o {o}", "--image-tokens: "},
      {"run --impl emu --model {m}", "--output is required"},
      {"diff {d} missing.h5", "missing.h5: cannot open"},
      {"diff {d} {x}", "not an HDF5 file"},
      {"diff {d} {d} --model missing.gguf", "missing.gguf: model file does not exist"},
      {"check --model {m} --impls foo", "--impls: expected \"ref\", \"emu\" or \"cuda\""},
      {"check --model {m} --tokens 0", "--tokens: Value 0 not in range"},
      {"check --model {m} --layers 9", "--layers: layer 9 is not in"},
      {"check --model {m} --adversarial x", "--adversarial: x not in {on,off}"},
      {"check --model {m} --route x", "--route: route must be host or device"},
      {"check --model {m} --input-seed -2", "--input-seed: expected a whole number"},
      {"inspect missing.h5", "missing.h5: file does not exist"},
      {"inspect {x}", "magic: expected \"GGUF\""},
      {"sensitivity --model {m} --layer 9", "--layer 9: "},
      {"sensitivity --model {m} --expert 999", "--expert 999: the layer has 16 routed experts"},
      {"sensitivity --model {m} --classes foo", "--classes: unknown perturbation class \"foo\""},
      {"sensitivity --model {m} --impl ref", "--impl: ref not in {emu,cuda}"},
      {"sensitivity --model {m} --tokens 0", "--tokens: Value 0 not in range"},
      {"golden verify --data " + p("nodir"), "manifest.txt: cannot open the golden manifest"},
      {"frobnicate", "unknown command \"frobnicate\""},
      {"run --impl emu --model {m} --residual -o {o}", "--residual: "},
      {"run --impl emu --model {m} --chain --trace " + p("nodir") + "/t.json -o {o}",
       "--trace " + p("nodir") + "/t.json: directory"},
      {"run --impl emu --model {m} --cache-slots 8 -o {o}",
       "--cache-slots 8: only the cuda implementation has an expert cache"},
      {"run --impl cuda --model {m} --cache-slots 8 --cache-bytes 1GB -o {o}",
       "give one size of the expert cache"},
      {"run --impl cuda --model {m} --cache-slots 8 --prefetch-k 2 -o {o}",
       "--prefetch-k 2: prefetch reads in the reader pool"},
      {"run --impl cuda --model {m} --reader-threads 2 -o {o}",
       "which runs only with --cache-slots or --cache-bytes"},
      {"run --impl cuda --model {m} --cache-slots 8 --pipeline --chain -o {o}",
       "--pipeline: it stages layer L+1"},
      {"run --impl cuda --model {m} --cache-slots 8 --pipeline --route device -o {o}",
       "--pipeline: the stage / launch / finish split is the host route's"},
      {"run --impl cuda --model {m} --cache-bytes 12 -o {o}",
       "--cache-bytes 12: expected one size"},
      {"run --impl cuda --model {m} --cache-bytes 3XB -o {o}",
       "--cache-bytes 3XB: expected a size"},
      {"run --impl cuda --model {m} --cache-slots 0 -o {o}", "--cache-slots: Value 0 not in range"},
      {"run --impl cuda --model {m} --reader-threads 65 -o {o}",
       "--reader-threads: Value 65 not in range"},
      {"run --impl cuda --model {m} --stream-checks x -o {o}",
       "--stream-checks: x not in {readers,after}"},
      {"run --impl cuda --model {m} --expert-source x -o {o}",
       "--expert-source: x not in {model,memory}"},
      {"check --model {m} --impls ref,emu --cache-slots 8",
       "the expert cache is the cuda implementation's, which this check does not run"},
      {"cache --trace missing.json", "missing.json: trace file does not exist"},
      {"cache --trace {x}", "not valid JSON"},
      {"cache --synthetic layers=0", "--synthetic: layers=0: expected 1 to 4096"},
      {"cache --synthetic layers=2 --order x", "--order: x not in {batch,decode}"},
      {"cache --synthetic layers=2 --sizes x", "--sizes \"x\": piece \"x\" does not start"},
      {"cache --synthetic layers=2 --prefetch-k x", "--prefetch-k x: expected a whole number"},
      {"cache --synthetic layers=2 --save-trace " + p("nodir") + "/t.json",
       "--save-trace " + p("nodir") + "/t.json: directory"},
  };
  for (const Case& c : cases) {
    std::string a = fill(c.args, "{m}", p("tiny.gguf"));
    a = fill(a, "{d}", p("d.h5"));
    a = fill(a, "{x}", p("x.txt"));
    a = fill(a, "{o}", p("out.gguf"));
    const CliResult r = run(a);
    EXPECT_EXIT_CODE(r, 2);
    EXPECT_CONTAINS(r.err, "moecheck: error: ", r);
    EXPECT_CONTAINS(r.err, c.needle, r);
    EXPECT_FALSE(fs::exists(p("out.gguf"))) << "an output was written: " << r.cmd;
  }
}

}  // namespace
}  // namespace moecheck::testing
