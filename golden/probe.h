// Reading a file that may crash a library we do not control (libhdf5 1.10 on some corrupt
// dumps): the read runs first in a forked child process; a crash there, or a read that loops past
// the time limit, becomes an InputError naming the file and the signal or the limit, an InputError
// there comes back with its message, and only a read that succeeded in the child is repeated in
// this process. Used for dumps without moecheck's integrity stamp (golden/dump_hdf5.h);
// docs/reliability.md.
#pragma once

#include <functional>
#include <string>

namespace moecheck {

// Seconds a probe may take before its child is ended (SIGALRM): MOECHECK_PROBE_SECONDS when set
// (1 .. 86400; anything else is an InputError), else kDefaultProbeSeconds: room for reading a
// dump of several GB with taps.
inline constexpr unsigned kDefaultProbeSeconds = 120;
unsigned probe_seconds();

// Runs `read` in a child process. Returns when it completed; throws InputError (its message,
// "<file>: <library> crashed reading it (signal N: name) ...", or "... did not finish reading it
// within N s ..." when the child ran past probe_seconds()) otherwise.
void probe_in_child(const std::string& file, const std::function<void()>& read);

}  // namespace moecheck
