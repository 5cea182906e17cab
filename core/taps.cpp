// Stage names (the report's and the dump's) and the shared expert's taps. Contract:
// docs/golden-format.md (dataset names), core/taps.h.
#include "core/taps.h"

namespace moecheck {
namespace {

struct StageInfo {
  Stage stage;
  const char* name;
  const char* dataset;
};

constexpr StageInfo kStages[kStageCount] = {
    {Stage::kInput, "input", "input"},
    {Stage::kRouterLogits, "router_logits", "router_logits"},
    {Stage::kTopkIds, "topk_ids", "topk_ids"},
    {Stage::kTopkWeights, "topk_weights", "topk_weights"},
    {Stage::kXQ8, "x_q8", "x_q8"},
    {Stage::kExpertsWeights, "experts.weights", "weights"},
    {Stage::kExpertsGate, "experts.gate", "gate"},
    {Stage::kExpertsUp, "experts.up", "up"},
    {Stage::kExpertsH, "experts.h", "h"},
    {Stage::kExpertsHQ8, "experts.h_q8", "h_q8"},
    {Stage::kExpertsDown, "experts.down", "down"},
    {Stage::kSharedWeights, "shared.weights", "weights"},
    {Stage::kSharedGate, "shared.gate", "gate"},
    {Stage::kSharedUp, "shared.up", "up"},
    {Stage::kSharedH, "shared.h", "h"},
    {Stage::kSharedHQ8, "shared.h_q8", "h_q8"},
    {Stage::kSharedDown, "shared.down", "down"},
    {Stage::kAcc, "acc", "acc"},
    {Stage::kOutput, "output", "output"},
};

const StageInfo& info(Stage s) { return kStages[static_cast<int>(s)]; }

}  // namespace

const std::array<Stage, kStageCount>& all_stages() {
  static const std::array<Stage, kStageCount> k = [] {
    std::array<Stage, kStageCount> a{};
    for (int i = 0; i < kStageCount; ++i) a[static_cast<size_t>(i)] = kStages[i].stage;
    return a;
  }();
  return k;
}

const char* stage_name(Stage s) { return info(s).name; }
const char* stage_dataset(Stage s) { return info(s).dataset; }

bool is_routed_stage(Stage s) { return s >= Stage::kExpertsWeights && s <= Stage::kExpertsDown; }
bool is_shared_stage(Stage s) { return s >= Stage::kSharedWeights && s <= Stage::kSharedDown; }

ExpertField stage_field(Stage s) {
  const int first =
      static_cast<int>(is_shared_stage(s) ? Stage::kSharedWeights : Stage::kExpertsWeights);
  return static_cast<ExpertField>(static_cast<int>(s) - first);
}

Stage expert_stage(bool shared, ExpertField f) {
  const int first = static_cast<int>(shared ? Stage::kSharedWeights : Stage::kExpertsWeights);
  return static_cast<Stage>(first + static_cast<int>(f));
}

bool parse_stage(const std::string& name, Stage* out) {
  for (const StageInfo& i : kStages) {
    if (name == i.name) {
      *out = i.stage;
      return true;
    }
  }
  return false;
}

void fill_shared_taps(ExpertTaps& s, int64_t T) {
  s.expert = -1;
  s.tokens.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s.tokens[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  s.weights.assign(static_cast<size_t>(T), 1.0f);
}

}  // namespace moecheck
