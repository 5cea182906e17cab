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
#include <stdexcept>

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
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key length, 1-byte key, type, uint8
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
    c.fail(et_at,
           field + ": array element type id " + std::to_string(et) + " is not a GGUF type (0..12)");
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

uint8_t* Reader::writable(const uint8_t* p, uint64_t n) const {
  if (!copy_on_write_) throw std::logic_error(name_ + ": writable view of a read-only mapping");
  if (p < base_ || n > size_ || static_cast<uint64_t>(p - base_) > size_ - n)
    throw std::logic_error(name_ + ": writable range outside the mapping");
  return const_cast<uint8_t*>(p);  // the mapping is PROT_WRITE (private pages)
}

Reader Reader::open(const std::string& path, MapMode mode) {
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
    const int prot = mode == MapMode::kCopyOnWrite ? PROT_READ | PROT_WRITE : PROT_READ;
    void* p = ::mmap(nullptr, map->size, prot, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot map " + std::to_string(map->size) +
                       " bytes: " + std::strerror(err));
    }
    map->addr = p;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  const uint8_t* base = static_cast<const uint8_t*>(map->addr);
  const uint64_t size = map->size;
  Reader r = parse(std::move(map), base, size, path);
  r.copy_on_write_ = mode == MapMode::kCopyOnWrite;
  return r;
}

Reader Reader::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* base = owned->data();
  const uint64_t size = owned->size();
  return parse(std::move(owned), base, size, name);
}

Reader Reader::from_memory(std::shared_ptr<const void> owner, const uint8_t* base, uint64_t size,
                           const std::string& name, MapMode mode) {
  Reader r = parse(std::move(owner), base, size, name);
  r.copy_on_write_ = mode == MapMode::kCopyOnWrite;
  return r;
}

// The steps of Reader::parse, each reading one part of the file through the bounds-checked
// cursor and failing with the file offset and the field.
class Parser {
 public:
  Parser(Reader& r, Cursor& c) : r_(r), c_(c) {}

  void header() {
    const uint8_t* base = r_.base_;
    c_.need(4, "magic");
    if (std::memcmp(base, "GGUF", 4) != 0) {
      char found[32];
      std::snprintf(found, sizeof found, "%02x %02x %02x %02x", base[0], base[1], base[2], base[3]);
      c_.fail(0, std::string("magic: expected \"GGUF\" (47 47 55 46), found ") + found);
    }
    c_.uint(4, "magic");
    r_.version_ = c_.u32("version");
    if (r_.version_ != kVersion) {
      // ggml's test: a byte-swapped file has its version in the high half.
      if ((r_.version_ & 0xFFFFu) == 0 && r_.version_ != 0)
        c_.fail(4,
                "version: " + std::to_string(r_.version_) +
                    " is a byte-swapped (big-endian) GGUF; only little-endian files are supported");
      c_.fail(4, "version: expected 3, found " + std::to_string(r_.version_));
    }
    n_tensors_ = c_.u64("tensor_count");
    n_kv_ = c_.u64("kv_count");
    if (n_tensors_ > c_.left() / kMinTensorInfoBytes)
      c_.fail(8, "tensor_count " + std::to_string(n_tensors_) + " needs at least " +
                     std::to_string(kMinTensorInfoBytes) + " bytes per tensor info, only " +
                     std::to_string(c_.left()) + " bytes left in the file");
    if (n_kv_ > (c_.left() - n_tensors_ * kMinTensorInfoBytes) / kMinKvBytes)
      c_.fail(16, "kv_count " + std::to_string(n_kv_) + " needs at least " +
                      std::to_string(kMinKvBytes) + " bytes per key-value pair, only " +
                      std::to_string(c_.left()) +
                      " bytes left in the file besides the tensor infos");
  }

  void metadata() {
    r_.kvs_.reserve(static_cast<size_t>(n_kv_));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const std::string field = "kv[" + std::to_string(i) + "]";
      KeyValue kv;
      kv.file_offset = c_.pos();
      kv.key = c_.str(field + " key");
      if (kv.key.empty()) c_.fail(kv.file_offset, field + " key is empty");
      if (const auto it = r_.kv_index_.find(kv.key); it != r_.kv_index_.end())
        c_.fail(kv.file_offset, field + " key \"" + kv.key + "\" duplicates kv[" +
                                    std::to_string(it->second) + "]");
      const std::string vfield = field + " \"" + kv.key + "\"";
      const uint64_t type_at = c_.pos();
      const uint32_t t = c_.u32(vfield + " value type");
      if (t >= kValueTypeCount)
        c_.fail(type_at,
                vfield + ": value type id " + std::to_string(t) + " is not a GGUF type (0..12)");
      const uint64_t value_at = c_.pos();
      kv.value = read_value(c_, static_cast<ValueType>(t), vfield);
      if (kv.key == kAlignmentKey) alignment(kv.value, vfield, type_at, value_at);
      r_.kv_index_.emplace(kv.key, r_.kvs_.size());
      r_.kvs_.push_back(std::move(kv));
    }
  }

  void tensor_infos() {
    offset_at_.resize(static_cast<size_t>(n_tensors_));
    r_.tensors_.reserve(static_cast<size_t>(n_tensors_));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      TensorInfo t = tensor_info(i);
      r_.tensor_index_.emplace(t.name, r_.tensors_.size());
      r_.tensors_.push_back(std::move(t));
    }
  }

  // Every tensor's data inside the file, and no two overlapping.
  void data_section() {
    const uint64_t size = r_.size_;
    r_.data_offset_ = (c_.pos() + r_.alignment_ - 1) / r_.alignment_ * r_.alignment_;
    for (size_t i = 0; i < r_.tensors_.size(); ++i) {
      const TensorInfo& t = r_.tensors_[i];
      const uint64_t avail = r_.data_offset_ <= size ? size - r_.data_offset_ : 0;
      if (r_.data_offset_ > size || t.offset > avail || t.nbytes > avail - t.offset)
        c_.fail(offset_at_[i],
                "tensor[" + std::to_string(i) + "] \"" + t.name + "\": data [" +
                    std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                    ") relative to the data section at " + std::to_string(r_.data_offset_) +
                    " ends past the end of the file (size " + std::to_string(size) + ")");
    }
    std::vector<size_t> order(r_.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const std::vector<TensorInfo>& ts = r_.tensors_;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ts[a].offset < ts[b].offset || (ts[a].offset == ts[b].offset && a < b);
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = ts[order[k - 1]];
      const TensorInfo& cur = ts[order[k]];
      if (prev.offset + prev.nbytes > cur.offset)
        c_.fail(offset_at_[order[k]], "tensor[" + std::to_string(order[k]) + "] \"" + cur.name +
                                          "\": data at " + std::to_string(cur.offset) +
                                          " overlaps tensor[" + std::to_string(order[k - 1]) +
                                          "] \"" + prev.name + "\" [" +
                                          std::to_string(prev.offset) + ", " +
                                          std::to_string(prev.offset + prev.nbytes) + ")");
    }
  }

 private:
  void alignment(const Value& v, const std::string& vfield, uint64_t type_at, uint64_t value_at) {
    if (v.type != ValueType::kUint32)
      c_.fail(type_at, vfield + ": must be uint32, found " + type_name(v.type));
    const uint64_t a = v.bits;
    if (a == 0 || (a & (a - 1)) != 0)
      c_.fail(value_at, vfield + ": must be a power of two, found " + std::to_string(a));
    r_.alignment_ = static_cast<uint32_t>(a);
  }

  TensorInfo tensor_info(uint64_t i) {
    const std::string field = "tensor[" + std::to_string(i) + "]";
    TensorInfo t;
    t.info_offset = c_.pos();
    t.name = c_.str(field + " name");
    if (t.name.empty()) c_.fail(t.info_offset, field + " name is empty");
    if (t.name.size() > kMaxNameBytes)
      c_.fail(t.info_offset, field + " name is " + std::to_string(t.name.size()) +
                                 " bytes, at most " + std::to_string(kMaxNameBytes) +
                                 " allowed (ggml GGML_MAX_NAME)");
    if (const auto it = r_.tensor_index_.find(t.name); it != r_.tensor_index_.end())
      c_.fail(t.info_offset, field + " name \"" + t.name + "\" duplicates tensor[" +
                                 std::to_string(it->second) + "]");
    const std::string tf = field + " \"" + t.name + "\"";
    const uint64_t nd_at = c_.pos();
    t.n_dims = c_.u32(tf + " n_dims");
    if (t.n_dims == 0 || t.n_dims > kMaxDims)
      c_.fail(nd_at, tf + ": n_dims must be 1..4, found " + std::to_string(t.n_dims));
    std::vector<int64_t> ne;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = c_.pos();
      const uint64_t v = c_.u64(tf + " ne[" + std::to_string(d) + "]");
      if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        c_.fail(ne_at, tf + ": ne[" + std::to_string(d) + "] must be in 1..2^63-1, found " +
                           std::to_string(v));
      t.ne[d] = static_cast<int64_t>(v);
      ne.push_back(t.ne[d]);
    }
    const uint64_t type_at = c_.pos();
    t.type = c_.u32(tf + " type");
    if (!type_traits(t.type).name)
      c_.fail(type_at, tf + ": unknown ggml type id " + std::to_string(t.type));
    t.nbytes =
        tensor_nbytes(t.type, ne, r_.name_ + ": offset " + std::to_string(nd_at) + ": " + tf);
    offset_at_[static_cast<size_t>(i)] = c_.pos();
    t.offset = c_.u64(tf + " offset");
    if (t.offset % r_.alignment_ != 0)
      c_.fail(c_.pos() - 8, tf + ": data offset " + std::to_string(t.offset) +
                                " is not a multiple of the alignment " +
                                std::to_string(r_.alignment_));
    return t;
  }

  Reader& r_;
  Cursor& c_;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  std::vector<uint64_t> offset_at_;  // where each tensor's offset field sits in the file
};

Reader Reader::parse(std::shared_ptr<const void> owner, const uint8_t* base, uint64_t size,
                     const std::string& name) {
  Reader r;
  r.name_ = name;
  r.owner_ = std::move(owner);
  r.base_ = base;
  r.size_ = size;
  Cursor c(base, size, r.name_);
  Parser p(r, c);
  p.header();
  p.metadata();
  p.tensor_infos();
  p.data_section();
  return r;
}

}  // namespace moecheck::gguf
