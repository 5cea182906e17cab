// Terminal-only progress bar (stderr). Contract: docs/cli.md "Output".
#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

namespace moecheck::cli {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), on_(enabled && ::isatty(STDERR_FILENO) == 1) {
  if (on_ && total_ > 0) draw("");  // a total set later (gen) draws on the first update
}

Progress::~Progress() {
  if (on_) std::fprintf(stderr, "\r\033[K");
}

void Progress::step(const std::string& what) {
  ++done_;
  if (on_) draw(what);
}

void Progress::update(int64_t done, const std::string& what) {
  if (done == done_) return;
  done_ = done;
  if (on_) draw(what);
}

void Progress::draw(const std::string& what) {
  constexpr int kWidth = 30;
  const int64_t total = total_ > 0 ? total_ : 1;
  const int fill = static_cast<int>(kWidth * (done_ > total ? total : done_) / total);
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld %s", label_.c_str(), bar.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), what.c_str());
  std::fflush(stderr);
}

}  // namespace moecheck::cli
