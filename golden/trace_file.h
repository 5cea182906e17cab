// Routing traces as files: one JSON document (format "moecheck-routing-trace", version 1) holding
// a RoutingTrace (core/routing_trace.h) and the bytes of one routed expert when known. Written
// whole or not at all (golden/atomic_file.h); read back with every field checked: JSON syntax,
// duplicate and unknown keys, each field's type and shape, then RoutingTrace::validate. Every
// error is an InputError naming the file and the JSON path of the bad field
// ("t.json: layers[1].picks[3][0]: expected an integer, found \"x\"").
// Contract: docs/streaming.md "Traces".
#pragma once

#include <cstdint>
#include <string>

#include "core/routing_trace.h"

namespace moecheck {

inline constexpr const char* kTraceFormat = "moecheck-routing-trace";
inline constexpr int64_t kTraceVersion = 1;

struct TraceFile {
  RoutingTrace trace;
  // Bytes of one routed expert (gate + up + down of one expert of the stacks), for sizes in
  // bytes; 0 when unknown (the key is then left out of the file).
  int64_t expert_bytes = 0;
};

// The document's text: keys in the order format, version, origin, n_routed, topk, tokens,
// expert_bytes (when known), layers; one line per layer ({"layer", "picks", "predicted"}, picks
// and predicted as [tokens][topk] arrays, predicted [] where the layer has none).
std::string trace_json(const TraceFile& t);

// Validates (InputError naming `path`), then writes atomically.
void write_trace_file(const std::string& path, const TraceFile& t);

// Reads and validates `path`; InputError naming the file and the field.
TraceFile read_trace_file(const std::string& path);
// The same from a document's text; `where` names it in errors.
TraceFile parse_trace_json(const std::string& text, const std::string& where);

}  // namespace moecheck
