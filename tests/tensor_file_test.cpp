// The readers of other engines' tensors (golden/tensor_file.h): .npy (versions 1.0 / 2.0 / 3.0),
// .npz (stored, deflated by zlib), safetensors; round trips on bytes the test writes itself, every
// malformed field an InputError naming the file, the member or tensor and the field, and every
// truncation of a valid file refused (never a crash).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <zlib.h>

#include <cstring>
#include <string>

#include "expect_error.h"
#include "golden/tensor_file.h"

namespace moecheck {
namespace {

using testutil::expect_error;

HostTensor f32_tensor(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i) - 3.25f;
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// A .npy of the given version and header text around `data`.
std::vector<uint8_t> npy_raw(int major, const std::string& header, const std::vector<uint8_t>& d) {
  std::string o = "\x93NUMPY";
  o += static_cast<char>(major), o += '\0';
  const size_t n = header.size();
  o += static_cast<char>(n & 0xff), o += static_cast<char>(n >> 8);
  if (major >= 2) o += static_cast<char>(n >> 16), o += '\0';
  o += header;
  o.append(reinterpret_cast<const char*>(d.data()), d.size());
  return std::vector<uint8_t>(o.begin(), o.end());
}

std::string hdr(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }\n";
}

TEST(TensorFile, NpyRoundTripAndVersions) {
  const HostTensor t = f32_tensor({3, 4});
  const std::vector<uint8_t> b = make_npy(t);
  const HostTensor r = parse_npy(b.data(), b.size(), "a.npy");
  EXPECT_EQ(r.shape, t.shape);
  EXPECT_EQ(r.bytes, t.bytes);
  EXPECT_EQ(tensor_to_f32(r)[5], -0.75f);
  for (int v : {2, 3}) {
    const std::vector<uint8_t> b2 = npy_raw(v, hdr("<f4", "(3, 4)"), t.bytes);
    const HostTensor r2 = parse_npy(b2.data(), b2.size(), "v.npy");
    EXPECT_EQ(r2.bytes, t.bytes) << "version " << v;
  }
  HostTensor one = f32_tensor({5});
  const std::vector<uint8_t> b1 = make_npy(one);
  EXPECT_EQ(parse_npy(b1.data(), b1.size(), "o.npy").shape, std::vector<int64_t>{5});
}

TEST(TensorFile, NpyDtypes) {
  std::vector<uint8_t> d = {0x80, 0x3f, 0x00, 0xc0};  // bf16 1.0, -2.0
  const std::vector<uint8_t> b = npy_raw(1, hdr("<u2", "(2,)"), d);
  expect_error([&] { parse_npy(b.data(), b.size(), "u.npy"); }, {"u.npy", "descr", "--dtype bf16"},
               "u2 without the flag");
  const HostTensor r = parse_npy(b.data(), b.size(), "u.npy", U16As::kBF16);
  EXPECT_EQ(tensor_to_f32(r), (std::vector<float>{1.0f, -2.0f}));
  std::vector<uint8_t> i8(16, 0);
  i8[0] = 7, i8[8] = 0xff, i8[9] = 0xff, i8[10] = 0xff, i8[11] = 0xff, i8[12] = 0xff, i8[13] = 0xff,
  i8[14] = 0xff, i8[15] = 0xff;
  const std::vector<uint8_t> bi = npy_raw(1, hdr("<i8", "(2,)"), i8);
  EXPECT_EQ(tensor_to_i32(parse_npy(bi.data(), bi.size(), "i.npy")), (std::vector<int32_t>{7, -1}));
  const std::vector<uint8_t> bh = npy_raw(1, hdr("<f2", "(1,)"), {0x00, 0x3c});
  EXPECT_EQ(tensor_to_f32(parse_npy(bh.data(), bh.size(), "h.npy"))[0], 1.0f);
  expect_error([&] { tensor_to_i32(parse_npy(bh.data(), bh.size(), "h.npy")); },
               {"h.npy", "dtype", "integer"}, "float as ids");
}

TEST(TensorFile, NpyMalformed) {
  const std::vector<uint8_t> d(48, 0);
  struct Case {
    std::vector<uint8_t> bytes;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {npy_raw(1, hdr(">f4", "(3, 4)"), d), {"descr", "big-endian"}},
      {npy_raw(1, hdr("<f4", "(3, 4)", true), d), {"fortran_order", "C order"}},
      {npy_raw(1, hdr("<c8", "(3, 4)"), d), {"descr", "unsupported dtype '<c8'"}},
      {npy_raw(1, hdr("<f4", "(3, 5)"), d), {"data", "60 bytes", "48"}},
      {npy_raw(4, hdr("<f4", "(3, 4)"), d), {"version", "4.0"}},
      {npy_raw(1, "{'descr': '<f4', 'shape': (3, 4), }", d), {"header", "fortran_order"}},
      {npy_raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -4), }", d),
       {"shape", "non-negative"}},
      {npy_raw(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", d),
       {"descr", "structured"}},
      // Dimensions each under 2^40 whose product passes int64 (found by fuzz_tensor).
      {npy_raw(1, hdr("<f4", "(999999999999, 999999, 9999, 9, 4)"), d), {"shape", "exceeds 2^56"}},
      {{'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0, 0, 0}, {"magic"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> parts = cases[i].parts;
    parts.push_back("bad.npy");
    try {
      parse_npy(cases[i].bytes.data(), cases[i].bytes.size(), "bad.npy");
      ADD_FAILURE() << "case " << i << ": no InputError";
    } catch (const InputError& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "case " << i << ": \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
  // A header length past the end of the file.
  std::vector<uint8_t> b = npy_raw(1, hdr("<f4", "(3, 4)"), d);
  b[8] = 0xff, b[9] = 0x7f;
  expect_error([&] { parse_npy(b.data(), b.size(), "bad.npy"); },
               {"bad.npy", "header", "truncated"}, "header length");
}

// Raw deflate of `d` (what zipfile's ZIP_DEFLATED stores).
std::vector<uint8_t> deflate_raw(const std::vector<uint8_t>& d) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&z, d.size()));
  z.next_in = const_cast<Bytef*>(d.data());
  z.avail_in = static_cast<uInt>(d.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A one-member zip written with method 8 (deflated).
std::vector<uint8_t> npz_deflated(const std::string& name, const std::vector<uint8_t>& d) {
  const std::vector<uint8_t> c = deflate_raw(d);
  const uint32_t crc = static_cast<uint32_t>(crc32(0, d.data(), static_cast<uInt>(d.size())));
  std::vector<uint8_t> o;
  auto p16 = [](std::vector<uint8_t>& v, uint64_t x) {
    for (int i = 0; i < 2; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  auto p32 = [](std::vector<uint8_t>& v, uint64_t x) {
    for (int i = 0; i < 4; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  p32(o, 0x04034b50), p16(o, 20), p16(o, 0), p16(o, 8), p32(o, 0), p32(o, crc);
  p32(o, c.size()), p32(o, d.size()), p16(o, name.size()), p16(o, 0);
  o.insert(o.end(), name.begin(), name.end());
  o.insert(o.end(), c.begin(), c.end());
  const size_t cd = o.size();
  p32(o, 0x02014b50), p16(o, 20), p16(o, 20), p16(o, 0), p16(o, 8), p32(o, 0), p32(o, crc);
  p32(o, c.size()), p32(o, d.size()), p16(o, name.size()), p16(o, 0), p16(o, 0), p16(o, 0);
  p16(o, 0), p32(o, 0), p32(o, 0);
  o.insert(o.end(), name.begin(), name.end());
  const size_t cd_size = o.size() - cd;
  p32(o, 0x06054b50), p16(o, 0), p16(o, 0), p16(o, 1), p16(o, 1), p32(o, cd_size), p32(o, cd);
  p16(o, 0);
  return o;
}

// A tensor with a zero extent (shape (0, 4)) holds no bytes: every conversion gives an empty
// vector (fuzz_tensor found tensor_to_bf16 passing a null pointer to memcpy here; UBSan flags
// that even for 0 bytes, so the ASan + UBSan suite checks it too).
TEST(TensorFile, EmptyTensorsConvertToEmptyVectors) {
  const std::vector<uint8_t> b = npy_raw(1, hdr("<u2", "(0, 4)"), {});
  const HostTensor r = parse_npy(b.data(), b.size(), "e.npy", U16As::kBF16);
  EXPECT_EQ(r.numel(), 0);
  EXPECT_TRUE(tensor_to_bf16(r).empty());
  EXPECT_TRUE(tensor_to_f32(r).empty());
  const std::vector<uint8_t> bf = npy_raw(1, hdr("<f4", "(0,)"), {});
  EXPECT_TRUE(tensor_to_bf16(parse_npy(bf.data(), bf.size(), "f.npy")).empty());
  const std::vector<uint8_t> bi = npy_raw(1, hdr("<i4", "(2, 0)"), {});
  EXPECT_TRUE(tensor_to_i32(parse_npy(bi.data(), bi.size(), "i.npy")).empty());
}

TEST(TensorFile, NpzStoredAndDeflated) {
  const HostTensor a = f32_tensor({2, 3}), b = f32_tensor({4});
  const std::vector<uint8_t> z = make_npz_stored({{"output", make_npy(a)}, {"x", make_npy(b)}});
  const auto m = parse_npz(z.data(), z.size(), "e.npz");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("output").bytes, a.bytes);
  EXPECT_EQ(m.at("x").shape, b.shape);
  const std::vector<uint8_t> zd = npz_deflated("output.npy", make_npy(f32_tensor({64, 16})));
  EXPECT_EQ(parse_npz(zd.data(), zd.size(), "d.npz").at("output").bytes,
            f32_tensor({64, 16}).bytes);
}

TEST(TensorFile, NpzMalformed) {
  const std::vector<uint8_t> good = make_npz_stored({{"output", make_npy(f32_tensor({2, 3}))}});
  std::vector<uint8_t> crc = good;
  crc[30 + 10 + 70] ^= 1;  // a data byte of the member
  expect_error([&] { parse_npz(crc.data(), crc.size(), "c.npz"); },
               {"c.npz", "member output.npy", "CRC-32"}, "corrupt member");
  // Two members of one name (a map cannot hold them: the second name is patched).
  std::vector<uint8_t> two =
      make_npz_stored({{"a", make_npy(f32_tensor({1}))}, {"b", make_npy(f32_tensor({1}))}});
  for (size_t i = 0; i + 5 <= two.size(); ++i)
    if (std::memcmp(two.data() + i, "b.npy", 5) == 0) two[i] = 'a';
  expect_error([&] { parse_npz(two.data(), two.size(), "d.npz"); },
               {"d.npz", "member a.npy", "twice"}, "duplicate member");
  std::vector<uint8_t> meth = good;
  meth[8] = 12;  // local header method bzip2 (the central directory's is read: patch it too)
  for (size_t i = 0; i + 4 <= meth.size(); ++i)
    if (meth[i] == 0x50 && meth[i + 1] == 0x4b && meth[i + 2] == 1 && meth[i + 3] == 2)
      meth[i + 10] = 12;
  expect_error([&] { parse_npz(meth.data(), meth.size(), "m.npz"); },
               {"m.npz", "compression method", "12"}, "method");
  const std::vector<uint8_t> zd = npz_deflated("y.npy", make_npy(f32_tensor({64, 16})));
  std::vector<uint8_t> bad = zd;
  bad[30 + 5 + 3] ^= 0xff;
  expect_error([&] { parse_npz(bad.data(), bad.size(), "z.npz"); }, {"z.npz", "member y.npy"},
               "corrupt deflate");
  const std::vector<uint8_t> other = npz_deflated("notes.txt", {'h', 'i'});
  expect_error([&] { parse_npz(other.data(), other.size(), "o.npz"); },
               {"o.npz", "member notes.txt", "not a .npy member"}, "non-npy member");
}

std::vector<uint8_t> safetensors(const std::string& json, const std::vector<uint8_t>& data) {
  std::string o;
  for (int i = 0; i < 8; ++i) o += static_cast<char>((json.size() >> (8 * i)) & 0xff);
  o += json;
  o.append(reinterpret_cast<const char*>(data.data()), data.size());
  return std::vector<uint8_t>(o.begin(), o.end());
}

TEST(TensorFile, SafetensorsRoundTrip) {
  const HostTensor a = f32_tensor({2, 3});
  std::vector<uint8_t> data = a.bytes;
  data.insert(data.end(), {0x80, 0x3f, 0x00, 0x40});  // bf16 1, 2
  const std::vector<uint8_t> f = safetensors(
      R"({"__metadata__":{"engine":"x"},"output":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("w":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]}})",
      data);
  const auto m = parse_safetensors(f.data(), f.size(), "s.safetensors");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("output").bytes, a.bytes);
  EXPECT_EQ(tensor_to_f32(m.at("w")), (std::vector<float>{1.0f, 2.0f}));
}

TEST(TensorFile, SafetensorsMalformed) {
  const std::vector<uint8_t> d(24, 0);
  struct Case {
    std::string json;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"({"y":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]}})",
       {"tensor y", "dtype", "F8_E4M3"}},
      {R"({"y":{"dtype":"F32","shape":[2,3],"data_offsets":[0,48]}})",
       {"tensor y", "data_offsets", "outside"}},
      {R"({"y":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})",
       {"tensor y", "data_offsets", "need 32"}},
      {R"({"y":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"y":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
       {"tensor y", "twice"}},
      {R"({"y":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", {"tensor y", "shape"}},
      {R"({"y":{"dtype":"F32","data_offsets":[0,24]}})", {"tensor y", "shape", "missing"}},
      {R"({"y":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24])", {"header", "JSON"}},
      {R"([1,2])", {"header", "object"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<uint8_t> f = safetensors(cases[i].json, d);
    try {
      parse_safetensors(f.data(), f.size(), "bad.safetensors");
      ADD_FAILURE() << "case " << i << ": no InputError";
    } catch (const InputError& e) {
      std::vector<std::string> parts = cases[i].parts;
      parts.push_back("bad.safetensors");
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "case " << i << ": \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
  std::vector<uint8_t> f = safetensors("{}", d);
  f[7] = 1;  // a header length of 2^56
  expect_error([&] { parse_safetensors(f.data(), f.size(), "h.safetensors"); },
               {"h.safetensors", "header length", "past the end"}, "header length");
}

// Fuzz-style: every prefix of a valid file is refused with an InputError (nothing else thrown,
// no crash under the sanitizers), and every single-byte flip either parses or is an InputError.
TEST(TensorFile, EveryTruncationAndByteFlipIsAnInputError) {
  const std::vector<uint8_t> npy = make_npy(f32_tensor({3, 5}));
  const std::vector<uint8_t> npz = make_npz_stored({{"output", npy}});
  const std::vector<uint8_t> nzd = npz_deflated("output.npy", npy);
  const std::vector<uint8_t> st =
      safetensors(R"({"output":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]}})",
                  f32_tensor({3, 5}).bytes);
  auto parse = [](int kind, const std::vector<uint8_t>& b) {
    if (kind == 0) parse_npy(b.data(), b.size(), "f.npy");
    else if (kind == 1 || kind == 2) parse_npz(b.data(), b.size(), "f.npz");
    else parse_safetensors(b.data(), b.size(), "f.safetensors");
  };
  int k = 0;
  for (const std::vector<uint8_t>* f : {&npy, &npz, &nzd, &st}) {
    for (size_t n = 0; n < f->size(); ++n) {
      const std::vector<uint8_t> cut(f->begin(), f->begin() + static_cast<long>(n));
      EXPECT_THROW(parse(k, cut), InputError) << "file kind " << k << " cut to " << n << " bytes";
    }
    for (size_t i = 0; i < f->size(); ++i) {
      std::vector<uint8_t> b = *f;
      b[i] ^= 0x5a;
      try {
        parse(k, b);
      } catch (const InputError&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "file kind " << k << " byte " << i << " flipped: " << e.what();
      }
    }
    ++k;
  }
}

// Any dtype, rank 0..4 and shape, any bytes (NaN payloads included): make_npy then parse_npy, and
// a stored .npz of several such members then parse_npz, give the same dtype, shape and bytes.
RC_GTEST_PROP(TensorFileProperty, NpyAndNpzRoundTripAnyDtypeAndShape, ()) {
  const std::vector<TensorDtype> dtypes = {TensorDtype::kF32, TensorDtype::kF16,
                                           TensorDtype::kI32, TensorDtype::kI64,
                                           TensorDtype::kU8,  TensorDtype::kBF16};
  std::map<std::string, std::vector<uint8_t>> members;
  std::map<std::string, HostTensor> want;
  const int n_members = *rc::gen::inRange(1, 4);
  for (int m = 0; m < n_members; ++m) {
    HostTensor t;
    t.dtype = *rc::gen::elementOf(dtypes);
    t.shape = *rc::gen::container<std::vector<int64_t>>(*rc::gen::inRange(0, 5),
                                                        rc::gen::inRange<int64_t>(0, 5));
    t.bytes = *rc::gen::container<std::vector<uint8_t>>(
        static_cast<size_t>(t.numel()) * tensor_dtype_size(t.dtype), rc::gen::arbitrary<uint8_t>());
    const std::vector<uint8_t> b = make_npy(t);
    const U16As u16 = t.dtype == TensorDtype::kBF16 ? U16As::kBF16 : U16As::kRefuse;
    const HostTensor r = parse_npy(b.data(), b.size(), "p.npy", u16);
    RC_ASSERT(r.dtype == t.dtype);
    RC_ASSERT(r.shape == t.shape);
    RC_ASSERT(r.bytes == t.bytes);
    const std::string name = "m" + std::to_string(m);
    members[name] = b;  // make_npz_stored names the member name + ".npy"
    want[name] = t;
  }
  const std::vector<uint8_t> z = make_npz_stored(members);
  const std::map<std::string, HostTensor> got =
      parse_npz(z.data(), z.size(), "p.npz", U16As::kBF16);
  RC_ASSERT(got.size() == want.size());
  for (const auto& [name, t] : want) {
    RC_ASSERT(got.count(name) == 1u);
    RC_ASSERT(got.at(name).shape == t.shape);
    RC_ASSERT(got.at(name).bytes == t.bytes);
  }
}

}  // namespace
}  // namespace moecheck
