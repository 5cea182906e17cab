// A small streaming JSON writer for `--json` output (objects, arrays, strings, numbers, bools).
// Non-finite numbers, which JSON cannot hold, are written as the strings "NaN", "Infinity" and
// "-Infinity" (docs/cli.md "Machine output").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck::cli {

class Json {
 public:
  Json& begin_object();
  Json& end_object();
  Json& begin_array();
  Json& end_array();
  Json& key(const std::string& k);
  Json& value(const std::string& v);
  Json& value(const char* v) { return value(std::string(v)); }
  Json& value(double v);
  Json& value(int64_t v);
  Json& value(int v) { return value(static_cast<int64_t>(v)); }
  Json& value(uint64_t v);
  Json& value(bool v);
  Json& null();
  // key(k).value(v) in one call.
  template <class T>
  Json& kv(const std::string& k, const T& v) {
    key(k);
    return value(v);
  }

  const std::string& str() const { return s_; }

 private:
  void separate();
  std::string s_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

std::string json_escape(const std::string& s);

}  // namespace moecheck::cli
