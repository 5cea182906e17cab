// mmvq: Q2_K / Q3_K weight rows read in place times q8_1 activation rows, f32 out; groups of up
// to kMaxGroupRows activation rows per weight matrix, and the one-token form running all
// selected experts of a projection in one launch (base pointers from a device slot table).
// Contract: docs/numerics.md "mmvq_q2k, mmvq_q3k"; twins: emu::mmvq, emu::mmvq_experts.
// Schedule: a tile is W consecutive rows (W = 2, 4, 8 warps per block) of one group's matrix.
// A persistent grid walks the tiles, each block a contiguous range; tiles t + 1 and t + 2 are
// copied into shared memory with 16-byte cp.async (three buffers) while tile t is computed.
// Warp w computes row w of the tile for every token of the group: lane l takes units
// g = l, l + 32, ... (exact dp4a integer parts, the float part of numerics.md), then the
// butterfly. Loads never change the arithmetic. Performance: docs/performance.md "GPU".
#include <cuda_pipeline.h>

#include <string>

#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/kernels.h"
#include "emulate/error.h"

namespace moecheck::cuda {
namespace {

enum class Form : int { kPlain, kExperts, kGroups };

struct MmvqParams {
  Form form;
  const uint8_t* w;             // kPlain
  const uint8_t* const* table;  // kExperts, kGroups: device slot table
  const MmvqGroup* groups;      // kGroups
  const BlockQ8_1* a;
  bool a_per_expert;            // kExperts
  float* y;
  int64_t rows;
  int64_t K;
  int64_t T;                    // kPlain
  int row_bytes;
  int max_n;                    // every group has at most max_n tokens
  int64_t n_groups;
};

// A group's matrix base and token count, and its token rows (activation row, output row).
// Every thread reads these itself (read-only, cached loads): no thread waits on another's
// pointer load before it can issue its copies.
// A slot pointer from the device table through the read-only path.
__device__ __forceinline__ const uint8_t* load_slot(const uint8_t* const* table, int64_t i) {
  return reinterpret_cast<const uint8_t*>(__ldg(reinterpret_cast<const unsigned long long*>(table) + i));
}

struct GroupInfo {
  const uint8_t* base;
  int n;
};

__device__ __forceinline__ GroupInfo group_info(const MmvqParams& p, int64_t group) {
  if (p.form == Form::kPlain) {
    const int64_t t0 = group * kMaxGroupRows;
    return {p.w, static_cast<int>(p.T - t0 < kMaxGroupRows ? p.T - t0 : kMaxGroupRows)};
  }
  if (p.form == Form::kExperts) return {load_slot(p.table, group), 1};
  const MmvqGroup* gr = p.groups + group;
  const int n = __ldg(&gr->n);
  if (n < 0 || n > p.max_n) __trap();  // a group larger than the launch was sized for
  return {load_slot(p.table, __ldg(&gr->slot)), n};
}

__device__ __forceinline__ int act_row(const MmvqParams& p, int64_t group, int i) {
  if (p.form == Form::kPlain) return static_cast<int>(group * kMaxGroupRows + i);
  if (p.form == Form::kExperts) return p.a_per_expert ? static_cast<int>(group) : 0;
  return __ldg(&p.groups[group].a_row[i]);
}

__device__ __forceinline__ int out_row(const MmvqParams& p, int64_t group, int i) {
  if (p.form == Form::kPlain) return static_cast<int>(group * kMaxGroupRows + i);
  if (p.form == Form::kExperts) return static_cast<int>(group);
  return __ldg(&p.groups[group].y_row[i]);
}

// Starts the copy of [s, e) (2-byte aligned) into buf as whole 16-byte aligned chunks: byte x
// lands at buf[x - align_down(s, 16)]. The chunks at the two ends may cover up to 15 bytes
// outside the span; an aligned 16-byte chunk never crosses a page, so they are readable, and
// those bytes are never used.
template <int kThreads>
__device__ __forceinline__ void prefetch_span(const uint8_t* s, const uint8_t* e, uint8_t* buf) {
  const uintptr_t A = reinterpret_cast<uintptr_t>(s) & ~uintptr_t{15};
  const uintptr_t B = (reinterpret_cast<uintptr_t>(e) + 15) & ~uintptr_t{15};
  const int nchunk = static_cast<int>((B - A) / 16);
  const uint8_t* src = reinterpret_cast<const uint8_t*>(A);
  for (int c = threadIdx.x; c < nchunk; c += kThreads) __pipeline_memcpy_async(buf + 16 * c, src + 16 * c, 16);
}

// Unsigned bytes of a times signed bytes of b, summed into c (PTX dp4a.u32.s32): the masked
// weight quants below are 0..192 and must not be read as signed.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int r;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// The group's activation rows staged once per block and group: per (token, unit) the 32
// quants, d8 widened to f32 and the exact sums of the two halves. The quants are stored as two
// arrays of 16-byte words (values 0-15, then 16-31), unit-contiguous, so that a warp's lanes
// (consecutive units) read consecutive 16-byte words: no shared-memory bank conflicts.
struct ActLayout {
  int q, d, s, bytes;
  __host__ __device__ ActLayout(int buf_bytes, int units, int max_n) {
    q = 3 * buf_bytes;
    d = q + max_n * units * 32;
    s = d + max_n * units * 4;
    bytes = s + max_n * units * 8;
  }
};

// Two passes: the rows' 36-byte blocks are read as consecutive 4-byte words (coalesced: a
// warp reads 128 contiguous bytes) and scattered into the layout, then each (token, unit)
// sums its halves from shared memory. The caller synchronises after.
template <int kThreads>
__device__ __forceinline__ void stage_act(const MmvqParams& p, int64_t group, int n, int units, uint8_t* smem,
                                          const ActLayout& L) {
  uint32_t* q_lo = reinterpret_cast<uint32_t*>(smem + L.q);  // words 0-3 of every (token, unit)
  uint32_t* q_hi = q_lo + 4 * n * units;                     // words 4-7
  float* act_d = reinterpret_cast<float*>(smem + L.d);
  const int words = 9 * units;  // one row of q8_1 blocks
  for (int i = 0; i < n; ++i) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p.a + static_cast<int64_t>(act_row(p, group, i)) * units);
    for (int w = threadIdx.x; w < words; w += kThreads) {
      const uint32_t v = __ldg(src + w);
      const int g = w / 9, k = w - 9 * g;
      const int it = i * units + g;
      // NaN bits of d8 never reach an output unchanged (only through fma_rn, which returns the
      // canonical NaN on both sides), so the hardware conversion is exact enough here.
      if (k == 0) act_d[it] = __half2float(__ushort_as_half(static_cast<uint16_t>(v & 0xFFFF)));
      else if (k <= 4) q_lo[4 * it + k - 1] = v;
      else q_hi[4 * it + k - 5] = v;
    }
  }
  __syncthreads();
  int2* act_s = reinterpret_cast<int2*>(smem + L.s);
  for (int it = threadIdx.x; it < n * units; it += kThreads) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 = __dp4a(0x01010101, static_cast<int>(q_lo[4 * it + k]), s0);
      s1 = __dp4a(0x01010101, static_cast<int>(q_hi[4 * it + k]), s1);
    }
    act_s[it] = make_int2(s0, s1);
  }
}

__device__ __forceinline__ float f16_arith(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Row `row_off` (byte offset in buf) against the n staged tokens: the lane chains and the
// butterfly; lane 0 writes y[out_row(i) * rows + row]. Integer parts by masked dp4a: the quants
// of unit b sit at bits 2 (b % 4) of each byte, so q & (3 << 2 (b % 4)) dotted with a is
// 4^(b % 4) times the true dot, shifted back exactly (numerics.md: integer parts are exact).
template <GgmlType kType, bool kAligned4, int kMaxN>
__device__ __forceinline__ void row_dot(const MmvqParams& p, const uint8_t* smem, const uint8_t* buf, const ActLayout& L,
                                        int row_off, int n, int64_t group, int64_t row) {
  constexpr int kBB = kType == GgmlType::kQ2K ? 84 : 110;  // block bytes
  const int lane = threadIdx.x % kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const uint4* act_q = reinterpret_cast<const uint4*>(smem + L.q);
  const float* act_d = reinterpret_cast<const float*>(smem + L.d);
  const int2* act_s = reinterpret_cast<const int2*>(smem + L.s);
  float acc[kMaxN];
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) acc[i] = 0.0f;
  for (int g = lane; g < units; g += kWarpSize) {
    const int b = g % kQ8PerSuperBlock;
    const int blk = row_off + (g / kQ8PerSuperBlock) * kBB;
    const int sh = 2 * (b % 4);
    const uint32_t mask = 0x03030303u << sh;
    uint32_t q[8], hm[8];
    int sc0, sc1, mn0 = 0, mn1 = 0;
    float d, dmin = 0.0f;
    if constexpr (kType == GgmlType::kQ2K) {
      if constexpr (kAligned4) lds_words_aligned<8>(buf, blk + 16 + 32 * (b / 4), q);
      else lds_words<8>(buf, blk + 16 + 32 * (b / 4), q);
      const uint32_t sc = lds_u16(buf, blk + 2 * b);  // scales[2b], scales[2b + 1]
      sc0 = sc & 0xF;
      mn0 = (sc >> 4) & 0xF;
      sc1 = (sc >> 8) & 0xF;
      mn1 = (sc >> 12) & 0xF;
      d = f16_arith(lds_u16(buf, blk + 80));
      dmin = f16_arith(lds_u16(buf, blk + 82));
    } else {
      lds_words<8>(buf, blk + 32 + 32 * (b / 4), q);
      lds_words<8>(buf, blk, hm);
      const uint8_t* scales = buf + blk + 96;
      const int j0 = 2 * b, j1 = 2 * b + 1;
      sc0 = (((scales[j0 & 7] >> (4 * (j0 >> 3))) & 0xF) | (((scales[8 + (j0 & 3)] >> (2 * (j0 >> 2))) & 3) << 4)) - 32;
      sc1 = (((scales[j1 & 7] >> (4 * (j1 >> 3))) & 0xF) | (((scales[8 + (j1 & 3)] >> (2 * (j1 >> 2))) & 3) << 4)) - 32;
      d = f16_arith(lds_u16(buf, blk + 108));
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] &= mask;
    if constexpr (kType == GgmlType::kQ3K) {
#pragma unroll
      for (int k = 0; k < 8; ++k) hm[k] &= 0x01010101u << b;  // high bit of unit b: bit b
    }
#pragma unroll
    for (int i = 0; i < kMaxN; ++i) {
      if (i < n) {
        const int ai = i * units + g;
        const uint4 x0 = act_q[ai], x1 = act_q[n * units + ai];
        const int aq[8] = {static_cast<int>(x0.x), static_cast<int>(x0.y), static_cast<int>(x0.z), static_cast<int>(x0.w),
                           static_cast<int>(x1.x), static_cast<int>(x1.y), static_cast<int>(x1.z), static_cast<int>(x1.w)};
        const int2 hs = act_s[ai];
        int p0 = 0, p1 = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          p0 = dp4a_us(q[k], aq[k], p0);
          p1 = dp4a_us(q[k + 4], aq[k + 4], p1);
        }
        p0 >>= sh;
        p1 >>= sh;
        if constexpr (kType == GgmlType::kQ3K) {  // quant = low - 4 + 4 high
          int h0 = 0, h1 = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            h0 = dp4a_us(hm[k], aq[k], h0);
            h1 = dp4a_us(hm[k + 4], aq[k + 4], h1);
          }
          p0 += 4 * ((h0 >> b) - hs.x);
          p1 += 4 * ((h1 >> b) - hs.y);
        }
        const int A = sc0 * p0 + sc1 * p1;
        float t;
        if constexpr (kType == GgmlType::kQ2K) {
          const int B = mn0 * hs.x + mn1 * hs.y;
          t = fma_rn(d, static_cast<float>(A), -mul_rn(dmin, static_cast<float>(B)));
        } else {
          t = mul_rn(d, static_cast<float>(A));
        }
        acc[i] = fma_rn(act_d[ai], t, acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) {
    if (i < n) {
      const float v = warp_butterfly(acc[i]);
      if (lane == 0) p.y[static_cast<int64_t>(out_row(p, group, i)) * p.rows + row] = v;
    }
  }
}

// Bytes of one of the three tile buffers: W rows plus the alignment slack at both ends (and the funnel's
// one-word over-read).
__host__ __device__ constexpr int tile_buffer_bytes(int warps, int row_bytes) {
  return (warps * row_bytes + 48 + 15) / 16 * 16;
}

// 64 registers at most, so that 2048 threads fit an SM. Block b walks the contiguous tiles
// [b * tiles / grid, (b + 1) * tiles / grid): consecutive row blocks of mostly one group, so the
// activation is staged once per group change and the weight reads are sequential. Three tile
// buffers: tiles t + 1 and t + 2 are in flight while tile t is computed.
template <GgmlType kType, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarpSize, 32 / kWarps) mmvq_kernel(MmvqParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kThreads = kWarps * kWarpSize;
  const int buf_bytes = tile_buffer_bytes(kWarps, p.row_bytes);
  const int units = static_cast<int>(p.K / kQK8_1);
  const ActLayout L(buf_bytes, units, p.max_n);
  const int rb = static_cast<int>((p.rows + kWarps - 1) / kWarps);  // row blocks per group
  const int64_t tiles = static_cast<int64_t>(rb) * p.n_groups;
  const int64_t t_begin = tiles * blockIdx.x / gridDim.x, t_end = tiles * (blockIdx.x + 1) / gridDim.x;
  const int n_tiles = static_cast<int>(t_end - t_begin);

  // Tiles are addressed as (group, row block) cursors advanced one step at a time: no 64-bit
  // division per tile.
  struct Cursor {
    int group, rblk;
  };
  auto advance = [rb](Cursor c) {
    if (++c.rblk == rb) {
      c.rblk = 0;
      ++c.group;
    }
    return c;
  };
  auto tile_start = [&](Cursor c, const GroupInfo& gi) {
    return gi.base + static_cast<int64_t>(c.rblk) * kWarps * p.row_bytes;
  };
  auto tile_rows = [&](Cursor c) {
    const int64_t left = p.rows - static_cast<int64_t>(c.rblk) * kWarps;
    return static_cast<int>(left < kWarps ? left : kWarps);
  };
  auto issue = [&](Cursor c, const GroupInfo& gi, int k) {
    const uint8_t* s = tile_start(c, gi);
    prefetch_span<kThreads>(s, s + static_cast<int64_t>(tile_rows(c)) * p.row_bytes, smem + k * buf_bytes);
  };

  Cursor c0{static_cast<int>(t_begin / rb), static_cast<int>(t_begin % rb)};
  Cursor c1 = advance(c0), c2 = advance(c1);
  GroupInfo g0{nullptr, 0}, g1{nullptr, 0}, g2{nullptr, 0};
  if (n_tiles > 0) {
    g0 = group_info(p, c0.group);
    issue(c0, g0, 0);
  }
  __pipeline_commit();
  if (n_tiles > 1) {
    g1 = group_info(p, c1.group);
    issue(c1, g1, 1);
  }
  __pipeline_commit();
  int k = 0;
  int staged = -1;
  for (int i = 0; i < n_tiles; ++i) {
    if (i + 2 < n_tiles) {
      g2 = group_info(p, c2.group);
      issue(c2, g2, k == 0 ? 2 : k - 1);  // the buffer tile i - 1 used
    }
    __pipeline_commit();
    __pipeline_wait_prior(2);  // tile i has landed
    __syncthreads();
    const int key = p.form == Form::kExperts && !p.a_per_expert ? 0 : c0.group;
    if (key != staged) {  // block-uniform
      stage_act<kThreads>(p, c0.group, g0.n, units, smem, L);
      staged = key;
      __syncthreads();
    }
    const int warp = threadIdx.x / kWarpSize;
    if (warp < tile_rows(c0)) {
      const int align_off = static_cast<int>(reinterpret_cast<uintptr_t>(tile_start(c0, g0)) & 15);
      const int row_off = align_off + warp * p.row_bytes;
      const uint8_t* buf = smem + k * buf_bytes;
      const int64_t row = static_cast<int64_t>(c0.rblk) * kWarps + warp;
      // Q2_K blocks are 84 bytes: all 4-byte aligned when the tile's first row is (uniform).
      // One token (the one-token form) gets its own code: no guards for seven absent tokens.
      const bool aligned = kType == GgmlType::kQ2K && ((align_off | p.row_bytes) & 3) == 0;
      if (g0.n == 1) {
        if (aligned) row_dot<kType, true, 1>(p, smem, buf, L, row_off, 1, c0.group, row);
        else row_dot<kType, false, 1>(p, smem, buf, L, row_off, 1, c0.group, row);
      } else {
        if (aligned) row_dot<kType, true, kMaxGroupRows>(p, smem, buf, L, row_off, g0.n, c0.group, row);
        else row_dot<kType, false, kMaxGroupRows>(p, smem, buf, L, row_off, g0.n, c0.group, row);
      }
    }
    __syncthreads();  // buffer k and the staged activation are free again
    c0 = c1;
    c1 = c2;
    c2 = advance(c2);
    g0 = g1;
    g1 = g2;
    k = k == 2 ? 0 : k + 1;
  }
}

template <GgmlType kType, int kWarps>
void launch_one(const MmvqParams& p, void* stream) {
  const int smem = ActLayout(tile_buffer_bytes(kWarps, p.row_bytes), static_cast<int>(p.K / kQK8_1), p.max_n).bytes;
  static int smem_set = 48 * 1024;  // the dynamic shared-memory limit, raised when needed
  if (smem > smem_set) {
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(mmvq_kernel<kType, kWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    smem_set = smem;
  }
  // Persistent grid: as many blocks as fit the device at once, at most one per tile.
  static int resident = 0;
  static int resident_smem = -1;
  if (resident_smem != smem) {
    int per_sm = 0, dev = 0, sms = 0;
    MOECHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmvq_kernel<kType, kWarps>,
                                                                      kWarps * kWarpSize, smem));
    MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
    MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    resident = per_sm * sms;
    resident_smem = smem;
  }
  const int64_t tiles = (p.rows + kWarps - 1) / kWarps * p.n_groups;
  const int64_t grid = tiles < resident ? tiles : resident;
  mmvq_kernel<kType, kWarps><<<static_cast<unsigned>(grid), kWarps * kWarpSize, smem, as_stream(stream)>>>(p);
  MOECHECK_CUDA_LAUNCHED();
}

template <GgmlType kType>
void launch_warps(const MmvqParams& p, int warps, void* stream) {
  switch (warps) {
    case 2: launch_one<kType, 2>(p, stream); break;
    case 4: launch_one<kType, 4>(p, stream); break;
    default: launch_one<kType, 8>(p, stream); break;
  }
}

void launch(MmvqParams p, GgmlType t, int64_t n_groups, int max_n, int warps, const char* op, void* stream) {
  const std::string where = std::string("cuda::") + op + ": ";
  if (t != GgmlType::kQ2K && t != GgmlType::kQ3K)
    throw InputError(where + "weight type must be Q2_K (10) or Q3_K (11), found " +
                     std::to_string(static_cast<uint32_t>(t)));
  if (!expert_warps_allowed(warps))
    throw InputError(where + "warps per block must be 2, 4 or 8, found " + std::to_string(warps));
  if (p.K <= 0 || p.K % kQK_K != 0 || p.rows < 0 || n_groups < 0)
    throw InputError(where + "need K a positive multiple of 256 and rows >= 0, found K=" +
                     std::to_string(p.K) + " rows=" + std::to_string(p.rows));
  p.row_bytes = static_cast<int>(row_bytes(t, p.K));
  if (max_n < 1 || max_n > kMaxGroupRows)
    throw InputError(where + "tokens per group must be in [1, 8], found " + std::to_string(max_n));
  p.max_n = max_n;
  const int64_t smem = p.K > (int64_t{1} << 20)
                           ? int64_t{1} << 40
                           : ActLayout(tile_buffer_bytes(warps, p.row_bytes), static_cast<int>(p.K / kQK8_1), max_n).bytes;
  if (smem > 200 * 1024)
    throw InputError(where + "K=" + std::to_string(p.K) + " with " + std::to_string(max_n) + " tokens per group needs " +
                     std::to_string(smem) + " bytes of shared memory at " + std::to_string(warps) +
                     " warps (limit 204800)");
  if (p.rows == 0 || n_groups == 0) return;
  p.n_groups = n_groups;
  require_aligned(p.a, 4, op, "a");
  require_aligned(p.y, 4, op, "y");
  if (t == GgmlType::kQ2K) {
    launch_warps<GgmlType::kQ2K>(p, warps, stream);
  } else {
    launch_warps<GgmlType::kQ3K>(p, warps, stream);
  }
}

}  // namespace

void mmvq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
          int64_t T, int warps, void* stream) {
  if (T < 0) throw InputError("cuda::mmvq: T must be >= 0, found " + std::to_string(T));
  require_aligned(w, 2, "mmvq", "w");
  MmvqParams p{Form::kPlain, w, nullptr, nullptr, a, false, y, rows, K, T, 0, 0, 0};
  launch(p, t, (T + kMaxGroupRows - 1) / kMaxGroupRows, static_cast<int>(T < kMaxGroupRows ? T : kMaxGroupRows), warps,
         "mmvq", stream);
}

void mmvq_experts(GgmlType t, const uint8_t* const* expert_w, int64_t n, const BlockQ8_1* a,
                  bool a_per_expert, float* y, int64_t rows, int64_t K, int warps, void* stream) {
  if (n < 0) throw InputError("cuda::mmvq_experts: n must be >= 0, found " + std::to_string(n));
  if (n > 0) require_aligned(expert_w, 8, "mmvq_experts", "expert_w (pointer table)");
  MmvqParams p{Form::kExperts, nullptr, expert_w, nullptr, a, a_per_expert, y, rows, K, 1, 0, 0, 0};
  launch(p, t, n, 1, warps, "mmvq_experts", stream);
}

void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups, int max_n,
                 const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps, void* stream) {
  if (n_groups > 0) {
    require_aligned(slots, 8, "mmvq_groups", "slots (pointer table)");
    require_aligned(groups, 4, "mmvq_groups", "groups");
  }
  MmvqParams p{Form::kGroups, nullptr, slots, groups, a, false, y, rows, K, 0, 0, 0, 0};
  launch(p, t, n_groups, max_n, warps, "mmvq_groups", stream);
}

}  // namespace moecheck::cuda
