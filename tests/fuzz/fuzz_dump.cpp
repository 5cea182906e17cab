// libFuzzer target: the dump reader's public path (read_dump: the integrity stamp, the probe
// process for unstamped or changed files, the validating reader) on arbitrary bytes written to a
// temporary file (removed after each input). Every input must end in a dump or an InputError, in
// this process; a crash of libhdf5 must surface as the probe's InputError, never as a crash here.
// Run: .ci/fuzz.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "golden/dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/moecheck_fuzz_dump_" + std::to_string(::getpid()) + ".h5";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    (void)moecheck::read_dump(path);
  } catch (const moecheck::InputError&) {}
  // Removed after every input, so no run (the fuzzing, or the triage's one process per saved
  // input) leaves its temporary file behind; an input that kills the process leaves it, with
  // the finding.
  std::remove(path.c_str());
  return 0;
}
