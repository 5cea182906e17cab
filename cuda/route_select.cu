// The device route's selection: route_select (one block per token: scores with
// core/score_math.h, keys with the token's bias, the NaN rule, top-k by repeated warp argmax with
// ties to the lower id, the weights, the slot lookups and the header's status and error
// locations) and, for one token, route_select_plan_one (the same launch also writes the device
// plan). The plan for any T: cuda/route_plan.cu. Contract: docs/numerics.md "route_select";
// twins: emu::route_select and build_layer_plan.
#include <string>

#include "core/error.h"
#include "core/portable_math.h"
#include "core/route_header.h"
#include "core/score_math.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/pdl.cuh"

namespace moecheck::cuda {
namespace {

__device__ __forceinline__ bool is_nan(float v) { return v != v; }

// a comes before b in the selection order: larger key, ties to the lower id (keys are numbers).
__device__ __forceinline__ bool before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// The warp's best (key, id) of the lanes' candidates (id -1: none) under `before`, in every lane.
__device__ __forceinline__ void warp_best(float& bk, int& bi) {
  for (int o = 16; o >= 1; o /= 2) {
    const float ok = __shfl_xor_sync(0xFFFFFFFFu, bk, o);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
    if (oi >= 0 && (bi < 0 || before(ok, oi, bk, bi))) {
      bk = ok;
      bi = oi;
    }
  }
}

// The selection order as one unsigned 64-bit key: the key's bits mapped to an unsigned order
// (+0 and -0 first made one value, as they tie under ==), then 0xFFFFFFFF - id, so that a larger
// packed value is `before` a smaller one. Keys are numbers here (NaN tokens never select), and
// every packed value of an expert exceeds 0, which marks "no candidate".
__device__ __forceinline__ unsigned long long pack_key(float k, int id) {
  const uint32_t b = __float_as_uint(k == 0.0f ? 0.0f : k);
  const uint32_t u = (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
  return static_cast<unsigned long long>(u) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}

// The experts a lane holds in registers for the packed top-k (n_routed <= 32 * kRegCand).
constexpr int kRegCand = 16;

// Top-k of the n keys by warp 0 (lane l holds experts l + 32 i, i < kRegCand, as packed keys in
// registers): each round the warp's maximum by two 32-bit warp reductions (the order key, then
// the id part among the lanes holding that key); the owner drops its pick and rescans its own
// candidates. The order is a strict total order, so the result is the same as `warp_best`'s.
__device__ void topk_packed(const float* key, int n, int k, int* ids) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  unsigned long long c[kRegCand];
#pragma unroll
  for (int i = 0; i < kRegCand; ++i) {
    const int e = lane + kWarpSize * i;
    c[i] = e < n ? pack_key(key[e], e) : 0ull;
  }
  unsigned long long best = 0;
  int at = 0;
#pragma unroll
  for (int i = 0; i < kRegCand; ++i)
    if (c[i] > best) {
      best = c[i];
      at = i;
    }
  for (int j = 0; j < k; ++j) {
    const uint32_t hi = __reduce_max_sync(0xFFFFFFFFu, static_cast<uint32_t>(best >> 32));
    const uint32_t lo = __reduce_max_sync(
        0xFFFFFFFFu, static_cast<uint32_t>(best >> 32) == hi ? static_cast<uint32_t>(best) : 0u);
    const int id = static_cast<int>(0xFFFFFFFFu - lo);
    if (lane == 0) ids[j] = id;
    if (id % kWarpSize == lane) {  // the owner: drop the pick, find its next best in one pass
      best = 0;
      int next = 0;
#pragma unroll
      for (int i = 0; i < kRegCand; ++i) {
        if (i == at) c[i] = 0ull;
        if (c[i] > best) {
          best = c[i];
          next = i;
        }
      }
      at = next;
    }
  }
  __syncwarp();
}

struct SelectArgs {
  const float* logits;
  const float* bias;
  const float* bias_vl;
  const uint8_t* mask;
  RouteParams rp;
  const int32_t* slots;
  int32_t* hdr;
  int64_t T;
  bool init;  // one token: the kernel writes the header's fixed words itself (no init launch)
  // route_select_plan_one: the slot pointer arrays and the device plan (nullptr: none).
  const uint8_t* const* slot_gate = nullptr;
  const uint8_t* const* slot_up = nullptr;
  const uint8_t* const* slot_down = nullptr;
  uint8_t* plan = nullptr;
};

__device__ __forceinline__ unsigned long long location(int64_t t, int e) {
  return static_cast<unsigned long long>(t) << 32 | static_cast<uint32_t>(e);
}

__device__ __forceinline__ void header_init(int32_t* hdr, int64_t T, int64_t k) {
  const RouteHeaderLayout L{T, k};
  hdr[RouteHeaderLayout::kStatus] = 0;
  hdr[RouteHeaderLayout::kTokens] = static_cast<int32_t>(T);
  if (L.words() > L.slots() + L.pairs()) hdr[L.words() - 1] = 0;  // the padding word
  *reinterpret_cast<unsigned long long*>(hdr + RouteHeaderLayout::kNaNLoc) = kRouteNoError;
  *reinterpret_cast<unsigned long long*>(hdr + RouteHeaderLayout::kMissLoc) = kRouteNoError;
}

__global__ void route_header_init(int32_t* hdr, int64_t T, int64_t k) { header_init(hdr, T, k); }

// The block's per-expert staging (route_select_kernel), every global read of the selection issued
// at its start: thread i takes experts i, i + blockDim, ... (at most kStageUnroll of them, in one
// unrolled pass, so that a thread's experts cost one round trip, not one each). For each it
// loads the token's logit, its bias (both biases when there is an image mask, chosen once the
// mask byte is in) and its slot; then, for the one-token plan, the three slot pointers of a
// resident expert, one round trip after the slot and in flight while the score's f64 chain runs.
// The selection was a chain of four dependent round trips (logits, bias, slot, slot pointers),
// each slower while the shared expert streams beside it (docs/performance.md). Shared: s, key
// [n] f32, bvl [n] f32 when there is a mask, slot_e [n], and ptr [3][n] (first) when the
// pointers are staged. Scores are core/routing.cpp score_token's (each a long f64 chain);
// softmax's max and sum run on thread 0 in id order, exactly as the host loops.
// NaN rule of route_token: the first expert whose logit or bias is NaN, else the first NaN key
// (minima by atomicMin: order-free); n when none.
// Slot pointers are staged for the one-token plan up to this many experts (24 B each).
constexpr int kStagedPointerExperts = 1024;

// Experts a thread stages in the unrolled pass (the launch's blocks give at most this many).
constexpr int kStageUnroll = 8;

struct Staged {
  float* s;
  float* key;
  float* bvl;  // [n] the image-span bias when there is a mask; else unused
  int32_t* slot_e;
  const uint8_t** ptr;  // [3][n] gate, up, down pointers; nullptr: not staged
};

__host__ __device__ inline bool has_vl(const SelectArgs& a) {
  return a.bias_vl != nullptr && a.mask != nullptr;
}

__host__ __device__ inline bool stage_slot_pointers(const SelectArgs& a) {
  return a.plan != nullptr && a.rp.n_routed <= kStagedPointerExperts;
}

__device__ int stage_token(const SelectArgs& a, int64_t t, const Staged& st) {
  const int n = static_cast<int>(a.rp.n_routed);
  const bool sm = a.rp.score_func == static_cast<int>(ScoreFunc::kSoftmax);
  const bool sig = a.rp.score_func == static_cast<int>(ScoreFunc::kSigmoid);
  const float* z = a.logits + t * n;
  const bool vl = has_vl(a);
  __shared__ int first_in, first_key;
  __shared__ float m_sh, sum_sh;
  if (threadIdx.x == 0) {
    first_in = n;
    first_key = n;
  }
  const bool use_vl = vl && a.mask[t] != 0;
  __syncthreads();
  // Every global read first: thread i's experts i + j blockDim in one unrolled pass (the launch
  // gives at most kStageUnroll a thread; a loop covers any more). The first expert's values stay
  // in registers (one expert a thread, as with one token, reads nothing back); the others are
  // parked in shared memory, each thread reading back only its own experts (no barrier).
  const int bd = static_cast<int>(blockDim.x), per = (n + bd - 1) / bd;
  const float* bvp = vl ? a.bias_vl : a.bias;  // without a mask: bias again, never used
  float zr[kStageUnroll], br[kStageUnroll], vr[kStageUnroll];
  int32_t sr[kStageUnroll];
#pragma unroll
  for (int j = 0; j < kStageUnroll; ++j) {  // the loads, unconditional within a round (clamped)
    if (j >= per) break;
    const int e = min(static_cast<int>(threadIdx.x) + j * bd, n - 1);
    zr[j] = z[e];
    br[j] = a.bias[e];
    vr[j] = bvp[e];
    sr[j] = a.slots[e];
  }
#pragma unroll
  for (int j = 1; j < kStageUnroll; ++j) {
    const int e = static_cast<int>(threadIdx.x) + j * bd;
    if (j >= per) break;
    if (e < n) {
      st.s[e] = zr[j];
      st.key[e] = br[j];
      if (vl) st.bvl[e] = vr[j];
      st.slot_e[e] = sr[j];
    }
  }
  for (int e = static_cast<int>(threadIdx.x) + kStageUnroll * bd; e < n; e += bd) {
    st.s[e] = z[e];
    st.key[e] = a.bias[e];
    if (vl) st.bvl[e] = a.bias_vl[e];
    st.slot_e[e] = a.slots[e];
  }
  // Expert e's score and key (zv its logit, b its bias for this token, slot its slot).
  auto score = [&](int e, float zv, float b, int32_t slot) {
    const uint8_t *pg = nullptr, *pu = nullptr, *pd = nullptr;
    if (st.ptr != nullptr && slot >= 0) {  // in flight while the score's chain runs
      pg = a.slot_gate[slot];
      pu = a.slot_up[slot];
      pd = a.slot_down[slot];
    }
    const float q = div_rn(zv, a.rp.gate_temp);
    float sc = q;
    if (!sm) sc = sig ? psigmoid(q) : psqrt_softplus(q);
    if (is_nan(zv) || is_nan(b)) atomicMin(&first_in, e);
    st.s[e] = sc;
    if (sm) {
      st.key[e] = b;  // the key once the softmax is done
    } else {
      const float k = add_rn(sc, b);
      st.key[e] = k;
      if (is_nan(k)) atomicMin(&first_key, e);
    }
    st.slot_e[e] = slot;
    if (st.ptr != nullptr) {
      st.ptr[e] = pg;
      st.ptr[n + e] = pu;
      st.ptr[2 * n + e] = pd;
    }
  };
  if (static_cast<int>(threadIdx.x) < n)
    score(static_cast<int>(threadIdx.x), zr[0], use_vl ? vr[0] : br[0], sr[0]);
  for (int e = static_cast<int>(threadIdx.x) + bd; e < n; e += bd)
    score(e, st.s[e], use_vl ? st.bvl[e] : st.key[e], st.slot_e[e]);
  __syncthreads();
  if (sm) {
    float* s = st.s;
    if (threadIdx.x == 0) {
      float m = s[0];
      for (int e = 1; e < n; ++e) m = s[e] > m ? s[e] : m;
      m_sh = m;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = pexp(sub_rn(s[e], m_sh));
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int e = 0; e < n; ++e) sum = add_rn(sum, s[e]);
      sum_sh = sum;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      s[e] = div_rn(s[e], sum_sh);
      const float k = add_rn(s[e], st.key[e]);
      st.key[e] = k;
      if (is_nan(k)) atomicMin(&first_key, e);
    }
    __syncthreads();
  }
  return first_in < n ? first_in : first_key;
}

// Warp 0: the weights in pick order (the sum on lane 0 in pick order, + 1e-20, then each
// quotient and route_scale), the slot lookups and the header words of token t, lane l taking
// picks l, l + 32 (the slot loads of all picks in flight at once). The weights and slots also
// land in w_out / slot_out [k] for one_token_plan.
__device__ void write_token(const SelectArgs& a, int64_t t, const int* ids, const float* s,
                            const int32_t* slot_e, float* w_out, int32_t* slot_out) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int k = static_cast<int>(a.rp.topk);
  const RouteHeaderLayout L{a.T, k};
  const bool norm = a.rp.norm_topk_prob && k > 1;
  float sum = 0.0f;
  if (norm && lane == 0) {
    for (int j = 0; j < k; ++j) sum = add_rn(sum, s[ids[j]]);
    sum = add_rn(sum, 1e-20f);
  }
  sum = __shfl_sync(0xFFFFFFFFu, sum, 0);
  for (int j = lane; j < k; j += kWarpSize) {
    float w = s[ids[j]];
    if (norm) w = div_rn(w, sum);
    w = mul_rn(w, a.rp.route_scale);
    const int32_t slot = slot_e[ids[j]];
    a.hdr[RouteHeaderLayout::kPicks + t * k + j] = ids[j];
    a.hdr[L.weights() + t * k + j] = static_cast<int32_t>(__float_as_uint(w));
    a.hdr[L.slots() + t * k + j] = slot;
    if (slot < 0) {
      atomicOr(&a.hdr[RouteHeaderLayout::kStatus], kRouteMiss);
      atomicMin(reinterpret_cast<unsigned long long*>(a.hdr + RouteHeaderLayout::kMissLoc),
                location(t, ids[j]));
    }
    w_out[j] = w;
    slot_out[j] = slot;
  }
  __syncwarp();
}

// One token's plan written by the selecting warp itself (route_select_plan_one): the content
// route_plan gives for T = 1 (each pick its own group of one row, in ascending expert id),
// scratch included; lane l writes picks l, l + 32. A nonzero status: zero rows and weights,
// counts 0 (as route_plan). w / slot: the picks' weights and slots from write_token.
__device__ void one_token_plan(const SelectArgs& a, const int* ids, const float* w,
                               const int32_t* slot, const uint8_t* const* ptr, bool nan_token) {
  const int n = static_cast<int>(a.rp.n_routed);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int k = static_cast<int>(a.rp.topk), P = k, U = k;
  const DevicePlanLayout D(1, k);
  auto* groups = reinterpret_cast<MmvqGroup*>(a.plan + D.groups);
  auto* rows = reinterpret_cast<int32_t*>(a.plan + D.rows);
  auto* weights = reinterpret_cast<float*>(a.plan + D.weights);
  auto* counts = reinterpret_cast<int32_t*>(a.plan + D.counts);
  auto* pick_pair = reinterpret_cast<int32_t*>(a.plan + D.scratch);
  const auto** sp = reinterpret_cast<const uint8_t**>(a.plan + D.slots);
  // The one-token status without a read of the header: this launch initialised it (a.init),
  // and only this warp can set it: a NaN token (nan_token) or a pick with slot -1 (kRouteMiss,
  // visible in slot[] after write_token's __syncwarp).
  bool bad = nan_token;
  if (!nan_token)
    for (int j = lane; j < k; j += kWarpSize) bad = bad || slot[j] < 0;
  if (__any_sync(0xFFFFFFFFu, bad)) {
    for (int i = lane; i < P; i += kWarpSize) {
      rows[i] = 0;
      weights[i] = 0.0f;
    }
    if (lane == 0) counts[0] = counts[1] = counts[2] = counts[3] = 0;
    return;
  }
  for (int j = lane; j < k; j += kWarpSize) {  // pick j is the r-th smallest id: pair row, group r
    int r = 0;
    for (int q = 0; q < k; ++q) r += ids[q] < ids[j];
    pick_pair[j] = r;
    MmvqGroup g{};
    g.n = 1;
    g.slot = r;
    g.y_row[0] = r;
    groups[r] = g;
    g.slot = U + r;
    g.y_row[0] = P + r;
    groups[P + r] = g;
    g.slot = 2 * U + r;
    g.a_row[0] = r;
    g.y_row[0] = r;
    groups[2 * P + r] = g;
    if (ptr != nullptr) {  // staged by stage_token, expert ids[j]'s
      sp[r] = ptr[ids[j]];
      sp[U + r] = ptr[n + ids[j]];
      sp[2 * U + r] = ptr[2 * n + ids[j]];
    } else {
      sp[r] = a.slot_gate[slot[j]];
      sp[U + r] = a.slot_up[slot[j]];
      sp[2 * U + r] = a.slot_down[slot[j]];
    }
    rows[r] = r;
    weights[r] = w[j];
  }
  if (lane == 0) {
    counts[0] = 2 * k;
    counts[1] = k;
    counts[2] = k;
    counts[3] = a.rp.mmvq_max_rows >= 1 ? k : 0;  // one pair per expert: all MMVQ or all MMQ
  }
}

// Block t routes token t (blockDim: one or two experts per thread). Shared memory: scores, keys
// [n] f32. Scores, keys and the NaN rule over the block; top-k by warp 0, lane l holding experts
// l + 32 i with its picked flags as the bits i of one word (n <= 2048).
__global__ void __launch_bounds__(1024) route_select_kernel(SelectArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int n = static_cast<int>(a.rp.n_routed), k = static_cast<int>(a.rp.topk);
  const int lane = static_cast<int>(threadIdx.x);
  const int64_t t = blockIdx.x;
  pdl::wait();  // the logits (cuda/pdl.cuh: nothing is read before it)
  pdl::launch_dependents();
  if (a.init && threadIdx.x == 0) header_init(a.hdr, a.T, k);
  const bool stage_ptrs = stage_slot_pointers(a);
  Staged st{};
  st.ptr = stage_ptrs ? reinterpret_cast<const uint8_t**>(smem) : nullptr;
  st.s = reinterpret_cast<float*>(smem + (stage_ptrs ? static_cast<size_t>(n) * 24 : 0));
  st.key = st.s + n;
  st.bvl = st.key + n;
  st.slot_e = reinterpret_cast<int32_t*>(st.bvl + (has_vl(a) ? n : 0));
  const int bad = stage_token(a, t, st);
  const float* s = st.s;
  const float* key = st.key;
  if (threadIdx.x >= kWarpSize) return;
  __shared__ int ids[64];
  __shared__ float w_sh[64];
  __shared__ int32_t slot_sh[64];
  if (bad < n) {
    if (lane == 0) {
      const RouteHeaderLayout L{a.T, k};
      atomicOr(&a.hdr[RouteHeaderLayout::kStatus], kRouteNaN);
      atomicMin(reinterpret_cast<unsigned long long*>(a.hdr + RouteHeaderLayout::kNaNLoc),
                location(t, bad));
      for (int j = 0; j < k; ++j) {
        a.hdr[RouteHeaderLayout::kPicks + t * k + j] = -1;
        a.hdr[L.weights() + t * k + j] = 0;
        a.hdr[L.slots() + t * k + j] = -1;
      }
    }
    __syncwarp();
    if (a.plan != nullptr) one_token_plan(a, ids, w_sh, slot_sh, st.ptr, true);  // the zero plan
    return;
  }
  if (n <= kWarpSize * kRegCand) {
    topk_packed(key, n, k, ids);
  } else {
    unsigned long long picked = 0;
    for (int j = 0; j < k; ++j) {
      float bk = 0.0f;
      int bi = -1;
      for (int e = lane, i = 0; e < n; e += kWarpSize, ++i)
        if (!(picked >> i & 1ull) && (bi < 0 || before(key[e], e, bk, bi))) {
          bk = key[e];
          bi = e;
        }
      warp_best(bk, bi);
      if (lane == 0) ids[j] = bi;
      if (bi % kWarpSize == lane) picked |= 1ull << (bi / kWarpSize);
    }
    __syncwarp();
  }
  write_token(a, t, ids, s, st.slot_e, w_sh, slot_sh);
  if (a.plan != nullptr) one_token_plan(a, ids, w_sh, slot_sh, st.ptr, false);
}

void check_select(int64_t T, const RouteParams& rp) {
  const std::string where = "cuda::route_select: ";
  if (T < 0 || T > 0x7FFFFFFF || rp.n_routed < 1 || rp.n_routed > kMaxRouteExperts || rp.topk < 1 ||
      rp.topk > 64 || rp.topk > rp.n_routed)
    throw InputError(where + "need 0 <= T < 2^31, 1 <= n_routed <= 2048, 1 <= topk <= min(64, " +
                     "n_routed), found T=" + std::to_string(T) + " n_routed=" +
                     std::to_string(rp.n_routed) + " topk=" + std::to_string(rp.topk));
}

// One block per token, one thread per expert (two beyond 1024 experts), at least one warp; at
// most 256 threads for several tokens, so that a block fits the room one block of the shared
// expert's register-staged GEMV leaves (12 K registers; docs/performance.md "the T = 8 stall").
// No bit depends on the thread count (the kernel loops over experts by blockDim.x).
void launch_select(const SelectArgs& a, void* stream) {
  const int64_t n = a.rp.n_routed;
  const int64_t most = a.T > 1 ? 256 : 1024;
  const int threads =
      static_cast<int>(n > most ? most : (n + kWarpSize - 1) / kWarpSize * kWarpSize);
  const size_t smem =
      static_cast<size_t>(n) * (12 + (has_vl(a) ? 4 : 0) + (stage_slot_pointers(a) ? 24 : 0));
  pdl::launch(route_select_kernel, dim3(static_cast<unsigned>(a.T)), dim3(threads), smem,
              as_stream(stream), a);
}

}  // namespace

void route_select(const float* logits, int64_t T, const float* bias, const float* bias_vl,
                  const uint8_t* image_mask, const RouteParams& rp, const int32_t* slots,
                  int32_t* hdr, void* stream) {
  check_select(T, rp);
  require_aligned(hdr, 8, "route_select", "hdr");
  if (T != 1) {  // several tokens' warps update the status: the fixed words first
    route_header_init<<<1, 1, 0, as_stream(stream)>>>(hdr, T, rp.topk);
    MOECHECK_CUDA_CHECK(cudaGetLastError());
  }
  if (T == 0) return;
  const SelectArgs a{logits, bias, bias_vl, image_mask, rp, slots, hdr, T, T == 1};
  launch_select(a, stream);
}

void route_select_plan_one(const float* logits, const float* bias, const float* bias_vl,
                           const uint8_t* image_mask, const RouteParams& rp, const int32_t* slots,
                           int32_t* hdr, const uint8_t* const* slot_gate,
                           const uint8_t* const* slot_up, const uint8_t* const* slot_down,
                           uint8_t* plan, void* stream) {
  check_select(1, rp);
  require_aligned(hdr, 8, "route_select_plan_one", "hdr");
  require_aligned(plan, 16, "route_select_plan_one", "plan");
  SelectArgs a{logits, bias, bias_vl, image_mask, rp, slots, hdr, 1, true};
  a.slot_gate = slot_gate;
  a.slot_up = slot_up;
  a.slot_down = slot_down;
  a.plan = plan;
  launch_select(a, stream);
}

}  // namespace moecheck::cuda
