// The device route's plan: route_plan (one block, a parallel scan over the experts: the layer
// plan of core/layer_plan.h built from route_select's header, in the device plan layout of
// core/route_header.h, with the slot pointers the MMVQ and MMQ launches read). Contract:
// docs/numerics.md "route_select" (Device plan); twin: build_layer_plan.
#include <string>

#include "core/error.h"
#include "core/route_header.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"

namespace moecheck::cuda {
namespace {

// 256: a block fits the room one block of the shared expert's register-staged GEMV leaves
// (docs/performance.md "the T = 8 stall"). No bit depends on it.
constexpr int kPlanThreads = 256;
// Up to this many picks (T * topk) are staged in shared memory for the scans below.
constexpr int64_t kStagedPicks = 3072;  // with 2048 experts: 44 KB, under the 48 KB default

struct PlanArgs {
  const int32_t* hdr;
  int64_t T, n, k;
  int mmvq_max_rows;
  const int32_t* slots;
  const uint8_t* const* slot_gate;
  const uint8_t* const* slot_up;
  const uint8_t* const* slot_down;
  uint8_t* plan;
};

// Expert e's pairs (tokens ascending) into its groups: gate at gfirst, up at P + gfirst, down at
// 2P + gfirst, chunks of kMaxGroupRows; pick_pair[i] = the pair row of pick i.
// picks: the header's picks (staged in shared memory when they fit).
__device__ void expert_groups(const PlanArgs& a, const int32_t* picks, int e, int cnt, int first,
                              int u, int U, int gfirst, MmvqGroup* groups, int32_t* pick_pair) {
  const int64_t P = a.T * a.k;
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

// Pick i's pair row and weight at the accumulation row of its rank among its token's picks by
// expert id (core/layer_plan.cpp make_accumulation: each token's rows in ascending expert id;
// the ids of a token are distinct).
__device__ void pick_accumulation(const PlanArgs& a, const int32_t* picks, int64_t i,
                                  const int32_t* pick_pair, int32_t* rows, float* weights) {
  const int64_t k = a.k, t0 = i / k * k;
  const RouteHeaderLayout L{a.T, k};
  int64_t rank = 0;
  for (int64_t q = 0; q < k; ++q) rank += picks[t0 + q] < picks[i];
  rows[t0 + rank] = pick_pair[i];
  weights[t0 + rank] = __int_as_float(a.hdr[L.weights() + i]);
}

// Groups of an expert with cnt pairs: one MMVQ group (cnt <= mmvq_max_rows) or its MMQ groups.
__device__ __forceinline__ int4 expert_counts(int cnt, int mmvq_max_rows) {
  const int small = cnt > 0 && cnt <= mmvq_max_rows ? 1 : 0;
  return make_int4(cnt, cnt > 0 ? 1 : 0, small,
                   small ? 0 : (cnt + kMaxGroupRows - 1) / kMaxGroupRows);
}

__device__ __forceinline__ int4 add4(int4 a, int4 b) {
  return make_int4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Pair rows and groups in ascending expert id: each thread takes a contiguous run of experts,
// the block scans the runs' (pairs, used experts, MMVQ groups, MMQ groups) exclusively
// (integers: exact), then each thread writes its run's first pair row, used-expert index and
// first group (MMVQ groups first, then MMQ groups: core/layer_plan.h). Thread blockDim - 1
// writes the totals: counts {2G, G, U, Gs} and *U_out. Ends synchronised.
__device__ void scan_experts(int n, int mmvq_max_rows, const int* cnt, int* first, int* uidx,
                             int* gfirst, int32_t* counts, int* U_out) {
  __shared__ int4 warp_sum[kPlanThreads / kWarpSize];
  const int per = (n + kPlanThreads - 1) / kPlanThreads;
  const int e0 = static_cast<int>(threadIdx.x) * per, e1 = min(e0 + per, n);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  int4 v = make_int4(0, 0, 0, 0);
  for (int e = e0; e < e1; ++e) v = add4(v, expert_counts(cnt[e], mmvq_max_rows));
  int4 inc = v;  // inclusive scan over the warp
  for (int o = 1; o < kWarpSize; o *= 2) {
    const int4 u =
        make_int4(__shfl_up_sync(0xFFFFFFFFu, inc.x, o), __shfl_up_sync(0xFFFFFFFFu, inc.y, o),
                  __shfl_up_sync(0xFFFFFFFFu, inc.z, o), __shfl_up_sync(0xFFFFFFFFu, inc.w, o));
    if (lane >= o) inc = add4(inc, u);
  }
  if (lane == kWarpSize - 1) warp_sum[warp] = inc;
  __syncthreads();
  int4 base = make_int4(inc.x - v.x, inc.y - v.y, inc.z - v.z, inc.w - v.w);
  int gs = 0;  // the MMVQ groups of all experts
  for (int w = 0; w < kPlanThreads / kWarpSize; ++w) {
    if (w < warp) base = add4(base, warp_sum[w]);
    gs += warp_sum[w].z;
  }
  for (int e = e0; e < e1; ++e) {
    const int4 c = expert_counts(cnt[e], mmvq_max_rows);
    first[e] = base.x;
    uidx[e] = cnt[e] > 0 ? base.y : -1;
    gfirst[e] = c.z != 0 ? base.z : gs + base.w;
    base = add4(base, c);
  }
  if (threadIdx.x == kPlanThreads - 1) {
    counts[0] = 2 * (base.z + base.w);
    counts[1] = base.z + base.w;
    counts[2] = base.y;
    counts[3] = base.z;
    *U_out = base.y;
  }
  __syncthreads();
}

// One block. Shared memory: cnt, first, uidx, gfirst [n] i32, then the picks [T k] i32 when
// T k <= kStagedPicks.
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
    if (threadIdx.x == 0) counts[0] = counts[1] = counts[2] = counts[3] = 0;
    return;
  }
  int* cnt = reinterpret_cast<int*>(smem);
  int* first = cnt + n;
  int* uidx = first + n;
  int* gfirst = uidx + n;
  const int32_t* hpicks = a.hdr + RouteHeaderLayout::kPicks;
  int32_t* staged = gfirst + n;
  const int32_t* picks = P <= kStagedPicks ? staged : hpicks;
  for (int e = threadIdx.x; e < n; e += blockDim.x) cnt[e] = 0;
  if (P <= kStagedPicks)
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) staged[i] = hpicks[i];
  __syncthreads();
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x) atomicAdd(&cnt[picks[i]], 1);
  __syncthreads();
  scan_experts(n, a.mmvq_max_rows, cnt, first, uidx, gfirst, counts, &U_sh);
  for (int e = threadIdx.x; e < n; e += blockDim.x)
    if (cnt[e] > 0)
      expert_groups(a, picks, e, cnt[e], first[e], uidx[e], U_sh, gfirst[e], groups, pick_pair);
  __syncthreads();  // pick_pair written (global memory, this block)
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x)
    pick_accumulation(a, picks, i, pick_pair, rows, weights);
}

}  // namespace

void route_plan(const int32_t* hdr, int64_t T, const RouteParams& rp, const int32_t* slots,
                const uint8_t* const* slot_gate, const uint8_t* const* slot_up,
                const uint8_t* const* slot_down, uint8_t* plan, void* stream) {
  if (T <= 0) return;
  if (rp.n_routed < 1 || rp.n_routed > kMaxRouteExperts || rp.topk < 1 || rp.topk > 64)
    throw InputError("cuda::route_plan: need 1 <= n_routed <= 2048 and 1 <= topk <= 64, found " +
                     std::to_string(rp.n_routed) + ", " + std::to_string(rp.topk));
  require_aligned(plan, 16, "route_plan", "plan");
  if (rp.mmvq_max_rows < 0 || rp.mmvq_max_rows > kMaxGroupRows)
    throw InputError("cuda::route_plan: mmvq_max_rows must be in [0, 8], found " +
                     std::to_string(rp.mmvq_max_rows));
  const PlanArgs a{hdr,   T,         rp.n_routed, rp.topk,   rp.mmvq_max_rows,
                   slots, slot_gate, slot_up,     slot_down, plan};
  const int64_t P = T * rp.topk;
  const size_t smem =
      static_cast<size_t>(rp.n_routed) * 16 + static_cast<size_t>(P <= kStagedPicks ? P : 0) * 4;
  route_plan_kernel<<<1, kPlanThreads, smem, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda
