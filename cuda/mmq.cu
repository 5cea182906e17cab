// mmq: the batched form of mmvq (groups of up to 8 activation rows of one expert, many groups
// per launch), for experts with more rows than an MMVQ group: Q2_K / Q3_K rows read in place
// through the slot table, integer parts on the int8 tensor cores (cuda/mmq_tile.cuh), float
// parts and order exactly docs/numerics.md "mmvq_q2k, mmvq_q3k" ("mmq" there): the same bits
// as mmvq and emu::mmvq for every (row, token), whatever the grouping.
//
// Work. An item is 64 consecutive rows (a block tile) of one group's matrix against the
// group's n <= 8 token rows; a persistent grid walks the items (row tile major, so the blocks
// running together read the same rows for the groups of one expert, from L2). K is walked in
// rounds of 4 super-blocks (32 q8_1 units, one per contract lane), double-buffered
// in shared memory by 16-byte cp.async: per row the 16-byte-aligned cover of the round's blocks
// (a row's phase is its address mod 16), per token the round's 32 q8_1 blocks.
// Warps. 8 warps: row warp wr (0, 1) owns rows 32 wr .. 32 wr + 31 of the tile (two 16-row mma
// tiles), class warp wc (0..3) owns the units b = 2 wc, 2 wc + 1 of every super-block, i.e. the
// contract lanes l = 8 a + b (a = sb % 4): its lanes keep those 8 lanes' chains acc[a][b] for
// their 4 outputs per mma tile and extend them in increasing unit, as the contract's lane l
// does. At the end of an item the butterfly's tree is replayed: levels 16 and 8 (over a) in
// registers, giving Q(b) = (v[b] + v[16 + b]) + (v[8 + b] + v[24 + b]); level 4 (b ^ 4: class
// warp wc ^ 2) and level 2 (b ^ 2: wc ^ 1) through shared memory; level 1 (b ^ 1) in registers.
// Float addition is commutative, so each sum equals the butterfly's lane-0 value bit for bit.
// Ragged rows: the checked variant (rows not a multiple of 64) skips loads and stores of rows
// past the end; token columns past n are never stored. Reads: each row's cover may reach up to
// 15 bytes past its last block, inside the 16-byte chunk holding it (weight buffers are
// allocated with 16 bytes of slack; see cuda::mmq_groups).
#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/mmq_tile.cuh"

namespace moecheck::cuda {
namespace {

using namespace mmq_tile;

constexpr int kRowWarps = 2, kClassWarps = 4, kTiles = 2;
constexpr int kTileRows = kRowWarps * kTiles * 16;             // 64 rows per item
constexpr int kThreads = kRowWarps * kClassWarps * kWarpSize;  // 256
constexpr int kSbPerRound = 4;
constexpr int kActStride = 32 * 36 + 16;  // bytes per token per round (1168 = 4 x 73 words)

template <bool kQ2K>
struct Q {
  static constexpr int kBlock = kQ2K ? 84 : 110;
  // Bytes per row per round: the cover of 4 blocks plus a 16-byte phase, 4 x odd words (no
  // bank conflicts between the 8 row lanes of a fragment).
  static constexpr int kStride = kQ2K ? 368 : 496;
  static constexpr int kWeights = kTileRows * kStride;
  static constexpr int kStage = kWeights + kMaxGroupRows * kActStride;
  static constexpr int kSmem = 2 * kStage + kRowWarps * 2 * kWarpSize * 16 * 4;
};

struct MmqArgs {
  const uint8_t* const* slots;  // device slot table (groups), or nullptr (plain)
  const MmvqGroup* groups;      // nullptr: plain form, group g = tokens 8g .. 8g + 7 of w
  const uint8_t* w;             // plain form's matrix
  int64_t T;                    // plain form's token count
  const int32_t* dev_range;     // nullable: the live groups [range[3], range[1]) per projection
  int64_t g_begin, g_end;       // the groups per projection (when dev_range is null)
  int64_t proj_stride;
  int n_proj;
  const BlockQ8_1* a;
  float* y;
  int64_t rows, K;
};

struct Item {
  const uint8_t* w;
  int n;
  const int32_t* a_row;  // nullptr: rows t0 + i
  const int32_t* y_row;
  int t0;
  int64_t row0;
};

__device__ __forceinline__ Item item_of(const MmqArgs& p, int64_t it, int64_t ng, int64_t g0) {
  const int64_t per_tile = ng * p.n_proj;
  const int64_t rt = it / per_tile, rem = it % per_tile;
  const int64_t proj = rem / ng, g = g0 + rem % ng;
  Item m;
  m.row0 = rt * kTileRows;
  if (p.groups == nullptr) {
    m.w = p.w;
    m.t0 = static_cast<int>(g * kMaxGroupRows);
    m.n = static_cast<int>(p.T - m.t0 < kMaxGroupRows ? p.T - m.t0 : kMaxGroupRows);
    m.a_row = m.y_row = nullptr;
  } else {
    const MmvqGroup& G = p.groups[proj * p.proj_stride + g];
    m.w = p.slots[G.slot];
    m.n = G.n;
    m.a_row = G.a_row;
    m.y_row = G.y_row;
    m.t0 = 0;
  }
  return m;
}

__device__ __forceinline__ void cp_async16(uint8_t* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}

// Round r of item m into stage buffer `st`: per row the 16-byte chunks covering its blocks
// 4r .. 4r + nsb_r - 1, per token its q8_1 blocks 32r .. 32r + 8 nsb_r - 1.
template <bool kQ2K, bool kCheck>
__device__ void load_round(const MmqArgs& p, const Item& m, int r, int nsb, uint8_t* st) {
  static_assert(kThreads == 4 * kTileRows && kThreads == kWarpSize * kMaxGroupRows,
                "four threads per weight row, one warp per token");
  const int nsb_r = nsb - kSbPerRound * r < kSbPerRound ? nsb - kSbPerRound * r : kSbPerRound;
  const int row = threadIdx.x / 4;
  if (!kCheck || m.row0 + row < p.rows) {
    const int64_t row_bytes = static_cast<int64_t>(nsb) * Q<kQ2K>::kBlock;
    const uintptr_t src = reinterpret_cast<uintptr_t>(m.w) +
                          static_cast<uintptr_t>((m.row0 + row) * row_bytes) +
                          static_cast<uintptr_t>(r * kSbPerRound * Q<kQ2K>::kBlock);
    const uintptr_t a16 = src & ~uintptr_t{15};
    const int chunks = static_cast<int>((src + nsb_r * Q<kQ2K>::kBlock - a16 + 15) / 16);
    uint8_t* dst = st + row * Q<kQ2K>::kStride;
    for (int ch = threadIdx.x % 4; ch < chunks; ch += 4)
      cp_async16(dst + 16 * ch, reinterpret_cast<const void*>(a16 + 16 * ch));
  }
  const int t = threadIdx.x / kWarpSize;
  if (t < m.n) {
    const int64_t arow = m.a_row != nullptr ? m.a_row[t] : m.t0 + t;
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p.a + arow * (p.K / kQK8_1) + 32 * r);
    uint8_t* dst = st + Q<kQ2K>::kWeights + t * kActStride;
    const int chunks = nsb_r * 18;  // 8 blocks of 36 bytes per super-block: 18 chunks
    for (int ch = threadIdx.x % kWarpSize; ch < chunks; ch += kWarpSize)
      cp_async16(dst + 16 * ch, src + 16 * ch);
  }
  asm volatile("cp.async.commit_group;");
}

// The lane's chains for round r from stage buffer st: acc[tile][a][bb][output].
template <bool kQ2K>
__device__ __forceinline__ void compute_round(const Item& m, int r, int nsb, const uint8_t* st,
                                              float (&acc)[kTiles][4][2][4]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp / kClassWarps, wc = warp % kClassWarps, g = lane / 4, c = lane % 4;
  const int nsb_r = nsb - kSbPerRound * r < kSbPerRound ? nsb - kSbPerRound * r : kSbPerRound;
  const uint32_t row_bytes = static_cast<uint32_t>(nsb) * Q<kQ2K>::kBlock;
  const uint8_t* act = st + Q<kQ2K>::kWeights;
  int ph[kTiles][2];  // each row's phase: its round start's address mod 16 (32-bit arithmetic
                      // suffices: only the low 4 bits are used)
#pragma unroll
  for (int tl = 0; tl < kTiles; ++tl)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wr * 32 + tl * 16 + g + 8 * h;
      const uint32_t src = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(m.w)) +
                           static_cast<uint32_t>(m.row0 + row) * row_bytes +
                           static_cast<uint32_t>(r * kSbPerRound * Q<kQ2K>::kBlock);
      ph[tl][h] = row * Q<kQ2K>::kStride + static_cast<int>(src & 15u);
    }
#pragma unroll
  for (int a = 0; a < kSbPerRound; ++a) {
    if (a >= nsb_r) break;
    uint32_t b0[2], b1[2];  // the token columns' quants of units 8a + 2wc + bb
    float d8[2][2];
#pragma unroll
    for (int bb = 0; bb < 2; ++bb) {
      const int u = 8 * a + 2 * wc + bb;
      const uint8_t* blk = act + g * kActStride + 36 * u;
      b0[bb] = *reinterpret_cast<const uint32_t*>(blk + 4 + 4 * c);
      b1[bb] = *reinterpret_cast<const uint32_t*>(blk + 20 + 4 * c);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        d8[bb][j] = f16_operand(lds_u16(act, (2 * c + j) * kActStride + 36 * u));
    }
#pragma unroll
    for (int tl = 0; tl < kTiles; ++tl) {
      const RowSb r0 = row_sb<kQ2K>(st, ph[tl][0] + a * Q<kQ2K>::kBlock, wc, c);
      const RowSb r1 = row_sb<kQ2K>(st, ph[tl][1] + a * Q<kQ2K>::kBlock, wc, c);
      unit_chain<kQ2K, 0>(r0, r1, 2 * wc, b0[0], b1[0], d8[0], acc[tl][a][0]);
      unit_chain<kQ2K, 1>(r0, r1, 2 * wc + 1, b0[1], b1[1], d8[1], acc[tl][a][1]);
    }
  }
}

// The butterfly's tree over the lane's chains (header), then the stores of class warp 0.
template <bool kCheck>
__device__ void finish_item(const MmqArgs& p, const Item& m, float (&acc)[kTiles][4][2][4],
                            float* xch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp / kClassWarps, wc = warp % kClassWarps, g = lane / 4, c = lane % 4;
  float q[kTiles][2][4];  // Q(2 wc + bb) per output
#pragma unroll
  for (int tl = 0; tl < kTiles; ++tl)
#pragma unroll
    for (int bb = 0; bb < 2; ++bb)
#pragma unroll
      for (int o = 0; o < 4; ++o)
        q[tl][bb][o] = add_rn(add_rn(acc[tl][0][bb][o], acc[tl][2][bb][o]),
                              add_rn(acc[tl][1][bb][o], acc[tl][3][bb][o]));
  // xch: [row warp][2 slots][32 lanes][16 values]
  float* mine = xch + ((wr * 2 + (wc & 1)) * kWarpSize + lane) * 16;
  if (wc >= 2) {  // level 4: b ^ 4 lives in class warp wc ^ 2
#pragma unroll
    for (int v = 0; v < 16; ++v) mine[v] = q[v / 8][(v / 4) % 2][v % 4];
  }
  __syncthreads();
  if (wc < 2) {
#pragma unroll
    for (int v = 0; v < 16; ++v)
      q[v / 8][(v / 4) % 2][v % 4] = add_rn(q[v / 8][(v / 4) % 2][v % 4], mine[v]);
  }
  __syncthreads();
  if (wc == 1) {  // level 2: b ^ 2 lives in class warp wc ^ 1
#pragma unroll
    for (int v = 0; v < 16; ++v) mine[v] = q[v / 8][(v / 4) % 2][v % 4];
  }
  __syncthreads();
  if (wc == 0) {
    const float* other = xch + ((wr * 2 + 1) * kWarpSize + lane) * 16;
#pragma unroll
    for (int tl = 0; tl < kTiles; ++tl)
#pragma unroll
      for (int o = 0; o < 4; ++o) {
        const float s0 = add_rn(q[tl][0][o], other[tl * 8 + o]);      // S(0) = R(0) + R(2)
        const float s1 = add_rn(q[tl][1][o], other[tl * 8 + 4 + o]);  // S(1) = R(1) + R(3)
        const int col = 2 * c + (o & 1);
        const int64_t row = m.row0 + wr * 32 + tl * 16 + g + 8 * (o >> 1);
        if (col < m.n && (!kCheck || row < p.rows)) {
          const int64_t yr = m.y_row != nullptr ? m.y_row[col] : m.t0 + col;
          p.y[yr * p.rows + row] = add_rn(s0, s1);  // level 1
        }
      }
  }
}

template <bool kQ2K, bool kCheck>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(MmqArgs p) {
  extern __shared__ __align__(16) uint8_t smem[];
  int64_t g0 = p.g_begin, g1 = p.g_end;
  if (p.dev_range != nullptr) {
    g0 = p.dev_range[3];
    g1 = p.dev_range[1];
  }
  const int64_t ng = g1 - g0;
  if (ng <= 0) return;
  const int nsb = static_cast<int>(p.K / kQK_K), rounds = (nsb + kSbPerRound - 1) / kSbPerRound;
  const int64_t items = (p.rows + kTileRows - 1) / kTileRows * ng * p.n_proj;
  float* xch = reinterpret_cast<float*>(smem + 2 * Q<kQ2K>::kStage);
  float acc[kTiles][4][2][4];
  // Items blockIdx.x, + gridDim.x, ...; each in `rounds` steps, the next step's round loaded
  // while this one computes. The item is decoded once, when its first round is loaded.
  int64_t it = blockIdx.x;
  if (it >= items) return;
  Item m = item_of(p, it, ng, g0);
  load_round<kQ2K, kCheck>(p, m, 0, nsb, smem);
  int r = 0, buf = 0;
  for (;;) {
    int r1 = r + 1;
    int64_t it1 = it;
    Item m1 = m;
    if (r1 == rounds) {
      r1 = 0;
      it1 = it + gridDim.x;
      if (it1 < items) m1 = item_of(p, it1, ng, g0);
    }
    const bool more = it1 < items;
    // One barrier per step: this step's round has landed (the only copy group in flight) and
    // every warp has finished the previous step, whose buffer the next round then refills.
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    if (more) load_round<kQ2K, kCheck>(p, m1, r1, nsb, smem + (buf ^ 1) * Q<kQ2K>::kStage);
    if (r == 0) {
#pragma unroll
      for (int tl = 0; tl < kTiles; ++tl)
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int bb = 0; bb < 2; ++bb)
#pragma unroll
            for (int o = 0; o < 4; ++o) acc[tl][a][bb][o] = 0.0f;
    }
    compute_round<kQ2K>(m, r, nsb, smem + buf * Q<kQ2K>::kStage, acc);
    if (r == rounds - 1) finish_item<kCheck>(p, m, acc, xch);
    if (!more) break;
    m = m1;
    r = r1;
    it = it1;
    buf ^= 1;
  }
}

template <bool kQ2K, bool kCheck>
void launch_typed(const MmqArgs& p, void* stream) {
  static int sms = 0;
  if (sms == 0) {
    sms = current_sm_count();
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(
        mmq_kernel<kQ2K, kCheck>, cudaFuncAttributeMaxDynamicSharedMemorySize, Q<kQ2K>::kSmem));
  }
  // Persistent: two blocks per multiprocessor (the shared memory of one is under half of the
  // multiprocessor's); fewer when the host knows the items.
  int64_t grid = 2 * static_cast<int64_t>(sms);
  if (p.dev_range == nullptr) {
    const int64_t items = (p.rows + kTileRows - 1) / kTileRows * (p.g_end - p.g_begin) * p.n_proj;
    grid = items < grid ? items : grid;
  }
  if (grid <= 0) return;
  mmq_kernel<kQ2K, kCheck>
      <<<static_cast<unsigned>(grid), kThreads, Q<kQ2K>::kSmem, as_stream(stream)>>>(p);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

void launch(const MmqArgs& p, GgmlType t, const char* op, void* stream) {
  const std::string where = std::string("cuda::") + op + ": ";
  if (t != GgmlType::kQ2K && t != GgmlType::kQ3K)
    throw InputError(where + "weight type must be Q2_K (10) or Q3_K (11), found " +
                     std::to_string(static_cast<uint32_t>(t)));
  if (p.K <= 0 || p.K % kQK_K != 0 || p.K > (int64_t{1} << 24) || p.rows < 0)
    throw InputError(where + "need K a positive multiple of 256 (at most 2^24) and rows >= 0, " +
                     "found K=" + std::to_string(p.K) + " rows=" + std::to_string(p.rows));
  if (p.rows == 0) return;
  require_aligned(p.a, 16, op, "a");
  require_aligned(p.y, 4, op, "y");
  const bool check = p.rows % kTileRows != 0;
  if (t == GgmlType::kQ2K) {
    if (check) launch_typed<true, true>(p, stream);
    else launch_typed<true, false>(p, stream);
  } else {
    if (check) launch_typed<false, true>(p, stream);
    else launch_typed<false, false>(p, stream);
  }
}

}  // namespace

void mmq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
         int64_t T, void* stream) {
  if (T < 0) throw InputError("cuda::mmq: T must be >= 0, found " + std::to_string(T));
  require_aligned(w, 16, "mmq", "w");
  const MmqArgs p{nullptr, nullptr, w, T, nullptr, 0, (T + kMaxGroupRows - 1) / kMaxGroupRows,
                  0,       1,       a, y, rows,    K};
  if (T > 0) launch(p, t, "mmq", stream);
}

void mmq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                int n_proj, int64_t proj_stride, const BlockQ8_1* a, float* y, int64_t rows,
                int64_t K, void* stream) {
  if (n_groups < 0 || n_proj < 1 || (n_proj > 1 && proj_stride < n_groups))
    throw InputError("cuda::mmq_groups: need n_groups >= 0, n_proj >= 1 and proj_stride >= " +
                     std::string("n_groups, found ") + std::to_string(n_groups) + ", " +
                     std::to_string(n_proj) + ", " + std::to_string(proj_stride));
  if (n_groups == 0) return;
  require_aligned(slots, 8, "mmq_groups", "slots (pointer table)");
  require_aligned(groups, 4, "mmq_groups", "groups");
  const MmqArgs p{slots,       groups, nullptr, 0, nullptr, 0, n_groups,
                  proj_stride, n_proj, a,       y, rows,    K};
  launch(p, t, "mmq_groups", stream);
}

void mmq_groups_planned(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                        const int32_t* counts, int n_proj, int64_t proj_stride, const BlockQ8_1* a,
                        float* y, int64_t rows, int64_t K, void* stream) {
  if (n_proj < 1 || proj_stride < 0)
    throw InputError("cuda::mmq_groups_planned: need n_proj >= 1 and proj_stride >= 0, found " +
                     std::to_string(n_proj) + ", " + std::to_string(proj_stride));
  if (proj_stride == 0) return;
  require_aligned(slots, 8, "mmq_groups_planned", "slots (pointer table)");
  require_aligned(groups, 4, "mmq_groups_planned", "groups");
  require_aligned(counts, 16, "mmq_groups_planned", "counts");
  const MmqArgs p{slots, groups, nullptr, 0, counts, 0, 0, proj_stride, n_proj, a, y, rows, K};
  launch(p, t, "mmq_groups_planned", stream);
}

}  // namespace moecheck::cuda
