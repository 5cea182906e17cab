// Streaming JSON writer of the command line's machine output. Contract: docs/cli.md.
#include "tools/json.h"

#include <cmath>
#include <cstdio>

namespace moecheck::cli {

std::string json_escape(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

void Json::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) s_ += ",";
    first_.back() = false;
  }
}

Json& Json::begin_object() {
  separate();
  s_ += "{";
  first_.push_back(true);
  return *this;
}
Json& Json::end_object() {
  s_ += "}";
  first_.pop_back();
  return *this;
}
Json& Json::begin_array() {
  separate();
  s_ += "[";
  first_.push_back(true);
  return *this;
}
Json& Json::end_array() {
  s_ += "]";
  first_.pop_back();
  return *this;
}
Json& Json::key(const std::string& k) {
  separate();
  s_ += json_escape(k) + ":";
  after_key_ = true;
  return *this;
}
Json& Json::value(const std::string& v) {
  separate();
  s_ += json_escape(v);
  return *this;
}
Json& Json::value(double v) {
  separate();
  if (std::isnan(v)) {
    s_ += "\"NaN\"";
  } else if (std::isinf(v)) {
    s_ += v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  } else {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    s_ += buf;
  }
  return *this;
}
Json& Json::value(int64_t v) {
  separate();
  s_ += std::to_string(v);
  return *this;
}
Json& Json::value(uint64_t v) {
  separate();
  s_ += std::to_string(v);
  return *this;
}
Json& Json::value(bool v) {
  separate();
  s_ += v ? "true" : "false";
  return *this;
}
Json& Json::null() {
  separate();
  s_ += "null";
  return *this;
}

}  // namespace moecheck::cli
