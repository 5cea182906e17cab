// The command line on synthetic models (docs/streaming.md "Synthetic models", docs/cli.md): a
// spec given where a model file goes (inspect FILE, run / check / diff / sensitivity --model)
// gives what the file `gen` writes for the same options gives: the same inspect output, dumps
// that diff as the same, the same check and sensitivity reports, the same whole-file digest. An
// output named like a spec is not taken for the model; a bad spec is exit 2 naming the key, with
// nothing written.
#include <filesystem>
#include <string>

#include "golden/sha256.h"
#include "tests/cli_test_util.h"

namespace moecheck::testing {
namespace {

constexpr const char* kSpec = "synthetic:tiny,layers=2";

// `text` with every occurrence of `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size())
    text.replace(at, from.size(), to);
  return text;
}

class CliSynthetic : public CliFixture {};

TEST_F(CliSynthetic, InspectOfASpecShowsTheFileGenWrites) {
  for (const std::string json : {"", " --json"}) {
    const CliResult s = run(std::string("inspect ") + kSpec + json);
    const CliResult f = run("inspect " + p("tiny.gguf") + json);
    EXPECT_EXIT_CODE(s, 0);
    EXPECT_EXIT_CODE(f, 0);
    EXPECT_EQ(s.out, replaced(f.out, p("tiny.gguf"), kSpec)) << s.cmd;
  }
  const CliResult big = run("inspect synthetic:ds41,layers=40");
  EXPECT_EXIT_CODE(big, 0);
  EXPECT_CONTAINS(big.out, "synthetic:ds41,layers=40: GGUF v3, 199753812064 bytes", big);
  EXPECT_CONTAINS(big.out, "moecheck model: 40 layer(s)", big);
}

TEST_F(CliSynthetic, RunOnASpecDiffsAsTheSameAsRunOnTheFile) {
  for (const std::string impl : {"emu", "ref"}) {
    const CliResult s = run("run --impl " + impl + " --model " + kSpec + " --taps --hash-file -o " +
                            p(impl + "-syn.h5"));
    const CliResult f = run("run --impl " + impl + " --model " + p("tiny.gguf") +
                            " --taps --hash-file -o " + p(impl + "-file.h5"));
    EXPECT_EXIT_CODE(s, 0);
    EXPECT_EXIT_CODE(f, 0);
    const CliResult d = run("diff " + p(impl + "-syn.h5") + " " + p(impl + "-file.h5"));
    EXPECT_EXIT_CODE(d, 0);
    EXPECT_CONTAINS(d.out, "result: same", d);
    const CliResult dm =
        run("diff " + p(impl + "-syn.h5") + " " + p(impl + "-file.h5") + " --model " + kSpec);
    EXPECT_EXIT_CODE(dm, 0);
    // --hash-file recorded the image's digest: the file's.
    const CliResult i = run("inspect " + p(impl + "-syn.h5"));
    EXPECT_CONTAINS(i.out, "whole-file sha256 " + sha256_file(p("tiny.gguf")), i);
    EXPECT_CONTAINS(i.out, std::string("model: ") + kSpec, i);
  }
}

TEST_F(CliSynthetic, CheckOnASpecReportsAsOnTheFile) {
  const CliResult s = run("check --model synthetic:tiny --impls ref,emu --json");
  const CliResult f = run("check --model " + p("tiny.gguf") + " --impls ref,emu --json");
  EXPECT_EXIT_CODE(s, 0);
  EXPECT_EXIT_CODE(f, 0);
  EXPECT_CONTAINS(s.out, "\"pass\":true", s);
  EXPECT_EQ(s.out, replaced(f.out, p("tiny.gguf"), "synthetic:tiny")) << s.cmd;
  const CliResult keep = run("check --model synthetic:tiny --impls emu --keep " + p("kept"));
  EXPECT_EXIT_CODE(keep, 0);
  EXPECT_TRUE(fs::exists(p("kept/emu.h5")));
}

TEST_F(CliSynthetic, SensitivityOnASpecReportsAsOnTheFile) {
  const CliResult s =
      run("sensitivity --model synthetic:tiny --classes scale,quants --tokens 4 --json");
  const CliResult f =
      run("sensitivity --model " + p("tiny.gguf") + " --classes scale,quants --tokens 4 --json");
  EXPECT_EXIT_CODE(s, 0);
  EXPECT_EXIT_CODE(f, 0);
  EXPECT_EQ(s.out, replaced(f.out, p("tiny.gguf"), "synthetic:tiny")) << s.cmd;
}

TEST_F(CliSynthetic, AnOutputNamedLikeASpecIsNotTakenForTheModel) {
  const CliResult r =
      run_with("", "run --impl emu --model synthetic:tiny -o synthetic:tiny", dir_.string());
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(fs::exists(dir_ / "synthetic:tiny"));
  // "./synthetic:tiny" is the file: the dump just written.
  const CliResult i = run_with("", "inspect ./synthetic:tiny", dir_.string());
  EXPECT_EXIT_CODE(i, 0);
  EXPECT_CONTAINS(i.out, "moecheck dump format", i);
}

TEST_F(CliSynthetic, ABadSpecIsExit2NamingTheKeyAndWritesNothing) {
  const CliResult r = run("run --impl emu --model synthetic:tiny,layerz=2 -o " + p("bad.h5"));
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_CONTAINS(r.err, "moecheck: error: synthetic:tiny,layerz=2: unknown key \"layerz\"", r);
  EXPECT_FALSE(fs::exists(p("bad.h5")));
  const CliResult c = run("check --model synthetic:tiny,layers=0");
  EXPECT_EXIT_CODE(c, 2);
  EXPECT_CONTAINS(c.err, "key \"layers\": expected a whole number in [1, 1024], found \"0\"", c);
  const CliResult i = run("inspect synthetic:huge --json");
  EXPECT_EXIT_CODE(i, 2);
  EXPECT_CONTAINS(i.out, "unknown preset \\\"huge\\\"", i);
  const CliResult l = run("run --impl emu --model synthetic:tiny --layers 2 -o " + p("bad.h5"));
  EXPECT_EXIT_CODE(l, 2);
  EXPECT_CONTAINS(l.err, "--layers: layer 2 is not in synthetic:tiny", l);
  EXPECT_FALSE(fs::exists(p("bad.h5")));
}

}  // namespace
}  // namespace moecheck::testing
