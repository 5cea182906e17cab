// GGUF values, ggml type sizes and tensor byte sizes: the parts the reader and writer share.
// Contract: docs/gguf.md "Value types" and "Tensor types"; type ids and block sizes are ggml's
// (ggml's enum ggml_type in include/ggml.h and the block structs of src/ggml-common.h,
// ggml-org/ggml at d99724f2).
#include "golden/gguf.h"

#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace moecheck::gguf {

const char* type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "unknown";
}

size_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool: return 1;
    case ValueType::kUint16:
    case ValueType::kInt16: return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64: return 8;
    case ValueType::kString:
    case ValueType::kArray: return 0;
  }
  return 0;
}

int64_t Value::as_int() const {
  switch (scalar_bytes(type)) {
    case 1: return static_cast<int8_t>(bits & 0xFF);
    case 2: return static_cast<int16_t>(bits & 0xFFFF);
    case 4: return static_cast<int32_t>(bits & 0xFFFFFFFFu);
    default: return static_cast<int64_t>(bits);
  }
}

float Value::as_f32() const {
  const uint32_t u = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

double Value::as_f64() const {
  double f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace {
Value scalar(ValueType t, uint64_t bits) {
  Value v;
  v.type = t;
  v.bits = bits;
  return v;
}
}  // namespace

Value make_uint8(uint8_t v) { return scalar(ValueType::kUint8, v); }
Value make_int8(int8_t v) { return scalar(ValueType::kInt8, static_cast<uint8_t>(v)); }
Value make_uint16(uint16_t v) { return scalar(ValueType::kUint16, v); }
Value make_int16(int16_t v) { return scalar(ValueType::kInt16, static_cast<uint16_t>(v)); }
Value make_uint32(uint32_t v) { return scalar(ValueType::kUint32, v); }
Value make_int32(int32_t v) { return scalar(ValueType::kInt32, static_cast<uint32_t>(v)); }
Value make_uint64(uint64_t v) { return scalar(ValueType::kUint64, v); }
Value make_int64(int64_t v) { return scalar(ValueType::kInt64, static_cast<uint64_t>(v)); }
Value make_bool(bool v) { return scalar(ValueType::kBool, v ? 1 : 0); }

Value make_float32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return scalar(ValueType::kFloat32, u);
}

Value make_float64(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return scalar(ValueType::kFloat64, u);
}

Value make_string(std::string v) {
  Value r;
  r.type = ValueType::kString;
  r.str = std::move(v);
  return r;
}

Value make_array(ValueType elem_type, std::vector<Value> items) {
  Value r;
  r.type = ValueType::kArray;
  r.elem_type = elem_type;
  r.items = std::move(items);
  return r;
}

namespace {

// Every float in full (9 significant digits round-trip an f32, 17 an f64): std::to_string's "%f"
// shows 1e-20 as 0.000000.
std::string float_text(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

std::string describe(const Value& v) {
  switch (v.type) {
    case ValueType::kString: return "string \"" + v.str + "\"";
    case ValueType::kArray:
      return std::string("array<") + type_name(v.elem_type) + ">[" +
             std::to_string(v.items.size()) + "]";
    case ValueType::kFloat32: return "float32 " + float_text(v.as_f32(), 9);
    case ValueType::kFloat64: return "float64 " + float_text(v.as_f64(), 17);
    case ValueType::kBool: return v.bits ? "bool true" : "bool false";
    case ValueType::kInt8:
    case ValueType::kInt16:
    case ValueType::kInt32:
    case ValueType::kInt64:
      return std::string(type_name(v.type)) + " " + std::to_string(v.as_int());
    default: return std::string(type_name(v.type)) + " " + std::to_string(v.bits);
  }
}

TypeTraits type_traits(uint32_t ggml_type) {
  // Ids missing here (4, 5, 31-33: removed from ggml; 36-38, 40+: not known to this project)
  // are rejected by the reader rather than guessed.
  switch (ggml_type) {
    case 0: return {"F32", 1, 4};
    case 1: return {"F16", 1, 2};
    case 2: return {"Q4_0", 32, 18};
    case 3: return {"Q4_1", 32, 20};
    case 6: return {"Q5_0", 32, 22};
    case 7: return {"Q5_1", 32, 24};
    case 8: return {"Q8_0", 32, 34};
    case 9: return {"Q8_1", 32, 36};
    case 10: return {"Q2_K", 256, 84};
    case 11: return {"Q3_K", 256, 110};
    case 12: return {"Q4_K", 256, 144};
    case 13: return {"Q5_K", 256, 176};
    case 14: return {"Q6_K", 256, 210};
    case 15: return {"Q8_K", 256, 292};
    case 16: return {"IQ2_XXS", 256, 66};
    case 17: return {"IQ2_XS", 256, 74};
    case 18: return {"IQ3_XXS", 256, 98};
    case 19: return {"IQ1_S", 256, 50};
    case 20: return {"IQ4_NL", 32, 18};
    case 21: return {"IQ3_S", 256, 110};
    case 22: return {"IQ2_S", 256, 82};
    case 23: return {"IQ4_XS", 256, 136};
    case 24: return {"I8", 1, 1};
    case 25: return {"I16", 1, 2};
    case 26: return {"I32", 1, 4};
    case 27: return {"I64", 1, 8};
    case 28: return {"F64", 1, 8};
    case 29: return {"IQ1_M", 256, 56};
    case 30: return {"BF16", 1, 2};
    case 34: return {"TQ1_0", 256, 54};
    case 35: return {"TQ2_0", 256, 66};
    case 39: return {"MXFP4", 32, 17};
    default: return {};
  }
}

std::string shape_string(const TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

uint64_t tensor_nbytes(uint32_t type, const std::vector<int64_t>& ne, const std::string& what) {
  const TypeTraits tt = type_traits(type);
  if (!tt.name) throw InputError(what + ": unknown ggml type id " + std::to_string(type));
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    throw InputError(what + ": n_dims must be 1.." + std::to_string(kMaxDims) + ", found " +
                     std::to_string(ne.size()));
  // Every product is bounded by INT64_MAX so that int64 element counts never overflow.
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t values = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] <= 0)
      throw InputError(what + ": ne[" + std::to_string(i) + "] must be positive, found " +
                       std::to_string(ne[i]));
    const uint64_t d = static_cast<uint64_t>(ne[i]);
    if (values > kMax / d)
      throw InputError(what + ": element count overflows int64 at ne[" + std::to_string(i) + "]");
    values *= d;
  }
  if (ne[0] % tt.block_values != 0)
    throw InputError(what + ": ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " +
                     tt.name + " block size " + std::to_string(tt.block_values));
  const uint64_t blocks = values / static_cast<uint64_t>(tt.block_values);
  if (blocks > kMax / static_cast<uint64_t>(tt.block_bytes))
    throw InputError(what + ": byte size overflows int64");
  return blocks * static_cast<uint64_t>(tt.block_bytes);
}

}  // namespace moecheck::gguf
