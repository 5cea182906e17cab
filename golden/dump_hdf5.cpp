// HDF5 helpers of the tensor dumps: typed writers with compression, validating readers.
// Contract: docs/golden-format.md (fixed-size UTF-8 string attributes, little-endian
// integers and IEEE f32, datasets chunked by rows with shuffle + deflate when available).
#include "golden/dump_hdf5.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "golden/sha256.h"

namespace moecheck::h5 {
namespace {

hid_t file_type(Elem e) {
  switch (e) {
    case Elem::kU8: return H5T_STD_U8LE;
    case Elem::kU16: return H5T_STD_U16LE;
    case Elem::kI32: return H5T_STD_I32LE;
    case Elem::kF32: return H5T_IEEE_F32LE;
  }
  return H5T_IEEE_F32LE;
}

hid_t mem_type(Elem e) {
  switch (e) {
    case Elem::kU8: return H5T_NATIVE_UINT8;
    case Elem::kU16: return H5T_NATIVE_UINT16;
    case Elem::kI32: return H5T_NATIVE_INT32;
    case Elem::kF32: return H5T_NATIVE_FLOAT;
  }
  return H5T_NATIVE_FLOAT;
}

size_t elem_bytes(Elem e) {
  switch (e) {
    case Elem::kU8: return 1;
    case Elem::kU16: return 2;
    case Elem::kI32: return 4;
    case Elem::kF32: return 4;
  }
  return 4;
}

constexpr hsize_t kCompactBytes = 16 * 1024;

[[noreturn]] void write_fail(const std::string& what) {
  throw std::runtime_error("HDF5 write failed: " + what);
}

void put_attr(hid_t obj, const std::string& name, hid_t ftype, hid_t mtype, const void* v,
              hsize_t n, bool scalar) {
  Handle space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle attr(H5Acreate2(obj, name.c_str(), ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), mtype, v) < 0) write_fail("attribute " + name);
}

std::string dims_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += d[i] < 0 ? std::string("*") : std::to_string(d[i]);
  }
  return s + "]";
}

}  // namespace

std::string elem_name(Elem e) {
  switch (e) {
    case Elem::kU8: return "uint8";
    case Elem::kU16: return "uint16";
    case Elem::kI32: return "int32";
    case Elem::kF32: return "float32";
  }
  return "?";
}

void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

bool has_hdf5_signature(const std::string& path) {
  static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char b[kUserBlock + 8] = {};
  const size_t n = std::fread(b, 1, sizeof b, f);
  std::fclose(f);
  return (n >= 8 && std::memcmp(b, kSig, 8) == 0) ||
         (n == sizeof b && std::memcmp(b + kUserBlock, kSig, 8) == 0);
}

namespace {

// The stamp's text: magic, "size <n>\n", "sha256 <hex>\n", zero padding to kUserBlock.
std::string stamp_text(uint64_t size, const std::string& hex) {
  return std::string(kStampMagic) + "size " + std::to_string(size) + "\nsha256 " + hex + "\n";
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<uint8_t> v;
  uint8_t buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) v.insert(v.end(), buf, buf + n);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) throw InputError(path + ": read error");
  return v;
}

}  // namespace

Stamp verify_stamp(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  char head[sizeof kStampMagic - 1] = {};
  const size_t n = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  if (n != sizeof head || std::memcmp(head, kStampMagic, sizeof head) != 0) return Stamp::kNone;
  const std::vector<uint8_t> bytes = read_all(path);
  if (bytes.size() < kUserBlock) return Stamp::kMismatch;
  const std::string want = stamp_text(bytes.size(), sha256_hex(bytes.data() + kUserBlock,
                                                               bytes.size() - kUserBlock));
  if (std::memcmp(bytes.data(), want.data(), want.size()) != 0) return Stamp::kMismatch;
  for (size_t i = want.size(); i < kUserBlock; ++i)
    if (bytes[i] != 0) return Stamp::kMismatch;
  return Stamp::kMatch;
}

Handle create_image() {
  quiet_errors();
  // The core driver keeps the file in memory only. Version-0 superblock (low bound EARLIEST):
  // the image of an open file with a v2 superblock (libver 1.8) carries the open-file status
  // flags under a stale checksum in HDF5 1.10 and cannot be read back; v0 has no checksum.
  // Read by every HDF5 >= 1.8 (h5py, h5dump).
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_EARLIEST, H5F_LIBVER_V18);
  H5Pset_fapl_core(fapl.get(), size_t{1} << 20, 0);
  Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_userblock(fcpl.get(), kUserBlock);
  Handle f(H5Fcreate("moecheck-dump-image", H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
  if (!f.valid()) write_fail("cannot create an in-memory HDF5 file");
  return f;
}

// H5Fget_file_image returns the file from its base address on (without the user block), which
// is where the stamp goes.
std::vector<uint8_t> finish_image(Handle& f) {
  if (H5Fflush(f.get(), H5F_SCOPE_GLOBAL) < 0) write_fail("flushing the in-memory HDF5 file");
  const ssize_t n = H5Fget_file_image(f.get(), nullptr, 0);
  if (n <= 0) write_fail("reading the in-memory HDF5 file's size");
  std::vector<uint8_t> bytes(kUserBlock + static_cast<size_t>(n));
  if (H5Fget_file_image(f.get(), bytes.data() + kUserBlock, static_cast<size_t>(n)) != n)
    write_fail("copying the in-memory HDF5 file");
  f.reset();
  const std::string stamp =
      stamp_text(bytes.size(), sha256_hex(bytes.data() + kUserBlock, bytes.size() - kUserBlock));
  std::memset(bytes.data(), 0, kUserBlock);
  std::memcpy(bytes.data(), stamp.data(), stamp.size());
  return bytes;
}

Handle create_group(hid_t parent, const std::string& name, const std::string& where) {
  Handle g(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) write_fail("group " + where);
  return g;
}

// Fixed-size strings (NUL-padded, at least one byte): libhdf5 1.10 crashes reading some corrupt
// variable-length string attributes; fixed-size ones are plain bytes to it.
void write_attr(hid_t obj, const std::string& name, const std::string& v) {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), v.empty() ? 1 : v.size());
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  const std::string padded = v.empty() ? std::string(1, '\0') : v;
  put_attr(obj, name, t.get(), t.get(), padded.data(), 1, true);
}
void write_attr(hid_t obj, const std::string& name, int64_t v) {
  put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, 1, true);
}
void write_attr(hid_t obj, const std::string& name, uint64_t v) {
  put_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, 1, true);
}
void write_attr(hid_t obj, const std::string& name, float v) {
  put_attr(obj, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &v, 1, true);
}
void write_attr(hid_t obj, const std::string& name, const std::vector<int32_t>& v) {
  put_attr(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT32, v.data(), v.size(), false);
}

void write_dataset(hid_t parent, const std::string& name, Elem e, const void* data,
                   const std::vector<int64_t>& dims) {
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  Handle space(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  hsize_t total = 1;
  for (hsize_t d : hd) total *= d;
  hsize_t bytes = total * elem_bytes(e);
  if (total > 0 && bytes <= kCompactBytes) {
    // Small datasets (most per-expert taps) live in the object header: a chunk index and
    // filter pipeline per dataset would cost more than the data (the golden set stays small).
    H5Pset_layout(dcpl.get(), H5D_COMPACT);
  } else if (total > 0) {
    // Chunks of whole rows, at most ~1 MiB: small datasets are one chunk.
    std::vector<hsize_t> chunk = hd;
    hsize_t row = elem_bytes(e);
    for (size_t i = 1; i < hd.size(); ++i) row *= hd[i];
    chunk[0] = std::max<hsize_t>(
        1, std::min<hsize_t>(hd[0], (hsize_t{1} << 20) / std::max<hsize_t>(row, 1)));
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (H5Zfilter_avail(H5Z_FILTER_SHUFFLE) > 0) H5Pset_shuffle(dcpl.get());
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) H5Pset_deflate(dcpl.get(), 6);
  }
  Handle ds(H5Dcreate2(parent, name.c_str(), file_type(e), space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) write_fail("dataset " + name);
  if (total > 0 && H5Dwrite(ds.get(), mem_type(e), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    write_fail("dataset " + name);
}

// ---- Reader ----

Reader::Reader(std::string file) : file_(std::move(file)) {
  quiet_errors();
  std::FILE* f = std::fopen(file_.c_str(), "rb");
  if (f == nullptr) throw InputError(file_ + ": cannot open (" + std::strerror(errno) + ")");
  std::fclose(f);
  if (!has_hdf5_signature(file_))
    throw InputError(file_ + ": not an HDF5 file (no HDF5 signature at offset 0)");
  file_id_ = Handle(H5Fopen(file_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_id_.valid())
    throw InputError(file_ + ": HDF5 library cannot open it (truncated or corrupt file)");
}

void Reader::fail(const std::string& path, const std::string& msg) const {
  throw InputError(file_ + ": " + path + ": " + msg);
}

bool Reader::has_object(hid_t parent, const std::string& name) const {
  return H5Lexists(parent, name.c_str(), H5P_DEFAULT) > 0;
}

bool Reader::has_attr(hid_t obj, const std::string& name) const {
  return H5Aexists(obj, name.c_str()) > 0;
}

Handle Reader::open_group(hid_t parent, const std::string& path, const std::string& name) const {
  const std::string full = path == "/" ? "/" + name : path + "/" + name;
  if (!has_object(parent, name)) fail(full, "missing group");
  H5O_info_t info;
  if (H5Oget_info_by_name(parent, name.c_str(), &info, H5P_DEFAULT) < 0 ||
      info.type != H5O_TYPE_GROUP)
    fail(full, "expected a group");
  Handle g(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) fail(full, "cannot open group (corrupt file)");
  return g;
}

std::vector<std::string> Reader::children(hid_t group, const std::string& path) const {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) fail(path, "cannot list group (corrupt file)");
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n =
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) fail(path, "cannot read link name (corrupt file)");
    std::string s(static_cast<size_t>(n) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT);
    s.resize(static_cast<size_t>(n));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> Reader::attr_names(hid_t obj, const std::string& path) const {
  H5O_info_t info;
  if (H5Oget_info(obj, &info) < 0) fail(path, "cannot read object header (corrupt file)");
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    const ssize_t n =
        H5Aget_name_by_idx(obj, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) fail(path, "cannot read attribute name (corrupt file)");
    std::string s(static_cast<size_t>(n) + 1, '\0');
    H5Aget_name_by_idx(obj, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT);
    s.resize(static_cast<size_t>(n));
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

struct AttrOpen {
  Handle attr, type, space;
  H5T_class_t cls = H5T_NO_CLASS;
  hssize_t n = 0;
};

}  // namespace

static AttrOpen open_attr(const Reader& r, hid_t obj, const std::string& path,
                          const std::string& name) {
  if (!r.has_attr(obj, name)) r.fail(path, "missing attribute " + name);
  AttrOpen a;
  a.attr = Handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.attr.valid()) r.fail(path, "cannot open attribute " + name);
  a.type = Handle(H5Aget_type(a.attr.get()), H5Tclose);
  a.space = Handle(H5Aget_space(a.attr.get()), H5Sclose);
  a.cls = H5Tget_class(a.type.get());
  a.n = H5Sget_simple_extent_npoints(a.space.get());
  return a;
}

std::string Reader::attr_str(hid_t obj, const std::string& path, const std::string& name) const {
  AttrOpen a = open_attr(*this, obj, path, name);
  if (a.cls != H5T_STRING || a.n != 1) fail(path, "attribute " + name + ": expected a string");
  if (H5Tis_variable_str(a.type.get()) > 0) {
    Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(a.type.get()));
    char* p = nullptr;
    if (H5Aread(a.attr.get(), mt.get(), &p) < 0) fail(path, "attribute " + name + ": cannot read");
    std::string s = p != nullptr ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t size = H5Tget_size(a.type.get());
  if (size == 0 || size > (size_t{1} << 20)) fail(path, "attribute " + name + ": bad string size");
  std::string s(size, '\0');
  Handle mt(H5Tcopy(a.type.get()), H5Tclose);
  if (H5Aread(a.attr.get(), mt.get(), s.data()) < 0)
    fail(path, "attribute " + name + ": cannot read");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t Reader::attr_int(hid_t obj, const std::string& path, const std::string& name) const {
  AttrOpen a = open_attr(*this, obj, path, name);
  if (a.cls != H5T_INTEGER || a.n != 1) fail(path, "attribute " + name + ": expected one integer");
  int64_t v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v) < 0)
    fail(path, "attribute " + name + ": does not fit int64");
  return v;
}

uint64_t Reader::attr_uint(hid_t obj, const std::string& path, const std::string& name) const {
  AttrOpen a = open_attr(*this, obj, path, name);
  if (a.cls != H5T_INTEGER || a.n != 1) fail(path, "attribute " + name + ": expected one integer");
  uint64_t v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_UINT64, &v) < 0)
    fail(path, "attribute " + name + ": does not fit uint64");
  return v;
}

float Reader::attr_f32(hid_t obj, const std::string& path, const std::string& name) const {
  AttrOpen a = open_attr(*this, obj, path, name);
  if (a.cls != H5T_FLOAT || a.n != 1 || H5Tget_size(a.type.get()) != 4)
    fail(path, "attribute " + name + ": expected one float32");
  float v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_FLOAT, &v) < 0)
    fail(path, "attribute " + name + ": cannot read");
  return v;
}

std::vector<int32_t> Reader::attr_i32_array(hid_t obj, const std::string& path,
                                            const std::string& name) const {
  AttrOpen a = open_attr(*this, obj, path, name);
  if (a.cls != H5T_INTEGER || H5Sget_simple_extent_ndims(a.space.get()) > 1 || a.n < 0 ||
      a.n > (1 << 20))
    fail(path, "attribute " + name + ": expected a 1-d integer array");
  std::vector<int32_t> v(static_cast<size_t>(a.n));
  if (a.n > 0 && H5Aread(a.attr.get(), H5T_NATIVE_INT32, v.data()) < 0)
    fail(path, "attribute " + name + ": values do not fit int32");
  return v;
}

std::vector<int64_t> Reader::check_dataset(hid_t parent, const std::string& path,
                                           const std::string& name, Elem e,
                                           const std::vector<int64_t>& dims) const {
  const std::string full = path + "/" + name;
  if (!has_object(parent, name)) fail(full, "missing dataset");
  H5O_info_t info;
  if (H5Oget_info_by_name(parent, name.c_str(), &info, H5P_DEFAULT) < 0 ||
      info.type != H5O_TYPE_DATASET)
    fail(full, "expected a dataset");
  Handle ds(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) fail(full, "cannot open dataset (corrupt file)");
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  bool ok = size == elem_bytes(e);
  if (e == Elem::kF32) {
    ok = ok && cls == H5T_FLOAT;
  } else {
    const H5T_sign_t sign = H5Tget_sign(type.get());
    ok = ok && cls == H5T_INTEGER && (sign == H5T_SGN_2) == (e == Elem::kI32);
  }
  if (!ok)
    fail(full, "expected element type " + elem_name(e) + ", found another type (class " +
                   std::to_string(static_cast<int>(cls)) + ", " + std::to_string(size) + " bytes)");
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > 8) fail(full, "bad dataspace");
  std::vector<hsize_t> hd(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), hd.data(), nullptr);
  std::vector<int64_t> found(hd.begin(), hd.end());
  bool shape_ok = found.size() == dims.size();
  for (size_t i = 0; shape_ok && i < dims.size(); ++i)
    shape_ok = dims[i] < 0 || dims[i] == found[i];
  if (!shape_ok)
    fail(full, "expected shape " + dims_string(dims) + ", found " + dims_string(found));
  // Guard the allocation the caller is about to make (a corrupt header could claim anything).
  int64_t total = static_cast<int64_t>(elem_bytes(e));
  for (int64_t d : found) {
    if (d > (int64_t{1} << 40) / std::max<int64_t>(total, 1)) fail(full, "dataset too large");
    total *= d;
  }
  return found;
}

void Reader::read_raw(hid_t parent, const std::string& path, const std::string& name, Elem e,
                      void* out) const {
  Handle ds(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) == 0) return;
  if (H5Dread(ds.get(), mem_type(e), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail(path + "/" + name, "cannot read data (truncated or corrupt file)");
}

}  // namespace moecheck::h5
