// The provenance group of a dump layer (golden/dump_slices.h).
#include "golden/dump_slices.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "golden/model_file.h"
#include "golden/sha256.h"

namespace moecheck::dump_detail {

using h5::Elem;

// /layers/<L>/tensors: which tensors and expert slices the forward read, and their SHA-256.
void put_slices(hid_t layer_group, const std::vector<SliceHash>& slices, const std::string& where) {
  h5::Handle g = h5::create_group(layer_group, "tensors", where + "/tensors");
  const int64_t n = static_cast<int64_t>(slices.size());
  std::vector<int32_t> tensor, expert;
  std::vector<uint8_t> digest;
  for (const SliceHash& h : slices) {
    tensor.push_back(tensor_code(h.tensor));
    expert.push_back(h.expert);
    std::array<uint8_t, 32> d{};
    if (!from_hex(h.sha256, d))
      throw InputError("dump " + where + ": slice digest \"" + h.sha256 +
                       "\" is not 64 hex digits");
    digest.insert(digest.end(), d.begin(), d.end());
  }
  std::string names;
  auto name_codes = [&names](const auto& list) {
    for (LayerTensor t : list) {
      if (!names.empty()) names += ',';
      names += std::to_string(tensor_code(t));
      names += '=';
      names += tensor_name(0, t).substr(6);  // without "blk.0."
    }
  };
  name_codes(kLayerTensors);
  name_codes(kOptionalLayerTensors);
  h5::write_attr(g.get(), "tensor_codes", names);
  h5::write_dataset(g.get(), "tensor", Elem::kI32, tensor.data(), {n});
  h5::write_dataset(g.get(), "expert", Elem::kI32, expert.data(), {n});
  h5::write_dataset(g.get(), "sha256", Elem::kU8, digest.data(), {n, 32});
}

// The layer's provenance, or nothing when the dump records none (version 1, or tensors built
// elsewhere).
std::vector<SliceHash> get_slices(const h5::Reader& rd, hid_t layers, int32_t L) {
  const std::string lp = "/layers/" + std::to_string(L), path = lp + "/tensors";
  h5::Handle lg = rd.open_group(layers, "/layers", std::to_string(L));
  if (!rd.has_object(lg.get(), "tensors")) return {};
  h5::Handle g = rd.open_group(lg.get(), lp, "tensors");
  std::vector<int64_t> dims;
  const auto tensor = rd.read_dataset<int32_t>(g.get(), path, "tensor", {-1}, &dims);
  const int64_t n = dims[0];
  const auto expert = rd.read_dataset<int32_t>(g.get(), path, "expert", {n});
  const auto digest = rd.read_dataset<uint8_t>(g.get(), path, "sha256", {n, 32});
  std::vector<SliceHash> out;
  for (int64_t i = 0; i < n; ++i) {
    SliceHash h;
    if (!tensor_from_code(tensor[i], &h.tensor))
      rd.fail(path + "/tensor", "element " + std::to_string(i) + ": unknown tensor code " +
                                    std::to_string(tensor[i]));
    h.expert = expert[i];
    if (h.expert < -1)
      rd.fail(path + "/expert",
              "element " + std::to_string(i) + ": expert " + std::to_string(h.expert));
    std::array<uint8_t, 32> d{};
    std::copy(digest.begin() + i * 32, digest.begin() + (i + 1) * 32, d.begin());
    h.sha256 = to_hex(d);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace moecheck::dump_detail
