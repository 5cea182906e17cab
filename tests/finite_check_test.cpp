// Non-finite weights refused on the first read of a slice (golden/finite_check.h): bf16, f16 and
// f32 values and the f16 scales of Q2_K (d, dmin) and Q3_K (d), named by file, slice, row, column
// or super-block and the bits; through SliceHasher on a generated model with one expert's scale
// set to NaN: that expert's slice is refused, the other experts' are not (no whole-model scan).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "golden/finite_check.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/provenance.h"

namespace moecheck {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(FiniteCheck, DenseValuesNamedByRowColumnAndBits) {
  std::vector<uint16_t> bf(12, 0x3F80);  // 1.0
  const auto* p = reinterpret_cast<const uint8_t*>(bf.data());
  EXPECT_EQ(error_of([&] { check_finite_slice("m.gguf", "t", 30, 4, p, 24); }), "");
  bf[6] = 0x7FC0;  // NaN at row 1, column 2
  EXPECT_EQ(
      error_of([&] { check_finite_slice("m.gguf", "blk.0.ffn_gate_inp.weight", 30, 4, p, 24); }),
      "m.gguf: tensor blk.0.ffn_gate_inp.weight: row 1, column 2 is NaN (bits 0x7FC0); "
      "non-finite weights are refused (docs/reliability.md)");
  bf[6] = 0xFF80;  // -Inf
  EXPECT_NE(error_of([&] { check_finite_slice("m", "t", 30, 4, p, 24); }).find("is -Inf"),
            std::string::npos);
  std::vector<uint16_t> h(4, 0x3C00);
  h[3] = 0x7C00;  // f16 +Inf
  EXPECT_NE(error_of([&] {
              check_finite_slice("m", "t", 1, 2, reinterpret_cast<const uint8_t*>(h.data()), 8);
            }).find("row 1, column 1 is +Inf"),
            std::string::npos);
  std::vector<float> f(3, 1.0f);
  f[2] = std::nanf("");
  EXPECT_NE(error_of([&] {
              check_finite_slice("m", "t", 0, 3, reinterpret_cast<const uint8_t*>(f.data()), 12);
            }).find("row 0, column 2 is NaN"),
            std::string::npos);
}

TEST(FiniteCheck, KQuantScalesNamedBySuperBlockAndRow) {
  std::vector<BlockQ2K> q2(4);
  std::memset(q2.data(), 0, q2.size() * sizeof(BlockQ2K));
  for (auto& b : q2) b.d = b.dmin = 0x3C00;
  const auto* p2 = reinterpret_cast<const uint8_t*>(q2.data());
  EXPECT_EQ(error_of([&] { check_finite_slice("m", "t", 10, 512, p2, sizeof(BlockQ2K) * 4); }), "");
  q2[3].dmin = 0x7E00;  // row 1 (2 super-blocks per row), super-block 1
  EXPECT_NE(error_of([&] {
              check_finite_slice("m", "t", 10, 512, p2, sizeof(BlockQ2K) * 4);
            }).find("super-block 1 of row 1: dmin is NaN (bits 0x7E00)"),
            std::string::npos);
  std::vector<BlockQ3K> q3(2);
  std::memset(q3.data(), 0, q3.size() * sizeof(BlockQ3K));
  q3[1].d = 0xFC00;
  EXPECT_NE(error_of([&] {
              check_finite_slice("m", "t", 11, 256, reinterpret_cast<const uint8_t*>(q3.data()),
                                 sizeof(BlockQ3K) * 2);
            }).find("super-block 0 of row 1: d is -Inf"),
            std::string::npos);
}

TEST(FiniteCheck, SliceHasherRefusesOnlyTheSliceThatHoldsTheNaN) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("moecheck_finite_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  GenOptions o = preset_options("tiny");
  o.n_layers = 1;
  write_model(o, path);
  uint64_t at = 0;
  {
    const ModelFile m = ModelFile::open(path);
    const gguf::TensorInfo* ti = m.gguf().find_tensor(tensor_name(0, LayerTensor::kGateExps));
    ASSERT_NE(ti, nullptr);
    const uint64_t per_expert = ti->nbytes / static_cast<uint64_t>(ti->ne[2]);
    // Expert 3, row 5, super-block 1: its d.
    const uint64_t row_bytes = static_cast<uint64_t>(ti->ne[0] / kQK_K) * sizeof(BlockQ2K);
    at = m.gguf().data_offset() + ti->offset + 3 * per_expert + 5 * row_bytes + sizeof(BlockQ2K) +
         offsetof(BlockQ2K, d);
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    const uint16_t nan = 0x7E00;
    f.write(reinterpret_cast<const char*>(&nan), 2);
  }
  SliceHasher h(ModelFile::open(path));
  EXPECT_EQ(error_of([&] { h.slice(0, LayerTensor::kGateExps, 2); }), "");
  EXPECT_EQ(error_of([&] { h.slice(0, LayerTensor::kUpExps, 3); }), "");
  const std::string e = error_of([&] { h.slice(0, LayerTensor::kGateExps, 3); });
  EXPECT_NE(e.find(path + ": tensor blk.0.ffn_gate_exps.weight[expert 3]: super-block 1 of row 5: "
                          "d is NaN (bits 0x7E00)"),
            std::string::npos)
      << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moecheck
