// Output files written whole or not at all: the bytes go to `<path>.tmp-<pid>` through POSIX
// write(2), then fsync, close and rename onto `path`; any failure (a full disk, a read-only or
// missing directory, a failed fsync) removes the temporary file and throws an InputError naming
// the path, the step and errno's text. Used by every file moecheck writes (GGUF models, HDF5
// dumps), so that no library touches the disk on our behalf (libhdf5 crashed in its exit-time
// cleanup after a failed flush on a full disk; docs/reliability.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moecheck {

class AtomicFile {
 public:
  // Creates the temporary file next to `path` (InputError when it cannot).
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: closes and removes the temporary file
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  // fsync, close, rename onto the path. After it the file is in place.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& step, int err);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `data` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const void* data, size_t n);

}  // namespace moecheck
