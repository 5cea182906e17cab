// Tensors other engines dumped, read for `moecheck import` (tools/cmd_import.cpp): numpy `.npy`
// (format versions 1.0, 2.0, 3.0; NEP 1), `.npz` (a zip archive of `.npy` members, stored or
// deflated, zip64 records understood) and safetensors (an 8-byte little-endian header length, a
// JSON header of dtype / shape / data_offsets per tensor, then the data). Only what an engine
// dump needs: little-endian, C order, dtypes f32, f16, bf16 (safetensors BF16; a `.npy` '<u2'
// only when the caller says it holds bf16), i32, i64, u8. Every malformed file is an InputError
// naming the file, the member or tensor and the field, with what was expected and found.
// Contract: docs/golden-format.md "Imported dumps", docs/cli.md "import".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moecheck {

enum class TensorDtype { kF32, kF16, kBF16, kU16, kI32, kI64, kU8 };
// "f32", "f16", "bf16", "u16", "i32", "i64", "u8".
const char* tensor_dtype_name(TensorDtype d);
size_t tensor_dtype_size(TensorDtype d);

struct HostTensor {
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;  // row-major (C order)
  std::vector<uint8_t> bytes;  // little-endian elements, prod(shape) * size
  std::string where;           // "file.npz: member x.npy" for messages
  int64_t numel() const;
};

// How a 2-byte '<u2' array of a `.npy` is read: refused (the default: a u16 array is not a float
// format), or taken as bf16 bit patterns (`--dtype bf16`).
enum class U16As { kRefuse, kBF16 };

// One `.npy` file's bytes; `where` names it in messages.
HostTensor parse_npy(const uint8_t* data, size_t n, const std::string& where,
                     U16As u16 = U16As::kRefuse);
// Every member of a `.npz` archive, keyed by member name without ".npy" (numpy's keys).
std::map<std::string, HostTensor> parse_npz(const uint8_t* data, size_t n, const std::string& where,
                                            U16As u16 = U16As::kRefuse);
// Every tensor of a safetensors file, keyed by name (`__metadata__` is skipped).
std::map<std::string, HostTensor> parse_safetensors(const uint8_t* data, size_t n,
                                                    const std::string& where);

// A file by its extension (.npy: one tensor under the key ""; .npz; .safetensors). InputError for
// a missing or unreadable file or another extension.
std::map<std::string, HostTensor> read_tensor_file(const std::string& path,
                                                   U16As u16 = U16As::kRefuse);

// Element conversions (InputError naming t.where when the dtype cannot be converted so: a float
// tensor for integer ids, an integer tensor for values).
std::vector<float> tensor_to_f32(const HostTensor& t);
std::vector<uint16_t> tensor_to_bf16(const HostTensor& t);  // f32 rounded to nearest even
std::vector<int32_t> tensor_to_i32(const HostTensor& t);    // i64 values must fit

// Test helpers (and `moecheck` itself writes none): a version 1.0 `.npy` of the tensor, and a
// stored (method 0) zip of named `.npy` members.
std::vector<uint8_t> make_npy(const HostTensor& t);
std::vector<uint8_t> make_npz_stored(const std::map<std::string, std::vector<uint8_t>>& members);

}  // namespace moecheck
