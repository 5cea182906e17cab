// Test-only: writes one tensor of a GGUF file dequantised by moecheck (core/kquant.h
// dequantize_row: F32, F16, BF16, Q2_K, Q3_K; the weights the reference computes with) as raw
// little-endian float32, row after row in file order, so tests/interop/interop_test.py can
// compare it bit for bit with gguf-py's `gguf.quants.dequantize`.
//   dequant_probe <model.gguf> <tensor name> <out.f32>
// Exit 0 written, 2 bad input (the message names the file and the tensor).
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "core/kquant.h"
#include "golden/gguf.h"

namespace {

using namespace moecheck;

void probe(const std::string& file, const std::string& name, const std::string& out_path) {
  const gguf::Reader r = gguf::Reader::open(file);
  const gguf::TensorInfo* t = r.find_tensor(name);
  if (t == nullptr) throw InputError(file + ": tensor " + name + ": not in the file");
  const gguf::TypeTraits tt = gguf::type_traits(t->type);
  const int64_t cols = t->ne[0];
  const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
  const int64_t row_bytes = cols / tt.block_values * tt.block_bytes;
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(out_path + ": cannot be written");
  std::vector<float> y(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    try {
      dequantize_row(static_cast<GgmlType>(t->type), r.data(*t) + i * row_bytes, y.data(), cols);
    } catch (const InputError& e) {
      throw InputError(file + ": tensor " + name + " (" + (tt.name ? tt.name : "?") +
                       "): " + e.what());
    }
    out.write(reinterpret_cast<const char*>(y.data()),
              static_cast<std::streamsize>(y.size() * sizeof(float)));
  }
  if (!out.flush()) throw InputError(out_path + ": write failed");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: dequant_probe <model.gguf> <tensor name> <out.f32>\n");
    return 2;
  }
  try {
    probe(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dequant_probe: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
