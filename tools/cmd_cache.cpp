// `moecheck cache`: a routing trace (a file from `run --trace`, or a synthetic skewed one)
// replayed through the expert cache at several sizes: LRU (the real policy), LRU with prefetch,
// Belady's optimum, and the trace's prefetch recall / precision. Contract: docs/cli.md "cache",
// docs/streaming.md "Cache simulation".
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/cache_sim.h"
#include "core/error.h"
#include "core/routing_trace.h"
#include "golden/synthetic_trace.h"
#include "golden/trace_file.h"
#include "tools/cache_sizes.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/preflight.h"

namespace moecheck::cli {
namespace {

struct CacheArgs {
  std::string trace;
  std::string synthetic;
  std::string sizes;
  std::string order = "batch";
  std::string prefetch_k = "all";
  std::string save_trace;
  bool json = false;
};

struct CacheGiven {
  CLI::Option *synthetic = nullptr, *sizes = nullptr, *prefetch_k = nullptr;
};

// Everything the output shows.
struct CacheReport {
  std::string source;  // the trace file, or "synthetic"
  TraceFile file;
  ReplayOrder order = ReplayOrder::kBatch;
  int64_t prefetch_k = 0;
  TraceDemand demand;
  bool has_accuracy = false;
  PrefetchAccuracy accuracy;
  std::vector<CacheSize> sizes;
  std::vector<CacheSimResult> results;
};

std::string k_text(int64_t k) { return k == kPrefetchAll ? "all" : std::to_string(k); }

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * x);
  return b;
}

// Right-aligned cells: the size 12 wide, the others 11.
std::string table_row(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) {
    const size_t w = i == 0 ? 12 : 11;
    out += std::string(cells[i].size() < w ? w - cells[i].size() : 1, ' ') + cells[i];
  }
  return out;
}

void print_text(const CacheReport& r) {
  const RoutingTrace& t = r.file.trace;
  std::printf("trace %s: %s\n", r.source.c_str(), t.origin.c_str());
  std::printf("  %zu layer(s) x %lld token(s), top-%lld of %lld experts, one expert %s\n",
              t.layers.size(), static_cast<long long>(t.tokens), static_cast<long long>(t.topk),
              static_cast<long long>(t.n_routed),
              r.file.expert_bytes > 0
                  ? bytes_text(static_cast<uint64_t>(r.file.expert_bytes)).c_str()
                  : "of unknown size");
  const TraceDemand& d = r.demand;
  std::printf(
      "replay %s: %lld forward(s), %lld key accesses, %lld distinct keys, minimum %lld slots "
      "(the largest forward)\n",
      replay_order_name(r.order), static_cast<long long>(d.forwards),
      static_cast<long long>(d.accesses), static_cast<long long>(d.distinct_keys),
      static_cast<long long>(d.min_slots));
  if (d.accesses == d.distinct_keys)
    std::printf(
        "  every key is asked for once: no cache size hits without prefetch (in batch order a "
        "trace that visits each layer once has no reuse; --order decode replays a pass per "
        "token)\n");
  if (r.has_accuracy) {
    const PrefetchAccuracy& a = r.accuracy;
    std::printf(
        "prefetch at K=%s: recall %s (%lld of %lld picked keys), precision %s (%lld of %lld "
        "predicted keys issued), over %lld predicted forward(s)\n",
        k_text(r.prefetch_k).c_str(), pct(a.recall()).c_str(),
        static_cast<long long>(a.picked_predicted), static_cast<long long>(a.picked),
        pct(a.precision()).c_str(), static_cast<long long>(a.issued_picked),
        static_cast<long long>(a.issued), static_cast<long long>(a.forwards));
  } else {
    std::printf("prefetch: %s\n",
                d.has_predictions ? "off (--prefetch-k 0)" : "the trace has no predictions");
  }
  const bool bytes = r.file.expert_bytes > 0, pf = r.has_accuracy;
  std::vector<std::string> head = {"size", "slots"};
  if (bytes) head.push_back("bytes");
  head.push_back("LRU");
  if (pf) head.push_back("LRU+pf");
  head.push_back("Belady");
  std::printf("\n%s\n", table_row(head).c_str());
  for (size_t i = 0; i < r.sizes.size(); ++i) {
    const CacheSimResult& x = r.results[i];
    std::vector<std::string> cells = {r.sizes[i].label, std::to_string(x.slots)};
    if (bytes)
      cells.push_back(
          bytes_text(static_cast<uint64_t>(x.slots) * static_cast<uint64_t>(r.file.expert_bytes)));
    if (x.below_minimum) {
      std::printf("%s  below the minimum of %lld slots (the largest forward): not simulated\n",
                  table_row(cells).c_str(), static_cast<long long>(x.min_slots));
      continue;
    }
    cells.push_back(pct(x.lru.hit_rate()));
    if (pf) cells.push_back(pct(x.lru_prefetch.hit_rate()));
    cells.push_back(pct(x.belady.hit_rate()));
    std::printf("%s\n", table_row(cells).c_str());
  }
}

void counts_json(Json& j, const char* key, const SimCounts& c, bool prefetch) {
  j.key(key).begin_object().kv("hits", c.hits).kv("misses", c.misses).kv("reads", c.reads);
  j.kv("evictions", c.counters.evictions).kv("hit_rate", c.hit_rate());
  if (prefetch)
    j.kv("prefetch_issued", c.counters.prefetch_issued)
        .kv("prefetch_used", c.counters.prefetch_used)
        .kv("prefetch_wasted", c.counters.prefetch_wasted)
        .kv("prefetch_dropped", c.counters.prefetch_dropped);
  j.end_object();
}

void print_json(const CacheReport& r) {
  const RoutingTrace& t = r.file.trace;
  Json j;
  j.begin_object().kv("trace", r.source).kv("origin", t.origin);
  j.kv("layers", static_cast<int64_t>(t.layers.size())).kv("tokens", t.tokens);
  j.kv("topk", t.topk).kv("n_routed", t.n_routed).key("expert_bytes");
  if (r.file.expert_bytes > 0) j.value(r.file.expert_bytes);
  else j.null();
  const TraceDemand& d = r.demand;
  j.kv("order", replay_order_name(r.order)).kv("forwards", d.forwards).kv("accesses", d.accesses);
  j.kv("distinct_keys", d.distinct_keys).kv("min_slots", d.min_slots);
  j.key("prefetch_k");
  if (r.prefetch_k == kPrefetchAll) j.value("all");
  else j.value(r.prefetch_k);
  j.key("prefetch");
  if (r.has_accuracy) {
    const PrefetchAccuracy& a = r.accuracy;
    j.begin_object().kv("forwards", a.forwards).kv("picked", a.picked);
    j.kv("picked_predicted", a.picked_predicted).kv("issued", a.issued);
    j.kv("issued_picked", a.issued_picked).kv("recall", a.recall());
    j.kv("precision", a.precision()).end_object();
  } else {
    j.null();
  }
  j.key("sizes").begin_array();
  for (size_t i = 0; i < r.sizes.size(); ++i) {
    const CacheSimResult& x = r.results[i];
    j.begin_object().kv("size", r.sizes[i].label).kv("slots", x.slots).key("bytes");
    if (r.file.expert_bytes > 0) j.value(x.slots * r.file.expert_bytes);
    else j.null();
    j.kv("below_minimum", x.below_minimum);
    if (x.below_minimum) {
      j.key("lru").null().key("lru_prefetch").null().key("belady").null().end_object();
      continue;
    }
    counts_json(j, "lru", x.lru, false);
    if (r.has_accuracy) counts_json(j, "lru_prefetch", x.lru_prefetch, true);
    else j.key("lru_prefetch").null();
    counts_json(j, "belady", x.belady, false);
    j.end_object();
  }
  j.end_array().end_object();
  std::printf("%s\n", j.str().c_str());
}

// The trace: read from --trace, or made from --synthetic (and saved with --save-trace).
TraceFile load_trace(const CacheArgs& a, const CacheGiven& g, std::string* source) {
  if (a.trace.empty() == (g.synthetic->count() == 0))
    throw InputError("give exactly one of --trace FILE and --synthetic SPEC");
  if (!a.save_trace.empty() && !a.trace.empty())
    throw InputError("--save-trace " + a.save_trace +
                     ": only a --synthetic trace is saved (--trace " + a.trace +
                     " is a file already)");
  if (!a.trace.empty()) {
    *source = a.trace;
    return read_trace_file(a.trace);
  }
  *source = "synthetic";
  const SyntheticTraceSpec spec = parse_synthetic_spec(a.synthetic, "--synthetic");
  if (!a.save_trace.empty()) require_output_file("--save-trace", a.save_trace, {});
  TraceFile f = synthetic_trace(spec);
  if (!a.save_trace.empty()) write_trace_file(a.save_trace, f);
  return f;
}

int run_cache(const CacheArgs& a, const CacheGiven& g) {
  CacheReport r;
  r.order = parse_replay_order(a.order, "--order");
  r.prefetch_k = parse_prefetch_k(a.prefetch_k);
  const std::vector<SizeSpec> specs =
      g.sizes->count() > 0 ? parse_size_list(a.sizes) : std::vector<SizeSpec>{};
  r.file = load_trace(a, g, &r.source);
  const std::vector<TraceForward> forwards = trace_forwards(r.file.trace, r.order);
  r.demand = trace_demand(forwards);
  if (g.prefetch_k->count() > 0 && r.prefetch_k > 0 && !r.demand.has_predictions)
    throw InputError("--prefetch-k " + a.prefetch_k + ": " + r.source +
                     " has no predictions for any forward in " + replay_order_name(r.order) +
                     " order, so prefetch would change nothing");
  r.has_accuracy = r.prefetch_k > 0 && r.demand.has_predictions;
  if (r.has_accuracy) r.accuracy = prefetch_accuracy(forwards, r.prefetch_k);
  r.sizes = specs.empty()
                ? default_sizes(r.demand.min_slots, r.demand.distinct_keys)
                : resolve_sizes(specs, r.file.expert_bytes, r.demand.distinct_keys, r.source);
  for (const CacheSize& s : r.sizes) {
    if (s.slots >= 1) {
      r.results.push_back(simulate_cache(forwards, s.slots, r.prefetch_k));
      continue;
    }
    CacheSimResult none;  // 0 slots (a byte size below one expert, a small percentage)
    none.below_minimum = true;
    none.min_slots = r.demand.min_slots;
    r.results.push_back(none);
  }
  if (a.json) print_json(r);
  else print_text(r);
  return kExitSame;
}

}  // namespace

void add_cache(CLI::App& app, int& rc) {
  auto a = std::make_shared<CacheArgs>();
  CLI::App* s = app.add_subcommand(
      "cache", "Replay a routing trace through the expert cache: LRU, LRU + prefetch, Belady");
  s->footer(
      "Examples:\n"
      "  moecheck run --impl emu --model m.gguf --chain --residual --trace t.json -o d.h5\n"
      "  moecheck cache --trace t.json --sizes 64,128,1.5GB,25% --order decode\n"
      "  moecheck cache --synthetic \"layers=40,tokens=64,experts=384,topk=6,zipf=1.0,"
      "predict=0.7,seed=1\"\n"
      "Exit codes: 0 done, 2 error (a bad trace file names the field).");
  s->add_option("--trace", a->trace, "routing trace file (JSON, from run --trace)");
  CacheGiven g;
  g.synthetic = s->add_option(
      "--synthetic", a->synthetic,
      "a synthetic skewed trace: key=value list of layers, tokens, experts, topk, zipf, predict, "
      "seed, expert_bytes (docs/streaming.md)");
  g.sizes = s->add_option("--sizes", a->sizes,
                          "cache sizes: slots, bytes (1.5GB, 512MiB) or % of the distinct keys "
                          "(default: the minimum, doubling, up to every distinct key)");
  s->add_option("--order", a->order,
                "replay order: batch (a forward per layer) | decode (a "
                "forward per token and layer)")
      ->check(CLI::IsMember({"batch", "decode"}))
      ->capture_default_str();
  g.prefetch_k = s->add_option("--prefetch-k", a->prefetch_k,
                               "experts prefetched per forward: a count, or all (0: no prefetch)")
                     ->capture_default_str();
  s->add_option("--save-trace", a->save_trace, "write the --synthetic trace to this file");
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, g, &rc] { rc = run_cache(*a, g); });
}

}  // namespace moecheck::cli
