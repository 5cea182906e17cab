// A synthetic model with no file: `ModelFile::open("synthetic:tiny,layers=2")` behaves like the
// file `moecheck gen` writes for the same options (the same metadata, tensor infos, header bytes
// and tensor bytes) while nothing is on disk. The GGUF image lives in an anonymous private
// mapping of the whole file's size (MAP_NORESERVE: a 197 GB ds41 model costs only the pages
// touched); the header is written at open, each layer's tensors when the layer is first used
// (ModelFile::layer, resident_layer), by several threads from the generator's own fill callbacks
// (golden/generator.h model_writer), and its pages are given back (MADV_DONTNEED) when the last
// LayerWeights holding them is destroyed. Contract: docs/streaming.md "Synthetic models".
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "golden/generator.h"
#include "golden/gguf.h"
#include "golden/model_file.h"

namespace moecheck {

// The most layers a spec may ask for (ds41 at 1024 layers is a 5 TB image: still only address
// space, but the tensor infos of more would be a large header for no use).
inline constexpr int kMaxSyntheticLayers = 1024;

// The options of a spec: "synthetic:PRESET" then ",key=value" items in any order, each at most
// once: layers=N (1..1024), seed=S (uint64), shared=bf16|kquant, blocks=quantized|random,
// alignment=A (a power of two in [8, 65536]), convention=deepseek2|deepseek4|deepseek41,
// router=bf16|f16, and the flag vision. Omitted keys take the preset's values (and `gen`'s
// defaults: router f16 for deepseek4 / deepseek41). InputError naming the spec and the key (an
// unknown key, a bad value, a repeated key, an unknown preset).
GenOptions parse_synthetic_spec(const std::string& spec);
// The canonical spec of options the grammar can express ("synthetic:tiny,layers=2,seed=1", then
// only the keys that differ from the preset's defaults); InputError for options it cannot
// (per-layer clamps, hash-routed layers, a changed config).
std::string synthetic_spec(const GenOptions& o);

// Opens a synthetic model: ModelFile::open(spec, mode) is open_synthetic(spec, mode, 0). Fills use
// `fill_threads` threads (0: the hardware's concurrency); the bytes never depend on it.
ModelFile open_synthetic(const std::string& spec, gguf::MapMode mode = gguf::MapMode::kReadOnly,
                         int fill_threads = 0);

// What a synthetic model's image has done so far (tests and measurements).
struct SyntheticStats {
  int64_t resident_fills = 0;  // layers whose router, bias, bias_vl and shared expert were filled
  int64_t stack_fills = 0;     // layers whose routed stacks were filled
  int64_t chunks = 0;          // fill-callback calls (one expert of one stack each, for stacks)
  int64_t releases = 0;        // parts given back (MADV_DONTNEED)
  int layers_resident = 0;     // layers whose non-stack tensors are filled now
  int layers_full = 0;         // layers whose stacks are filled now
};

namespace detail {

// The image of a synthetic model and the fill state of each layer. Two parts per layer: 0 the
// router, bias (or hash table), bias_vl and shared expert; 1 the three routed stacks. A part is
// filled while any handle from hold() that covers it lives; a stacks handle holds the layer's
// part-0 handle too.
class SyntheticImage : public std::enable_shared_from_this<SyntheticImage> {
 public:
  SyntheticImage(const GenOptions& o, const std::string& spec, int fill_threads);
  SyntheticImage(const SyntheticImage&) = delete;
  SyntheticImage& operator=(const SyntheticImage&) = delete;

  // A reader over the image (the header is parsed, no tensor byte is touched).
  gguf::Reader reader(gguf::MapMode mode) const;
  const GenOptions& options() const { return options_; }
  // Keeps layer L's part 0 (and with `stacks` part 1) filled while the handle lives; fills what
  // is not filled yet.
  std::shared_ptr<const void> hold(int layer, bool stacks) const;
  // The same handle when that is filled now (someone holds it), else nullptr: nothing is made.
  std::shared_ptr<const void> held_now(int layer, bool stacks) const;
  // The SHA-256 of the whole image (the file `gen` writes), filling one layer at a time.
  std::string sha256() const;
  SyntheticStats stats() const;

 private:
  struct Mapping;
  struct Held;
  struct Piece {
    size_t tensor = 0;              // index in the writer's (and the reader's) tensor list
    uint64_t begin = 0, bytes = 0;  // absolute offset in the image, tensor bytes
  };
  struct Slot {
    std::mutex mu;
    std::vector<Piece> parts[2];
    std::weak_ptr<const void> live[2];
    uint64_t generation[2] = {0, 0};
    bool filled[2] = {false, false};
  };

  void map_pieces();
  void fill(const std::vector<const Piece*>& pieces) const;
  void release(int layer, int part, uint64_t generation) const;

  GenOptions options_;
  std::string spec_;
  int threads_ = 1;
  gguf::Writer writer_;
  std::shared_ptr<Mapping> map_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0, data_offset_ = 0;
  std::vector<gguf::TensorInfo> infos_;
  std::unique_ptr<Slot[]> slots_;
  std::vector<uint64_t> layer_begin_;  // absolute start of each layer's bytes
  mutable std::atomic<int64_t> resident_fills_{0}, stack_fills_{0}, chunks_{0}, releases_{0};
};

}  // namespace detail
}  // namespace moecheck
