// emu::route_select: the device route's header on the CPU (emulate/route_select.h).
#include "emulate/route_select.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/numfmt.h"
#include "core/route_header.h"

namespace moecheck::emu {
namespace {

void put_u64(int32_t* hdr, int64_t word, uint64_t v) { std::memcpy(hdr + word, &v, sizeof v); }
uint64_t get_u64(const int32_t* hdr, int64_t word) {
  uint64_t v;
  std::memcpy(&v, hdr + word, sizeof v);
  return v;
}
uint64_t location(int64_t token, int64_t expert) {
  return static_cast<uint64_t>(token) << 32 | static_cast<uint32_t>(expert);
}

}  // namespace

void route_select(const float* logits, int64_t T, const RouteBias& bias, const MoeConfig& c,
                  const int32_t* slots, int32_t* hdr) {
  const int64_t n = c.n_routed, k = c.topk;
  const RouteHeaderLayout L{T, k};
  std::fill(hdr, hdr + L.words(), 0);
  hdr[RouteHeaderLayout::kTokens] = static_cast<int32_t>(T);
  put_u64(hdr, RouteHeaderLayout::kNaNLoc, kRouteNoError);
  put_u64(hdr, RouteHeaderLayout::kMissLoc, kRouteNoError);
  std::vector<float> s(static_cast<size_t>(n)), w(static_cast<size_t>(k));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    int32_t* picks = hdr + RouteHeaderLayout::kPicks + t * k;
    int32_t* wbits = hdr + L.weights() + t * k;
    int32_t* pslot = hdr + L.slots() + t * k;
    const int64_t bad = route_token(logits + t * n, bias.of(t), c, s.data(), ids.data(), w.data());
    if (bad >= 0) {
      hdr[RouteHeaderLayout::kStatus] |= kRouteNaN;
      put_u64(hdr, RouteHeaderLayout::kNaNLoc,
              std::min(get_u64(hdr, RouteHeaderLayout::kNaNLoc), location(t, bad)));
      std::fill(picks, picks + k, -1);
      std::fill(pslot, pslot + k, -1);
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      picks[j] = ids[j];
      wbits[j] = static_cast<int32_t>(f32_bits(w[j]));
      pslot[j] = slots[ids[j]];
      if (pslot[j] < 0) {
        hdr[RouteHeaderLayout::kStatus] |= kRouteMiss;
        put_u64(hdr, RouteHeaderLayout::kMissLoc,
                std::min(get_u64(hdr, RouteHeaderLayout::kMissLoc), location(t, ids[j])));
      }
    }
  }
}

}  // namespace moecheck::emu
