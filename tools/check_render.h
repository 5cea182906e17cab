// Text and JSON renderings of `moecheck check`'s result (compare/check.h). Contract: docs/cli.md
// "check".
#pragma once

#include <string>

#include "compare/check.h"

namespace moecheck::cli {

std::string render_check_text(const CheckResult& r);
std::string render_check_json(const CheckResult& r);

}  // namespace moecheck::cli
