// The deepseek4 / deepseek41 conventions through the command line (docs/gguf.md "Conventions",
// docs/cli.md "gen"): `gen --convention` writes them, `inspect` shows the convention, router type,
// per-layer clamps and defaulted keys, `check` leaves a hash-routed layer out and says so, `run
// --layers` naming it is refused (exit 2, nothing written), and options no file can hold are
// refused before anything is written. Repro: each failure prints its command line.
#include "cli_test_util.h"
#include "golden/dump.h"

namespace moecheck::testing {
namespace {

class CliConvention : public CliFixture {};

TEST_F(CliConvention, Deepseek4GenInspectCheckAndTheHashLayer) {
  const CliResult g =
      run("gen --convention deepseek4 --layers 3 --hash-layers 1 --swiglu-limits 10,10,0.75 "
          "--swiglu-limits-shared 10,8,0.25 --blocks random -o " +
          p("v4.gguf"));
  EXPECT_EXIT_CODE(g, 0);
  EXPECT_CONTAINS(g.out, "deepseek4 convention, F16 router", g);
  const CliResult i = run("inspect " + p("v4.gguf"));
  EXPECT_EXIT_CODE(i, 0);
  EXPECT_CONTAINS(i.out, "convention: deepseek4, router F16, hash-routed layers 0-0", i);
  EXPECT_CONTAINS(i.out, "1: 10 / 8, 2: 0.75 / 0.25", i);
  EXPECT_CONTAINS(i.out, "defaulted: moecheck.gate_temp = 1 (absent from the file)", i);
  const CliResult c = run("check --model " + p("v4.gguf") + " --tokens 4");
  EXPECT_EXIT_CODE(c, 0);
  EXPECT_CONTAINS(c.out, "not run: layer 0: hash-routed", c);
  EXPECT_CONTAINS(c.out, "\nlayer 1\n", c);
  EXPECT_CONTAINS(c.out, "\nlayer 2\n", c);
  EXPECT_CONTAINS(c.out, "result: PASS", c);
  EXPECT_EQ(c.out.find("\nlayer 0\n"), std::string::npos) << c.cmd;
  const CliResult r =
      run("run --impl emu --model " + p("v4.gguf") + " --layers 0-1 -o " + p("never.h5"));
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_CONTAINS(r.err, "layer 0 is hash-routed (tensor \"blk.0.ffn_gate_tid2eid.weight\"", r);
  EXPECT_FALSE(fs::exists(p("never.h5"))) << r.cmd;
  // The dump of layer 2 records its own clamps (they differ from the root's, layer 0's).
  const CliResult d =
      run("run --impl emu --model " + p("v4.gguf") + " --layers 2 -o " + p("l2.h5"));
  EXPECT_EXIT_CODE(d, 0);
  const Dump dump = read_dump(p("l2.h5"));
  EXPECT_EQ(dump.meta.config.swiglu_limit, 10.0f) << d.cmd;
  ASSERT_EQ(dump.meta.layer_clamps.count(2), 1u) << d.cmd;
  EXPECT_EQ(dump.meta.layer_clamps.at(2), (std::pair<float, float>{0.75f, 0.25f})) << d.cmd;
  const CliResult di = run("inspect " + p("l2.h5"));
  EXPECT_CONTAINS(di.out, "clamps         swiglu_limit 0.75, shared 0.25 (this layer's own)", di);
  // Another dump of the same layer diffs clean; the clamps are compared per layer.
  EXPECT_EXIT_CODE(run("run --impl emu --model " + p("v4.gguf") + " --layers 2 -o " + p("l2b.h5")),
                   0);
  EXPECT_EXIT_CODE(run("diff " + p("l2.h5") + " " + p("l2b.h5")), 0);
}

TEST_F(CliConvention, OptionsNoFileCanHoldAreRefused) {
  const CliResult a =
      run("gen --swiglu-limits 10,5 -o " + p("x.gguf"));  // deepseek2 holds one limit
  EXPECT_EXIT_CODE(a, 2);
  EXPECT_CONTAINS(a.err, "per-layer SwiGLU limits need the deepseek4 or deepseek41", a);
  const CliResult b = run("gen --convention deepseek41 --hash-layers 1 -o " + p("x.gguf"));
  EXPECT_EXIT_CODE(b, 2);
  EXPECT_CONTAINS(b.err, "need the deepseek4 convention", b);
  const CliResult c = run("gen --convention deepseek4 --swiglu-limits 10 -o " + p("x.gguf"));
  EXPECT_EXIT_CODE(c, 2);
  EXPECT_CONTAINS(c.err, "1 per-layer SwiGLU limit(s) for 2 layer(s)", c);
  EXPECT_FALSE(fs::exists(p("x.gguf")));
  const CliResult v = run("gen --convention deepseek41 --router bf16 -o " + p("v41.gguf"));
  EXPECT_EXIT_CODE(v, 0);
  EXPECT_CONTAINS(run("inspect " + p("v41.gguf")).out, "convention: deepseek41, router BF16", v);
}

}  // namespace
}  // namespace moecheck::testing
