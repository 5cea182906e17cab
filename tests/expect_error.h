// Test helper shared by the file-format tests: run `f` and expect a moecheck::InputError whose
// message holds every one of `parts` (the file, offset, field, tensor a user must be told).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace moecheck::testutil {

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts, const std::string& ctx) {
  try {
    f();
    ADD_FAILURE() << ctx << ": no InputError";
  } catch (const InputError& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << ctx << ": message \"" << e.what() << "\" lacks \"" << p << "\"";
  }
}

}  // namespace moecheck::testutil
