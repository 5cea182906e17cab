// Routing trace files (golden/trace_file.h): nlohmann/json text, written atomically, read with
// every field checked by its JSON path.
#include "golden/trace_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "golden/atomic_file.h"

namespace moecheck {
namespace {

using nlohmann::json;

std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

json ids_json(const std::vector<int32_t>& v, int64_t tokens, int64_t topk) {
  json a = json::array();
  if (v.empty()) return a;
  for (int64_t t = 0; t < tokens; ++t)
    a.push_back(std::vector<int32_t>(v.begin() + t * topk, v.begin() + (t + 1) * topk));
  return a;
}

// Where an error is: the file, and the JSON path of the field.
struct At {
  const std::string& where;
  std::string path;
  At sub(const std::string& key) const { return At{where, path.empty() ? key : path + "." + key}; }
  At item(size_t i) const { return At{where, path + "[" + std::to_string(i) + "]"}; }
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(where + ": " + (path.empty() ? "the document" : path) + ": " + what);
  }
};

std::string found(const json& v) {
  std::string s = dump(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + s;
}

int64_t get_int(const json& v, const At& at, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) at.fail("expected an integer, found " + found(v));
  // Non-negative integers parse as unsigned (up to 2^64 - 1), negative ones as signed.
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                              (lo <= 0 || v.get<uint64_t>() >= static_cast<uint64_t>(lo))
                        : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!fits)
    at.fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "], found " + dump(v));
  return v.get<int64_t>();
}

const json& get_array(const json& v, const At& at, size_t n, const std::string& of) {
  if (!v.is_array()) at.fail("expected an array of " + of + ", found " + found(v));
  if (v.size() != n)
    at.fail("expected " + std::to_string(n) + " " + of + ", found " + std::to_string(v.size()));
  return v;
}

// The object's keys: each of `required` present, nothing outside required and optional.
void check_keys(const json& o, const At& at, const std::vector<std::string>& required,
                const std::vector<std::string>& optional) {
  if (!o.is_object()) at.fail("expected a JSON object, found " + found(o));
  std::string known;
  for (const std::vector<std::string>* v : {&required, &optional})
    for (const std::string& k : *v) known += (known.empty() ? "" : ", ") + k;
  for (const auto& item : o.items())
    if (std::find(required.begin(), required.end(), item.key()) == required.end() &&
        std::find(optional.begin(), optional.end(), item.key()) == optional.end())
      at.sub(item.key()).fail("unknown key (expected " + known + ")");
  for (const std::string& k : required)
    if (!o.contains(k)) at.sub(k).fail("missing");
}

// [tokens][topk] expert ids, each in [0, n_routed), flattened.
std::vector<int32_t> read_ids(const json& v, const At& at, const RoutingTrace& t) {
  std::vector<int32_t> out;
  const size_t T = static_cast<size_t>(t.tokens), K = static_cast<size_t>(t.topk);
  get_array(v, at, T, "tokens' arrays (tokens = " + std::to_string(T) + ")");
  out.reserve(T * K);
  for (size_t i = 0; i < T; ++i) {
    const At ai = at.item(i);
    const json& row = get_array(v[i], ai, K, "expert ids (topk = " + std::to_string(K) + ")");
    for (size_t j = 0; j < K; ++j)
      out.push_back(static_cast<int32_t>(get_int(row[j], ai.item(j), 0, t.n_routed - 1)));
  }
  return out;
}

TraceLayer read_layer(const json& v, const At& at, const RoutingTrace& t) {
  check_keys(v, at, {"layer", "picks"}, {"predicted"});
  TraceLayer l;
  l.layer = static_cast<int32_t>(
      get_int(v["layer"], at.sub("layer"), 0, std::numeric_limits<int32_t>::max()));
  l.picks = read_ids(v["picks"], at.sub("picks"), t);
  if (v.contains("predicted")) {
    const json& p = v["predicted"];
    if (!(p.is_array() && p.empty())) l.predicted = read_ids(p, at.sub("predicted"), t);
  }
  return l;
}

// The first key that appears twice in one object, by JSON path ("" when none): nlohmann keeps the
// last silently, so the parser's events are followed (a path frame per open container).
class DuplicateKeys {
 public:
  bool operator()(int, json::parse_event_t ev, json& parsed) {
    using E = json::parse_event_t;
    if (ev == E::object_start || ev == E::array_start) {
      child();
      frames_.push_back(Frame{ev == E::array_start, -1, {}, {}});
    } else if (ev == E::object_end || ev == E::array_end) {
      frames_.pop_back();
    } else if (ev == E::key) {
      Frame& f = frames_.back();
      f.key = parsed.get<std::string>();
      if (!f.keys.insert(f.key).second && first_.empty()) first_ = path();
    } else if (ev == E::value && !frames_.empty() && frames_.back().array) {
      ++frames_.back().index;
    }
    return true;
  }
  const std::string& first() const { return first_; }

 private:
  struct Frame {
    bool array = false;
    int64_t index = -1;
    std::string key;
    std::set<std::string> keys;
  };
  void child() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_)
      p += f.array ? "[" + std::to_string(f.index) + "]" : (p.empty() ? "" : ".") + f.key;
    return p;
  }
  std::vector<Frame> frames_;
  std::string first_;
};

}  // namespace

std::string trace_json(const TraceFile& f) {
  const RoutingTrace& t = f.trace;
  std::ostringstream os;
  os << "{\n  \"format\": " << dump(kTraceFormat) << ",\n  \"version\": " << kTraceVersion
     << ",\n  \"origin\": " << dump(t.origin) << ",\n  \"n_routed\": " << t.n_routed
     << ",\n  \"topk\": " << t.topk << ",\n  \"tokens\": " << t.tokens;
  if (f.expert_bytes > 0) os << ",\n  \"expert_bytes\": " << f.expert_bytes;
  os << ",\n  \"layers\": [";
  for (size_t i = 0; i < t.layers.size(); ++i) {
    const TraceLayer& l = t.layers[i];
    json o = json::object();
    o["layer"] = l.layer;
    o["picks"] = ids_json(l.picks, t.tokens, t.topk);
    o["predicted"] = ids_json(l.predicted, t.tokens, t.topk);
    os << (i ? ",\n    " : "\n    ") << "{\"layer\": " << l.layer
       << ", \"picks\": " << dump(o["picks"]) << ", \"predicted\": " << dump(o["predicted"]) << "}";
  }
  os << "\n  ]\n}\n";
  return os.str();
}

void write_trace_file(const std::string& path, const TraceFile& t) {
  t.trace.validate(path);
  if (t.trace.layers.empty()) throw InputError(path + ": layers: a trace needs at least one layer");
  if (t.expert_bytes < 0)
    throw InputError(path + ": expert_bytes: expected >= 0, found " +
                     std::to_string(t.expert_bytes));
  const std::string text = trace_json(t);
  write_file_atomic(path, text.data(), text.size());
}

TraceFile parse_trace_json(const std::string& text, const std::string& where) {
  DuplicateKeys dup;
  json doc;
  try {
    doc = json::parse(text, std::ref(dup));
  } catch (const json::exception& e) {
    throw InputError(where + ": not valid JSON (" + e.what() + ")");
  }
  const At top{where, ""};
  if (!dup.first().empty()) top.sub(dup.first()).fail("key appears twice in its object");
  check_keys(doc, top, {"format", "version", "origin", "n_routed", "topk", "tokens", "layers"},
             {"expert_bytes"});
  if (!doc["format"].is_string() || doc["format"].get<std::string>() != kTraceFormat)
    top.sub("format").fail(std::string("expected \"") + kTraceFormat + "\", found " +
                           found(doc["format"]));
  const int64_t version = get_int(doc["version"], top.sub("version"), 1, 1 << 30);
  if (version != kTraceVersion)
    top.sub("version").fail("version " + std::to_string(version) + " is not one this moecheck " +
                            "reads (it reads " + std::to_string(kTraceVersion) + ")");
  if (!doc["origin"].is_string())
    top.sub("origin").fail("expected a string, found " + found(doc["origin"]));
  TraceFile f;
  RoutingTrace& t = f.trace;
  t.origin = doc["origin"].get<std::string>();
  const int64_t big = std::numeric_limits<int64_t>::max();
  t.n_routed = get_int(doc["n_routed"], top.sub("n_routed"), 1, big);
  t.topk = get_int(doc["topk"], top.sub("topk"), 1, big);
  t.tokens = get_int(doc["tokens"], top.sub("tokens"), 1, big);
  t.validate(where);  // the sizes, before any array is read by them
  if (doc.contains("expert_bytes"))
    f.expert_bytes = get_int(doc["expert_bytes"], top.sub("expert_bytes"), 1, big);
  const json& layers = doc["layers"];
  if (!layers.is_array() || layers.empty())
    top.sub("layers").fail("expected a non-empty array of layers, found " + found(layers));
  for (size_t i = 0; i < layers.size(); ++i)
    t.layers.push_back(read_layer(layers[i], top.sub("layers").item(i), t));
  t.validate(where);
  return f;
}

TraceFile read_trace_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path + ": trace file does not exist");
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path + ": is not a regular file (expected a trace file)");
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    const int err = errno;
    throw InputError(path + ": cannot open the trace file (" + std::strerror(err) + ")");
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(path + ": cannot read the trace file");
  return parse_trace_json(text, path);
}

}  // namespace moecheck
