// The `.npy` reader (NEP 1: magic, version, header length, a Python-literal dict with descr,
// fortran_order and shape, then the data), the element conversions and the file dispatch.
// The `.npz` and safetensors readers: golden/tensor_zip.cpp, golden/safetensors.cpp.
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/numfmt.h"
#include "golden/tensor_file.h"

namespace moecheck {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& field, const std::string& why) {
  throw InputError(where + ": " + field + ": " + why);
}

// The header dict of a `.npy`: a small parser of exactly the literal numpy writes ({'key': value,
// ...}, values a quoted string, True / False, or a tuple of integers), whitespace anywhere.
class NpyHeader {
 public:
  NpyHeader(std::string s, std::string where) : s_(std::move(s)), where_(std::move(where)) {}

  void parse() {
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') break;
      const std::string key = quoted("a quoted key");
      expect(':');
      skip();
      if (key == "descr") {
        descr = quoted("descr: a quoted dtype string (structured dtypes are not supported)");
        has_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        has_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        has_shape = true;
      } else {
        fail(where_, "header", "unknown key '" + key + "'");
      }
      skip();
      if (peek() == ',') ++i_;
    }
    if (!has_descr || !has_fortran || !has_shape)
      fail(where_, "header",
           std::string("missing key '") +
               (!has_descr     ? "descr"
                : !has_fortran ? "fortran_order"
                               : "shape") +
               "'");
  }

  std::string descr;
  bool fortran = false, has_descr = false, has_fortran = false, has_shape = false;
  std::vector<int64_t> shape;

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    skip();
    if (peek() != c)
      fail(where_, "header", std::string("expected '") + c + "' at byte " + std::to_string(i_));
    ++i_;
  }
  std::string quoted(const std::string& what) {
    skip();
    const char q = peek();
    if (q != '\'' && q != '"') fail(where_, "header", "expected " + what);
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail(where_, "header", "unterminated string");
    std::string v = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail(where_, "fortran_order", "expected True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> v;
    expect('(');
    while (true) {
      skip();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail(where_, "shape", "expected a non-negative integer at byte " + std::to_string(i_));
      int64_t x = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (x > (int64_t{1} << 40)) fail(where_, "shape", "dimension too large");
        x = x * 10 + (s_[i_++] - '0');
      }
      v.push_back(x);
      skip();
      if (peek() == ',') ++i_;
    }
    ++i_;
    return v;
  }

  std::string s_, where_;
  size_t i_ = 0;
};

TensorDtype npy_dtype(const std::string& d, const std::string& where, U16As u16) {
  if (d.size() >= 2 && d[0] == '>' && d != ">u1" && d != ">i1")
    fail(where, "descr",
         "'" + d + "' is big-endian; write little-endian ('<') arrays (numpy: a.astype('<f4'))");
  if (d == "<f4") return TensorDtype::kF32;
  if (d == "<f2") return TensorDtype::kF16;
  if (d == "|u1" || d == "<u1") return TensorDtype::kU8;
  if (d == "<i4") return TensorDtype::kI32;
  if (d == "<i8") return TensorDtype::kI64;
  if (d == "<u2") {
    if (u16 == U16As::kBF16) return TensorDtype::kBF16;
    fail(where, "descr",
         "'<u2' is read only as bf16 bit patterns, when the dtype is given (--dtype bf16)");
  }
  fail(where, "descr",
       "unsupported dtype '" + d + "' (expected <f4, <f2, <u2 as bf16, <i4, <i8 or |u1)");
}

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

const char* tensor_dtype_name(TensorDtype d) {
  switch (d) {
    case TensorDtype::kF32: return "f32";
    case TensorDtype::kF16: return "f16";
    case TensorDtype::kBF16: return "bf16";
    case TensorDtype::kU16: return "u16";
    case TensorDtype::kI32: return "i32";
    case TensorDtype::kI64: return "i64";
    case TensorDtype::kU8: return "u8";
  }
  return "?";
}

size_t tensor_dtype_size(TensorDtype d) {
  switch (d) {
    case TensorDtype::kF32:
    case TensorDtype::kI32: return 4;
    case TensorDtype::kF16:
    case TensorDtype::kBF16:
    case TensorDtype::kU16: return 2;
    case TensorDtype::kI64: return 8;
    case TensorDtype::kU8: return 1;
  }
  return 0;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostTensor parse_npy(const uint8_t* data, size_t n, const std::string& where, U16As u16) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10) fail(where, "header", "truncated: " + std::to_string(n) + " bytes");
  if (std::memcmp(data, kMagic, 6) != 0) fail(where, "magic", "not a .npy file (no \\x93NUMPY)");
  const int major = data[6];
  if (major < 1 || major > 3)
    fail(
        where, "version",
        "expected 1.0, 2.0 or 3.0, found " + std::to_string(major) + "." + std::to_string(data[7]));
  const size_t pre = major == 1 ? 10 : 12;
  if (n < pre) fail(where, "header length", "truncated");
  const size_t hlen = major == 1
                          ? (static_cast<size_t>(data[8]) | static_cast<size_t>(data[9]) << 8)
                          : le32(data + 8);
  if (hlen > n - pre)
    fail(where, "header",
         "truncated: header length " + std::to_string(hlen) + " past the end of the file");
  NpyHeader h(std::string(reinterpret_cast<const char*>(data + pre), hlen), where);
  h.parse();
  HostTensor t;
  t.where = where;
  t.dtype = npy_dtype(h.descr, where, u16);
  if (h.fortran)
    fail(where, "fortran_order",
         "Fortran-order arrays are not read; write C order (numpy: np.ascontiguousarray(a))");
  t.shape = h.shape;
  // The element count in checked arithmetic before numel(): each dimension is at most 2^40, but
  // a header's product of them may exceed int64 (found by fuzz_tensor).
  uint64_t elems = 1;
  for (const int64_t d : t.shape)
    if (__builtin_mul_overflow(elems, static_cast<uint64_t>(d), &elems) ||
        elems > (uint64_t{1} << 56))
      fail(where, "shape", "the element count exceeds 2^56");
  const size_t have = n - pre - hlen;
  const size_t want = static_cast<size_t>(t.numel()) * tensor_dtype_size(t.dtype);
  if (have != want)
    fail(where, "data",
         "shape and dtype need " + std::to_string(want) + " bytes, the file holds " +
             std::to_string(have));
  t.bytes.assign(data + pre + hlen, data + n);
  return t;
}

std::map<std::string, HostTensor> read_tensor_file(const std::string& path, U16As u16) {
  auto ends = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (!ends(".npy") && !ends(".npz") && !ends(".safetensors"))
    throw InputError(path + ": expected a .npy, .npz or .safetensors file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
  if (f.bad()) throw InputError(path + ": read failed");
  if (ends(".npy")) return {{"", parse_npy(b.data(), b.size(), path, u16)}};
  if (ends(".npz")) return parse_npz(b.data(), b.size(), path, u16);
  return parse_safetensors(b.data(), b.size(), path);
}

std::vector<float> tensor_to_f32(const HostTensor& t) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  const uint8_t* p = t.bytes.data();
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == TensorDtype::kF32) {
      std::memcpy(&out[i], p + 4 * i, 4);
      continue;
    }
    uint16_t h;
    if (t.dtype != TensorDtype::kF16 && t.dtype != TensorDtype::kBF16)
      fail(t.where, "dtype",
           std::string("expected a float tensor (f32, f16, bf16), found ") +
               tensor_dtype_name(t.dtype));
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = t.dtype == TensorDtype::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return out;
}

std::vector<uint16_t> tensor_to_bf16(const HostTensor& t) {
  std::vector<uint16_t> out;
  if (t.dtype == TensorDtype::kBF16) {
    out.resize(static_cast<size_t>(t.numel()));
    // An empty tensor has no bytes to copy (memcpy of null pointers is undefined, even of 0).
    if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), out.size() * 2);
    return out;
  }
  for (float v : tensor_to_f32(t)) out.push_back(f32_to_bf16(v));
  return out;
}

std::vector<int32_t> tensor_to_i32(const HostTensor& t) {
  if (t.dtype != TensorDtype::kI32 && t.dtype != TensorDtype::kI64)
    fail(t.where, "dtype",
         std::string("expected integer ids (i32, i64), found ") + tensor_dtype_name(t.dtype));
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == TensorDtype::kI32) {
      std::memcpy(&out[i], t.bytes.data() + 4 * i, 4);
      continue;
    }
    int64_t v;
    std::memcpy(&v, t.bytes.data() + 8 * i, 8);
    if (v < INT32_MIN || v > INT32_MAX)
      fail(t.where, "element " + std::to_string(i), std::to_string(v) + " does not fit in int32");
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

std::vector<uint8_t> make_npy(const HostTensor& t) {
  std::string descr;
  switch (t.dtype) {
    case TensorDtype::kF32: descr = "<f4"; break;
    case TensorDtype::kF16: descr = "<f2"; break;
    case TensorDtype::kBF16:
    case TensorDtype::kU16: descr = "<u2"; break;
    case TensorDtype::kI32: descr = "<i4"; break;
    case TensorDtype::kI64: descr = "<i8"; break;
    case TensorDtype::kU8: descr = "|u1"; break;
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  shape += t.shape.size() == 1 ? ",)" : ")";
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string head = "\x93NUMPY";
  head += static_cast<char>(1), head += static_cast<char>(0);
  head += static_cast<char>(h.size() & 0xff), head += static_cast<char>(h.size() >> 8);
  head += h;
  std::vector<uint8_t> out(head.size() + t.bytes.size());
  std::memcpy(out.data(), head.data(), head.size());
  if (!t.bytes.empty()) std::memcpy(out.data() + head.size(), t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace moecheck
