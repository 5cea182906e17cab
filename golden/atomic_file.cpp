// AtomicFile (golden/atomic_file.h): temp + write(2) + fsync + rename, cleaned up on failure.
#include "golden/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace moecheck {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw InputError(path_ + ": cannot create the temporary file " + tmp_ + ": " +
                     std::strerror(err));
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& step, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw InputError(path_ + ": " + step + " " + tmp_ + " failed: " + std::strerror(err) +
                   " (nothing was written to " + path_ + ")");
}

void AtomicFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("writing", errno);
    if (w == 0) fail("writing", EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("flushing", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("closing", errno);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming", errno);
  committed_ = true;
}

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  AtomicFile f(path);
  f.write(data, n);
  f.commit();
}

}  // namespace moecheck
