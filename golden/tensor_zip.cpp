// The `.npz` reader: a zip archive (PKWARE APPNOTE) of `.npy` members, as numpy.savez (stored)
// and numpy.savez_compressed (deflated) write it. Read through the central directory (zip64
// end records and the zip64 extra field understood), each member's local header checked for its
// name and data offset, deflated members inflated by zlib, every member's CRC-32 checked.
#include <zlib.h>

#include <cstring>
#include <set>

#include "core/error.h"
#include "golden/tensor_file.h"

namespace moecheck {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& field, const std::string& why) {
  throw InputError(where + ": " + field + ": " + why);
}

uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

constexpr uint32_t kEocd = 0x06054b50, kEocd64 = 0x06064b50, kLocator64 = 0x07064b50,
                   kCentral = 0x02014b50, kLocal = 0x04034b50;

struct Entry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t csize = 0, usize = 0, offset = 0;
};

class Zip {
 public:
  Zip(const uint8_t* d, size_t n, std::string where) : d_(d), n_(n), where_(std::move(where)) {}

  // The central directory's entries.
  std::vector<Entry> entries() {
    size_t eocd = find_eocd();
    uint64_t count = le(d_ + eocd + 10, 2), cd_size = le(d_ + eocd + 12, 4),
             cd_off = le(d_ + eocd + 16, 4);
    if (count == 0xffff || cd_size == 0xffffffff || cd_off == 0xffffffff) {
      if (eocd < 20 || le(d_ + eocd - 20, 4) != kLocator64)
        fail(where_, "zip64 locator", "the end record says zip64 but no locator precedes it");
      const uint64_t z = le(d_ + eocd - 20 + 8, 8);
      if (z > n_ || n_ - z < 56 || le(d_ + z, 4) != kEocd64)
        fail(where_, "zip64 end record", "missing or out of range at offset " + std::to_string(z));
      count = le(d_ + z + 32, 8), cd_size = le(d_ + z + 40, 8), cd_off = le(d_ + z + 48, 8);
    }
    if (cd_off > n_ || cd_size > n_ - cd_off)
      fail(where_, "central directory",
           "offset " + std::to_string(cd_off) + " + size " + std::to_string(cd_size) +
               " past the end of the file");
    std::vector<Entry> out;
    size_t p = cd_off;
    for (uint64_t i = 0; i < count; ++i) out.push_back(central(p, cd_off + cd_size, i));
    return out;
  }

  // The member's uncompressed bytes, CRC checked.
  std::vector<uint8_t> data(const Entry& e) {
    const std::string w = "member " + e.name;
    if (e.offset > n_ || n_ - e.offset < 30 || le(d_ + e.offset, 4) != kLocal)
      fail(where_, w, "local header missing at offset " + std::to_string(e.offset));
    const uint64_t start = e.offset + 30 + le(d_ + e.offset + 26, 2) + le(d_ + e.offset + 28, 2);
    if (start > n_ || e.csize > n_ - start)
      fail(where_, w,
           "compressed data (" + std::to_string(e.csize) + " bytes at " + std::to_string(start) +
               ") past the end of the file");
    if (e.flags & 1) fail(where_, w, "encrypted members are not read");
    if (e.usize > (uint64_t{1} << 36) || (e.method == 8 && e.usize > 1100 * e.csize + 1024))
      fail(where_, w + ": uncompressed size", std::to_string(e.usize) + " bytes is implausible");
    std::vector<uint8_t> out;
    if (e.method == 0) {
      if (e.csize != e.usize)
        fail(where_, w,
             "stored member with compressed size " + std::to_string(e.csize) +
                 " != uncompressed size " + std::to_string(e.usize));
      out.assign(d_ + start, d_ + start + e.csize);
    } else if (e.method == 8) {
      out = inflate_raw(d_ + start, e.csize, e.usize, w);
    } else {
      fail(where_, w + ": compression method",
           std::to_string(e.method) + " (expected 0 stored or 8 deflated)");
    }
    const uint32_t crc =
        static_cast<uint32_t>(crc32_z(crc32(0, nullptr, 0), out.data(), out.size()));
    if (crc != e.crc) fail(where_, w, "CRC-32 mismatch (the member is corrupt)");
    return out;
  }

 private:
  size_t find_eocd() const {
    if (n_ < 22) fail(where_, "end of central directory", "file too short to be a zip archive");
    const size_t lo = n_ >= 22 + 65535 ? n_ - 22 - 65535 : 0;
    for (size_t p = n_ - 22 + 1; p-- > lo;)
      if (le(d_ + p, 4) == kEocd) return p;
    fail(where_, "end of central directory", "not found (not a zip archive, or truncated)");
  }

  Entry central(size_t& p, uint64_t end, uint64_t i) {
    const std::string w = "central directory entry " + std::to_string(i);
    if (p > end || end - p < 46 || le(d_ + p, 4) != kCentral)
      fail(where_, w, "missing or truncated");
    Entry e;
    e.flags = static_cast<uint16_t>(le(d_ + p + 8, 2));
    e.method = static_cast<uint16_t>(le(d_ + p + 10, 2));
    e.crc = static_cast<uint32_t>(le(d_ + p + 16, 4));
    e.csize = le(d_ + p + 20, 4), e.usize = le(d_ + p + 24, 4), e.offset = le(d_ + p + 42, 4);
    const uint64_t nl = le(d_ + p + 28, 2), xl = le(d_ + p + 30, 2), cl = le(d_ + p + 32, 2);
    if (end - p - 46 < nl + xl + cl) fail(where_, w, "name or extra field truncated");
    e.name.assign(reinterpret_cast<const char*>(d_ + p + 46), nl);
    zip64_extra(e, d_ + p + 46 + nl, xl, w);
    p += 46 + nl + xl + cl;
    return e;
  }

  // The zip64 extra field (id 1): 8-byte sizes and offset for each field that reads all ones.
  void zip64_extra(Entry& e, const uint8_t* x, uint64_t n, const std::string& w) const {
    for (uint64_t q = 0; q + 4 <= n;) {
      const uint64_t id = le(x + q, 2), sz = le(x + q + 2, 2);
      if (q + 4 + sz > n) fail(where_, w, "extra field truncated");
      if (id == 1) {
        uint64_t k = q + 4;
        for (uint64_t* f : {&e.usize, &e.csize, &e.offset}) {
          if (*f != 0xffffffff) continue;
          if (k + 8 > q + 4 + sz) fail(where_, w, "zip64 extra field too short");
          *f = le(x + k, 8), k += 8;
        }
      }
      q += 4 + sz;
    }
  }

  std::vector<uint8_t> inflate_raw(const uint8_t* src, uint64_t n, uint64_t usize,
                                   const std::string& w) const {
    std::vector<uint8_t> out(static_cast<size_t>(usize));
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail(where_, w, "zlib inflateInit2 failed");
    z.next_in = const_cast<Bytef*>(src);
    z.avail_in = static_cast<uInt>(n);
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(usize);
    const int rc = inflate(&z, Z_FINISH);
    const uint64_t got = z.total_out;
    inflateEnd(&z);
    if (rc != Z_STREAM_END || got != usize)
      fail(where_, w,
           "deflate stream corrupt or of another length (zlib: " +
               std::string(rc == Z_DATA_ERROR ? "data error" : "incomplete") + ")");
    return out;
  }

  const uint8_t* d_;
  size_t n_;
  std::string where_;
};

void put16(std::vector<uint8_t>& o, uint64_t v) {
  for (int i = 0; i < 2; ++i) o.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put32(std::vector<uint8_t>& o, uint64_t v) {
  for (int i = 0; i < 4; ++i) o.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

std::map<std::string, HostTensor> parse_npz(const uint8_t* data, size_t n, const std::string& where,
                                            U16As u16) {
  Zip z(data, n, where);
  std::map<std::string, HostTensor> out;
  for (const Entry& e : z.entries()) {
    if (e.name.size() < 5 || e.name.compare(e.name.size() - 4, 4, ".npy") != 0)
      fail(where, "member " + e.name, "not a .npy member");
    const std::string key = e.name.substr(0, e.name.size() - 4);
    if (out.count(key) > 0) fail(where, "member " + e.name, "appears twice");
    const std::vector<uint8_t> b = z.data(e);
    out.emplace(key, parse_npy(b.data(), b.size(), where + ": member " + e.name, u16));
  }
  return out;
}

std::vector<uint8_t> make_npz_stored(const std::map<std::string, std::vector<uint8_t>>& members) {
  std::vector<uint8_t> o, cd;
  for (const auto& [name, b] : members) {
    const std::string fn = name + ".npy";
    const uint32_t crc = static_cast<uint32_t>(crc32_z(crc32(0, nullptr, 0), b.data(), b.size()));
    const size_t off = o.size();
    put32(o, kLocal), put16(o, 20), put16(o, 0), put16(o, 0), put32(o, 0), put32(o, crc);
    put32(o, b.size()), put32(o, b.size()), put16(o, fn.size()), put16(o, 0);
    o.insert(o.end(), fn.begin(), fn.end());
    o.insert(o.end(), b.begin(), b.end());
    put32(cd, kCentral), put16(cd, 20), put16(cd, 20), put16(cd, 0), put16(cd, 0), put32(cd, 0);
    put32(cd, crc), put32(cd, b.size()), put32(cd, b.size()), put16(cd, fn.size());
    put16(cd, 0), put16(cd, 0), put16(cd, 0), put16(cd, 0), put32(cd, 0), put32(cd, off);
    cd.insert(cd.end(), fn.begin(), fn.end());
  }
  const size_t cd_off = o.size();
  o.insert(o.end(), cd.begin(), cd.end());
  put32(o, kEocd), put16(o, 0), put16(o, 0), put16(o, members.size()), put16(o, members.size());
  put32(o, cd.size()), put32(o, cd_off), put16(o, 0);
  return o;
}

}  // namespace moecheck
