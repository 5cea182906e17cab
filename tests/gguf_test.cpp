// GGUF reader and writer (golden/gguf.h, docs/gguf.md): write-then-read is the identity over
// random metadata of every type, random tensors and alignments; every truncation and every
// corrupted header, kv and tensor-info field of a small file is an InputError that names the
// byte offset and the field (never a crash: also run under build-h2-asan). The expected file
// bytes come from an independent byte builder here, so the writer is checked against the format.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

#include "core/error.h"
#include "golden/generator.h"
#include "golden/gguf.h"
#include "tests/expect_error.h"

namespace moecheck::gguf {
namespace {

std::string temp_path(const std::string& tag) {
  static int n = 0;
  return std::string(MOECHECK_BINARY_DIR) + "/gguf_test-" + std::to_string(::getpid()) + "-" + tag +
         "-" + std::to_string(n++) + ".gguf";
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

using testutil::expect_error;

// ---- an independent GGUF byte builder that records where each field starts ----
struct Raw {
  std::vector<uint8_t> b;
  std::map<std::string, size_t> at;

  void mark(const std::string& field) {
    if (!field.empty()) at[field] = b.size();
  }
  void uint(uint64_t v, size_t n, const std::string& field = "") {
    mark(field);
    for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s, const std::string& field = "") {
    uint(s.size(), 8, field);
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad(size_t a) {
    while (b.size() % a) b.push_back(0);
  }
  void patch(const std::string& field, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) b[at.at(field) + i] = static_cast<uint8_t>(v >> (8 * i));
  }
};

uint8_t data_byte(int tensor, uint64_t i) {
  return static_cast<uint8_t>(i * 131 + tensor * 17 + 5);
}

// The fixture: 7 kvs of several types, a Q2_K [512, 2] tensor (336 bytes, padded to 352) and an
// F32 [8, 2] tensor (64 bytes) at offset 352.
Raw fixture_bytes() {
  Raw r;
  r.uint(0x46554747, 4, "magic");
  r.uint(3, 4, "version");
  r.uint(2, 8, "tensor_count");
  r.uint(7, 8, "kv_count");
  r.str(kAlignmentKey, "kv0.key");
  r.uint(4, 4, "kv0.type");
  r.uint(32, 4, "kv0.value");
  r.str("t.u8", "kv1.key");
  r.uint(0, 4, "kv1.type");
  r.uint(7, 1);
  r.str("t.str", "kv2.key");
  r.uint(8, 4, "kv2.type");
  r.str("hello", "kv2.value");
  r.str("t.arr", "kv3.key");
  r.uint(9, 4, "kv3.type");
  r.uint(3, 4, "kv3.elem");
  r.uint(3, 8, "kv3.count");
  for (int i = 0; i < 3; ++i) r.uint(static_cast<uint16_t>(-i), 2);
  r.str("t.bool", "kv4.key");
  r.uint(7, 4, "kv4.type");
  r.uint(1, 1, "kv4.value");
  r.str("t.sarr", "kv5.key");
  r.uint(9, 4, "kv5.type");
  r.uint(8, 4, "kv5.elem");
  r.uint(2, 8, "kv5.count");
  r.str("a", "kv5.item0");
  r.str("bc");
  r.str("t.f64", "kv6.key");
  r.uint(12, 4, "kv6.type");
  r.uint(0x400921FB54442D18ull, 8);  // pi
  r.str("blk.0.a", "t0.name");
  r.uint(2, 4, "t0.n_dims");
  r.uint(512, 8, "t0.ne0");
  r.uint(2, 8, "t0.ne1");
  r.uint(10, 4, "t0.type");
  r.uint(0, 8, "t0.offset");
  r.str("blk.0.b", "t1.name");
  r.uint(2, 4, "t1.n_dims");
  r.uint(8, 8, "t1.ne0");
  r.uint(2, 8, "t1.ne1");
  r.uint(0, 4, "t1.type");
  r.uint(352, 8, "t1.offset");
  r.pad(32);
  r.mark("data");
  for (uint64_t i = 0; i < 336; ++i) r.b.push_back(data_byte(0, i));
  r.pad(32);
  for (uint64_t i = 0; i < 64; ++i) r.b.push_back(data_byte(1, i));
  r.pad(32);
  return r;
}

Writer fixture_writer() {
  Writer w;
  w.set_alignment(32);
  w.set("t.u8", make_uint8(7));
  w.set("t.str", make_string("hello"));
  w.set("t.arr", make_array(ValueType::kInt16, {make_int16(0), make_int16(-1), make_int16(-2)}));
  w.set("t.bool", make_bool(true));
  w.set("t.sarr", make_array(ValueType::kString, {make_string("a"), make_string("bc")}));
  w.set("t.f64", make_float64(3.141592653589793));
  for (int t = 0; t < 2; ++t) {
    TensorSpec s;
    s.name = t == 0 ? "blk.0.a" : "blk.0.b";
    s.type = t == 0 ? 10 : 0;
    s.ne = t == 0 ? std::vector<int64_t>{512, 2} : std::vector<int64_t>{8, 2};
    s.chunk_bytes = 100;  // uneven chunks: the writer must call back at offsets 0, 100, 200, ...
    s.fill = [t](uint64_t off, uint8_t* out, uint64_t n) {
      for (uint64_t i = 0; i < n; ++i) out[i] = data_byte(t, off + i);
    };
    w.add_tensor(std::move(s));
  }
  return w;
}

TEST(GgufWriter, FixtureBytesMatchIndependentBuilder) {
  const std::string path = temp_path("fixture");
  fixture_writer().write(path);
  const std::vector<uint8_t> got = read_all(path);
  std::remove(path.c_str());
  EXPECT_EQ(got, fixture_bytes().b);
  EXPECT_FALSE(exists(path + ".tmp-" + std::to_string(::getpid())));
}

TEST(GgufReader, FixtureFieldsRead) {
  const Raw raw = fixture_bytes();
  const Reader r = Reader::from_bytes(raw.b, "fixture.gguf");
  ASSERT_EQ(r.kvs().size(), 7u);
  EXPECT_EQ(r.alignment(), 32u);
  EXPECT_EQ(r.find("t.arr")->value.items[2].as_int(), -2);
  EXPECT_EQ(r.find("t.sarr")->value.items[1].str, "bc");
  EXPECT_EQ(r.find("t.f64")->value.as_f64(), 3.141592653589793);
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.data_offset(), raw.at.at("data"));
  const TensorInfo* b = r.find_tensor("blk.0.b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->nbytes, 64u);
  EXPECT_EQ(r.data(*b)[5], data_byte(1, 5));
  EXPECT_EQ(r.data(*r.find_tensor("blk.0.a"))[335], data_byte(0, 335));
}

// Every prefix shorter than the end of the last tensor's data must be rejected with an offset;
// prefixes that drop only the trailing padding are complete files.
TEST(GgufReader, EveryTruncationIsAnInputError) {
  const Raw raw = fixture_bytes();
  const size_t data_end = raw.at.at("data") + 352 + 64;
  ASSERT_LE(data_end, raw.b.size());
  for (size_t len = 0; len <= raw.b.size(); ++len) {
    std::vector<uint8_t> cut(raw.b.begin(), raw.b.begin() + static_cast<std::ptrdiff_t>(len));
    if (len >= data_end) {
      EXPECT_NO_THROW(Reader::from_bytes(cut, "cut.gguf")) << "length " << len;
    } else {
      expect_error([&] { Reader::from_bytes(cut, "cut.gguf"); }, {"cut.gguf: offset "},
                   "length " + std::to_string(len));
    }
  }
}

struct Corruption {
  std::string name, field;
  uint64_t value;
  size_t bytes;
  std::vector<std::string> expect;  // message parts; "@field" stands for "offset <field's offset>"
  size_t delta = 0;                 // reported offset relative to the field
};

TEST(GgufReader, CorruptedFieldsNameOffsetAndField) {
  const std::vector<Corruption> cases = {
      {"magic", "magic", 0x46554748, 4, {"@", "magic: expected \"GGUF\""}},
      {"version2", "version", 2, 4, {"@", "version: expected 3, found 2"}},
      {"version_swapped", "version", 0x03000000, 4, {"@", "byte-swapped"}},
      {"tensor_count_huge", "tensor_count", 1ull << 40, 8, {"@", "tensor_count 1099511627776"}},
      {"kv_count_huge", "kv_count", 1ull << 40, 8, {"@", "kv_count 1099511627776"}},
      {"key_length_huge",
       "kv1.key",
       1000000000000ull,
       8,
       {"@", "kv[1] key length 1000000000000 exceeds"}},
      {"key_empty", "kv1.key", 0, 8, {"@", "kv[1] key is empty"}},
      {"value_type", "kv1.type", 13, 4, {"@", "value type id 13 is not a GGUF type"}},
      {"string_length", "kv2.value", 1ull << 50, 8, {"@", "kv[2] \"t.str\" length"}},
      {"array_elem_nested", "kv3.elem", 9, 4, {"@", "nested arrays"}},
      {"array_elem_unknown", "kv3.elem", 99, 4, {"@", "element type id 99"}},
      {"array_count", "kv3.count", 1ull << 62, 8, {"@", "array count 4611686018427387904"}},
      {"string_array_count", "kv5.count", 1ull << 40, 8, {"@", "kv[5] \"t.sarr\": array count"}},
      {"string_item_length", "kv5.item0", 1ull << 40, 8, {"@", "kv[5] \"t.sarr\"[0] length"}},
      {"bool_value", "kv4.value", 2, 1, {"@", "bool byte must be 0 or 1, found 2"}},
      {"alignment_type",
       "kv0.type",
       5,
       4,
       {"@", "general.alignment\": must be uint32, found int32"}},
      {"alignment_3", "kv0.value", 3, 4, {"@", "must be a power of two, found 3"}},
      {"alignment_0", "kv0.value", 0, 4, {"@", "must be a power of two, found 0"}},
      {"tensor_name_empty", "t1.name", 0, 8, {"@", "tensor[1] name is empty"}},
      {"tensor_name_long", "t1.name", 64, 8, {"@", "tensor[1] name is 64 bytes, at most 63"}},
      {"tensor_name_huge", "t1.name", 1ull << 60, 8, {"@", "tensor[1] name length"}},
      {"n_dims_0", "t0.n_dims", 0, 4, {"@", "n_dims must be 1..4, found 0"}},
      {"n_dims_5", "t0.n_dims", 5, 4, {"@", "n_dims must be 1..4, found 5"}},
      {"ne0_zero", "t0.ne0", 0, 8, {"@", "ne[0] must be in 1..2^63-1, found 0"}},
      {"ne1_negative", "t0.ne1", 1ull << 63, 8, {"@", "ne[1] must be in 1..2^63-1"}},
      {"ne0_not_block",
       "t0.ne0",
       500,
       8,
       {"ne[0] = 500 is not a multiple of the Q2_K block size 256"}},
      {"ne_overflow", "t0.ne1", 1ull << 62, 8, {"overflows"}},
      {"type_removed", "t0.type", 4, 4, {"@", "unknown ggml type id 4"}},
      {"type_unknown",
       "t1.type",
       1000,
       4,
       {"@", "tensor[1] \"blk.0.b\": unknown ggml type id 1000"}},
      {"offset_unaligned",
       "t1.offset",
       353,
       8,
       {"@", "data offset 353 is not a multiple of the alignment 32"}},
      {"offset_past_end", "t1.offset", 1ull << 40, 8, {"@", "ends past the end of the file"}},
      {"offset_overlap", "t1.offset", 320, 8, {"@", "overlaps tensor[0] \"blk.0.a\" [0, 336)"}},
  };
  for (const Corruption& c : cases) {
    Raw raw = fixture_bytes();
    raw.patch(c.field, c.value, c.bytes);
    std::vector<std::string> parts;
    for (const std::string& p : c.expect)
      parts.push_back(
          p == "@" ? "bad.gguf: offset " + std::to_string(raw.at.at(c.field) + c.delta) + ": " : p);
    try {
      Reader::from_bytes(raw.b, "bad.gguf");
      ADD_FAILURE()
          << c.name
          << ": no InputError (--gtest_filter=GgufReader.CorruptedFieldsNameOffsetAndField)";
    } catch (const InputError& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << c.name << ": message \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
}

TEST(GgufReader, DuplicateTensorNameAndKey) {
  Raw raw = fixture_bytes();
  raw.b[raw.at.at("t1.name") + 8 + 6] = 'a';  // "blk.0.b" -> "blk.0.a"
  expect_error([&] { Reader::from_bytes(raw.b, "dup.gguf"); },
               {"dup.gguf: offset " + std::to_string(raw.at.at("t1.name")), "duplicates tensor[0]"},
               "dup tensor");
  Raw raw2 = fixture_bytes();  // kv[5] "t.sarr" renamed to kv[4]'s "t.bool" (same length)
  std::memcpy(&raw2.b[raw2.at.at("kv5.key") + 8], "t.bool", 6);
  expect_error([&] { Reader::from_bytes(raw2.b, "dup.gguf"); },
               {"dup.gguf: offset " + std::to_string(raw2.at.at("kv5.key")),
                "kv[5] key \"t.bool\" duplicates kv[4]"},
               "dup key");
}

// The reader accepts any aligned, in-bounds, non-overlapping offsets (ggml requires them
// contiguous in info order; docs/gguf.md says why we are more lenient).
TEST(GgufReader, AcceptsGapsAndReversedOrder) {
  Raw raw;
  raw.uint(0x46554747, 4);
  raw.uint(3, 4);
  raw.uint(2, 8);
  raw.uint(0, 8);
  raw.str("x");
  raw.uint(1, 4);
  raw.uint(8, 8);
  raw.uint(0, 4);
  raw.uint(96, 8);  // after a gap
  raw.str("y");
  raw.uint(1, 4);
  raw.uint(4, 8);
  raw.uint(0, 4);
  raw.uint(0, 8);
  raw.pad(32);
  const size_t data = raw.b.size();
  raw.b.resize(data + 128, 0);
  raw.b[data + 96] = 0xAB;
  raw.b[data + 0] = 0xCD;
  const Reader r = Reader::from_bytes(raw.b, "gaps.gguf");
  EXPECT_EQ(r.data(*r.find_tensor("x"))[0], 0xAB);
  EXPECT_EQ(r.data(*r.find_tensor("y"))[0], 0xCD);
}

TEST(GgufReader, OpenErrorsNameThePath) {
  expect_error([] { Reader::open("/nonexistent/dir/m.gguf"); },
               {"/nonexistent/dir/m.gguf: cannot open"}, "missing");
  const std::string empty = temp_path("empty");
  { std::ofstream f(empty); }
  expect_error([&] { Reader::open(empty); },
               {empty + ": offset 0: magic: needs 4 bytes, only 0 left"}, "empty");
  std::remove(empty.c_str());
}

TEST(GgufWriter, FailureLeavesNoFile) {
  const std::string path = temp_path("fail");
  Writer w = fixture_writer();
  w.add_tensor(TensorSpec{"boom", 0, {8}, 0, [](uint64_t, uint8_t*, uint64_t) {
                            throw InputError("fill failed on purpose");
                          }});
  expect_error([&] { w.write(path); }, {"fill failed on purpose"}, "throwing fill");
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(path + ".tmp-" + std::to_string(::getpid())));
  expect_error([&] { fixture_writer().write("/nonexistent/dir/out.gguf"); },
               {"/nonexistent/dir/out.gguf: cannot create"}, "bad dir");
}

TEST(GgufWriter, RejectsBadInput) {
  Writer w;
  w.set("a", make_uint8(1));
  expect_error([&] { w.set("a", make_uint8(2)); }, {"duplicate metadata key \"a\""}, "dup");
  expect_error([&] { w.set("", make_uint8(2)); }, {"empty metadata key"}, "empty");
  expect_error([&] { w.set("n", make_array(ValueType::kArray, {})); }, {"scalar or string"},
               "nested");
  expect_error([&] { w.set("m", make_array(ValueType::kUint8, {make_int8(1)})); },
               {"element is int8"}, "mixed");
  expect_error([&] { w.set_alignment(48); }, {"power of two, found 48"}, "align");
  auto fill = [](uint64_t, uint8_t*, uint64_t) {};
  expect_error(
      [&] {
        w.add_tensor({"q", 10, {100}, 0, fill});
      },
      {"not a multiple of the Q2_K block size 256"}, "block");
  expect_error(
      [&] {
        w.add_tensor({"q", 77, {256}, 0, fill});
      },
      {"unknown ggml type id 77"}, "type");
  expect_error(
      [&] {
        w.add_tensor({std::string(64, 'n'), 0, {1}, 0, fill});
      },
      {"longer than 63"}, "name");
  expect_error(
      [&] {
        w.add_tensor({"q", 0, {1, 2, 3, 4, 5}, 0, fill});
      },
      {"n_dims must be 1..4, found 5"}, "dims");
}

// Random corruption of the fixture: up to four bytes or 8-byte words overwritten (with values
// that stress bounds: 0, 1, the file size, 2^63, all ones, or random). Parsing must either
// succeed with every tensor inside the file or throw InputError; anything else (another
// exception, a crash, a sanitizer report in build-h2-asan) fails.
RC_GTEST_PROP(GgufReader, RandomCorruptionIsValidOrInputError, ()) {
  Raw raw = fixture_bytes();
  const uint64_t size = raw.b.size();
  const int n = *rc::gen::inRange(1, 5);
  for (int i = 0; i < n; ++i) {
    const size_t at = *rc::gen::inRange<size_t>(0, raw.b.size());
    const int kind = *rc::gen::inRange(0, 7);
    const uint64_t values[] = {0, 1, size, 1ull << 63, ~0ull, 33};
    const uint64_t v = kind < 6 ? values[kind] : *rc::gen::arbitrary<uint64_t>();
    const size_t width = *rc::gen::element<size_t>(1, 4, 8);
    for (size_t k = 0; k < width && at + k < raw.b.size(); ++k)
      raw.b[at + k] = static_cast<uint8_t>(v >> (8 * k));
  }
  try {
    const Reader r = Reader::from_bytes(raw.b, "fuzz.gguf");
    for (const TensorInfo& t : r.tensors())
      RC_ASSERT(r.data_offset() + t.offset + t.nbytes <= size);
  } catch (const InputError& e) {
    RC_ASSERT(std::string(e.what()).rfind("fuzz.gguf: offset ", 0) == 0);
  }
}

// ---- round trip property ----

Value random_scalar(ValueType t, Rng& rng) {
  Value v;
  v.type = t;
  if (t == ValueType::kString) {
    const size_t n = rng.next() % 12;
    for (size_t i = 0; i < n; ++i)
      v.str.push_back(static_cast<char>(rng.next()));  // any bytes, NUL too
  } else if (t == ValueType::kBool) {
    v.bits = rng.next() & 1;
  } else {
    const size_t n = scalar_bytes(t);
    v.bits = n == 8 ? rng.next() : rng.next() & ((uint64_t{1} << (8 * n)) - 1);
  }
  return v;
}

const uint32_t kTensorTypes[] = {0, 1, 2, 8, 9, 10, 11, 12, 14, 15, 16, 24, 28, 30, 39};

RC_GTEST_PROP(GgufRoundTrip, WriteThenReadIsIdentity, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Rng rng(seed);
  Writer w;
  std::vector<KeyValue> expect_kvs;
  const int align_choice = *rc::gen::inRange(0, 9);
  uint32_t alignment = kDefaultAlignment;
  if (align_choice > 0) {
    alignment = 1u << (align_choice == 8 ? 12 : align_choice - 1);  // 1 .. 64, and 4096
    w.set_alignment(alignment);
    expect_kvs.push_back({kAlignmentKey, make_uint32(alignment), 0});
  }
  const int n_kv = *rc::gen::inRange(0, 16);
  for (int i = 0; i < n_kv; ++i) {
    const auto t = static_cast<ValueType>(*rc::gen::inRange<uint32_t>(0, kValueTypeCount));
    Value v;
    if (t == ValueType::kArray) {
      ValueType et = static_cast<ValueType>(*rc::gen::inRange<uint32_t>(0, kValueTypeCount));
      if (et == ValueType::kArray) et = ValueType::kString;
      std::vector<Value> items(rng.next() % 9);
      for (Value& it : items) it = random_scalar(et, rng);
      v = make_array(et, std::move(items));
    } else {
      v = random_scalar(t, rng);
    }
    const std::string key =
        "k" + std::to_string(i) + "." + random_scalar(ValueType::kString, rng).str;
    w.set(key, v);
    expect_kvs.push_back({key, v, 0});
  }
  const int n_t = *rc::gen::inRange(0, 6);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < n_t; ++i) {
    TensorSpec s;
    s.name = "t" + std::to_string(i);
    s.type = kTensorTypes[rng.next() % std::size(kTensorTypes)];
    const int dims = 1 + static_cast<int>(rng.next() % 4);
    s.ne.push_back(type_traits(s.type).block_values * (1 + static_cast<int64_t>(rng.next() % 3)));
    for (int d = 1; d < dims; ++d) s.ne.push_back(1 + static_cast<int64_t>(rng.next() % 3));
    s.chunk_bytes = rng.next() % 3 == 0 ? 0 : 1 + rng.next() % 200;
    const uint64_t tseed = rng.next();
    s.fill = [tseed](uint64_t off, uint8_t* out, uint64_t n) {
      for (uint64_t k = 0; k < n; ++k) out[k] = static_cast<uint8_t>((off + k) * 37 + tseed);
    };
    specs.push_back(s);
    w.add_tensor(s);
  }
  const std::string path = temp_path("rt");
  w.write(path);
  const Reader r = Reader::open(path);
  std::remove(path.c_str());

  RC_ASSERT(r.kvs().size() == expect_kvs.size());
  for (size_t i = 0; i < expect_kvs.size(); ++i) {
    RC_ASSERT(r.kvs()[i].key == expect_kvs[i].key);
    RC_ASSERT(r.kvs()[i].value == expect_kvs[i].value);
  }
  RC_ASSERT(r.alignment() == alignment);
  RC_ASSERT(r.data_offset() == w.data_offset());
  RC_ASSERT(r.file_size() == w.file_size());
  RC_ASSERT(r.tensors().size() == specs.size());
  uint64_t expect_offset = 0;  // ggml's rule: each tensor at the padded end of the previous one
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = r.tensors()[i];
    RC_ASSERT(t.name == specs[i].name);
    RC_ASSERT(t.type == specs[i].type);
    RC_ASSERT(std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims) == specs[i].ne);
    RC_ASSERT(t.offset == expect_offset);
    RC_ASSERT(t.nbytes == tensor_nbytes(t.type, specs[i].ne, "t"));
    std::vector<uint8_t> want(t.nbytes);
    specs[i].fill(0, want.data(), t.nbytes);
    RC_ASSERT(std::memcmp(r.data(t), want.data(), t.nbytes) == 0);
    expect_offset += (t.nbytes + alignment - 1) / alignment * alignment;
  }
}

}  // namespace
}  // namespace moecheck::gguf
