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
// Up to this many picks (T * topk) are staged in shared memory (the picks, their weights and
// their pair rows) for the scans below.
constexpr int64_t kStagedPicks = 3072;
// Up to this many experts have their three slot pointers staged in shared memory (24 B each).
constexpr int kStagedPointerExperts = 1024;
// The experts one thread stages (n_routed <= kMaxRouteExperts).
constexpr int kExpertsPerThread = (kMaxRouteExperts + kPlanThreads - 1) / kPlanThreads;
constexpr int kPlanWarps = kPlanThreads / kWarpSize;
// Up to this many picks warp 0 ranks them alone (rank_picks); above, every warp ranks a chunk
// (rank_picks_warps), with counters of its own.
constexpr int64_t kOneWarpPicks = 64;

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

// The block's shared memory, in bytes from its start: cnt, first, uidx, gfirst [n] i32, then the
// rank counters [runs][n] i32 (runs: 1 up to kOneWarpPicks picks, kPlanWarps above); from a
// 16-byte boundary the staged slot pointers [3][n] (gate, up, down; when n <=
// kStagedPointerExperts); then, when P = T k <= kStagedPicks, the picks, their weights' bits and
// their pair rows [P] i32 each.
struct PlanSmem {
  bool ptrs = false, picks = false;
  int runs = 1;
  size_t ptr = 0, pick = 0, bytes = 0;
  __host__ __device__ PlanSmem(int64_t n, int64_t P)
      : ptrs(n <= kStagedPointerExperts),
        picks(P <= kStagedPicks),
        runs(P > kOneWarpPicks ? kPlanWarps : 1) {
    const auto N = static_cast<size_t>(n);
    ptr = (4 * (4 + static_cast<size_t>(runs)) * N + 15) / 16 * 16;
    pick = ptr + (ptrs ? 24 * N : 0);
    bytes = pick + (picks ? 12 * static_cast<size_t>(P) : 0);
  }
};
// The most shared memory a plan launch asks for: the larger of n = kStagedPointerExperts with its
// pointers staged and n = kMaxRouteExperts without, each with kPlanWarps counters and
// kStagedPicks picks.
constexpr size_t kPlanSmemStaged =
    (4 * (4 + kPlanWarps) * size_t{kStagedPointerExperts} + 15) / 16 * 16 +
    24 * size_t{kStagedPointerExperts} + 12 * size_t{kStagedPicks};
constexpr size_t kPlanSmemLarge =
    (4 * (4 + kPlanWarps) * size_t{kMaxRouteExperts} + 15) / 16 * 16 + 12 * size_t{kStagedPicks};
constexpr size_t kPlanSmemMax = kPlanSmemStaged > kPlanSmemLarge ? kPlanSmemStaged : kPlanSmemLarge;
static_assert(kPlanSmemMax <= 227 * 1024);

// Where the kernel reads the picks and writes / reads their pair rows: shared memory when
// staged, else the header and the plan's scratch. ptr: the staged slot pointers or nullptr.
struct PlanView {
  const int32_t* picks;
  const int32_t* wbits;  // the picks' weights as f32 bits
  int32_t* pair;         // pick i's pair row (written by rank_picks, read by pick_rows)
  int32_t* pair_out;     // the plan's scratch (written in both cases)
  const uint8_t** ptr;   // [3][n] or nullptr
};

// One warp's walk over picks [i_begin, i_end), 32 at a time: lanes holding the same expert find
// each other with __match_any_sync, a lane's rank is its expert's running count run[e] plus its
// lower peers, and the highest peer advances the count. Each pick's pair field gets that rank,
// plus first[e] when kFirst.
template <bool kFirst>
__device__ __forceinline__ void rank_walk(const PlanView& v, int64_t i_begin, int64_t i_end,
                                          const int* first, int* run, int lane) {
  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int64_t i0 = i_begin; i0 < i_end; i0 += kWarpSize) {
    const int64_t i = i0 + lane;
    const bool on = i < i_end;
    const int e = on ? v.picks[i] : -1;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, e);
    const int base = on ? run[e] : 0;
    __syncwarp();
    if (on) {
      v.pair[i] = (kFirst ? first[e] : 0) + base + __popc(peers & lower_lanes);
      if (lane == 31 - __clz(peers)) run[e] = base + __popc(peers);
    }
    __syncwarp();
  }
}

// Each pick's pair row: first[e] + its rank among expert e's picks in pick order (= token order,
// as a token's experts are distinct), by warp 0 walking all the picks (rank_walk): P / 32 short
// steps; the plan scanned all P picks once per used expert before (a serial chain of P shared
// loads, slow while the shared expert's GEMV holds the multiprocessor's shared-memory pipe).
__device__ void rank_picks(const PlanView& v, int64_t P, const int* first, int* run) {
  if (threadIdx.x >= kWarpSize) return;
  rank_walk<true>(v, 0, P, first, run, static_cast<int>(threadIdx.x));
}

// The same pair rows with every warp walking a chunk of the picks: warp w takes picks
// [w C, (w + 1) C) (C: P over the warps, rounded up to 32) by rank_walk, against counters of
// its own (runs + w n, zero at entry), and writes each pick's rank within its chunk; then each
// expert's counters become their exclusive prefix over the warps (a thread per expert, the warps
// in order), and each pick adds first[e] and its warp's prefix. A pick's rank is the count of
// expert e's picks before it in pick order: those in earlier chunks plus those before it in its
// own, the one-warp walk's number in P / (32 warps) steps of a warp instead of P / 32. Ends
// synchronised.
__device__ void rank_picks_warps(const PlanView& v, int64_t P, int n, const int* first, int* runs) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t C = ((P + kPlanWarps - 1) / kPlanWarps + kWarpSize - 1) / kWarpSize * kWarpSize;
  const int64_t i1 = (warp + 1) * C < P ? (warp + 1) * C : P;
  rank_walk<false>(v, warp * C, i1, nullptr, runs + static_cast<int64_t>(warp) * n,
                   static_cast<int>(threadIdx.x) % kWarpSize);
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < n; e += kPlanThreads) {
    int sum = 0;
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = runs[w * n + e];
      runs[w * n + e] = sum;
      sum += c;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < P; i += kPlanThreads) {
    const int e = v.picks[i];
    v.pair[i] += first[e] + runs[static_cast<int64_t>(i / C) * n + e];
  }
  __syncthreads();
}

// The three projections' first G groups zeroed by the whole block, word by word in order (each
// warp's stores fill whole sectors), before any of their fields is written: the unused entries of
// each expert's last group were 42 scattered 4-byte stores from one thread per one-pair expert.
// Ends synchronised.
__device__ void zero_groups(MmvqGroup* groups, int64_t P, int G) {
  static_assert(sizeof(MmvqGroup) % 4 == 0);
  constexpr int64_t kWords = sizeof(MmvqGroup) / 4;
  for (int64_t j = 0; j < 3; ++j) {
    int32_t* w = reinterpret_cast<int32_t*>(groups + j * P);
    for (int64_t i = threadIdx.x; i < G * kWords; i += kPlanThreads) w[i] = 0;
  }
  __syncthreads();
}

// Pick i into its expert's groups (gate at gfirst, up at P + gfirst, down at 2P + gfirst, chunks
// of kMaxGroupRows: the row of rank r in group r / 8, entry r % 8), its pair row into the scratch,
// and its pair row and weight at the accumulation row of its rank among its token's picks by
// expert id (core/layer_plan.cpp make_accumulation: each token's rows in ascending expert id).
__device__ void pick_rows(const PlanArgs& a, const PlanView& v, int64_t i, const int* first,
                          const int* gfirst, MmvqGroup* groups, int32_t* rows, float* weights) {
  const int64_t P = a.T * a.k, k = a.k, t0 = i / k * k;
  const int e = v.picks[i];
  const int32_t pp = v.pair[i], t = static_cast<int32_t>(i / k);
  const int r = pp - first[e];
  const int g = gfirst[e] + r / kMaxGroupRows, ii = r % kMaxGroupRows;
  groups[g].a_row[ii] = t;
  groups[g].y_row[ii] = pp;
  groups[P + g].a_row[ii] = t;
  groups[P + g].y_row[ii] = static_cast<int32_t>(P) + pp;
  groups[2 * P + g].a_row[ii] = pp;
  groups[2 * P + g].y_row[ii] = pp;
  if (v.pair_out != v.pair) v.pair_out[i] = pp;
  int64_t rank = 0;
  for (int64_t q = 0; q < k; ++q) rank += v.picks[t0 + q] < e;
  rows[t0 + rank] = pp;
  weights[t0 + rank] = __int_as_float(v.wbits[i]);
}

// Expert e's groups past their rows: the slot and row count of each (the unused entries of its
// last group are zero: zero_groups), and its three slot pointers at used-expert index u.
__device__ void expert_groups(const PlanArgs& a, const PlanView& v, int e, int cnt, int u, int U,
                              int gfirst, MmvqGroup* groups) {
  const int64_t P = a.T * a.k;
  for (int c = 0; c * kMaxGroupRows < cnt; ++c) {
    const int g = gfirst + c;
    const int nn =
        cnt - c * kMaxGroupRows < kMaxGroupRows ? cnt - c * kMaxGroupRows : kMaxGroupRows;
    groups[g].slot = u;
    groups[P + g].slot = U + u;
    groups[2 * P + g].slot = 2 * U + u;
    groups[g].n = groups[P + g].n = groups[2 * P + g].n = nn;
  }
  const auto** sp = reinterpret_cast<const uint8_t**>(a.plan);
  const int n = static_cast<int>(a.n);
  if (v.ptr != nullptr) {
    sp[u] = v.ptr[e];
    sp[U + u] = v.ptr[n + e];
    sp[2 * U + u] = v.ptr[2 * n + e];
  } else {
    const int32_t slot = a.slots[e];
    sp[u] = a.slot_gate[slot];
    sp[U + u] = a.slot_up[slot];
    sp[2 * U + u] = a.slot_down[slot];
  }
}

// An expert's terms in the scan: its pairs, whether it is used, its MMVQ group (0 or 1), and its
// MMQ groups, counted in `even` when they are an even number and in `odd` otherwise (the plan's
// parts: core/layer_plan.cpp group_part).
struct ExpertCounts {
  int pairs, used, small, even, odd;  // plain: the block's warp sums sit in __shared__
};

__device__ __forceinline__ ExpertCounts expert_counts(int cnt, int mmvq_max_rows) {
  ExpertCounts c{};
  c.pairs = cnt;
  c.used = cnt > 0 ? 1 : 0;
  c.small = cnt > 0 && cnt <= mmvq_max_rows ? 1 : 0;
  const int g = cnt > 0 && c.small == 0 ? (cnt + kMaxGroupRows - 1) / kMaxGroupRows : 0;
  (g % 2 == 0 ? c.even : c.odd) = g;
  return c;
}

__device__ __forceinline__ ExpertCounts add(ExpertCounts a, const ExpertCounts& b) {
  a.pairs += b.pairs;
  a.used += b.used;
  a.small += b.small;
  a.even += b.even;
  a.odd += b.odd;
  return a;
}

__device__ __forceinline__ ExpertCounts shfl_up(const ExpertCounts& a, int o) {
  ExpertCounts u{};
  u.pairs = __shfl_up_sync(0xFFFFFFFFu, a.pairs, o);
  u.used = __shfl_up_sync(0xFFFFFFFFu, a.used, o);
  u.small = __shfl_up_sync(0xFFFFFFFFu, a.small, o);
  u.even = __shfl_up_sync(0xFFFFFFFFu, a.even, o);
  u.odd = __shfl_up_sync(0xFFFFFFFFu, a.odd, o);
  return u;
}

// Pair rows and groups in ascending expert id: each thread takes a contiguous run of experts,
// the block scans the runs' ExpertCounts exclusively (integers: exact), then each thread writes
// its run's first pair row, used-expert index and first group: the MMVQ groups first, then the
// MMQ groups of the experts with an even number of them, then the others' (core/layer_plan.h),
// each part in ascending id. Thread blockDim - 1 writes the totals: counts {2G, G, U, Gs} and
// *U_out and *G_out. Ends synchronised.
__device__ void scan_experts(int n, int mmvq_max_rows, const int* cnt, int* first, int* uidx,
                             int* gfirst, int32_t* counts, int* U_out, int* G_out) {
  __shared__ ExpertCounts warp_sum[kPlanThreads / kWarpSize];
  const int per = (n + kPlanThreads - 1) / kPlanThreads;
  const int e0 = static_cast<int>(threadIdx.x) * per, e1 = min(e0 + per, n);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  ExpertCounts v{};
  for (int e = e0; e < e1; ++e) v = add(v, expert_counts(cnt[e], mmvq_max_rows));
  ExpertCounts inc = v;  // inclusive scan over the warp
  for (int o = 1; o < kWarpSize; o *= 2) {
    const ExpertCounts u = shfl_up(inc, o);
    if (lane >= o) inc = add(inc, u);
  }
  if (lane == kWarpSize - 1) warp_sum[warp] = inc;
  __syncthreads();
  ExpertCounts base{};  // exclusive: inc - v
  base.pairs = inc.pairs - v.pairs;
  base.used = inc.used - v.used;
  base.small = inc.small - v.small;
  base.even = inc.even - v.even;
  base.odd = inc.odd - v.odd;
  int gs = 0, ge = 0;  // all experts' MMVQ groups, and the MMQ groups of the even part
  for (int w = 0; w < kPlanThreads / kWarpSize; ++w) {
    if (w < warp) base = add(base, warp_sum[w]);
    gs += warp_sum[w].small;
    ge += warp_sum[w].even;
  }
  for (int e = e0; e < e1; ++e) {
    const ExpertCounts c = expert_counts(cnt[e], mmvq_max_rows);
    first[e] = base.pairs;
    uidx[e] = cnt[e] > 0 ? base.used : -1;
    gfirst[e] = c.small != 0 ? base.small : c.odd != 0 ? gs + ge + base.odd : gs + base.even;
    base = add(base, c);
  }
  if (threadIdx.x == kPlanThreads - 1) {
    const int G = base.small + base.even + base.odd;
    counts[0] = 2 * G;
    counts[1] = G;
    counts[2] = base.used;
    counts[3] = base.small;
    *U_out = base.used;
    *G_out = G;
  }
  __syncthreads();
}

// One block, PlanSmem's shared memory. Every global read the plan needs is issued when the block
// starts, before any result is used: the status word, the picks and their weights (staged), and
// each expert's slot followed by its three slot pointers (staged; the slot table is the layer's,
// not the selection's, so these do not wait for the header). Then, in shared memory: the counts
// per expert, their scan (pair rows and groups in ascending expert id), the picks' ranks
// (rank_picks, warp 0) beside the experts' group headers (expert_groups, the other warps), and
// one pass over the picks (pick_rows); above kOneWarpPicks picks every warp ranks a chunk first
// (rank_picks_warps), then the group headers. Every step is a few shared loads deep: the plan was a
// chain of dependent round trips to L2 and a serial scan of the picks per expert, 20 us at
// T = 8 beside the shared expert's GEMV (docs/performance.md).
__global__ void __launch_bounds__(kPlanThreads) route_plan_kernel(PlanArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int U_sh, G_sh;
  const int n = static_cast<int>(a.n);
  const int64_t P = a.T * a.k;
  const DevicePlanLayout D(a.T, a.k);
  const RouteHeaderLayout L{a.T, a.k};
  const PlanSmem S(n, P);
  auto* groups = reinterpret_cast<MmvqGroup*>(a.plan + D.groups);
  auto* rows = reinterpret_cast<int32_t*>(a.plan + D.rows);
  auto* weights = reinterpret_cast<float*>(a.plan + D.weights);
  auto* counts = reinterpret_cast<int32_t*>(a.plan + D.counts);
  auto* scratch = reinterpret_cast<int32_t*>(a.plan + D.scratch);
  int* cnt = reinterpret_cast<int*>(smem);
  int* first = cnt + n;
  int* uidx = first + n;
  int* gfirst = uidx + n;
  int* run = gfirst + n;  // [S.runs][n]
  auto* sptr = reinterpret_cast<const uint8_t**>(smem + S.ptr);
  auto* spick = reinterpret_cast<int32_t*>(smem + S.pick);
  const int32_t* hpicks = a.hdr + RouteHeaderLayout::kPicks;
  const int32_t* hw = a.hdr + L.weights();
  const PlanView v{S.picks ? spick : hpicks, S.picks ? spick + P : hw,
                   S.picks ? spick + 2 * P : scratch, scratch, S.ptrs ? sptr : nullptr};
  const int32_t status = a.hdr[RouteHeaderLayout::kStatus];
  if (S.picks)
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      spick[i] = hpicks[i];
      spick[P + i] = hw[i];
    }
  if (S.ptrs) {  // the slots of this thread's experts, then their pointers, all in flight
    int32_t slot[kExpertsPerThread];
#pragma unroll
    for (int j = 0; j < kExpertsPerThread; ++j) {
      const int e = static_cast<int>(threadIdx.x) + j * kPlanThreads;
      slot[j] = e < n ? a.slots[e] : -1;
    }
#pragma unroll
    for (int j = 0; j < kExpertsPerThread; ++j) {
      const int e = static_cast<int>(threadIdx.x) + j * kPlanThreads;
      if (e >= n) continue;
      const bool res = slot[j] >= 0;  // a miss raised the status: its pointers are never used
      sptr[e] = res ? a.slot_gate[slot[j]] : nullptr;
      sptr[n + e] = res ? a.slot_up[slot[j]] : nullptr;
      sptr[2 * n + e] = res ? a.slot_down[slot[j]] : nullptr;
    }
  }
  for (int e = threadIdx.x; e < n; e += blockDim.x) cnt[e] = 0;
  for (int e = threadIdx.x; e < S.runs * n; e += blockDim.x) run[e] = 0;
  __syncthreads();
  if (status != 0) {  // no valid routing: compute nothing
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      rows[i] = 0;
      weights[i] = 0.0f;
    }
    if (threadIdx.x == 0) counts[0] = counts[1] = counts[2] = counts[3] = 0;
    return;
  }
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x) atomicAdd(&cnt[v.picks[i]], 1);
  __syncthreads();
  scan_experts(n, a.mmvq_max_rows, cnt, first, uidx, gfirst, counts, &U_sh, &G_sh);
  zero_groups(groups, P, G_sh);
  if (S.runs > 1) rank_picks_warps(v, P, n, first, run);
  else rank_picks(v, P, first, run);  // warp 0, beside the group headers of the other warps
  for (int e = threadIdx.x; e < n; e += blockDim.x)  // independent of the ranks
    if (cnt[e] > 0) expert_groups(a, v, e, cnt[e], uidx[e], U_sh, gfirst[e], groups);
  __syncthreads();  // the pair rows written (shared memory, or global memory of this block)
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x)
    pick_rows(a, v, i, first, gfirst, groups, rows, weights);
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
  const PlanSmem S(rp.n_routed, T * rp.topk);
  // PlanSmem may pass 48 KB: the limit raised to the largest plan once per (kernel, device).
  allow_dynamic_smem(reinterpret_cast<const void*>(route_plan_kernel),
                     static_cast<int>(kPlanSmemMax));
  route_plan_kernel<<<1, kPlanThreads, S.bytes, as_stream(stream)>>>(a);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moecheck::cuda
