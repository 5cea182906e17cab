// GGUF v3 reader: maps the file read-only and validates every field before it is used.
// Contract: docs/gguf.md "Validation". Every read goes through Cursor, which checks the bytes
// left first; every count that sizes an allocation is checked against the bytes left before the
// allocation. Errors: "<file>: offset <n>: <field>: <what was expected and found>".
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "golden/gguf.h"

namespace moecheck::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF fields are little-endian and read in place");

namespace {

class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& name)
      : base_(base), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(uint64_t at, const std::string& msg) const {
    throw InputError(name_ + ": offset " + std::to_string(at) + ": " + msg);
  }

  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      fail(pos_, field + ": needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) +
                     " left in the file (size " + std::to_string(size_) + ")");
  }

  uint64_t uint(size_t n, const std::string& field) {
    need(n, field);
    uint64_t v = 0;
    std::memcpy(&v, base_ + pos_, n);  // little-endian host (asserted above)
    pos_ += n;
    return v;
  }
  uint32_t u32(const std::string& field) { return static_cast<uint32_t>(uint(4, field)); }
  uint64_t u64(const std::string& field) { return uint(8, field); }

  std::string str(const std::string& field) {
    const uint64_t at = pos_;
    const uint64_t len = u64(field + " length");
    if (len > left())
      fail(at, field + " length " + std::to_string(len) + " exceeds the " + std::to_string(left()) +
                   " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// Smallest encodings, used to bound counts before anything is allocated.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;           // key length, 1-byte key, type, uint8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, 1 dim, type, offset

Value read_scalar_or_string(Cursor& c, ValueType t, const std::string& field) {
  Value v;
  v.type = t;
  if (t == ValueType::kString) {
    v.str = c.str(field);
    return v;
  }
  const uint64_t at = c.pos();
  v.bits = c.uint(scalar_bytes(t), field);
  if (t == ValueType::kBool && v.bits > 1)
    c.fail(at, field + ": bool byte must be 0 or 1, found " + std::to_string(v.bits));
  return v;
}

Value read_value(Cursor& c, ValueType t, const std::string& field) {
  if (t != ValueType::kArray) return read_scalar_or_string(c, t, field);
  const uint64_t et_at = c.pos();
  const uint32_t et = c.u32(field + " array element type");
  if (et >= kValueTypeCount)
    c.fail(et_at, field + ": array element type id " + std::to_string(et) + " is not a GGUF type (0..12)");
  if (static_cast<ValueType>(et) == ValueType::kArray)
    c.fail(et_at, field + ": nested arrays are not allowed");
  const ValueType elem = static_cast<ValueType>(et);
  const uint64_t count_at = c.pos();
  const uint64_t count = c.u64(field + " array count");
  const uint64_t min_elem = elem == ValueType::kString ? 8 : scalar_bytes(elem);
  if (count > c.left() / min_elem)
    c.fail(count_at, field + ": array count " + std::to_string(count) + " of " + type_name(elem) +
                         " needs at least " + std::to_string(min_elem) + " bytes each, only " +
                         std::to_string(c.left()) + " bytes left in the file");
  Value v = make_array(elem, {});
  v.items.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i)
    v.items.push_back(read_scalar_or_string(c, elem, field + "[" + std::to_string(i) + "]"));
  return v;
}

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

}  // namespace

const KeyValue* Reader::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const TensorInfo* Reader::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Reader Reader::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  if (map->size > 0) {
    void* p = ::mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot map " + std::to_string(map->size) + " bytes: " + std::strerror(err));
    }
    map->addr = p;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  const uint8_t* base = static_cast<const uint8_t*>(map->addr);
  const uint64_t size = map->size;
  return parse(std::move(map), base, size, path);
}

Reader Reader::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* base = owned->data();
  const uint64_t size = owned->size();
  return parse(std::move(owned), base, size, name);
}

Reader Reader::parse(std::shared_ptr<const void> owner, const uint8_t* base, uint64_t size,
                     const std::string& name) {
  Reader r;
  r.name_ = name;
  r.owner_ = std::move(owner);
  r.base_ = base;
  r.size_ = size;
  Cursor c(base, size, r.name_);

  // ---- header ----
  c.need(4, "magic");
  if (std::memcmp(base, "GGUF", 4) != 0) {
    char found[32];
    std::snprintf(found, sizeof found, "%02x %02x %02x %02x", base[0], base[1], base[2], base[3]);
    c.fail(0, std::string("magic: expected \"GGUF\" (47 47 55 46), found ") + found);
  }
  c.uint(4, "magic");
  r.version_ = c.u32("version");
  if (r.version_ != kVersion) {
    // ggml's test: a byte-swapped file has its version in the high half.
    if ((r.version_ & 0xFFFFu) == 0 && r.version_ != 0)
      c.fail(4, "version: " + std::to_string(r.version_) +
                    " is a byte-swapped (big-endian) GGUF; only little-endian files are supported");
    c.fail(4, "version: expected 3, found " + std::to_string(r.version_));
  }
  const uint64_t n_tensors = c.u64("tensor_count");
  const uint64_t n_kv = c.u64("kv_count");
  if (n_tensors > c.left() / kMinTensorInfoBytes)
    c.fail(8, "tensor_count " + std::to_string(n_tensors) + " needs at least " +
                  std::to_string(kMinTensorInfoBytes) + " bytes per tensor info, only " +
                  std::to_string(c.left()) + " bytes left in the file");
  if (n_kv > (c.left() - n_tensors * kMinTensorInfoBytes) / kMinKvBytes)
    c.fail(16, "kv_count " + std::to_string(n_kv) + " needs at least " + std::to_string(kMinKvBytes) +
                   " bytes per key-value pair, only " + std::to_string(c.left()) +
                   " bytes left in the file besides the tensor infos");

  // ---- metadata ----
  r.kvs_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string field = "kv[" + std::to_string(i) + "]";
    KeyValue kv;
    kv.file_offset = c.pos();
    kv.key = c.str(field + " key");
    if (kv.key.empty()) c.fail(kv.file_offset, field + " key is empty");
    if (const auto it = r.kv_index_.find(kv.key); it != r.kv_index_.end())
      c.fail(kv.file_offset, field + " key \"" + kv.key + "\" duplicates kv[" + std::to_string(it->second) + "]");
    const std::string vfield = field + " \"" + kv.key + "\"";
    const uint64_t type_at = c.pos();
    const uint32_t t = c.u32(vfield + " value type");
    if (t >= kValueTypeCount)
      c.fail(type_at, vfield + ": value type id " + std::to_string(t) + " is not a GGUF type (0..12)");
    const uint64_t value_at = c.pos();
    kv.value = read_value(c, static_cast<ValueType>(t), vfield);
    if (kv.key == kAlignmentKey) {
      if (kv.value.type != ValueType::kUint32)
        c.fail(type_at, vfield + ": must be uint32, found " + type_name(kv.value.type));
      const uint64_t a = kv.value.bits;
      if (a == 0 || (a & (a - 1)) != 0)
        c.fail(value_at, vfield + ": must be a power of two, found " + std::to_string(a));
      r.alignment_ = static_cast<uint32_t>(a);
    }
    r.kv_index_.emplace(kv.key, r.kvs_.size());
    r.kvs_.push_back(std::move(kv));
  }

  // ---- tensor infos ----
  std::vector<uint64_t> offset_at(static_cast<size_t>(n_tensors));
  r.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string field = "tensor[" + std::to_string(i) + "]";
    TensorInfo t;
    t.info_offset = c.pos();
    t.name = c.str(field + " name");
    if (t.name.empty()) c.fail(t.info_offset, field + " name is empty");
    if (t.name.size() > kMaxNameBytes)
      c.fail(t.info_offset, field + " name is " + std::to_string(t.name.size()) + " bytes, at most " +
                                std::to_string(kMaxNameBytes) + " allowed (ggml GGML_MAX_NAME)");
    if (const auto it = r.tensor_index_.find(t.name); it != r.tensor_index_.end())
      c.fail(t.info_offset, field + " name \"" + t.name + "\" duplicates tensor[" + std::to_string(it->second) + "]");
    const std::string tf = field + " \"" + t.name + "\"";
    const uint64_t nd_at = c.pos();
    t.n_dims = c.u32(tf + " n_dims");
    if (t.n_dims == 0 || t.n_dims > kMaxDims)
      c.fail(nd_at, tf + ": n_dims must be 1..4, found " + std::to_string(t.n_dims));
    std::vector<int64_t> ne;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = c.pos();
      const uint64_t v = c.u64(tf + " ne[" + std::to_string(d) + "]");
      if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        c.fail(ne_at, tf + ": ne[" + std::to_string(d) + "] must be in 1..2^63-1, found " + std::to_string(v));
      t.ne[d] = static_cast<int64_t>(v);
      ne.push_back(t.ne[d]);
    }
    const uint64_t type_at = c.pos();
    t.type = c.u32(tf + " type");
    if (!type_traits(t.type).name)
      c.fail(type_at, tf + ": unknown ggml type id " + std::to_string(t.type));
    t.nbytes = tensor_nbytes(t.type, ne, r.name_ + ": offset " + std::to_string(nd_at) + ": " + tf);
    offset_at[static_cast<size_t>(i)] = c.pos();
    t.offset = c.u64(tf + " offset");
    if (t.offset % r.alignment_ != 0)
      c.fail(c.pos() - 8, tf + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                              std::to_string(r.alignment_));
    r.tensor_index_.emplace(t.name, r.tensors_.size());
    r.tensors_.push_back(std::move(t));
  }

  // ---- data section ----
  r.data_offset_ = (c.pos() + r.alignment_ - 1) / r.alignment_ * r.alignment_;
  for (size_t i = 0; i < r.tensors_.size(); ++i) {
    const TensorInfo& t = r.tensors_[i];
    const uint64_t avail = r.data_offset_ <= size ? size - r.data_offset_ : 0;
    if (r.data_offset_ > size || t.offset > avail || t.nbytes > avail - t.offset)
      c.fail(offset_at[i], "tensor[" + std::to_string(i) + "] \"" + t.name + "\": data [" +
                               std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                               ") relative to the data section at " + std::to_string(r.data_offset_) +
                               " ends past the end of the file (size " + std::to_string(size) + ")");
  }
  std::vector<size_t> order(r.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return r.tensors_[a].offset < r.tensors_[b].offset || (r.tensors_[a].offset == r.tensors_[b].offset && a < b);
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = r.tensors_[order[k - 1]];
    const TensorInfo& cur = r.tensors_[order[k]];
    if (prev.offset + prev.nbytes > cur.offset)
      c.fail(offset_at[order[k]], "tensor[" + std::to_string(order[k]) + "] \"" + cur.name + "\": data at " +
                                      std::to_string(cur.offset) + " overlaps tensor[" + std::to_string(order[k - 1]) +
                                      "] \"" + prev.name + "\" [" + std::to_string(prev.offset) + ", " +
                                      std::to_string(prev.offset + prev.nbytes) + ")");
  }
  return r;
}

}  // namespace moecheck::gguf
