// libFuzzer target: the readers of `moecheck import` (golden/tensor_file.h) on arbitrary bytes.
// The first byte picks the format (0 .npy, 1 .npy read with '<u2' as bf16, 2 .npz, 3
// safetensors), the rest is the file. Every input must end in parsed tensors, each then converted
// as import converts it (values to f32 and bf16, ids to i32, each only where its dtype allows),
// or an InputError; any other exception, a crash, a leak or undefined behaviour (ASan + UBSan) is
// a finding. Seeds: tests/fuzz/corpus/tensor. Run: .ci/fuzz 60 tensor (docs/reliability.md).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "core/error.h"
#include "golden/tensor_file.h"

namespace {

void convert(const moecheck::HostTensor& t) {
  try {
    (void)moecheck::tensor_to_f32(t);
    (void)moecheck::tensor_to_bf16(t);
  } catch (const moecheck::InputError&) {}
  try {
    (void)moecheck::tensor_to_i32(t);
  } catch (const moecheck::InputError&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moecheck;
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 4;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  try {
    std::map<std::string, HostTensor> ts;
    if (kind <= 1) ts[""] = parse_npy(p, n, "fuzz.npy", kind == 1 ? U16As::kBF16 : U16As::kRefuse);
    else if (kind == 2) ts = parse_npz(p, n, "fuzz.npz", U16As::kBF16);
    else ts = parse_safetensors(p, n, "fuzz.safetensors");
    for (const auto& [name, t] : ts) convert(t);
  } catch (const InputError&) {}
  return 0;
}
