// The image of a synthetic model (golden/synthetic_model.h): an anonymous private mapping of the
// file's size holding the header from open and each layer's tensors while a handle holds them.
// Every byte comes from the fill callbacks of model_writer, the ones write_model writes from, so
// the image is the file byte for byte. Contract: docs/streaming.md "Synthetic models".
#include "golden/synthetic_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <map>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "golden/sha256.h"

namespace moecheck {
namespace detail {

struct SyntheticImage::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

// A handle of one part of one layer: its end gives the part's pages back unless the part was
// filled again since (a newer generation). `under` is the layer's part-0 handle (stacks only),
// dropped after this one.
struct SyntheticImage::Held {
  Held(std::shared_ptr<const SyntheticImage> i, int l, int p, uint64_t g,
       std::shared_ptr<const void> u)
      : image(std::move(i)), layer(l), part(p), generation(g), under(std::move(u)) {}
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() { image->release(layer, part, generation); }

  std::shared_ptr<const SyntheticImage> image;
  int layer = 0, part = 0;
  uint64_t generation = 0;
  std::shared_ptr<const void> under;
};

SyntheticImage::SyntheticImage(const GenOptions& o, const std::string& spec, int fill_threads)
    : options_(o), spec_(spec), writer_(model_writer(o)) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  threads_ = fill_threads > 0 ? fill_threads : static_cast<int>(hw);
  const std::vector<uint8_t> header = writer_.header_bytes();
  size_ = writer_.file_size();
  data_offset_ = header.size();
  map_ = std::make_shared<Mapping>();
  // Untouched pages of a private anonymous mapping cost nothing; MAP_NORESERVE keeps the kernel
  // from counting the whole size against the commit limit.
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw InputError(spec + ": cannot map the synthetic model's " + std::to_string(size_) +
                     " bytes of address space: " + std::strerror(errno));
  map_->addr = p;
  map_->size = static_cast<size_t>(size_);
  base_ = static_cast<uint8_t*>(p);
  std::memcpy(base_, header.data(), header.size());
  infos_ = reader(gguf::MapMode::kReadOnly).tensors();
  map_pieces();
}

gguf::Reader SyntheticImage::reader(gguf::MapMode mode) const {
  return gguf::Reader::from_memory(map_, base_, size_, spec_, mode);
}

// Each tensor of the writer belongs to one part of one layer: its layer's tensors by name, the
// routed stacks to part 1, everything else (router, bias or hash table, bias_vl, shared expert)
// to part 0.
void SyntheticImage::map_pieces() {
  const int n = options_.n_layers;
  slots_ = std::make_unique<Slot[]>(static_cast<size_t>(n));
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < infos_.size(); ++i) index.emplace(infos_[i].name, i);
  std::vector<LayerTensor> all(kLayerTensors.begin(), kLayerTensors.end());
  all.insert(all.end(), kOptionalLayerTensors.begin(), kOptionalLayerTensors.end());
  size_t placed = 0;
  for (int L = 0; L < n; ++L) {
    std::vector<std::pair<std::string, int>> names;
    for (LayerTensor t : all) {
      const bool stack =
          t == LayerTensor::kGateExps || t == LayerTensor::kUpExps || t == LayerTensor::kDownExps;
      names.emplace_back(tensor_name(L, t), stack ? 1 : 0);
    }
    names.emplace_back(hash_table_name(L), 0);
    uint64_t begin = size_;
    for (const auto& [name, part] : names) {
      const auto it = index.find(name);
      if (it == index.end()) continue;
      const gguf::TensorInfo& t = infos_[it->second];
      slots_[L].parts[part].push_back(Piece{it->second, data_offset_ + t.offset, t.nbytes});
      begin = std::min(begin, data_offset_ + t.offset);
      ++placed;
    }
    if (L > 0 && begin < layer_begin_.back())
      throw std::logic_error(spec_ + ": layer " + std::to_string(L) + " out of file order");
    layer_begin_.push_back(begin);
  }
  if (placed != infos_.size())
    throw std::logic_error(spec_ + ": " + std::to_string(infos_.size() - placed) +
                           " tensor(s) belong to no layer");
}

// Fills the pieces: every chunk of every piece is one task, run by up to threads_ threads
// (dynamic: the next free task). The callbacks are pure functions of their offset, so the bytes
// do not depend on the thread count; the first failing task in task order is rethrown.
void SyntheticImage::fill(const std::vector<const Piece*>& pieces) const {
  struct Task {
    const Piece* piece;
    uint64_t at, n;
  };
  std::vector<Task> tasks;
  for (const Piece* p : pieces) {
    const gguf::TensorSpec& t = writer_.tensors()[p->tensor];
    const uint64_t chunk = t.chunk_bytes ? t.chunk_bytes : p->bytes;
    for (uint64_t at = 0; at < p->bytes; at += chunk)
      tasks.push_back(Task{p, at, std::min(chunk, p->bytes - at)});
  }
  std::vector<std::exception_ptr> errors(tasks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < tasks.size();) {
      const Task& k = tasks[i];
      try {
        writer_.tensors()[k.piece->tensor].fill(k.at, base_ + k.piece->begin + k.at, k.n);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t nt = std::min(tasks.size(), static_cast<size_t>(threads_));
  std::vector<std::thread> pool;
  for (size_t k = 1; k < nt; ++k) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  chunks_ += static_cast<int64_t>(tasks.size());
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

std::shared_ptr<const void> SyntheticImage::hold(int layer, bool stacks) const {
  if (layer < 0 || layer >= options_.n_layers)
    throw std::out_of_range(spec_ + ": no layer " + std::to_string(layer));
  // Declared before the lock: a handle that ends here runs release(), which takes the lock.
  std::shared_ptr<const void> part0, part1;
  Slot& s = slots_[layer];
  std::lock_guard<std::mutex> lock(s.mu);
  part0 = s.live[0].lock();
  if (stacks) part1 = s.live[1].lock();
  std::vector<const Piece*> todo;
  if (!part0)
    for (const Piece& p : s.parts[0]) todo.push_back(&p);
  if (stacks && !part1)
    for (const Piece& p : s.parts[1]) todo.push_back(&p);
  fill(todo);
  auto self = shared_from_this();
  if (!part0) {
    part0 = std::make_shared<Held>(self, layer, 0, ++s.generation[0], nullptr);
    s.live[0] = part0;
    s.filled[0] = true;
    ++resident_fills_;
  }
  if (stacks && !part1) {
    part1 = std::make_shared<Held>(self, layer, 1, ++s.generation[1], part0);
    s.live[1] = part1;
    s.filled[1] = true;
    ++stack_fills_;
  }
  return stacks ? part1 : part0;
}

std::shared_ptr<const void> SyntheticImage::held_now(int layer, bool stacks) const {
  if (layer < 0 || layer >= options_.n_layers) return nullptr;
  std::shared_ptr<const void> h;  // before the lock, as in hold()
  Slot& s = slots_[layer];
  std::lock_guard<std::mutex> lock(s.mu);
  h = s.live[stacks ? 1 : 0].lock();
  return h;
}

// The pages that lie wholly inside each piece are given back (the next read sees zeros until a
// fill); a page a piece shares with its neighbour keeps its bytes, which a refill rewrites the
// same.
void SyntheticImage::release(int layer, int part, uint64_t generation) const {
  Slot& s = slots_[layer];
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.generation[part] != generation || !s.filled[part]) return;  // filled again since
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const Piece& p : s.parts[part]) {
    const uint64_t lo = (p.begin + page - 1) / page * page, hi = (p.begin + p.bytes) / page * page;
    if (hi > lo) ::madvise(base_ + lo, static_cast<size_t>(hi - lo), MADV_DONTNEED);
  }
  s.filled[part] = false;
  ++releases_;
}

std::string SyntheticImage::sha256() const {
  Sha256 h;
  h.update(base_, static_cast<size_t>(layer_begin_.empty() ? size_ : layer_begin_[0]));
  for (int L = 0; L < options_.n_layers; ++L) {
    const std::shared_ptr<const void> held = hold(L, true);
    const uint64_t end = L + 1 < options_.n_layers ? layer_begin_[L + 1] : size_;
    h.update(base_ + layer_begin_[L], static_cast<size_t>(end - layer_begin_[L]));
  }
  return to_hex(h.finish());
}

SyntheticStats SyntheticImage::stats() const {
  SyntheticStats st;
  st.resident_fills = resident_fills_;
  st.stack_fills = stack_fills_;
  st.chunks = chunks_;
  st.releases = releases_;
  for (int L = 0; L < options_.n_layers; ++L) {
    std::lock_guard<std::mutex> lock(slots_[L].mu);
    st.layers_resident += slots_[L].filled[0] ? 1 : 0;
    st.layers_full += slots_[L].filled[1] ? 1 : 0;
  }
  return st;
}

}  // namespace detail

ModelFile open_synthetic(const std::string& spec, gguf::MapMode mode, int fill_threads) {
  const GenOptions o = parse_synthetic_spec(spec);
  auto image = std::make_shared<detail::SyntheticImage>(o, spec, fill_threads);
  ModelFile m = ModelFile::from_gguf(image->reader(mode));
  m.synthetic_ = std::move(image);
  return m;
}

}  // namespace moecheck
