// The command line on a full disk and a read-only directory, injected by the preloaded shim
// tests/shim/fail_io.c (MOECHECK_SHIM_ENOSPC_AFTER, MOECHECK_SHIM_EROFS_DIR): `run -o`, `check
// --keep` and `gen -o` exit 2 with the path and the system's message, never crash (libhdf5 once
// crashed at exit after a failed flush: exit 139), and leave nothing behind: no output file, no
// temporary file. Also: non-finite weights and inputs refused by name, and `inspect`'s integrity
// line. docs/reliability.md.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "golden/model_file.h"
#include "tests/cli_test_util.h"

namespace moecheck::testing {
namespace {

const std::string kShim = MOECHECK_BINARY_DIR "/tests/fail_io_shim.so";

// tests/cli_test_util.h's fixture (the tiny model, the runner) with a clean output directory per
// test and the shim preloaded when an environment is given.
class CliIo : public CliFixture {
 protected:
  using Result = CliResult;
  void SetUp() override {
    fs::remove_all(dir_ / "out");
    fs::create_directories(dir_ / "out");
    ASSERT_TRUE(fs::exists(kShim)) << kShim;
    fs::copy_file(p("tiny.gguf"), p("m.gguf"), fs::copy_options::overwrite_existing);
  }

  // Runs the binary with `env` (VAR=value ...) and the shim preloaded when env is not empty.
  static Result run(const std::string& env, const std::string& args) {
    return run_with(
        env.empty() ? "" : "LD_PRELOAD=" + kShim + " ASAN_OPTIONS=verify_asan_link_order=0 " + env,
        args, "");
  }
  // std::system runs sh -c: a child killed by a signal shows as exit 128 + signal.
  static bool signaled(const Result& r) { return r.code > 128; }

  // Nothing but the named files in the output directory.
  static void expect_out_empty(const Result& r) {
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "out"))
      ADD_FAILURE() << "left behind: " << e.path() << "\n  repro: " << r.cmd;
  }
};

#define EXPECT_FAILS_CLEANLY(r, needle)                                                      \
  do {                                                                                       \
    EXPECT_EQ((r).code, 2) << "repro: " << (r).cmd << "\n" << (r).err;                       \
    EXPECT_FALSE(signaled(r)) << "crashed: repro: " << (r).cmd;                              \
    EXPECT_NE((r).err.find(needle), std::string::npos) << (r).err << "\nrepro: " << (r).cmd; \
    EXPECT_NE((r).err.find("moecheck: error: "), std::string::npos) << (r).err;              \
  } while (0)

TEST_F(CliIo, RunOutputOnAFullDiskExits2AndLeavesNothing) {
  for (const char* impl : {"emu", "ref"}) {
    const Result r = run("MOECHECK_SHIM_ENOSPC_AFTER=4096",
                         std::string("run --impl ") + impl + " --model " + p("m.gguf") +
                             " --tokens 4 --taps -o " + p("out/d.h5"));
    EXPECT_FAILS_CLEANLY(r, "No space left on device");
    EXPECT_NE(r.err.find(p("out/d.h5")), std::string::npos) << r.err;
    expect_out_empty(r);
  }
}

TEST_F(CliIo, CheckKeepOnAFullDiskExits2AndLeavesNoDump) {
  const Result r =
      run("MOECHECK_SHIM_ENOSPC_AFTER=4096",
          "check --model " + p("m.gguf") + " --impls ref,emu --tokens 4 --keep " + p("out"));
  EXPECT_FAILS_CLEANLY(r, "No space left on device");
  expect_out_empty(r);
}

TEST_F(CliIo, GenOnAFullDiskExits2AndLeavesNothing) {
  const Result r = run("MOECHECK_SHIM_ENOSPC_AFTER=65536",
                       "gen --preset tiny --layers 1 --seed 3 -o " + p("out/g.gguf"));
  EXPECT_FAILS_CLEANLY(r, "No space left on device");
  expect_out_empty(r);
}

TEST_F(CliIo, ReadOnlyOutputDirectoryExits2ForRunGenAndCheck) {
  const std::string env = "MOECHECK_SHIM_EROFS_DIR=" + p("out");
  for (const std::string& args :
       {"run --impl emu --model " + p("m.gguf") + " --tokens 2 -o " + p("out/d.h5"),
        "gen --preset tiny --layers 1 -o " + p("out/g.gguf"),
        "check --model " + p("m.gguf") + " --impls ref,emu --tokens 2 --keep " + p("out")}) {
    const Result r = run(env, args);
    EXPECT_FAILS_CLEANLY(r, "Read-only file system");
    expect_out_empty(r);
  }
}

// The shim itself: without a limit the same commands succeed (the failures above are the
// injected ones, not the shim breaking the process).
TEST_F(CliIo, ShimWithoutLimitsChangesNothing) {
  const Result r = run("MOECHECK_SHIM_UNUSED=1",
                       "run --impl emu --model " + p("m.gguf") + " --tokens 2 -o " + p("out/d.h5"));
  EXPECT_EQ(r.code, 0) << r.cmd << "\n" << r.err;
  EXPECT_TRUE(fs::exists(p("out/d.h5")));
}

// Overwrites 2 bytes at `at` of a file.
void poke16(const std::string& file, uint64_t at, uint16_t v) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(reinterpret_cast<const char*>(&v), 2);
}

// A NaN in the router (read by every forward) and an Inf in the shared expert's down projection:
// `run` exits 2 naming the file, tensor, row and column on the first read of that tensor.
TEST_F(CliIo, NonFiniteWeightsAreRefusedNamingTheTensorRowAndColumn) {
  uint64_t router = 0, down = 0;
  {
    const ModelFile m = ModelFile::open(p("m.gguf"));
    const auto* r = m.gguf().find_tensor("blk.0.ffn_gate_inp.weight");
    const auto* d = m.gguf().find_tensor("blk.0.ffn_down_shexp.weight");
    ASSERT_TRUE(r != nullptr && d != nullptr);
    router = m.gguf().data_offset() + r->offset + 2 * (3 * static_cast<uint64_t>(r->ne[0]) + 7);
    down = m.gguf().data_offset() + d->offset + 2 * (2 * static_cast<uint64_t>(d->ne[0]) + 1);
  }
  fs::copy_file(p("m.gguf"), p("r.gguf"), fs::copy_options::overwrite_existing);
  poke16(p("r.gguf"), router, 0x7FC1);  // row 3, column 7: NaN
  Result r = run("", "run --impl emu --model " + p("r.gguf") + " --tokens 2 -o " + p("out/a.h5"));
  EXPECT_FAILS_CLEANLY(r, "tensor blk.0.ffn_gate_inp.weight: row 3, column 7 is NaN (bits 0x7FC1)");
  expect_out_empty(r);
  poke16(p("m.gguf"), down, 0x7F80);  // row 2, column 1: +Inf
  r = run("", "run --impl ref --model " + p("m.gguf") + " --tokens 2 -o " + p("out/b.h5"));
  EXPECT_FAILS_CLEANLY(r, "tensor blk.0.ffn_down_shexp.weight: row 2, column 1 is +Inf");
  expect_out_empty(r);
}

TEST_F(CliIo, NonFiniteInputInAnInputDumpIsRefusedByTokenAndColumn) {
  const Result r0 =
      run("", "run --impl emu --model " + p("m.gguf") + " --tokens 3 -o " + p("d.h5"));
  ASSERT_EQ(r0.code, 0) << r0.err;
  const Result fresh = run("", "inspect " + p("d.h5"));
  EXPECT_NE(fresh.out.find("integrity: stamp matches"), std::string::npos) << fresh.out;
  {  // token 1, column 5 of layer 0's input := NaN (through the HDF5 API: the stamp no longer
     // matches, so the reader goes through the probe process)
    hid_t f = H5Fopen(p("d.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "/layers/0/input", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    hid_t space = H5Dget_space(d);
    hsize_t dims[2];
    H5Sget_simple_extent_dims(space, dims, nullptr);
    std::vector<uint16_t> x(dims[0] * dims[1]);
    H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    x[1 * dims[1] + 5] = 0x7FC0;
    H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
  }
  const Result ins = run("", "inspect " + p("d.h5"));
  EXPECT_EQ(ins.code, 0) << ins.err;
  EXPECT_NE(ins.out.find("integrity: stamp does not match: changed since written"),
            std::string::npos)
      << ins.out;
  const Result r = run("", "run --impl emu --model " + p("m.gguf") + " --input " + p("d.h5") +
                               " -o " + p("out/e.h5"));
  EXPECT_FAILS_CLEANLY(r, "/layers/0/input token 1 column 5 is NaN (bf16 0x7FC0)");
  expect_out_empty(r);
}

}  // namespace
}  // namespace moecheck::testing
