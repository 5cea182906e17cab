// The device route: route_select (one block per token: scores with core/score_math.h, keys with
// the token's bias, the NaN rule, top-k by repeated block argmax with ties to the lower id, the
// weights, the slot lookups and the header's status and error locations) and route_plan (one
// block: the layer plan of core/layer_plan.h built from the header, in the device plan layout of
// core/route_header.h, with the slot pointers the MMVQ launches read). Contract: docs/numerics.md
// "route_select"; twins: emu::route_select and build_layer_plan.
#include <string>

#include "core/error.h"
#include "core/portable_math.h"
#include "core/route_header.h"
#include "core/score_math.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda {
namespace {

constexpr int kSelectThreads = 256;
constexpr int kPlanThreads = 512;
constexpr int64_t kMaxRouteExperts = 2048;  // route_plan's shared memory: 16 bytes per expert

__device__ __forceinline__ bool is_nan(float v) { return v != v; }

// a comes before b in the selection order: larger key, ties to the lower id (keys are numbers).
__device__ __forceinline__ bool before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// The block's best (key, id) over the experts not yet picked; id -1 when none.
__device__ void block_argmax(const float* key, const uint8_t* picked, int n, float* red_k,
                             int* red_i, float& out_k, int& out_i) {
  float bk = 0.0f;
  int bi = -1;
  for (int e = threadIdx.x; e < n; e += blockDim.x)
    if (!picked[e] && (bi < 0 || before(key[e], e, bk, bi))) {
      bk = key[e];
      bi = e;
    }
  for (int o = 16; o >= 1; o /= 2) {
    const float ok = __shfl_xor_sync(0xFFFFFFFFu, bk, o);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
    if (oi >= 0 && (bi < 0 || before(ok, oi, bk, bi))) {
      bk = ok;
      bi = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    red_k[warp] = bk;
    red_i[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
      if (red_i[w] >= 0 && (bi < 0 || before(red_k[w], red_i[w], bk, bi))) {
        bk = red_k[w];
        bi = red_i[w];
      }
    red_k[0] = bk;
    red_i[0] = bi;
  }
  __syncthreads();
  out_k = red_k[0];
  out_i = red_i[0];
  __syncthreads();
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
};

__device__ __forceinline__ unsigned long long location(int64_t t, int e) {
  return static_cast<unsigned long long>(t) << 32 | static_cast<uint32_t>(e);
}

__global__ void route_header_init(int32_t* hdr, int64_t T, int64_t k) {
  const RouteHeaderLayout L{T, k};
  hdr[RouteHeaderLayout::kStatus] = 0;
  hdr[RouteHeaderLayout::kTokens] = static_cast<int32_t>(T);
  if (L.words() > L.slots() + L.pairs()) hdr[L.words() - 1] = 0;  // the padding word
  *reinterpret_cast<unsigned long long*>(hdr + RouteHeaderLayout::kNaNLoc) = kRouteNoError;
  *reinterpret_cast<unsigned long long*>(hdr + RouteHeaderLayout::kMissLoc) = kRouteNoError;
}

// Scores s[e] of token row z (core/routing.cpp score_token): softmax's max and sum run on one
// thread in id order, exactly as the host loops.
__device__ void token_scores(const float* z, const RouteParams& rp, float* s) {
  const int n = static_cast<int>(rp.n_routed);
  if (rp.score_func != static_cast<int>(ScoreFunc::kSoftmax)) {
    const bool sig = rp.score_func == static_cast<int>(ScoreFunc::kSigmoid);
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const float a = div_rn(z[e], rp.gate_temp);
      s[e] = sig ? psigmoid(a) : psqrt_softplus(a);
    }
    __syncthreads();
    return;
  }
  __shared__ float m_sh, sum_sh;
  for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = div_rn(z[e], rp.gate_temp);
  __syncthreads();
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
  for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = div_rn(s[e], sum_sh);
  __syncthreads();
}

// The NaN rule of route_token: the first expert whose logit or bias is NaN, else the first NaN
// key; n when none.
__device__ int nan_expert(const float* z, const float* b, const float* key, int n) {
  __shared__ int first_in, first_key;
  if (threadIdx.x == 0) {
    first_in = n;
    first_key = n;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    if (is_nan(z[e]) || is_nan(b[e])) atomicMin(&first_in, e);
    if (is_nan(key[e])) atomicMin(&first_key, e);
  }
  __syncthreads();
  const int bad = first_in < n ? first_in : first_key;
  __syncthreads();
  return bad;
}

// Thread 0: the weights in pick order (sum, + 1e-20, quotient, route_scale), the slot lookups and
// the header words of token t.
__device__ void write_token(const SelectArgs& a, int64_t t, const int* ids, const float* s) {
  const int64_t k = a.rp.topk;
  const RouteHeaderLayout L{a.T, k};
  float w[64];
  for (int64_t j = 0; j < k; ++j) w[j] = s[ids[j]];
  if (a.rp.norm_topk_prob && k > 1) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = add_rn(sum, w[j]);
    sum = add_rn(sum, 1e-20f);
    for (int64_t j = 0; j < k; ++j) w[j] = div_rn(w[j], sum);
  }
  for (int64_t j = 0; j < k; ++j) {
    w[j] = mul_rn(w[j], a.rp.route_scale);
    const int32_t slot = a.slots[ids[j]];
    a.hdr[RouteHeaderLayout::kPicks + t * k + j] = ids[j];
    a.hdr[L.weights() + t * k + j] = static_cast<int32_t>(__float_as_uint(w[j]));
    a.hdr[L.slots() + t * k + j] = slot;
    if (slot < 0) {
      atomicOr(&a.hdr[RouteHeaderLayout::kStatus], kRouteMiss);
      atomicMin(reinterpret_cast<unsigned long long*>(a.hdr + RouteHeaderLayout::kMissLoc),
                location(t, ids[j]));
    }
  }
}

// Block t routes token t. Shared memory: scores, keys [n] f32, picked [n] u8.
__global__ void __launch_bounds__(kSelectThreads) route_select_kernel(SelectArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red_k[kSelectThreads / 32];
  __shared__ int red_i[kSelectThreads / 32];
  __shared__ int ids[64];
  const int n = static_cast<int>(a.rp.n_routed), k = static_cast<int>(a.rp.topk);
  const int64_t t = blockIdx.x;
  float* s = reinterpret_cast<float*>(smem);
  float* key = s + n;
  uint8_t* picked = reinterpret_cast<uint8_t*>(key + n);
  const float* z = a.logits + t * n;
  const float* b = a.bias_vl != nullptr && a.mask != nullptr && a.mask[t] != 0 ? a.bias_vl : a.bias;
  token_scores(z, a.rp, s);
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    key[e] = add_rn(s[e], b[e]);
    picked[e] = 0;
  }
  __syncthreads();
  const int bad = nan_expert(z, b, key, n);
  if (bad < n) {
    if (threadIdx.x == 0) {
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
    return;
  }
  for (int j = 0; j < k; ++j) {
    float bk;
    int bi;
    block_argmax(key, picked, n, red_k, red_i, bk, bi);
    if (threadIdx.x == 0) {
      ids[j] = bi;
      picked[bi] = 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) write_token(a, t, ids, s);
}

struct PlanArgs {
  const int32_t* hdr;
  int64_t T, n, k;
  const int32_t* slots;
  const uint8_t* const* slot_gate;
  const uint8_t* const* slot_up;
  const uint8_t* const* slot_down;
  uint8_t* plan;
};

// Expert e's pairs (tokens ascending) into its groups: gate at gfirst, up at P + gfirst, down at
// 2P + gfirst, chunks of kMaxGroupRows; pick_pair[i] = the pair row of pick i.
__device__ void expert_groups(const PlanArgs& a, int e, int cnt, int first, int u, int U,
                              int gfirst, MmvqGroup* groups, int32_t* pick_pair) {
  const int64_t P = a.T * a.k;
  const int32_t* picks = a.hdr + RouteHeaderLayout::kPicks;
  int r = 0;
  for (int64_t i = 0; i < P && r < cnt; ++i) {
    if (picks[i] != e) continue;
    const int32_t t = static_cast<int32_t>(i / a.k), pp = first + r;
    pick_pair[i] = pp;
    const int g = gfirst + r / kMaxGroupRows, ii = r % kMaxGroupRows;
    groups[g].a_row[ii] = t;
    groups[g].y_row[ii] = pp;
    groups[P + g].a_row[ii] = t;
    groups[P + g].y_row[ii] = static_cast<int32_t>(P) + pp;
    groups[2 * P + g].a_row[ii] = pp;
    groups[2 * P + g].y_row[ii] = pp;
    ++r;
  }
  for (int c = 0; c * kMaxGroupRows < cnt; ++c) {
    const int g = gfirst + c;
    const int nn =
        cnt - c * kMaxGroupRows < kMaxGroupRows ? cnt - c * kMaxGroupRows : kMaxGroupRows;
    for (int ii = nn; ii < kMaxGroupRows; ++ii)
      for (int64_t j = 0; j < 3; ++j) groups[j * P + g].a_row[ii] = groups[j * P + g].y_row[ii] = 0;
    groups[g].slot = u;
    groups[P + g].slot = U + u;
    groups[2 * P + g].slot = 2 * U + u;
    groups[g].n = groups[P + g].n = groups[2 * P + g].n = nn;
  }
  const auto** sp = reinterpret_cast<const uint8_t**>(a.plan);
  const int32_t slot = a.slots[e];
  sp[u] = a.slot_gate[slot];
  sp[U + u] = a.slot_up[slot];
  sp[2 * U + u] = a.slot_down[slot];
}

// Token t's pair rows and weights in ascending expert id (core/layer_plan.cpp
// make_accumulation).
__device__ void token_accumulation(const PlanArgs& a, int64_t t, const int32_t* pick_pair,
                                   int32_t* rows, float* weights) {
  const int64_t k = a.k;
  const RouteHeaderLayout L{a.T, k};
  const int32_t* picks = a.hdr + RouteHeaderLayout::kPicks + t * k;
  for (int64_t r = 0; r < k; ++r) {  // the r-th smallest expert id of the token (ids distinct)
    int64_t j_min = -1;
    for (int64_t j = 0; j < k; ++j) {
      int64_t rank = 0;
      for (int64_t q = 0; q < k; ++q) rank += picks[q] < picks[j];
      if (rank == r) j_min = j;
    }
    rows[t * k + r] = pick_pair[t * k + j_min];
    weights[t * k + r] = __int_as_float(a.hdr[L.weights() + t * k + j_min]);
  }
}

// One block. Shared memory: cnt, first, uidx, gfirst [n] i32.
__global__ void __launch_bounds__(kPlanThreads) route_plan_kernel(PlanArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int U_sh;
  const int n = static_cast<int>(a.n);
  const int64_t P = a.T * a.k;
  const DevicePlanLayout D(a.T, a.k);
  auto* groups = reinterpret_cast<MmvqGroup*>(a.plan + D.groups);
  auto* rows = reinterpret_cast<int32_t*>(a.plan + D.rows);
  auto* weights = reinterpret_cast<float*>(a.plan + D.weights);
  auto* counts = reinterpret_cast<int32_t*>(a.plan + D.counts);
  auto* pick_pair = reinterpret_cast<int32_t*>(a.plan + D.scratch);
  if (a.hdr[RouteHeaderLayout::kStatus] != 0) {  // no valid routing: compute nothing
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      rows[i] = 0;
      weights[i] = 0.0f;
    }
    if (threadIdx.x == 0) counts[0] = counts[1] = counts[2] = 0;
    return;
  }
  int* cnt = reinterpret_cast<int*>(smem);
  int* first = cnt + n;
  int* uidx = first + n;
  int* gfirst = uidx + n;
  for (int e = threadIdx.x; e < n; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x)
    atomicAdd(&cnt[a.hdr[RouteHeaderLayout::kPicks + i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {  // pair rows and groups in ascending expert id
    int pairs = 0, U = 0, G = 0;
    for (int e = 0; e < n; ++e) {
      first[e] = pairs;
      uidx[e] = cnt[e] > 0 ? U++ : -1;
      gfirst[e] = G;
      pairs += cnt[e];
      G += (cnt[e] + kMaxGroupRows - 1) / kMaxGroupRows;
    }
    U_sh = U;
    counts[0] = 2 * G;
    counts[1] = G;
    counts[2] = U;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += blockDim.x)
    if (cnt[e] > 0)
      expert_groups(a, e, cnt[e], first[e], uidx[e], U_sh, gfirst[e], groups, pick_pair);
  __syncthreads();
  for (int64_t t = threadIdx.x; t < a.T; t += blockDim.x)
    token_accumulation(a, t, pick_pair, rows, weights);
}

}  // namespace

void route_select(const float* logits, int64_t T, const float* bias, const float* bias_vl,
                  const uint8_t* image_mask, const RouteParams& rp, const int32_t* slots,
                  int32_t* hdr, void* stream) {
  const std::string where = "cuda::route_select: ";
  if (T < 0 || T > 0x7FFFFFFF || rp.n_routed < 1 || rp.n_routed > kMaxRouteExperts || rp.topk < 1 ||
      rp.topk > 64 || rp.topk > rp.n_routed)
    throw InputError(where + "need 0 <= T < 2^31, 1 <= n_routed <= 2048, 1 <= topk <= min(64, " +
                     "n_routed), found T=" + std::to_string(T) + " n_routed=" +
                     std::to_string(rp.n_routed) + " topk=" + std::to_string(rp.topk));
  require_aligned(hdr, 8, "route_select", "hdr");
  route_header_init<<<1, 1, 0, as_stream(stream)>>>(hdr, T, rp.topk);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
  if (T == 0) return;
  const SelectArgs a{logits, bias, bias_vl, image_mask, rp, slots, hdr, T};
  const size_t smem = static_cast<size_t>(rp.n_routed) * 9;
  route_select_kernel<<<static_cast<unsigned>(T), kSelectThreads, smem, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

void route_plan(const int32_t* hdr, int64_t T, const RouteParams& rp, const int32_t* slots,
                const uint8_t* const* slot_gate, const uint8_t* const* slot_up,
                const uint8_t* const* slot_down, uint8_t* plan, void* stream) {
  if (T <= 0) return;
  if (rp.n_routed < 1 || rp.n_routed > kMaxRouteExperts || rp.topk < 1 || rp.topk > 64)
    throw InputError("cuda::route_plan: need 1 <= n_routed <= 2048 and 1 <= topk <= 64, found " +
                     std::to_string(rp.n_routed) + ", " + std::to_string(rp.topk));
  require_aligned(plan, 16, "route_plan", "plan");
  const PlanArgs a{hdr, T, rp.n_routed, rp.topk, slots, slot_gate, slot_up, slot_down, plan};
  const size_t smem = static_cast<size_t>(rp.n_routed) * 16;
  route_plan_kernel<<<1, kPlanThreads, smem, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda
