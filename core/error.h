// Errors every part of moecheck raises. InputError is bad input (a malformed file, a wrong shape,
// a NaN routing key, a config that cannot work): the command line maps it to exit code 2. Its
// message names the file, tensor, field, layer or token, with what was expected and found.
#pragma once

#include <stdexcept>
#include <string>

namespace moecheck {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace moecheck
