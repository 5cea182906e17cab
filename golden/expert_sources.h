// The expert sources over model files and synthetic models (core/expert_source.h): a GGUF file
// read with pread on a descriptor of its own (never through a mapping, so a cache can read its
// misses straight into pinned staging), and the generator making any expert's blocks on demand.
// Contract: docs/streaming.md "Sources".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/expert_source.h"
#include "golden/generator.h"
#include "golden/model_file.h"

namespace moecheck {

// Layer L's stacks of a GGUF model file (moecheck's, deepseek4 or deepseek41 layouts), read by
// pread. The layouts of all layers are worked out at open; a layer that cannot be streamed
// (hash-routed, a stack missing, of a type other than Q2_K gate / up and Q3_K down, or of a shape
// other than the layer's config gives) is refused by layout(L) and read(L, ...) with an
// InputError naming the file, the layer and the tensor. Every read checks the expert's index and
// its byte range against the file's size at open, loops over partial reads (EINTR retried), and
// names a short read (the file shrank) and an I/O error (strerror) with the file, tensor, layer,
// expert and offset. Thread-safe: pread has no shared file offset. name(): "file <path>".
class FileExpertSource : public ExpertSource {
 public:
  // Opens `path` with ModelFile::open (the config and tensor infos), then a descriptor of its own.
  explicit FileExpertSource(const std::string& path);
  // The same over a model already open: its path() is opened for the reads (and its size then is
  // the size every range is checked against).
  explicit FileExpertSource(const ModelFile& m);
  ~FileExpertSource() override;
  FileExpertSource(const FileExpertSource&) = delete;
  FileExpertSource& operator=(const FileExpertSource&) = delete;

  std::string name() const override { return "file " + path_; }
  ExpertLayout layout(int layer) const override;
  void read(int layer, int64_t expert, Proj p, uint8_t* dst) const override;
  // The file's size when it was opened.
  uint64_t file_size() const { return size_; }

 private:
  struct Layer {
    ExpertLayout layout;
    std::array<uint64_t, 3> offset{};  // absolute file offset of each stack (gate, up, down)
    std::string refusal;               // non-empty: why the layer cannot be streamed
  };
  Layer inspect_layer(const ModelFile& m, int L) const;
  const Layer& find(int layer) const;
  std::string where(int layer, Proj p, int64_t expert) const;

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<Layer> layers_;
};

// Any expert's blocks made by generate_expert_blocks: the bytes `moecheck gen` writes for the same
// options (and a synthetic model's image holds). Layers outside [0, n_layers) and hash-routed ones
// are refused (InputError naming the source, layer and tensor); an expert outside
// [0, n_routed) too. name(): "synthetic <preset> seed <S>". Thread-safe (a pure function).
class SyntheticExpertSource : public ExpertSource {
 public:
  // InputError when the options cannot make a model (GenOptions::validate).
  explicit SyntheticExpertSource(GenOptions o);

  std::string name() const override;
  ExpertLayout layout(int layer) const override;
  void read(int layer, int64_t expert, Proj p, uint8_t* dst) const override;
  const GenOptions& options() const { return o_; }

 private:
  GenOptions o_;
};

}  // namespace moecheck
