// mmq: the batched form of mmvq (groups of up to 8 activation rows of one expert, many groups
// per launch), for experts with more rows than an MMVQ group: Q2_K / Q3_K rows read in place
// through the slot table, integer parts on the int8 tensor cores (cuda/mmq_tile.cuh), float
// parts and order exactly docs/numerics.md "mmvq_q2k, mmvq_q3k" ("mmq" there): the same bits
// as mmvq and emu::mmvq for every (row, token), whatever the grouping.
//
// Work. Items are counted per 64-row tile, projection and group position gi of the live range.
// Groups gi and gi + 1 (gi even) that read the same slot (the plan's consecutive groups of one
// expert) form a pair item: its 64 rows in two phases of 32 rows against 16 token columns, each
// weight fragment feeding the products of both 8-column halves, so a row's decode is shared by
// 16 tokens. Any other group is a single item: 64 rows (two 16-row mma tiles a warp) against its
// 8 columns. A pair's second group is skipped; the plain form's column blocks of 16 tokens are
// pairs of 8-token halves, the last one single when it holds 8 tokens or fewer. A persistent
// grid (an odd count of blocks, so that a block's items alternate between the two parities)
// walks the items row tile major, so the blocks running together read the same rows for the
// groups of one expert, from L2. K is walked in rounds of 4 super-blocks (32 q8_1 units, one per
// contract lane), double-buffered in shared memory by 16-byte cp.async: per row the 16-byte-aligned
// cover of the round's blocks (a row's phase is its address mod 16), per token the round's 32 q8_1
// blocks.
// Warps. 8 warps: row warp wr (0, 1) owns 16 rows (pair items) or 32 rows (single items) of the
// item, class warp wc (0..3) owns the units b = 2 wc, 2 wc + 1 of every super-block, i.e. the
// contract lanes l = 8 a + b (a = sb % 4): its lanes keep those 8 lanes' chains acc[a][b] for
// their 4 outputs per 16 x 8 mma tile and extend them in increasing unit, as the contract's
// lane l does. At the end of an item the butterfly's tree is replayed: levels 16 and 8 (over a)
// in registers, giving Q(b) = (v[b] + v[16 + b]) + (v[8 + b] + v[24 + b]); level 4 (b ^ 4: class
// warp wc ^ 2) and level 2 (b ^ 2: wc ^ 1) through shared memory; level 1 (b ^ 1) in registers.
// Float addition is commutative, so each sum equals the butterfly's lane-0 value bit for bit.
// Ragged rows: the checked variant (rows not a multiple of 64) skips loads and stores of rows
// past the end; token columns past a half's n are never stored. Reads: each row's cover may
// reach up to 15 bytes past its last block, inside the 16-byte chunk holding it (weight buffers
// are allocated with 16 bytes of slack; see cuda::mmq_groups).
#include <string>

#include "core/error.h"
#include "cuda/bulk_copy.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "cuda/mmq_tile.cuh"

namespace moecheck::cuda {
namespace {

using namespace mmq_tile;

constexpr int kRowWarps = 2, kClassWarps = 4;
constexpr int kParts = 2;      // a pair item's 8-column halves, a single item's 16-row tiles a warp
constexpr int kTileRows = 32;  // a pair item's rows per phase
constexpr int kWideRows = 2 * kTileRows;
constexpr int kItemCols = 2 * kMaxGroupRows;                   // a pair item's token columns
constexpr int kThreads = kRowWarps * kClassWarps * kWarpSize;  // 256
constexpr int kSbPerRound = 4;
constexpr int kActStride = 32 * 36 + 16;  // bytes per token per round (1168 = 4 x 73 words)

template <bool kQ2K>
struct Q {
  static constexpr int kBlock = kQ2K ? 84 : 110;
  // Bytes per row per round: the cover of 4 blocks plus a 16-byte phase, 4 x odd words (no
  // bank conflicts between the 8 row lanes of a fragment).
  static constexpr int kStride = kQ2K ? 368 : 496;
  static constexpr int kWeights = kWideRows * kStride;  // room for a single item's 64 rows
  static constexpr int kStage = kWeights + kItemCols * kActStride;
  static constexpr int kSmem = 2 * kStage + kRowWarps * 2 * kWarpSize * 16 * 4;
};

struct MmqArgs {
  const uint8_t* const* slots;  // device slot table (groups), or nullptr (plain)
  const MmvqGroup* groups;      // nullptr: plain form, column block g = tokens 16g .. 16g + 15
  const uint8_t* w;             // plain form's matrix
  int64_t T;                    // plain form's token count
  const int32_t* dev_range;     // nullable: the live groups [range[3], range[1]) per projection
  int64_t g_begin, g_end;       // the groups per projection (when dev_range is null); plain
                                // form: its column blocks
  int64_t proj_stride;
  int n_proj;
  const BlockQ8_1* a;
  float* y;
  int64_t rows, K;
};

// An item: one matrix against up to 16 token columns in two halves of 8 (half h: n[h] tokens;
// groups form: the halves are groups g[0] and g[0] + 1, their a_row and y_row; plain form: g
// nullptr, rows t0 + column). Pair items (wide false): rows row0 .. row0 + 31 of the phase (row0
// moves by 32 for the second), both halves. Single items (wide, n[1] = 0): rows row0 .. row0 +
// 63, half 0 only.
struct Item {
  const uint8_t* w;
  const MmvqGroup* g;
  int n[2];
  int t0;
  int row0;
  bool wide;
};

__device__ __forceinline__ int32_t item_a_row(const Item& m, bool h1, int i) {
  return m.g != nullptr ? m.g[h1 ? 1 : 0].a_row[i] : m.t0 + (h1 ? kMaxGroupRows : 0) + i;
}
__device__ __forceinline__ int32_t item_y_row(const Item& m, bool h1, int i) {
  return m.g != nullptr ? m.g[h1 ? 1 : 0].y_row[i] : m.t0 + (h1 ? kMaxGroupRows : 0) + i;
}

// Item `it` of the launch (64-row tile rt, projection, group position gi), or false when the
// item before it computes its outputs (a pair's second group: gi odd, and group gi - 1 reads the
// same slot). A pair item computes its 64 rows in two phases of 32 (row0, then row0 + 32).
__device__ __forceinline__ bool item_of(const MmqArgs& p, int64_t it, int64_t ng, int64_t g0,
                                        Item& m) {
  const int64_t per_tile = ng * p.n_proj;
  const int64_t rt = it / per_tile, rem = it % per_tile;
  const int64_t proj = rem / ng, gi = rem % ng;
  m.row0 = static_cast<int>(rt * kWideRows);
  if (p.groups == nullptr) {
    m.w = p.w;
    m.g = nullptr;
    m.t0 = static_cast<int>(gi * kItemCols);
    const int64_t left = p.T - m.t0;
    m.n[0] = static_cast<int>(left < kMaxGroupRows ? left : kMaxGroupRows);
    m.n[1] = static_cast<int>(left - kMaxGroupRows <= 0              ? 0
                              : left - kMaxGroupRows < kMaxGroupRows ? left - kMaxGroupRows
                                                                     : kMaxGroupRows);
  } else {
    const MmvqGroup* base = p.groups + proj * p.proj_stride + g0;
    const int32_t slot = __ldg(&base[gi].slot);
    const bool odd = (gi & 1) != 0;
    const int64_t other = odd ? gi - 1 : gi + 1;  // the pair partner's position
    const bool paired = other < ng && __ldg(&base[other].slot) == slot;
    if (odd && paired) return false;
    m.w = p.slots[slot];
    m.g = base + gi;
    m.t0 = 0;
    m.n[0] = __ldg(&base[gi].n);
    m.n[1] = paired ? __ldg(&base[gi + 1].n) : 0;
  }
  m.wide = m.n[1] == 0;
  return true;
}

// The first item at or after `it` (stepping by the grid) that computes outputs.
__device__ __forceinline__ int64_t next_item(const MmqArgs& p, int64_t it, int64_t items,
                                             int64_t ng, int64_t g0, Item& m) {
  while (it < items && !item_of(p, it, ng, g0, m)) it += gridDim.x;
  return it;
}

// Round r of item m into stage buffer `st`: per row the 16-byte chunks covering its blocks
// 4r .. 4r + nsb_r - 1, per token column its q8_1 blocks 32r .. 32r + 8 nsb_r - 1. Pair items:
// 8 threads a row (32 rows), 16 a column (16 columns); single items: 4 a row (64), 32 a column
// (8).
template <bool kQ2K, bool kCheck>
__device__ void load_round(const MmqArgs& p, const Item& m, int r, int nsb, uint8_t* st) {
  static_assert(kThreads == 8 * kTileRows && kThreads == 4 * kWideRows &&
                kThreads == 16 * kItemCols && kThreads == kWarpSize * kMaxGroupRows);
  const int nsb_r = nsb - kSbPerRound * r < kSbPerRound ? nsb - kSbPerRound * r : kSbPerRound;
  const int tpr = m.wide ? 4 : 8, tpc = m.wide ? 32 : 16;
  const int row = static_cast<int>(threadIdx.x) / tpr;
  if (!kCheck || m.row0 + row < p.rows) {
    const int64_t row_bytes = static_cast<int64_t>(nsb) * Q<kQ2K>::kBlock;
    const uintptr_t src = reinterpret_cast<uintptr_t>(m.w) +
                          static_cast<uintptr_t>((m.row0 + row) * row_bytes) +
                          static_cast<uintptr_t>(r * kSbPerRound * Q<kQ2K>::kBlock);
    const uintptr_t a16 = src & ~uintptr_t{15};
    const int chunks = static_cast<int>((src + nsb_r * Q<kQ2K>::kBlock - a16 + 15) / 16);
    uint8_t* dst = st + row * Q<kQ2K>::kStride;
    for (int ch = static_cast<int>(threadIdx.x) % tpr; ch < chunks; ch += tpr)
      bulk::async16(dst + 16 * ch, reinterpret_cast<const void*>(a16 + 16 * ch));
  }
  const int col = static_cast<int>(threadIdx.x) / tpc, i = col % kMaxGroupRows;
  const bool h1 = col >= kMaxGroupRows;  // selects, not a run-time index into the item
  if (i < (h1 ? m.n[1] : m.n[0])) {
    const int64_t arow = item_a_row(m, h1, i);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p.a + arow * (p.K / kQK8_1) + 32 * r);
    uint8_t* dst = st + Q<kQ2K>::kWeights + col * kActStride;
    const int chunks = nsb_r * 18;  // 8 blocks of 36 bytes per super-block: 18 chunks
    for (int ch = static_cast<int>(threadIdx.x) % tpc; ch < chunks; ch += tpc)
      bulk::async16(dst + 16 * ch, src + 16 * ch);
  }
  bulk::async_commit();
}

// The lane's chains for round r from stage buffer st: acc[a][bb][part][output], part the half
// (pair items) or the 16-row tile (single items, kWide).
template <bool kQ2K, bool kWide>
__device__ __forceinline__ void compute_round(const Item& m, int r, int nsb, const uint8_t* st,
                                              float (&acc)[4][2][kParts][4]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp / kClassWarps, wc = warp % kClassWarps, g = lane / 4, c = lane % 4;
  const int nsb_r = nsb - kSbPerRound * r < kSbPerRound ? nsb - kSbPerRound * r : kSbPerRound;
  const uint32_t row_bytes = static_cast<uint32_t>(nsb) * Q<kQ2K>::kBlock;
  const uint8_t* act = st + Q<kQ2K>::kWeights;
  constexpr int halves = kWide ? 1 : 2;  // a pair item's second half holds a token or more
  constexpr int kTiles = kWide ? 2 : 1;  // 16-row mma tiles of the warp
  // Each row's phase: its round start's address mod 16 (32-bit arithmetic suffices: only the
  // low 4 bits are used).
  int ph[kTiles][2];
#pragma unroll
  for (int tl = 0; tl < kTiles; ++tl)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wr * 16 * kTiles + tl * 16 + g + 8 * h;
      const uint32_t src = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(m.w)) +
                           static_cast<uint32_t>(m.row0 + row) * row_bytes +
                           static_cast<uint32_t>(r * kSbPerRound * Q<kQ2K>::kBlock);
      ph[tl][h] = row * Q<kQ2K>::kStride + static_cast<int>(src & 15u);
    }
#pragma unroll
  for (int a = 0; a < kSbPerRound; ++a) {
    if (a >= nsb_r) break;
    uint32_t b0[2][kParts], b1[2][kParts];  // the token columns' quants of units 8a + 2wc + bb
    float d8[2][kParts][2];
#pragma unroll
    for (int bb = 0; bb < 2; ++bb) {
      const int u = 8 * a + 2 * wc + bb;
#pragma unroll
      for (int hf = 0; hf < kParts; ++hf) {
        if (hf >= halves) break;
        const uint8_t* blk = act + (8 * hf + g) * kActStride + 36 * u;
        b0[bb][hf] = *reinterpret_cast<const uint32_t*>(blk + 4 + 4 * c);
        b1[bb][hf] = *reinterpret_cast<const uint32_t*>(blk + 20 + 4 * c);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          d8[bb][hf][j] = f16_operand(lds_u16(act, (8 * hf + 2 * c + j) * kActStride + 36 * u));
      }
    }
#pragma unroll
    for (int tl = 0; tl < kTiles; ++tl) {
      const RowSb r0 = row_sb<kQ2K>(st, ph[tl][0] + a * Q<kQ2K>::kBlock, wc, c);
      const RowSb r1 = row_sb<kQ2K>(st, ph[tl][1] + a * Q<kQ2K>::kBlock, wc, c);
      // Pair items: both halves into acc[a][bb][half]; single items: tile tl's chains against
      // half 0 into acc[a][bb][tl].
      float(&x0)[4] = acc[a][0][kWide ? tl : 0];
      float(&x1)[4] = acc[a][1][kWide ? tl : 0];
      float(&y0)[4] = acc[a][0][kWide ? tl : 1];
      float(&y1)[4] = acc[a][1][kWide ? tl : 1];
      if (tile_finite(r0, r1)) {
        unit_chain<kQ2K, 0, halves, true>(r0, r1, 2 * wc, b0[0], b1[0], d8[0], x0, y0);
        unit_chain<kQ2K, 1, halves, true>(r0, r1, 2 * wc + 1, b0[1], b1[1], d8[1], x1, y1);
      } else {
        unit_chain<kQ2K, 0, halves, false>(r0, r1, 2 * wc, b0[0], b1[0], d8[0], x0, y0);
        unit_chain<kQ2K, 1, halves, false>(r0, r1, 2 * wc + 1, b0[1], b1[1], d8[1], x1, y1);
      }
    }
  }
}

// The butterfly's tree over the lane's chains (header), then the stores of class warp 0.
template <bool kCheck>
__device__ void finish_item(const MmqArgs& p, const Item& m, float (&acc)[4][2][kParts][4],
                            float* xch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wr = warp / kClassWarps, wc = warp % kClassWarps, g = lane / 4, c = lane % 4;
  float q[kParts][2][4];  // Q(2 wc + bb) per output
#pragma unroll
  for (int x = 0; x < kParts; ++x)
#pragma unroll
    for (int bb = 0; bb < 2; ++bb)
#pragma unroll
      for (int o = 0; o < 4; ++o)
        q[x][bb][o] = add_rn(add_rn(acc[0][bb][x][o], acc[2][bb][x][o]),
                             add_rn(acc[1][bb][x][o], acc[3][bb][x][o]));
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
    for (int x = 0; x < kParts; ++x)
#pragma unroll
      for (int o = 0; o < 4; ++o) {
        const float s0 = add_rn(q[x][0][o], other[x * 8 + o]);      // S(0) = R(0) + R(2)
        const float s1 = add_rn(q[x][1][o], other[x * 8 + 4 + o]);  // S(1) = R(1) + R(3)
        const int i = 2 * c + (o & 1);                              // the column within its half
        // Pair items: half x of rows 16 wr ..; single items: tile x of rows 32 wr .., half 0.
        const bool h1 = !m.wide && x == 1;
        const int64_t row = m.row0 + (m.wide ? wr * 32 + x * 16 : wr * 16) + g + 8 * (o >> 1);
        if (i < (h1 ? m.n[1] : m.n[0]) && (!kCheck || row < p.rows)) {
          const int64_t yr = item_y_row(m, h1, i);
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
  const int64_t items = (p.rows + kWideRows - 1) / kWideRows * ng * p.n_proj;
  float* xch = reinterpret_cast<float*>(smem + 2 * Q<kQ2K>::kStage);
  // Items blockIdx.x, + gridDim.x, ... (those another item computes skipped); each in `rounds`
  // steps, the next step's round loaded while this one computes. The item is decoded once, when
  // its first round is loaded; its chains start at +0 once, before its first round.
  Item m;
  int64_t it = next_item(p, blockIdx.x, items, ng, g0, m);
  if (it >= items) return;
  load_round<kQ2K, kCheck>(p, m, 0, nsb, smem);
  int buf = 0;
  for (;;) {
    float acc[4][2][kParts][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int bb = 0; bb < 2; ++bb)
#pragma unroll
        for (int x = 0; x < kParts; ++x)
#pragma unroll
          for (int o = 0; o < 4; ++o) acc[a][bb][x][o] = 0.0f;
    Item m1 = m;  // the item of the step after the last round: this one's next phase, or the next
    int64_t it1 = it;
    bool more = true;
    for (int r = 0; r < rounds; ++r) {
      int r1 = r + 1;
      if (r1 == rounds) {
        r1 = 0;
        if (!m.wide && (m.row0 & kTileRows) == 0 && m.row0 + kTileRows < p.rows)
          m1.row0 = m.row0 + kTileRows;  // a pair item's second phase
        else it1 = next_item(p, it + gridDim.x, items, ng, g0, m1);
        more = it1 < items;
      }
      // One barrier per step: this step's round has landed (the only copy group in flight) and
      // every warp has finished the previous step, whose buffer the next round then refills.
      bulk::async_wait<0>();
      __syncthreads();
      if (more) load_round<kQ2K, kCheck>(p, m1, r1, nsb, smem + (buf ^ 1) * Q<kQ2K>::kStage);
      if (m.wide) compute_round<kQ2K, true>(m, r, nsb, smem + buf * Q<kQ2K>::kStage, acc);
      else compute_round<kQ2K, false>(m, r, nsb, smem + buf * Q<kQ2K>::kStage, acc);
      buf ^= 1;
    }
    finish_item<kCheck>(p, m, acc, xch);
    if (!more) break;
    m = m1;
    it = it1;
  }
}

template <bool kQ2K, bool kCheck>
void launch_typed(const MmqArgs& p, void* stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(mmq_kernel<kQ2K, kCheck>),
                     static_cast<int>(Q<kQ2K>::kSmem));
  const int sms = current_sm_count();
  // Persistent: two blocks per multiprocessor less one (an odd count: a block's items then
  // alternate between even and odd group positions, the odd ones of which may belong to the
  // item before); fewer when the host knows the items.
  int64_t grid = 2 * static_cast<int64_t>(sms) - 1;
  if (p.dev_range == nullptr) {
    const int64_t items = (p.rows + kWideRows - 1) / kWideRows * (p.g_end - p.g_begin) * p.n_proj;
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
  if (p.K <= 0 || p.K % kQK_K != 0 || p.K > (int64_t{1} << 24) || p.rows < 0 ||
      p.rows > (int64_t{1} << 30))
    throw InputError(where + "need K a positive multiple of 256 (at most 2^24) and rows in " +
                     "[0, 2^30], " + "found K=" + std::to_string(p.K) +
                     " rows=" + std::to_string(p.rows));
  if (p.rows == 0) return;
  require_aligned(p.a, 16, op, "a");
  require_aligned(p.y, 4, op, "y");
  const bool check = p.rows % kWideRows != 0;
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
  const MmqArgs p{nullptr, nullptr, w, T, nullptr, 0, (T + kItemCols - 1) / kItemCols,
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
