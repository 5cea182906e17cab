// The command line's machine output on nlohmann::ordered_json. Contract: docs/cli.md "Output".
#include "tools/json.h"

#include <cmath>
#include <stdexcept>
#include <utility>

namespace moecheck::cli {

using nlohmann::ordered_json;

ordered_json json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// Places v where the document stands (the top level, after a key in an object, or the next
// element of an array) and returns where it now lives.
ordered_json* Json::put(ordered_json v) {
  if (open_.empty()) {
    if (done_ || key_) throw std::logic_error("json: a value outside the document");
    doc_ = std::move(v);
    done_ = true;
    return &doc_;
  }
  ordered_json& at = *open_.back();
  if (at.is_array()) {
    if (key_) throw std::logic_error("json: key \"" + *key_ + "\" inside an array");
    at.push_back(std::move(v));
    return &at.back();
  }
  if (!key_) throw std::logic_error("json: a value without a key inside an object");
  const auto [it, inserted] = at.emplace(*key_, std::move(v));
  if (!inserted) throw std::logic_error("json: duplicate key \"" + *key_ + "\"");
  key_.reset();
  return &*it;
}

Json& Json::close(ordered_json::value_t type, const char* what) {
  if (open_.empty() || open_.back()->type() != type || key_)
    throw std::logic_error(std::string("json: unbalanced end of ") + what);
  open_.pop_back();
  return *this;
}

Json& Json::begin_object() {
  open_.push_back(put(ordered_json::object()));
  return *this;
}
Json& Json::end_object() { return close(ordered_json::value_t::object, "object"); }
Json& Json::begin_array() {
  open_.push_back(put(ordered_json::array()));
  return *this;
}
Json& Json::end_array() { return close(ordered_json::value_t::array, "array"); }

Json& Json::key(const std::string& k) {
  if (open_.empty() || !open_.back()->is_object() || key_)
    throw std::logic_error("json: key \"" + k + "\" outside an object");
  key_ = k;
  return *this;
}

Json& Json::value(const std::string& v) {
  put(v);
  return *this;
}
Json& Json::value(double v) {
  put(json_number(v));
  return *this;
}
Json& Json::value(int64_t v) {
  put(v);
  return *this;
}
Json& Json::value(uint64_t v) {
  put(v);
  return *this;
}
Json& Json::value(bool v) {
  put(v);
  return *this;
}
Json& Json::null() {
  put(nullptr);
  return *this;
}

std::string Json::str() const {
  if (!done_ || !open_.empty()) throw std::logic_error("json: the document is not finished");
  return doc_.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace moecheck::cli
