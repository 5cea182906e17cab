// The installed package's bit-for-bit probe (tests/package/run.cmake, CTest `package_consumer`):
// this one source is built in this tree (the target package_probe) and, against the installed
// package, by the consumer project tests/package/CMakeLists.txt with -O3 -march=native
// -ffp-contract=fast. Every build prints the same three FNV-1a hashes: plain float expressions
// of this file, the inline helpers of core/ compiled here (scores, exp, SwiGLU) and the
// emulation's library kernels, because moecheck::core carries -ffp-contract=off to its users
// (docs/building.md). The consumer's control build (-ffp-contract=fast forced on this file
// alone) shows the first hash does move when the flag is missing.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/blocks.h"
#include "core/numfmt.h"
#include "core/portable_math.h"
#include "core/score_math.h"
#include "emulate/bf16_gemv.h"
#include "emulate/mmvq.h"
#include "emulate/quantize_q8_1.h"

namespace {

struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xFFu;
      h *= 1099511628211ull;
    }
  }
};

struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 32);
  }
  float uniform(float scale) {
    return (static_cast<float>(next() >> 8) / 16777216.0f - 0.5f) * scale;
  }
};

// x * y + z written plainly: contracted to one fma when the numerics flag is lost.
uint64_t plain_expressions(Lcg& g) {
  Hash h;
  float acc = 0.0f;
  for (int i = 0; i < 100000; ++i) {
    const float x = g.uniform(8.0f), y = g.uniform(8.0f), z = g.uniform(8.0f);
    h.add(x * y + z);  // each product has one use, so a contracting build fuses it
    acc = x * z + acc * 0.5f;
  }
  h.add(acc);
  return h.h;
}

uint64_t inline_helpers(Lcg& g) {
  Hash h;
  for (int i = 0; i < 100000; ++i) {
    const float z = g.uniform(60.0f);
    h.add(moecheck::psqrt_softplus(z));
    h.add(moecheck::psigmoid(z));
    h.add(moecheck::pexp(0.5f * z));
    h.add(moecheck::swiglu(z, g.uniform(4.0f), 10.0f));
  }
  return h.h;
}

// q8_1 quantisation, Q2_K and Q3_K MMVQ on random blocks, and the bf16 GEMV.
uint64_t emulation_kernels(Lcg& g) {
  using namespace moecheck;
  const int64_t K = 512, rows = 16, T = 3;
  std::vector<float> x(static_cast<size_t>(T * K));
  for (auto& v : x) v = g.uniform(4.0f);
  std::vector<BlockQ8_1> a(static_cast<size_t>(T * K / kQK8_1));
  emu::quantize_q8_1(x.data(), a.data(), T, K);
  Hash h;
  for (GgmlType t : {GgmlType::kQ2K, GgmlType::kQ3K}) {
    std::vector<uint8_t> w(static_cast<size_t>(rows * row_bytes(t, K)));
    for (auto& b : w) b = static_cast<uint8_t>(g.next() >> 24);
    std::vector<float> y(static_cast<size_t>(T * rows));
    emu::mmvq(t, w.data(), a.data(), y.data(), rows, K, T);
    for (float v : y) h.add(v);
  }
  std::vector<uint16_t> wb(static_cast<size_t>(rows * K)), xb(static_cast<size_t>(T * K));
  for (auto& v : wb) v = f32_to_bf16(g.uniform(0.1f));
  for (auto& v : xb) v = f32_to_bf16(g.uniform(2.0f));
  std::vector<float> y(static_cast<size_t>(T * rows));
  emu::bf16_gemv(wb.data(), xb.data(), y.data(), rows, K, T);
  for (float v : y) h.add(v);
  return h.h;
}

}  // namespace

int main() {
  Lcg g{20261201};
  const uint64_t p = plain_expressions(g);
  const uint64_t i = inline_helpers(g);
  const uint64_t e = emulation_kernels(g);
  std::printf("plain %016llx\ninline %016llx\nemulate %016llx\n",
              static_cast<unsigned long long>(p), static_cast<unsigned long long>(i),
              static_cast<unsigned long long>(e));
  return 0;
}
