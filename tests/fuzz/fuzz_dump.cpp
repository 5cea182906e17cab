// libFuzzer target: the dump reader's public path (read_dump: the integrity stamp, the probe
// process for unstamped or changed files, the validating reader) on arbitrary bytes written to a
// temporary file. Every input must end in a dump or an InputError, in this process; a crash of
// libhdf5 must surface as the probe's InputError, never as a crash here. Run: .ci/fuzz.
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
  return 0;
}
