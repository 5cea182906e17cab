// probe_in_child (golden/probe.h): fork, run, report through a pipe.
#include "golden/probe.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"

namespace moecheck {
namespace {

constexpr int kChildInputError = 3;
constexpr int kChildOtherError = 4;

void send_and_exit(int fd, const char* msg, int code) {
  size_t n = std::strlen(msg);
  while (n > 0) {
    const ssize_t w = ::write(fd, msg, n);
    if (w <= 0) break;
    msg += w;
    n -= static_cast<size_t>(w);
  }
  ::_exit(code);
}

}  // namespace

unsigned probe_seconds() {
  const char* v = std::getenv("MOECHECK_PROBE_SECONDS");
  if (v == nullptr || *v == '\0') return kDefaultProbeSeconds;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (*end != '\0' || n == 0 || n > 86400)
    throw InputError(std::string("MOECHECK_PROBE_SECONDS=") + v +
                     ": expected a whole number of seconds in [1, 86400]");
  return static_cast<unsigned>(n);
}

void probe_in_child(const std::string& file, const std::function<void()>& read) {
  const unsigned limit = probe_seconds();
  int fds[2];
  if (::pipe(fds) != 0)
    throw InputError(file + ": cannot start the probe process (pipe: " + std::strerror(errno) +
                     ")");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw InputError(file + ": cannot start the probe process (fork: " + std::strerror(errno) +
                     ")");
  }
  if (pid == 0) {  // the child: read, report, never return (no atexit handlers: _exit)
    ::close(fds[0]);
    // Die by the signal itself (a sanitizer's or fuzzer's inherited handler would turn it into an
    // exit code), so the parent can name it.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, SIG_DFL);
    // A corrupt file can also make the library loop forever (libhdf5 1.10 on some damaged
    // global heaps): the child dies by SIGALRM after `limit` seconds.
    ::alarm(limit);
    try {
      read();
    } catch (const InputError& e) {
      send_and_exit(fds[1], e.what(), kChildInputError);
    } catch (const std::exception& e) {
      send_and_exit(fds[1], e.what(), kChildOtherError);
    } catch (...) {
      send_and_exit(fds[1], "unknown error", kChildOtherError);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
    throw InputError(file + ": the HDF5 library did not finish reading it within " +
                     std::to_string(limit) +
                     " s in a probe process (a corrupt file can make it loop); nothing was read "
                     "from it (MOECHECK_PROBE_SECONDS sets the limit)");
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    throw InputError(file + ": the HDF5 library crashed reading it (signal " + std::to_string(sig) +
                     ": " + strsignal(sig) +
                     ") in a probe process: the file is corrupt; nothing was read from it");
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) return;
  if (code == kChildInputError) throw InputError(msg);
  throw InputError(file + ": reading it failed in the probe process: " +
                   (msg.empty() ? "exit " + std::to_string(code) : msg));
}

}  // namespace moecheck
