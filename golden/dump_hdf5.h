// Thin, validating helpers over the HDF5 C API used by the tensor dumps (golden/dump.h):
// RAII handles, typed attribute and dataset writers (deflate + shuffle, chunked by rows), and
// readers that check the class, width and shape of what they read and throw an InputError naming
// the file and the object path. Contract: docs/golden-format.md.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace moecheck::h5 {

// Owns one HDF5 identifier; closes it with the matching H5?close.
class Handle {
 public:
  using CloseFn = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, CloseFn close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  CloseFn close_ = nullptr;
};

// Turns HDF5's own error-stack printing off: every failure becomes one InputError instead.
void quiet_errors();

// True when the file holds the HDF5 signature (\x89HDF\r\n\x1a\n) at offset 0 or, after a
// user block, at offset kUserBlock.
bool has_hdf5_signature(const std::string& path);

// The dumps' integrity stamp: moecheck writes every dump with a 512-byte HDF5 user block holding
// kStampMagic, the file size and the SHA-256 of bytes [512, size) (docs/golden-format.md
// "Integrity stamp"). A reader verifies it before libhdf5 sees a byte of the file: only a file
// whose stamp matches (exactly what moecheck wrote) is opened in this process directly; any other
// (no stamp: an older moecheck or another writer; a stamp that does not match: the file was
// edited, e.g. with h5py, or corrupted) is read first in a probe process (golden/probe.h), since
// libhdf5 1.10 crashes on some corrupt files.
inline constexpr size_t kUserBlock = 512;
inline constexpr char kStampMagic[] = "moecheck dump sha256\n";
enum class Stamp { kNone, kMatch, kMismatch };
Stamp verify_stamp(const std::string& path);

// ---- writing: the file is built in memory (HDF5's core driver, no backing store), then
// stamped and written by AtomicFile, so libhdf5 never writes to the disk ----

Handle create_image();
// Flushes and closes the in-memory file and returns its stamped bytes.
std::vector<uint8_t> finish_image(Handle& f);
Handle create_group(hid_t parent, const std::string& name, const std::string& where);

void write_attr(hid_t obj, const std::string& name, const std::string& v);
void write_attr(hid_t obj, const std::string& name, int64_t v);
void write_attr(hid_t obj, const std::string& name, uint64_t v);
void write_attr(hid_t obj, const std::string& name, float v);
void write_attr(hid_t obj, const std::string& name, const std::vector<int32_t>& v);

// Element kinds the dumps store.
enum class Elem { kU8, kU16, kI32, kF32 };

// Writes `data` (row-major, product(dims) elements) as dataset `name` under `parent`; compressed.
void write_dataset(hid_t parent, const std::string& name, Elem e, const void* data,
                   const std::vector<int64_t>& dims);

// ---- reading: every problem is an InputError "<file>: <object path>: ..." ----

class Reader {
 public:
  explicit Reader(std::string file);
  const std::string& file() const { return file_; }
  hid_t root() const { return file_id_.get(); }

  bool has_object(hid_t parent, const std::string& name) const;
  bool has_attr(hid_t obj, const std::string& name) const;
  Handle open_group(hid_t parent, const std::string& path, const std::string& name) const;
  // Names of the links directly under a group, in HDF5's name order.
  std::vector<std::string> children(hid_t group, const std::string& path) const;

  // Names of the attributes of `obj`, in creation order when tracked, else name order.
  std::vector<std::string> attr_names(hid_t obj, const std::string& path) const;

  std::string attr_str(hid_t obj, const std::string& path, const std::string& name) const;
  int64_t attr_int(hid_t obj, const std::string& path, const std::string& name) const;
  uint64_t attr_uint(hid_t obj, const std::string& path, const std::string& name) const;
  float attr_f32(hid_t obj, const std::string& path, const std::string& name) const;
  std::vector<int32_t> attr_i32_array(hid_t obj, const std::string& path,
                                      const std::string& name) const;

  // Reads dataset `name` under `parent` (at `path`), checking its element class and width
  // against T and its shape against `dims` (-1 = any extent). The actual dims go to `found`.
  template <class T>
  std::vector<T> read_dataset(hid_t parent, const std::string& path, const std::string& name,
                              const std::vector<int64_t>& dims,
                              std::vector<int64_t>* found = nullptr) const {
    const std::vector<int64_t> d = check_dataset(parent, path, name, elem_of<T>(), dims);
    int64_t n = 1;
    for (int64_t x : d) n *= x;
    std::vector<T> v(static_cast<size_t>(n));
    read_raw(parent, path, name, elem_of<T>(), v.data());
    if (found != nullptr) *found = d;
    return v;
  }

  // The shape of dataset `name` after checking its class, width and rank / extents.
  std::vector<int64_t> check_dataset(hid_t parent, const std::string& path, const std::string& name,
                                     Elem e, const std::vector<int64_t>& dims) const;

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const;

 private:
  template <class T>
  static constexpr Elem elem_of() {
    if constexpr (std::is_same_v<T, uint8_t>) return Elem::kU8;
    else if constexpr (std::is_same_v<T, uint16_t>) return Elem::kU16;
    else if constexpr (std::is_same_v<T, int32_t>) return Elem::kI32;
    else {
      static_assert(std::is_same_v<T, float>, "dumps store uint8, uint16, int32 and float32");
      return Elem::kF32;
    }
  }
  void read_raw(hid_t parent, const std::string& path, const std::string& name, Elem e,
                void* out) const;

  std::string file_;
  Handle file_id_;
};

std::string elem_name(Elem e);

}  // namespace moecheck::h5
