// Reading a file that may crash a library we do not control (libhdf5 1.10 on some corrupt
// dumps): the read runs first in a forked child process; a crash there becomes an InputError
// naming the file and the signal, an InputError there comes back with its message, and only a
// read that succeeded in the child is repeated in this process. Used for dumps without
// moecheck's integrity stamp (golden/dump_hdf5.h); docs/reliability.md.
#pragma once

#include <functional>
#include <string>

namespace moecheck {

// Runs `read` in a child process. Returns when it completed; throws InputError (its message, or
// "<file>: <library> crashed reading it (signal N: name) ...") otherwise.
void probe_in_child(const std::string& file, const std::function<void()>& read);

}  // namespace moecheck
