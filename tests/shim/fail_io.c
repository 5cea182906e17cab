/* A fault-injection shim for the command-line tests (tests/cli_io_test.cpp), preloaded with
 * LD_PRELOAD into the moecheck process: it makes write(2) on regular files fail with ENOSPC once
 * MOECHECK_SHIM_ENOSPC_AFTER bytes have been written to regular files (a full disk), and makes
 * open(2) for writing, and access(2) / faccessat(2) asking W_OK, fail with EROFS under the
 * directory MOECHECK_SHIM_EROFS_DIR (a read-only file system), and makes the n-th pread(2) /
 * pread64 call of the process (counted from 1 over every descriptor and thread) fail with EIO when
 * MOECHECK_SHIM_PREAD_EIO_AFTER=n (a disk that fails under golden/expert_sources.h's
 * FileExpertSource). Works as root (permissions would not stop root) and needs no mount. The names
 * moecheck calls (write, open, open64, openat, access, faccessat, pread, pread64) are wrapped;
 * everything else passes through. docs/reliability.md "How the faults are injected". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long long written;

static int regular_fd(int fd) {
  struct stat st;
  return fd > 2 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  const char* limit = getenv("MOECHECK_SHIM_ENOSPC_AFTER");
  if (limit && regular_fd(fd)) {
    const long long max = atoll(limit);
    if (written + (long long)n > max) {
      errno = ENOSPC;
      return -1;
    }
    written += (long long)n;
  }
  return real(fd, buf, n);
}

static int refused(const char* path, int flags) {
  const char* dir = getenv("MOECHECK_SHIM_EROFS_DIR");
  if (!dir || !path || (flags & (O_WRONLY | O_RDWR | O_CREAT)) == 0) return 0;
  const size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

#define WRAP_OPEN(name)                                                      \
  int name(const char* path, int flags, ...) {                              \
    static int (*real)(const char*, int, ...);                              \
    if (!real) real = (int (*)(const char*, int, ...))dlsym(RTLD_NEXT, #name); \
    mode_t mode = 0;                                                         \
    if (flags & O_CREAT) {                                                   \
      va_list ap;                                                            \
      va_start(ap, flags);                                                   \
      mode = (mode_t)va_arg(ap, int);                                        \
      va_end(ap);                                                            \
    }                                                                        \
    if (refused(path, flags)) {                                              \
      errno = EROFS;                                                         \
      return -1;                                                             \
    }                                                                        \
    return real(path, flags, mode);                                          \
  }
WRAP_OPEN(open)
WRAP_OPEN(open64)

int openat(int dirfd, const char* path, int flags, ...) {
  static int (*real)(int, const char*, int, ...);
  if (!real) real = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, "openat");
  mode_t mode = 0;
  if (flags & O_CREAT) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  if (refused(path, flags)) {
    errno = EROFS;
    return -1;
  }
  return real(dirfd, path, flags, mode);
}

int access(const char* path, int mode) {
  static int (*real)(const char*, int);
  if (!real) real = (int (*)(const char*, int))dlsym(RTLD_NEXT, "access");
  if ((mode & W_OK) && refused(path, O_WRONLY)) {
    errno = EROFS;
    return -1;
  }
  return real(path, mode);
}

int faccessat(int dirfd, const char* path, int mode, int flags) {
  static int (*real)(int, const char*, int, int);
  if (!real) real = (int (*)(int, const char*, int, int))dlsym(RTLD_NEXT, "faccessat");
  if ((mode & W_OK) && refused(path, O_WRONLY)) {
    errno = EROFS;
    return -1;
  }
  return real(dirfd, path, mode, flags);
}

static long long preads;

/* Whether this pread is the one MOECHECK_SHIM_PREAD_EIO_AFTER names (counted atomically: the file
 * source reads from several threads). */
static int pread_fails(void) {
  const char* nth = getenv("MOECHECK_SHIM_PREAD_EIO_AFTER");
  if (!nth) return 0;
  return __atomic_add_fetch(&preads, 1, __ATOMIC_SEQ_CST) == atoll(nth);
}

ssize_t pread(int fd, void* buf, size_t n, off_t offset) {
  static ssize_t (*real)(int, void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread");
  if (pread_fails()) {
    errno = EIO;
    return -1;
  }
  return real(fd, buf, n, offset);
}

ssize_t pread64(int fd, void* buf, size_t n, off64_t offset) {
  static ssize_t (*real)(int, void*, size_t, off64_t);
  if (!real) real = (ssize_t(*)(int, void*, size_t, off64_t))dlsym(RTLD_NEXT, "pread64");
  if (pread_fails()) {
    errno = EIO;
    return -1;
  }
  return real(fd, buf, n, offset);
}
