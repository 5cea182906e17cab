// The run's command-line lists (tools/runner.h): --layers, --image-tokens, and the bias_vl
// refusal of an image mask. Contract: docs/cli.md "run".
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/runner.h"

namespace moecheck::cli {

std::vector<int> parse_layer_list(const std::string& s) {
  std::vector<int> out;
  auto bad = [&](const std::string& why) -> void {
    throw InputError("--layers \"" + s + "\": " + why + " (expected e.g. 0,2-5)");
  };
  auto num = [&](const std::string& t) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos)
      bad("\"" + t + "\" is not a layer number");
    return std::stoi(t);
  };
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(num(item));
    } else {
      const int lo = num(item.substr(0, dash)), hi = num(item.substr(dash + 1));
      if (hi < lo) bad("range " + item + " is empty");
      for (int l = lo; l <= hi; ++l) out.push_back(l);
    }
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<uint8_t> parse_image_tokens(const std::string& s, int64_t T) {
  std::vector<uint8_t> mask(static_cast<size_t>(std::max<int64_t>(T, 0)), 0);
  auto bad = [&](const std::string& piece, const std::string& why) -> void {
    throw InputError("--image-tokens \"" + s + "\": piece \"" + piece + "\" " + why +
                     " (expected comma-separated token indices or inclusive ranges in [0, " +
                     std::to_string(T) + "), e.g. 3-17,40-60)");
  };
  auto num = [&](const std::string& piece, const std::string& t) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos)
      bad(piece, "is not a token index or range");
    const int64_t v = std::stoll(t);
    if (v >= T)
      bad(piece, "names token " + t + ", outside the run's " + std::to_string(T) + " token(s)");
    return v;
  };
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string piece = s.substr(pos, comma - pos);
    const size_t dash = piece.find('-');
    const int64_t lo = num(piece, piece.substr(0, dash));
    const int64_t hi = dash == std::string::npos ? lo : num(piece, piece.substr(dash + 1));
    if (hi < lo) bad(piece, "is reversed (write the lower index first)");
    for (int64_t t = lo; t <= hi; ++t) {
      if (mask[static_cast<size_t>(t)] != 0)
        bad(piece, "overlaps an earlier piece at token " + std::to_string(t));
      mask[static_cast<size_t>(t)] = 1;
    }
    pos = comma + 1;
  }
  return mask;
}

void require_bias_vl(const LayerWeights& w, const std::string& model, const std::string& flag) {
  if (w.bias_vl != nullptr) return;
  throw InputError(flag + ": " + model + " has no tensor \"" +
                   tensor_name(w.layer, LayerTensor::kBiasVl) +
                   "\" (model.py's Gate.bias_vl), so an image mask would change no pick; refused "
                   "(docs/cli.md \"run\")");
}

}  // namespace moecheck::cli
