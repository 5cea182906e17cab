// The `--json` output of the command line: one document built on nlohmann::ordered_json (keys
// stay in the order the commands add them) through the streaming calls the commands use
// (begin_object / key / value / end_object ...). What is moecheck's own here is the rule for
// numbers JSON cannot hold: NaN, +inf and -inf are written as the strings "NaN", "Infinity" and
// "-Infinity" (docs/cli.md "Output"). Misuse (a value without a key inside an object, a
// duplicate key, an unbalanced end, a second top-level value) throws std::logic_error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

  // The finished document, compact (no spaces), as one line. Bytes that are not UTF-8 (a GGUF
  // string or a file name) come out as U+FFFD, so the output always parses.
  std::string str() const;
  const nlohmann::ordered_json& doc() const { return doc_; }

 private:
  nlohmann::ordered_json* put(nlohmann::ordered_json v);
  Json& close(nlohmann::ordered_json::value_t type, const char* what);

  nlohmann::ordered_json doc_;
  std::vector<nlohmann::ordered_json*> open_;  // the containers begun and not yet ended
  std::optional<std::string> key_;             // a key waiting for its value
  bool done_ = false;                          // the top-level value is placed
};

// v as JSON: a number, or for a non-finite v the string "NaN", "Infinity" or "-Infinity".
nlohmann::ordered_json json_number(double v);

}  // namespace moecheck::cli
