// The safetensors reader: an 8-byte little-endian header length N, N bytes of JSON (one object per
// tensor: "dtype", "shape", "data_offsets" [begin, end) relative to the data that follows the
// header; an optional "__metadata__" of strings), then the data. nlohmann/json parses the header
// (its use stays in this file); duplicate names, which a JSON object would silently collapse, are
// caught while parsing.
#include <nlohmann/json.hpp>

#include <set>

#include "core/error.h"
#include "golden/tensor_file.h"

namespace moecheck {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& field, const std::string& why) {
  throw InputError(where + ": " + field + ": " + why);
}

TensorDtype st_dtype(const std::string& d, const std::string& where) {
  if (d == "F32") return TensorDtype::kF32;
  if (d == "F16") return TensorDtype::kF16;
  if (d == "BF16") return TensorDtype::kBF16;
  if (d == "I32") return TensorDtype::kI32;
  if (d == "I64") return TensorDtype::kI64;
  if (d == "U8") return TensorDtype::kU8;
  fail(where, "dtype", "unsupported \"" + d + "\" (expected F32, F16, BF16, I32, I64 or U8)");
}

// One tensor's entry, checked against the data section of `size` bytes.
HostTensor entry(const nlohmann::json& j, const std::string& where, const uint8_t* data,
                 uint64_t size) {
  if (!j.is_object()) fail(where, "entry", "expected an object");
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!j.contains(k)) fail(where, k, "missing");
  for (const auto& [k, v] : j.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets") fail(where, k, "unknown field");
  if (!j["dtype"].is_string()) fail(where, "dtype", "expected a string");
  HostTensor t;
  t.where = where;
  t.dtype = st_dtype(j["dtype"].get<std::string>(), where);
  const nlohmann::json& s = j["shape"];
  if (!s.is_array()) fail(where, "shape", "expected an array of integers");
  for (const nlohmann::json& d : s) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
      fail(where, "shape", "expected non-negative integers, found " + d.dump());
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const nlohmann::json& o = j["data_offsets"];
  if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
    fail(where, "data_offsets", "expected [begin, end], found " + o.dump());
  const uint64_t b = o[0].get<uint64_t>(), e = o[1].get<uint64_t>();
  if (b > e || e > size)
    fail(where, "data_offsets",
         "[" + std::to_string(b) + ", " + std::to_string(e) + ") outside the data section of " +
             std::to_string(size) + " bytes");
  const uint64_t want = static_cast<uint64_t>(t.numel()) * tensor_dtype_size(t.dtype);
  if (e - b != want)
    fail(where, "data_offsets",
         "span " + std::to_string(e - b) + " bytes, but shape and dtype need " +
             std::to_string(want));
  t.bytes.assign(data + b, data + e);
  return t;
}

}  // namespace

std::map<std::string, HostTensor> parse_safetensors(const uint8_t* data, size_t n,
                                                    const std::string& where) {
  if (n < 8) fail(where, "header length", "truncated: " + std::to_string(n) + " bytes");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | data[i];
  if (hlen > n - 8)
    fail(where, "header length",
         std::to_string(hlen) + " bytes, past the end of the file (" + std::to_string(n) + ")");
  std::set<std::string> seen;
  std::string dup;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& k) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && dup.empty() &&
        !seen.insert(k.get<std::string>()).second)
      dup = k.get<std::string>();
    return true;
  };
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(data + 8, data + 8 + hlen, cb);
  } catch (const nlohmann::json::exception& e) {
    fail(where, "header", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!dup.empty()) fail(where, "tensor " + dup, "appears twice in the header");
  if (!h.is_object()) fail(where, "header", "expected a JSON object");
  std::map<std::string, HostTensor> out;
  const uint8_t* body = data + 8 + hlen;
  const uint64_t size = n - 8 - hlen;
  for (const auto& [name, j] : h.items()) {
    if (name == "__metadata__") continue;
    out.emplace(name, entry(j, where + ": tensor " + name, body, size));
  }
  return out;
}

}  // namespace moecheck
