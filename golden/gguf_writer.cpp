// GGUF v3 writer: metadata and tensor infos built in memory, tensor data streamed from the
// callers' fill callbacks chunk by chunk, so a 4.9 GB layer never sits in memory.
// Contract: docs/gguf.md "Layout written". Tensors are contiguous in insertion order, each at
// the padded end of the one before (what ggml's reader requires); the file is written under a
// temporary name and renamed only when complete.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "golden/atomic_file.h"
#include "golden/gguf.h"
#include "golden/sha256.h"

namespace moecheck::gguf {

namespace {

constexpr uint64_t kDefaultChunkBytes = 16u << 20;

void put_uint(std::vector<uint8_t>& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_uint(out, s.size(), 8);
  out.insert(out.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& out, const Value& v) {
  if (v.type == ValueType::kString) {
    put_string(out, v.str);
  } else if (v.type == ValueType::kArray) {
    put_uint(out, static_cast<uint32_t>(v.elem_type), 4);
    put_uint(out, v.items.size(), 8);
    for (const Value& item : v.items) put_value(out, item);
  } else {
    put_uint(out, v.bits, scalar_bytes(v.type));
  }
}

void check_value(const Value& v, const std::string& what, bool in_array) {
  const auto t = static_cast<uint32_t>(v.type);
  if (t >= kValueTypeCount)
    throw InputError(what + ": value type id " + std::to_string(t) + " is not a GGUF type");
  if (v.type == ValueType::kArray) {
    if (in_array) throw InputError(what + ": nested arrays are not allowed");
    if (v.elem_type == ValueType::kArray || static_cast<uint32_t>(v.elem_type) >= kValueTypeCount)
      throw InputError(what + ": array element type must be a scalar or string type");
    for (size_t i = 0; i < v.items.size(); ++i) {
      if (v.items[i].type != v.elem_type)
        throw InputError(what + "[" + std::to_string(i) + "]: element is " +
                         type_name(v.items[i].type) + ", the array holds " +
                         type_name(v.elem_type));
      check_value(v.items[i], what + "[" + std::to_string(i) + "]", true);
    }
    return;
  }
  const size_t n = scalar_bytes(v.type);
  if (n > 0 && n < 8 && (v.bits >> (8 * n)) != 0)
    throw InputError(what + ": bits do not fit a " + type_name(v.type));
  if (v.type == ValueType::kBool && v.bits > 1) throw InputError(what + ": bool must be 0 or 1");
}

uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

void Writer::set(const std::string& key, Value v) {
  if (key.empty()) throw InputError("gguf writer: empty metadata key");
  for (const KeyValue& kv : kvs_)
    if (kv.key == key) throw InputError("gguf writer: duplicate metadata key \"" + key + "\"");
  check_value(v, "gguf writer: key \"" + key + "\"", false);
  if (key == kAlignmentKey) {
    if (v.type != ValueType::kUint32)
      throw InputError(std::string("gguf writer: ") + kAlignmentKey + " must be uint32, found " +
                       type_name(v.type));
    if (v.bits == 0 || (v.bits & (v.bits - 1)) != 0)
      throw InputError(std::string("gguf writer: ") + kAlignmentKey +
                       " must be a power of two, found " + std::to_string(v.bits));
  }
  kvs_.push_back(KeyValue{key, std::move(v), 0});
}

void Writer::add_tensor(TensorSpec spec) {
  const std::string what = "gguf writer: tensor \"" + spec.name + "\"";
  if (spec.name.empty()) throw InputError("gguf writer: empty tensor name");
  if (spec.name.size() > kMaxNameBytes)
    throw InputError(what + ": name longer than " + std::to_string(kMaxNameBytes) + " bytes");
  for (const TensorSpec& t : tensors_)
    if (t.name == spec.name) throw InputError(what + ": duplicate tensor name");
  if (!spec.fill) throw InputError(what + ": no fill callback");
  nbytes_.push_back(tensor_nbytes(spec.type, spec.ne, what));
  tensors_.push_back(std::move(spec));
}

uint32_t Writer::alignment() const {
  for (const KeyValue& kv : kvs_)
    if (kv.key == kAlignmentKey) return static_cast<uint32_t>(kv.value.bits);
  return kDefaultAlignment;
}

std::vector<uint64_t> Writer::tensor_offsets() const {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (const uint64_t n : nbytes_) {
    offsets.push_back(at);
    at += pad_to(n, alignment());
  }
  return offsets;
}

std::vector<uint8_t> Writer::header_bytes() const {
  std::vector<uint8_t> out;
  put_uint(out, 0x46554747u, 4);  // "GGUF"
  put_uint(out, kVersion, 4);
  put_uint(out, tensors_.size(), 8);
  put_uint(out, kvs_.size(), 8);
  for (const KeyValue& kv : kvs_) {
    put_string(out, kv.key);
    put_uint(out, static_cast<uint32_t>(kv.value.type), 4);
    put_value(out, kv.value);
  }
  const std::vector<uint64_t> offsets = tensor_offsets();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    put_string(out, t.name);
    put_uint(out, t.ne.size(), 4);
    for (const int64_t d : t.ne) put_uint(out, static_cast<uint64_t>(d), 8);
    put_uint(out, t.type, 4);
    put_uint(out, offsets[i], 8);
  }
  out.resize(pad_to(out.size(), alignment()), 0);
  return out;
}

uint64_t Writer::data_offset() const { return header_bytes().size(); }

uint64_t Writer::file_size() const {
  uint64_t n = data_offset();
  for (const uint64_t b : nbytes_) n += pad_to(b, alignment());
  return n;
}

std::string Writer::write(const std::string& path) const {
  AtomicFile f(path);  // temp + write(2) + fsync + rename; removed on any failure
  Sha256 digest;       // of the bytes as they go out: the file's SHA-256 with no second pass
  auto put = [&](const uint8_t* p, uint64_t n) {
    if (n == 0) return;
    f.write(p, static_cast<size_t>(n));
    digest.update(p, static_cast<size_t>(n));
  };
  const std::vector<uint8_t> header = header_bytes();
  put(header.data(), header.size());
  const uint64_t align = alignment();
  uint64_t max_chunk = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t chunk = tensors_[i].chunk_bytes ? tensors_[i].chunk_bytes : kDefaultChunkBytes;
    max_chunk = std::max(max_chunk, std::min(chunk, nbytes_[i]));
  }
  std::vector<uint8_t> buf(static_cast<size_t>(max_chunk));
  const std::vector<uint8_t> zeros(4096, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    const uint64_t chunk = t.chunk_bytes ? t.chunk_bytes : kDefaultChunkBytes;
    for (uint64_t at = 0; at < nbytes_[i]; at += chunk) {
      const uint64_t n = std::min(chunk, nbytes_[i] - at);
      t.fill(at, buf.data(), n);
      put(buf.data(), n);
    }
    // Alignment may be large (any power of two up to 2^31), so padding goes out in pieces.
    for (uint64_t pad = pad_to(nbytes_[i], align) - nbytes_[i]; pad > 0;) {
      const uint64_t n = std::min<uint64_t>(pad, zeros.size());
      put(zeros.data(), n);
      pad -= n;
    }
  }
  f.commit();
  return to_hex(digest.finish());
}

}  // namespace moecheck::gguf
