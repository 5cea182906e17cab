// Reading dumps that may crash libhdf5, and writing files whole or not at all: the integrity
// stamp of every dump moecheck writes (a match reads directly; an edited or unstamped file goes
// through the probe process), probe_in_child turning a crash into an InputError, a byte-flip
// sweep over an unstamped (format 1, variable-length strings) and a stamped dump that must never
// crash and must end in a dump or an InputError, and AtomicFile's cleanup.
// docs/reliability.md "Hostile dumps".
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden/atomic_file.h"
#include "golden/dump.h"
#include "golden/dump_hdf5.h"
#include "golden/probe.h"

namespace fs = std::filesystem;

namespace moecheck {
namespace {

const std::string kV1 = MOECHECK_SOURCE_DIR "/tests/data/dump_v1_small_emu.h5";

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("moecheck_guard_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> slurp(const std::string& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  std::vector<uint8_t> v;
  if (f == nullptr) return v;
  int c;
  while ((c = std::fgetc(f)) != EOF) v.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  return v;
}

TEST(Probe, CrashBecomesAnInputErrorNamingFileAndSignal) {
  try {
    probe_in_child("x.h5", [] { ::raise(SIGSEGV); });
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("x.h5: the HDF5 library crashed reading it (signal 11"), std::string::npos)
        << m;
  }
  try {
    probe_in_child("y.h5", [] { throw InputError("y.h5: /layers: missing group"); });
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "y.h5: /layers: missing group");
  }
  EXPECT_NO_THROW(probe_in_child("z.h5", [] {}));
}

// A read that never ends (libhdf5 1.10 loops on some damaged global heaps: a fuzz finding, the
// file in tests/data/dump_hang_global_heap.h5) is ended after MOECHECK_PROBE_SECONDS and becomes
// an InputError naming the file and the limit; a bad limit is refused by name.
TEST(Probe, ALoopingReadIsEndedAfterTheLimit) {
  ::setenv("MOECHECK_PROBE_SECONDS", "1", 1);
  try {
    probe_in_child("loop.h5", [] {
      for (;;) ::pause();
    });
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("loop.h5: the HDF5 library did not finish reading it within 1 s"),
              std::string::npos)
        << m;
  }
  const std::string hang =
      std::string(MOECHECK_SOURCE_DIR) + "/tests/fuzz/hostile/dump_hang_global_heap.h5";
  try {
    (void)read_dump(hang);
    FAIL() << "no InputError for " << hang;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish reading it within 1 s"), std::string::npos)
        << e.what();
  }
  ::setenv("MOECHECK_PROBE_SECONDS", "0", 1);
  EXPECT_THROW(probe_seconds(), InputError);
  ::setenv("MOECHECK_PROBE_SECONDS", "ten", 1);
  EXPECT_THROW(probe_seconds(), InputError);
  ::unsetenv("MOECHECK_PROBE_SECONDS");
  EXPECT_EQ(probe_seconds(), kDefaultProbeSeconds);
}

TEST(DumpStamp, WrittenDumpMatchesAnyChangedByteMismatches) {
  const fs::path d = temp_dir();
  const Dump v1 = read_dump(kV1);  // unstamped: read through the probe
  const std::string p = (d / "s.h5").string();
  write_dump(p, v1);
  EXPECT_EQ(h5::verify_stamp(p), h5::Stamp::kMatch);
  EXPECT_EQ(h5::verify_stamp(kV1), h5::Stamp::kNone);
  const Dump back = read_dump(p);
  EXPECT_EQ(back.layers.size(), v1.layers.size());
  EXPECT_EQ(back.layers[0].output, v1.layers[0].output);
  std::vector<uint8_t> bytes = slurp(p);
  for (size_t at : {size_t{3}, size_t{100}, size_t{600}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<uint8_t> b = bytes;
    b[at] ^= 0x40;
    const std::string q = (d / "f.h5").string();
    write_file_atomic(q, b.data(), b.size());
    EXPECT_NE(h5::verify_stamp(q), h5::Stamp::kMatch) << "byte " << at;
  }
  fs::remove_all(d);
}

// One-byte flips at seeded offsets: every read ends in a dump or an InputError, in this process
// (a crash inside libhdf5 is caught by the probe and named). Prints how many the probe caught.
void flip_sweep(const std::vector<uint8_t>& bytes, uint64_t seed, int n, const char* what) {
  const fs::path d = temp_dir();
  const std::string q = (d / "flip.h5").string();
  std::mt19937_64 g(seed);
  int ok = 0, refused = 0, crashed = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> b = bytes;
    const size_t at = g() % b.size();
    b[at] = static_cast<uint8_t>(b[at] ^ (1 + g() % 255));
    write_file_atomic(q, b.data(), b.size());
    try {
      (void)read_dump(q);
      ++ok;
    } catch (const InputError& e) {
      ++refused;
      if (std::string(e.what()).find("crashed") != std::string::npos) ++crashed;
    }
  }
  std::printf("%s: %d flips, %d read, %d refused (%d crashed libhdf5 in the probe)\n", what, n, ok,
              refused, crashed);
  EXPECT_EQ(ok + refused, n);
  fs::remove_all(d);
}

TEST(DumpGuard, ByteFlipSweepNeverCrashes_Unstamped300_Stamped100) {
  const std::vector<uint8_t> v1 = slurp(kV1);
  ASSERT_GT(v1.size(), 1000u);
  flip_sweep(v1, 20261201, 300, "format-1 dump (unstamped, variable-length strings)");
  const fs::path d = temp_dir();
  const std::string p = (d / "s.h5").string();
  write_dump(p, read_dump(kV1));
  flip_sweep(slurp(p), 7, 100, "stamped dump");
  fs::remove_all(d);
}

TEST(AtomicFile, MissingDirectoryNamesThePathAndUncommittedFilesVanish) {
  try {
    write_file_atomic("/nonexistent-dir/x.bin", "a", 1);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.bin: cannot create"),
              std::string::npos)
        << e.what();
  }
  const fs::path d = temp_dir();
  const std::string p = (d / "a.bin").string();
  {
    AtomicFile f(p);
    f.write("abc", 3);
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }  // not committed
  EXPECT_TRUE(fs::is_empty(d)) << "the temporary file was left behind";
  {
    AtomicFile f(p);
    f.write("abc", 3);
    f.commit();
  }
  EXPECT_EQ(fs::file_size(p), 3u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace moecheck
