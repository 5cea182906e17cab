// Reads experts of a model file through FileExpertSource (golden/expert_sources.h), for the tests
// that run it under the fault-injection shim (tests/shim/fail_io.c, MOECHECK_SHIM_PREAD_EIO_AFTER;
// tests/expert_sources_test.cpp). Usage: expert_read_probe MODEL LAYER FIRST COUNT. Reads the
// gate, up and down slices of experts FIRST .. FIRST+COUNT-1 of LAYER in that order, one pread
// each, and prints "<expert> <proj> <sha256>" per slice read; an InputError is printed as
// "expert_read_probe: error: <message>" on stderr with exit 2, as the command line does.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden/expert_sources.h"
#include "golden/sha256.h"

int main(int argc, char** argv) {
  using namespace moecheck;
  if (argc != 5) {
    std::fprintf(stderr, "usage: expert_read_probe MODEL LAYER FIRST COUNT\n");
    return 2;
  }
  try {
    const FileExpertSource src(argv[1]);
    const int layer = std::atoi(argv[2]);
    const int64_t first = std::atoll(argv[3]), count = std::atoll(argv[4]);
    const ExpertLayout l = src.layout(layer);
    for (int64_t e = first; e < first + count; ++e)
      for (Proj p : kAllProjs) {
        std::vector<uint8_t> buf(static_cast<size_t>(l.bytes(p)));
        src.read(layer, e, p, buf.data());
        std::printf("%lld %s %s\n", static_cast<long long>(e), proj_name(p),
                    sha256_hex(buf.data(), buf.size()).c_str());
        std::fflush(stdout);
      }
  } catch (const InputError& e) {
    std::fprintf(stderr, "expert_read_probe: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
