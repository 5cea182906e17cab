// The stage list of an imported dump (golden/dump.h, docs/golden-format.md "Imported dumps").
#include <algorithm>

#include "core/error.h"
#include "golden/dump.h"

namespace moecheck {

bool dump_has_stage(const DumpMeta& m, Stage s) {
  // Only an imported dump read from a file lists its stages; one built in memory with every stage
  // (check --against's judged layer: the kernel contract's run with the imported stages put in
  // place) carries the label and no list.
  if (m.implementation != "import" || m.stages.empty()) return true;
  return std::find(m.stages.begin(), m.stages.end(), stage_name(s)) != m.stages.end();
}

std::string join_stage_list(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

std::vector<std::string> parse_stage_list(const std::string& v, bool taps) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < v.size()) {
    const size_t c = std::min(v.find(',', pos), v.size());
    out.push_back(v.substr(pos, c - pos));
    Stage s;
    if (!parse_stage(out.back(), &s)) throw InputError("unknown stage \"" + out.back() + "\"");
    pos = c + 1;
  }
  auto has = [&](const char* n) { return std::find(out.begin(), out.end(), n) != out.end(); };
  if (!has("input") || !has("output"))
    throw InputError("must list input and output, found \"" + v + "\"");
  if (has("topk_ids") != has("topk_weights"))
    throw InputError("topk_ids and topk_weights come together, found \"" + v + "\"");
  if (has("acc") != taps)
    throw InputError("the tap stages (acc among them) are listed exactly when taps = 1, found \"" +
                     v + "\"");
  return out;
}

}  // namespace moecheck
