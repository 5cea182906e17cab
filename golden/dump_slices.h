// The provenance group of a dump layer, /layers/<L>/tensors (docs/golden-format.md
// "Provenance"): which tensors and expert slices the forward read, with their SHA-256. Used by
// golden/dump.cpp only.
#pragma once

#include <string>
#include <vector>

#include "golden/dump_hdf5.h"
#include "golden/provenance.h"

namespace moecheck::dump_detail {

void put_slices(hid_t layer_group, const std::vector<SliceHash>& slices, const std::string& where);
std::vector<SliceHash> get_slices(const h5::Reader& rd, hid_t layers, int32_t L);

}  // namespace moecheck::dump_detail
