// FileExpertSource and SyntheticExpertSource (golden/expert_sources.h). Messages: "<source>:
// tensor blk.L.ffn_gate_exps.weight layer L expert e: <what>", the form of HostExpertSource's
// (core/expert_source.cpp). Contract: docs/streaming.md "Sources".
#include "golden/expert_sources.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moecheck {
namespace {

size_t proj_index(Proj p) { return static_cast<size_t>(p); }

// The stack's type and shape for config c: gate / up Q2_K [inter, dim], down Q3_K [dim, inter].
ExpertStackView expected_stack(const MoeConfig& c, Proj p) {
  if (p == Proj::kDown) return ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, nullptr};
  return ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, nullptr};
}

std::string ne_text(const gguf::TensorInfo& t) { return gguf::shape_string(t); }

// The largest piece one pread asks for (Linux moves at most 0x7ffff000 bytes per call).
constexpr uint64_t kMaxPread = 1u << 30;

}  // namespace

FileExpertSource::FileExpertSource(const std::string& path)
    : FileExpertSource(ModelFile::open(path)) {}

FileExpertSource::FileExpertSource(const ModelFile& m) : path_(m.path()) {
  if (m.synthetic())
    throw InputError(path_ +
                     ": a synthetic model has no file to read (its expert_source() is a "
                     "SyntheticExpertSource)");
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(name() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError(name() + ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  try {
    for (int L = 0; L < m.n_layers(); ++L) layers_.push_back(inspect_layer(m, L));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

FileExpertSource::~FileExpertSource() {
  if (fd_ >= 0) ::close(fd_);
}

// Layer L's stacks from the tensor infos alone (no byte is read): where each starts, or why the
// layer cannot be streamed.
FileExpertSource::Layer FileExpertSource::inspect_layer(const ModelFile& m, int L) const {
  Layer out;
  const std::string at = name() + ": layer " + std::to_string(L) + ": ";
  if (m.hash_routed(L)) {
    out.refusal = at + "tensor " + hash_table_name(L) +
                  ": the layer is hash-routed (experts picked by token id); it has no routed "
                  "experts to stream";
    return out;
  }
  const MoeConfig c = m.layer_config(L);
  ExpertStackView* dst[3] = {&out.layout.gate, &out.layout.up, &out.layout.down};
  for (Proj p : kAllProjs) {
    const std::string tname = stack_tensor_name(L, p);
    const gguf::TensorInfo* t = m.gguf().find_tensor(tname);
    const ExpertStackView want = expected_stack(c, p);
    const std::string want_text = std::string(ggml_type_name(want.type)) + " [" +
                                  std::to_string(want.cols) + ", " + std::to_string(want.rows) +
                                  ", " + std::to_string(want.n_experts) + "]";
    if (!t) {
      out.refusal = at + "tensor " + tname + " is missing";
      return out;
    }
    if (t->type != static_cast<uint32_t>(want.type)) {
      const char* found = gguf::type_traits(t->type).name;
      out.refusal = at + "tensor " + tname + ": type " + (found ? found : "unknown") +
                    ", expected " + want_text +
                    ": routed experts of other types cannot be streamed (Q2_K gate / up, Q3_K "
                    "down)";
      return out;
    }
    if (t->n_dims != 3 || t->ne[0] != want.cols || t->ne[1] != want.rows ||
        t->ne[2] != want.n_experts) {
      out.refusal = at + "tensor " + tname + ": ne " + ne_text(*t) + " (ggml order), expected " +
                    want_text + " for dim " + std::to_string(c.dim) + ", inter " +
                    std::to_string(c.inter) + ", n_routed " + std::to_string(c.n_routed);
      return out;
    }
    *dst[proj_index(p)] = want;
    out.offset[proj_index(p)] = m.gguf().data_offset() + t->offset;
  }
  return out;
}

const FileExpertSource::Layer& FileExpertSource::find(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(layers_.size()))
    throw InputError(name() + ": layer " + std::to_string(layer) +
                     ": no such layer (the file has " + std::to_string(layers_.size()) +
                     " MoE layers; tensor " + stack_tensor_name(layer, Proj::kGate) +
                     " is not read)");
  const Layer& l = layers_[static_cast<size_t>(layer)];
  if (!l.refusal.empty()) throw InputError(l.refusal);
  return l;
}

ExpertLayout FileExpertSource::layout(int layer) const { return find(layer).layout; }

std::string FileExpertSource::where(int layer, Proj p, int64_t expert) const {
  return name() + ": tensor " + stack_tensor_name(layer, p) + " layer " + std::to_string(layer) +
         " expert " + std::to_string(expert);
}

void FileExpertSource::read(int layer, int64_t expert, Proj p, uint8_t* dst) const {
  const Layer& l = find(layer);
  const int64_t n_exp = l.layout.n_experts();
  if (expert < 0 || expert >= n_exp)
    throw InputError(where(layer, p, expert) + ": outside the stack's " + std::to_string(n_exp) +
                     " experts");
  const uint64_t n = static_cast<uint64_t>(l.layout.bytes(p));
  const uint64_t at = l.offset[proj_index(p)] + static_cast<uint64_t>(expert) * n;
  if (at > size_ || n > size_ - at)
    throw InputError(where(layer, p, expert) + ": bytes [" + std::to_string(at) + ", " +
                     std::to_string(at + n) + ") end past the file's " + std::to_string(size_) +
                     " bytes (its size when opened)");
  uint64_t got = 0;
  while (got < n) {
    const size_t want = static_cast<size_t>(std::min(n - got, kMaxPread));
    const ssize_t r = ::pread(fd_, dst + got, want, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw InputError(where(layer, p, expert) + ": read of " + std::to_string(n) +
                       " bytes at offset " + std::to_string(at) + " failed after " +
                       std::to_string(got) + ": " + std::strerror(errno));
    if (r == 0)
      throw InputError(where(layer, p, expert) + ": short read: got " + std::to_string(got) +
                       " of " + std::to_string(n) + " bytes at offset " + std::to_string(at) +
                       " (the file ends there now)");
    got += static_cast<uint64_t>(r);
  }
}

SyntheticExpertSource::SyntheticExpertSource(GenOptions o) : o_(std::move(o)) { o_.validate(); }

std::string SyntheticExpertSource::name() const {
  return "synthetic " + o_.preset + " seed " + std::to_string(o_.seed);
}

ExpertLayout SyntheticExpertSource::layout(int layer) const {
  if (layer < 0 || layer >= o_.n_layers)
    throw InputError(name() + ": layer " + std::to_string(layer) +
                     ": no such layer (the model has " + std::to_string(o_.n_layers) +
                     " layers; tensor " + stack_tensor_name(layer, Proj::kGate) + " is not made)");
  if (layer < o_.hash_layers)
    throw InputError(name() + ": layer " + std::to_string(layer) + ": tensor " +
                     hash_table_name(layer) +
                     ": the layer is hash-routed (experts picked by token id); it has no routed "
                     "experts to stream");
  const MoeConfig c = o_.layout().layer_config(o_.config, layer);
  return ExpertLayout{expected_stack(c, Proj::kGate), expected_stack(c, Proj::kUp),
                      expected_stack(c, Proj::kDown)};
}

void SyntheticExpertSource::read(int layer, int64_t expert, Proj p, uint8_t* dst) const {
  const ExpertLayout l = layout(layer);
  if (expert < 0 || expert >= l.n_experts())
    throw InputError(name() + ": tensor " + stack_tensor_name(layer, p) + " layer " +
                     std::to_string(layer) + " expert " + std::to_string(expert) +
                     ": outside the stack's " + std::to_string(l.n_experts()) + " experts");
  generate_expert_blocks(o_, layer, p, expert, dst);
}

}  // namespace moecheck
