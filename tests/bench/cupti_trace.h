// layer_bench's kernel timeline (`layer_bench trace`): CUPTI's concurrent-kernel activity
// records of the traced graph replays, reported per kernel as median start, end and duration.
// Compiled only where CMake found CUDA::cupti (MOECHECK_HAVE_CUPTI, tests/CMakeLists.txt); a
// header of layer_bench alone.
#pragma once

#ifdef MOECHECK_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/bench/bench_util.h"

// The kernel timeline of the traced replays, from CUPTI's concurrent-kernel activity records
// (start and end on the GPU's clock, per graph node).
namespace cupti_trace {
struct Rec {
  uint64_t start, end;
  uint32_t stream;
  std::string name;
};
inline std::vector<Rec> g_recs;

inline void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = size_t{8} << 20;
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

inline void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::string n = k->name != nullptr ? k->name : "?";
    int st = 0;
    if (char* d = abi::__cxa_demangle(n.c_str(), nullptr, nullptr, &st)) {
      n = d;
      std::free(d);
    }
    // The name without namespaces and parameters: "mmvq_sb_kernel<(GgmlType)11, 16, false>".
    for (size_t a; (a = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(a, 23);
    const size_t paren = n.rfind('(');
    if (paren != std::string::npos && n.back() == ')') n = n.substr(0, paren);
    const size_t lt = n.find('<');
    const size_t ns = n.rfind("::", lt == std::string::npos ? std::string::npos : lt);
    if (ns != std::string::npos) n = n.substr(ns + 2);
    g_recs.push_back({k->start, k->end, k->streamId, n.substr(0, 48)});
  }
  std::free(buf);
}

inline void check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    std::fprintf(stderr, "CUPTI %s failed: %s\n", what, s != nullptr ? s : "?");
    std::exit(1);
  }
}

inline void start() {
  check(cuptiActivityRegisterCallbacks(requested, completed), "register callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
}

// The replays' kernels in start order, split into replays of equal count; each kernel keyed by its
// name and occurrence within its replay; per key the median start and end (from its replay's
// first start) and duration, us, in order of median start.
inline void report(int replays) {
  check(cuptiActivityFlushAll(1), "flush");
  std::vector<Rec> r = g_recs;
  std::sort(r.begin(), r.end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
  if (r.empty() || r.size() % static_cast<size_t>(replays) != 0) {
    std::printf("trace: %zu kernel records, not a multiple of %d replays\n", r.size(), replays);
    return;
  }
  const size_t per = r.size() / static_cast<size_t>(replays);
  struct Row {
    std::vector<double> s, e, d;
    uint32_t stream = 0;
  };
  std::map<std::string, Row> rows;
  std::vector<double> span;
  for (int i = 0; i < replays; ++i) {
    const uint64_t t0 = r[i * per].start;
    uint64_t end = 0;
    std::map<std::string, int> seen;
    for (size_t j = 0; j < per; ++j) {
      const Rec& x = r[i * per + j];
      const std::string key = x.name + " #" + std::to_string(++seen[x.name]);
      Row& row = rows[key];
      row.s.push_back((x.start - t0) * 1e-3);
      row.e.push_back((x.end - t0) * 1e-3);
      row.d.push_back((x.end - x.start) * 1e-3);
      row.stream = x.stream;
      end = std::max(end, x.end);
    }
    span.push_back((end - t0) * 1e-3);
  }
  std::vector<std::pair<double, std::string>> order;
  for (auto& kv : rows) order.push_back({moecheck::bench::median(kv.second.s), kv.first});
  std::sort(order.begin(), order.end());
  std::printf(
      "\n| kernel | stream | start us | end us | duration us | in replays |\n"
      "|---|---|---|---|---|---|\n");
  for (const auto& o : order) {
    Row& row = rows[o.second];
    std::printf("| %s | %u | %.1f | %.1f | %.1f | %zu |\n", o.second.c_str(), row.stream,
                moecheck::bench::median(row.s), moecheck::bench::median(row.e),
                moecheck::bench::median(row.d), row.s.size());
  }
  std::printf("first kernel start to last kernel end, median of %d replays: %.1f us\n", replays,
              moecheck::bench::median(span));
}
}  // namespace cupti_trace
#endif
