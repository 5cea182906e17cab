// GGUF version 3 files: a validating, memory-mapped reader and a streaming writer.
// Contract: docs/gguf.md (layout, validation rules), after the GGUF specification in ggml's
// docs/gguf.md and src/gguf.cpp (ggml-org/ggml at d99724f2b141fed9e1a9f402213506c081433465).
// The reader never reads outside the file and never allocates from a size it has not checked
// against the bytes left; every problem is an InputError naming the file, the byte offset and
// the field. The writer streams tensor data from callbacks (a ds41 layer is 4.9 GB) into a
// temporary file that is renamed into place only when complete.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moecheck::gguf {

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;
inline constexpr size_t kMaxNameBytes = 63;  // ggml's GGML_MAX_NAME (64) less the NUL
inline constexpr const char* kAlignmentKey = "general.alignment";

// GGUF metadata value type ids, as stored.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;

const char* type_name(ValueType t);
// Bytes of a fixed-size value (0 for STRING and ARRAY).
size_t scalar_bytes(ValueType t);

// One metadata value. Scalars keep their little-endian bytes zero-extended in `bits`, so floats
// round-trip bit for bit (NaN payloads included); BOOL is 0 or 1.
struct Value {
  ValueType type = ValueType::kUint8;
  uint64_t bits = 0;                        // scalar types
  std::string str;                          // kString
  ValueType elem_type = ValueType::kUint8;  // kArray: element type (never kArray)
  std::vector<Value> items;                 // kArray: elements, all of elem_type

  bool operator==(const Value&) const = default;

  // Typed reads; each requires the exact type (callers check `type` first).
  uint64_t as_uint() const { return bits; }
  int64_t as_int() const;  // sign-extends INT8..INT64
  float as_f32() const;
  double as_f64() const;
  bool as_bool() const { return bits != 0; }
};

Value make_uint8(uint8_t v);
Value make_int8(int8_t v);
Value make_uint16(uint16_t v);
Value make_int16(int16_t v);
Value make_uint32(uint32_t v);
Value make_int32(int32_t v);
Value make_uint64(uint64_t v);
Value make_int64(int64_t v);
Value make_float32(float v);
Value make_float64(double v);
Value make_bool(bool v);
Value make_string(std::string v);
Value make_array(ValueType elem_type, std::vector<Value> items);

// Short human form for messages ("uint32 7", "string \"deepseek2\"", "array<float32>[3]").
std::string describe(const Value& v);

struct KeyValue {
  std::string key;
  Value value;
  uint64_t file_offset = 0;  // where the key starts in the file (reader only)
};

// ggml tensor type ids this project knows the block size of (ggml's enum ggml_type, include/ggml.h
// at ggml-org/ggml d99724f2).
struct TypeTraits {
  const char* name = nullptr;  // nullptr: unknown id
  int64_t block_values = 0;
  int64_t block_bytes = 0;
};
TypeTraits type_traits(uint32_t ggml_type);

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is the row length
  uint32_t type = 0;                             // ggml_type id
  uint64_t offset = 0;                           // relative to the data section
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;  // where the info starts in the file (reader only)

  int64_t n_values() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// "[5120, 2304, 384]"
std::string shape_string(const TensorInfo& t);

// How a file is mapped: read-only, or copy-on-write (private pages: writes change this process's
// view only, never the file; used by `moecheck sensitivity` to perturb what one implementation
// reads while the file and every other view stay intact).
enum class MapMode { kReadOnly, kCopyOnWrite };

// A parsed, validated GGUF file. Copies share the mapping.
class Reader {
 public:
  // Maps `path` (read-only unless asked) and validates it.
  static Reader open(const std::string& path, MapMode mode = MapMode::kReadOnly);
  // Validates bytes held in memory; `name` stands for the file in messages.
  static Reader from_bytes(std::vector<uint8_t> bytes, const std::string& name);
  // Validates `size` bytes at `base` that `owner` keeps alive (a synthetic model's anonymous
  // mapping, golden/synthetic_model.h); `name` stands for the file in messages. kCopyOnWrite lets
  // writable() hand out addresses inside it (the memory must then be writable).
  static Reader from_memory(std::shared_ptr<const void> owner, const uint8_t* base, uint64_t size,
                            const std::string& name, MapMode mode = MapMode::kReadOnly);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of the data section

  const std::vector<KeyValue>& kvs() const { return kvs_; }
  const KeyValue* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // The file's first data_offset() bytes: header, metadata, tensor infos and the padding before
  // the data section (valid while any copy of this Reader or `owner()` lives).
  const uint8_t* header_bytes() const { return base_; }
  // The tensor's bytes inside the mapping (valid while any copy of this Reader or `owner()` lives).
  const uint8_t* data(const TensorInfo& t) const { return base_ + data_offset_ + t.offset; }
  const uint8_t* bytes() const { return base_; }
  std::shared_ptr<const void> owner() const { return owner_; }
  // The writable address of `n` bytes at p inside a copy-on-write mapping; throws std::logic_error
  // for a read-only mapping or a range outside the file.
  uint8_t* writable(const uint8_t* p, uint64_t n) const;

 private:
  friend class Parser;  // golden/gguf_reader.cpp: the parse, one part of the file per step
  static Reader parse(std::shared_ptr<const void> owner, const uint8_t* base, uint64_t size,
                      const std::string& name);

  std::string name_;
  std::shared_ptr<const void> owner_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool copy_on_write_ = false;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Fills `n` bytes of a tensor starting at byte `offset` of its data into `out`.
using FillFn = std::function<void(uint64_t offset, uint8_t* out, uint64_t n)>;

struct TensorSpec {
  std::string name;
  uint32_t type = 0;         // ggml_type id
  std::vector<int64_t> ne;   // ggml order, 1..4 dims
  uint64_t chunk_bytes = 0;  // the writer asks for at most this many bytes per call; 0 = all
  FillFn fill;
};

// Builds a GGUF v3 file: metadata in insertion order, tensors contiguous in insertion order,
// each at the padded end of the one before (the layout ggml requires).
class Writer {
 public:
  // Adds a key; a duplicate key, an empty key, a nested array or a mixed array is an InputError.
  void set(const std::string& key, Value v);
  // Adds general.alignment (uint32, a power of two).
  void set_alignment(uint32_t alignment) { set(kAlignmentKey, make_uint32(alignment)); }
  // Checks name, dims, type and block divisibility now; data is pulled at write().
  void add_tensor(TensorSpec spec);

  uint32_t alignment() const;
  // Absolute offset the data section will start at, and each tensor's relative offset.
  uint64_t data_offset() const;
  std::vector<uint64_t> tensor_offsets() const;
  uint64_t file_size() const;
  // The file's first data_offset() bytes: header, metadata, tensor infos and the padding.
  std::vector<uint8_t> header_bytes() const;
  // The tensors in insertion order (their fill callbacks make the bytes write() would write).
  const std::vector<TensorSpec>& tensors() const { return tensors_; }

  // Writes `path + ".tmp-<pid>"`, then renames it to `path`; on any failure the temporary is
  // removed and the error rethrown. Returns the file's SHA-256 (hex), computed as it is written.
  std::string write(const std::string& path) const;

 private:
  std::vector<KeyValue> kvs_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> nbytes_;
};

// Size in bytes of a tensor of `type` with dims `ne`; throws InputError (naming `what`) for an
// unknown type, a non-positive dim, a row length that is not a multiple of the block, or overflow.
uint64_t tensor_nbytes(uint32_t type, const std::vector<int64_t>& ne, const std::string& what);

}  // namespace moecheck::gguf
