// What the command line shows (docs/cli.md): diff's statistics over same-sign pairs with the
// worst elements located, inspect's floats in full and its JSON numbers, golden update leaving
// unchanged dumps untouched, gen's progress bar on a terminal only.
// Repro: the failing command line is printed with every expectation.
#include <chrono>
#include <cstring>
#include <regex>
#include <string>

#include "cli_test_util.h"
#include "golden/gguf.h"

namespace moecheck::testing {
namespace {

class CliOutput : public CliFixture {};

// ref vs emu on tiny: stages whose values cross zero (the reference's tiny gate values against
// the emulation's) count those pairs in x-zero, and every stage that differs names where its
// max_abs and max_ulp are; JSON holds the same as numbers.
TEST_F(CliOutput, DiffLocatesTheWorstAndCountsZeroCrossings_tiny_L2_T8) {
  for (const char* impl : {"ref", "emu"})
    ASSERT_EQ(run(std::string("run --impl ") + impl + " --model " + p("tiny.gguf") + " --taps -o " +
                  p(std::string(impl) + ".h5"))
                  .code,
              0);
  const CliResult r = run("diff " + p("ref.h5") + " " + p("emu.h5"));
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_CONTAINS(r.out, "max_ulp     x-zero  nmse", r);
  EXPECT_CONTAINS(r.out, "worst elements (max_ulp over same-sign nonzero pairs):", r);
  const std::regex gate(
      R"(\n    experts\.gate +max_abs [0-9.e-]+ at expert [0-9]+ token [0-9]+ col [0-9]+ )"
      R"(\(A [-0-9.e]+, B [-0-9.e]+\); max_ulp [0-9]+ at expert [0-9]+ token [0-9]+ col [0-9]+)");
  EXPECT_TRUE(std::regex_search(r.out, gate)) << "repro: " << r.cmd << "\n" << r.out;
  EXPECT_CONTAINS(r.out, "first mismatches (pipeline order; ", r);
  EXPECT_CONTAINS(r.out, "worst mismatches of router_logits by |a-b| (10 of ", r);
  EXPECT_EQ(r.out.find("inf"), std::string::npos) << "an infinite max_rel: " << r.out;
  const CliResult j = run("diff " + p("ref.h5") + " " + p("emu.h5") + " --json");
  EXPECT_CONTAINS(j.out, "\"cross_zero\":", j);
  EXPECT_CONTAINS(j.out, "\"worst_abs\":{\"token\":", j);
  EXPECT_CONTAINS(j.out, "\"worst_mismatches\":[{", j);
}

// A float metadata value of 1e-20 printed as 0.000000 before; now in full, and a JSON number.
TEST_F(CliOutput, InspectPrintsSmallFloatsInFullAndJsonNumbers) {
  gguf::Writer w;
  w.set("test.eps", gguf::make_float32(1e-20f));
  w.set("test.count", gguf::make_uint64(7));
  w.set("test.list",
        gguf::make_array(gguf::ValueType::kInt32, {gguf::make_int32(-1), gguf::make_int32(2)}));
  w.add_tensor({"t", 0, {4, 2}, 0, [](uint64_t, uint8_t* out, uint64_t n) {
                  std::memset(out, 0, static_cast<size_t>(n));
                }});
  w.write(p("eps.gguf"));
  const CliResult t = run("inspect " + p("eps.gguf"));
  EXPECT_EXIT_CODE(t, 0);
  EXPECT_CONTAINS(t.out, "float32 9.99999968e-21", t);
  const CliResult j = run("inspect " + p("eps.gguf") + " --json");
  EXPECT_EXIT_CODE(j, 0);
  // The float32 nearest 1e-20 as a JSON number: the shortest decimal that reads back as that
  // float's exact value (9 digits before nlohmann/json wrote the output).
  EXPECT_CONTAINS(j.out, "\"test.eps\":{\"type\":\"float32\",\"value\":9.999999682655225e-21}", j);
  EXPECT_CONTAINS(j.out, "\"test.count\":{\"type\":\"uint64\",\"value\":7}", j);
  EXPECT_CONTAINS(j.out, "\"elem_type\":\"int32\",\"count\":2,\"values\":[-1,2]", j);
  EXPECT_CONTAINS(j.out, "\"shape\":[4,2]", j);
  ASSERT_EQ(run("run --impl emu --model " + p("tiny.gguf") + " --taps -o " + p("i.h5")).code, 0);
  const CliResult d = run("inspect " + p("i.h5") + " --json");
  EXPECT_CONTAINS(d.out, "\"input\":{\"shape\":[8,512],\"dtype\":\"bfloat16\"}", d);
  EXPECT_CONTAINS(d.out, "\"shared\":{\"expert\":-1,\"tokens\":8,\"gate\":[8,256]", d);
  EXPECT_EQ(d.out.find("\"[8, 512]"), std::string::npos) << "a shape as a string:\n" << d.out;
}

// golden update on a copy of the committed set: the emulation's dumps are this build's bits
// (golden verify holds them bit for bit), so they and the manifest are left untouched.
TEST_F(CliOutput, GoldenUpdateLeavesUnchangedDumpsUntouched) {
  const fs::path data = p("golden");
  fs::copy(MOECHECK_SOURCE_DIR "/golden/data", data, fs::copy_options::recursive);
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(24);
  for (const auto& e : fs::directory_iterator(data)) fs::last_write_time(e.path(), old);
  const std::string tiny_emu = slurp_file(data / "tiny_emu.h5");
  const CliResult u = run("golden update --data " + data.string());
  EXPECT_EXIT_CODE(u, 0);
  for (const char* f : {"tiny_emu.h5", "small_emu.h5"}) {
    EXPECT_CONTAINS(u.out, "unchanged " + (data / f).string() + " (same content; left untouched)",
                    u);
    EXPECT_EQ(fs::last_write_time(data / f), old) << f << " was rewritten";
  }
  EXPECT_CONTAINS(u.out, "unchanged " + (data / "manifest.txt").string(), u);
  EXPECT_EQ(fs::last_write_time(data / "manifest.txt"), old);
  EXPECT_EQ(slurp_file(data / "tiny_emu.h5"), tiny_emu);
}

// gen draws its bar on stderr only when stderr is a terminal and --json is not given (script(1)
// gives the command a terminal).
TEST_F(CliOutput, GenShowsProgressOnATerminalOnly) {
  if (!fs::exists("/usr/bin/script")) GTEST_SKIP() << "no /usr/bin/script to make a terminal";
  const std::string gen = kCliBinary + " gen --preset tiny -o " + p("g.gguf");
  auto on_tty = [&](const std::string& cmd) {
    const std::string out = p("tty.out");
    const std::string sh = "script -qec '" + cmd + "' /dev/null >" + out + " 2>&1";
    EXPECT_EQ(std::system(sh.c_str()), 0) << sh;
    return slurp_file(out);
  };
  const std::string bar = on_tty(gen);
  EXPECT_NE(bar.find("gen tiny [###"), std::string::npos) << "no bar on a terminal:\n" << bar;
  EXPECT_NE(bar.find("/5 MiB"), std::string::npos) << bar;
  EXPECT_EQ(on_tty(gen + " --json").find("gen tiny ["), std::string::npos) << "a bar with --json";
  const CliResult piped = run("gen --preset tiny -o " + p("g.gguf"));
  EXPECT_EXIT_CODE(piped, 0);
  EXPECT_EQ(piped.err, "") << "a bar on a pipe";
}

}  // namespace
}  // namespace moecheck::testing
