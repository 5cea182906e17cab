// The one-token MMVQ engine: Q2_K / Q3_K rows read in place against one q8_1 activation row per
// group, integer parts on the int8 tensor cores, float parts exactly as docs/numerics.md "mmvq_q2k,
// mmvq_q3k" writes them (the same bits as the dp4a kernel and emu::mmvq).
//
// Work. A tile is 16 rows of one group (rows r0 + i * stride, i = 0..15; stride 2 when a row is
// 2 mod 4 bytes long, so that every row of a tile has the same 4-byte phase), read in stages of
// 4 super-blocks per row (cuda/mmvq_tc_pipeline.cuh). A block of kW warps (4 when the row's
// super-blocks split evenly over the classes sb % 4, else 2) walks a contiguous range of tiles
// through a ring of 4 or 6 stage buffers: warp 0 lanes 0-15 copy one row each with cp.async.bulk
// (or every thread 16-byte cp.async), a full mbarrier per buffer says the bytes landed and an
// empty one that every warp is done with it. Warp w computes the classes sb % 4 = w (mod kW).
// Integer parts. For super-block sb and half h (units b = 4h + s, s = 0..3, sharing 32 quant
// bytes), mma.m16n8k32 (u8 x s8 -> s32) takes A = the 16 rows' quant bytes masked to unit s's bit
// pair (values 4^s q) and B = the activation of unit s in columns 2s (values 0-15) and 2s + 1
// (values 16-31), zeros elsewhere; four chained mmas (s = 0..3) leave in lane (g, c) = (lane / 4,
// lane % 4) the dots 4^c p0, 4^c p1 of unit 4h + c for rows g and g + 8: every lane holds two
// row-units, and their shifts back are exact. Q3_K adds four mmas over the high-bit planes.
//
// Float parts and order. Unit g of a row belongs to contract lane g % 32 = 8 (sb % 4) + 4h + c,
// and a stage starts at a multiple of 4 super-blocks, so lane (g, c) of the warp owning class
// sb % 4 keeps the chains acc[class][h][row] and extends each in increasing g, as numerics.md's
// lane does. At the end of a tile the warps hand their chains to warp 0 through shared memory,
// which replays the butterfly's tree: levels 16 and 8 (sb % 4), 4 (h), then 2 and 1 by shuffles
// over c. Performance: docs/performance.md "GPU".
#include "cuda/mmvq_tc.cuh"

#include <cuda_fp16.h>

#include <string>

#include "core/error.h"
#include "core/portable_math.h"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/mmvq_tc_pipeline.cuh"

namespace moecheck::cuda::mmvq_tc {
namespace {

using namespace detail;

// D += A (16 x 32 u8, row) * B (32 x 8 s8, col), s32 accumulate: exact integer arithmetic.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The word at shared byte offset off whose 4-byte phase (0 or 2) the caller knows.
template <bool kAligned>
__device__ __forceinline__ uint32_t word_at(int off) {
  if constexpr (kAligned) {
    return s_u32(off);
  } else {  // two aligned words joined by a funnel shift (the offset is 2 mod 4)
    return __funnelshift_r(s_u32(off & ~3), s_u32((off & ~3) + 4), 8 * (off & 3));
  }
}

// Per-lane B masks: lane (g, c) feeds column g, i.e. mma s = g / 2, half g % 2.
struct BMasks {
  uint32_t m0[4], m1[4];
};

// One super-block (both halves) of rows g and g + 8 at shared blkA / blkB, into the lane's
// chains acc[h][row] of class sb % 4.
template <GgmlType kType, bool kAligned>
__device__ __forceinline__ void super_block(const Ctx& c, int blkA, int blkB, int sb,
                                            const BMasks& bm, float (&acc)[2][2]) {
  const int lane = lane_id(), tig = lane & 3;
  float dA, dB, mA = 0.0f, mB = 0.0f;
  uint32_t hA0 = 0, hA1 = 0, hB0 = 0, hB1 = 0;
  if constexpr (kType == GgmlType::kQ2K) {
    uint32_t a, b;
    if constexpr (kAligned) {
      a = s_u32(blkA + 80);
      b = s_u32(blkB + 80);
    } else {
      a = s_u16(blkA + 80) | s_u16(blkA + 82) << 16;
      b = s_u16(blkB + 80) | s_u16(blkB + 82) << 16;
    }
    dA = f16_arith(static_cast<uint16_t>(a & 0xFFFF));
    mA = f16_arith(static_cast<uint16_t>(a >> 16));
    dB = f16_arith(static_cast<uint16_t>(b & 0xFFFF));
    mB = f16_arith(static_cast<uint16_t>(b >> 16));
  } else {
    dA = f16_arith(static_cast<uint16_t>(s_u16(blkA + 108)));
    dB = f16_arith(static_cast<uint16_t>(s_u16(blkB + 108)));
    hA0 = word_at<kAligned>(blkA + 4 * tig);
    hB0 = word_at<kAligned>(blkB + 4 * tig);
    hA1 = word_at<kAligned>(blkA + 16 + 4 * tig);
    hB1 = word_at<kAligned>(blkB + 16 + 4 * tig);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qoff = (kType == GgmlType::kQ2K ? 16 : 32) + 32 * h + 4 * tig;
    const uint32_t a0 = word_at<kAligned>(blkA + qoff), a1 = word_at<kAligned>(blkB + qoff);
    const uint32_t a2 = word_at<kAligned>(blkA + qoff + 16);
    const uint32_t a3 = word_at<kAligned>(blkB + qoff + 16);
    const uint32_t bw = s_u32(c.L.act_q + 4 * ((8 * sb + 4 * h) * 8 + lane));
    int D[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t m = 0x03030303u << (2 * s);
      mma_u8s8(D, a0 & m, a1 & m, a2 & m, a3 & m, bw & bm.m0[s], bw & bm.m1[s]);
    }
    int H[4] = {0, 0, 0, 0};
    if constexpr (kType == GgmlType::kQ3K) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t m = 0x01010101u << (4 * h + s);
        mma_u8s8(H, hA0 & m, hB0 & m, hA1 & m, hB1 & m, bw & bm.m0[s], bw & bm.m1[s]);
      }
    }
    const int b = 4 * h + tig;  // this lane's unit in the super-block
    const uint2 f = *reinterpret_cast<const uint2*>(tc_smem + c.L.act_f + 8 * (8 * sb + b));
    const float d8 = __uint_as_float(f.x);
    const int hs16 = static_cast<int>(f.y);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int blk = r == 0 ? blkA : blkB;
      int p0 = D[2 * r] >> (2 * tig), p1 = D[2 * r + 1] >> (2 * tig);
      float t;
      if constexpr (kType == GgmlType::kQ2K) {
        const int sc = static_cast<int>(s_u16(blk + 2 * b));  // scales[2b], [2b + 1]
        const int A = __dp2a_lo(static_cast<int>(__byte_perm(p0, p1, 0x5410)), sc & 0x0F0F, 0);
        const int B = __dp2a_lo(hs16, (sc >> 4) & 0x0F0F, 0);
        t = mmvq_unit_q2k(r == 0 ? dA : dB, r == 0 ? mA : mB, A, B);
      } else {
        const int a0s = static_cast<int>(static_cast<int16_t>(hs16 & 0xFFFF)), a1s = hs16 >> 16;
        p0 += 4 * ((H[2 * r] >> b) - a0s);  // quant = low - 4 + 4 high
        p1 += 4 * ((H[2 * r + 1] >> b) - a1s);
        const uint32_t lo = s_u16(blk + 96 + 2 * tig) >> (4 * h);
        const uint32_t hi = s_u16(blk + 104 + 2 * (tig & 1)) >> (2 * (2 * h + (tig >> 1)));
        const int sv = static_cast<int>((lo & 0x0F0Fu) | ((hi << 4) & 0x3030u));
        const int A =
            __dp2a_lo(static_cast<int>(__byte_perm(p0, p1, 0x5410)), sv, 0) - 32 * (p0 + p1);
        t = mmvq_unit_q3k(r == 0 ? dA : dB, A);
      }
      acc[h][r] = fma_rn(d8, t, acc[h][r]);
    }
  }
}

// This warp's super-blocks (q = w, w + kW, ... of the 4) of one stage, rows g and g + 8, from
// stage buffer `buf`, into the chains acc[q / kW] of class q.
template <GgmlType kType, int kW>
__device__ __forceinline__ void compute_stage(const Ctx& c, int buf, const GroupInfo& gi,
                                              const Cursor& tp, const BMasks& bm,
                                              float (&acc)[4 / kW][2][2]) {
  constexpr int kBB = kBlockBytes<kType>;
  const int gid = lane_id() >> 2, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const uintptr_t chunk_off = static_cast<uintptr_t>(tp.chunk * kChunkBlocks * kBB);
  const int64_t rA = c.row0(tp) + static_cast<int64_t>(c.stride) * gid;
  const int64_t rB = rA + static_cast<int64_t>(c.stride) * 8;
  const uintptr_t base = reinterpret_cast<uintptr_t>(gi.base) + chunk_off;
  const int offA = static_cast<int>((base + static_cast<uintptr_t>(rA * c.p.row_bytes)) & 15);
  const int offB = static_cast<int>((base + static_cast<uintptr_t>(rB * c.p.row_bytes)) & 15);
  const int bA = buf + gid * slot_bytes(kBB) + offA;  // shared byte offsets of rows g, g + 8
  const int bB = buf + (gid + 8) * slot_bytes(kBB) + offB;
#pragma unroll
  for (int q = 0; q < kChunkBlocks; ++q) {
    const int sb = kChunkBlocks * tp.chunk + q;
    if (q % kW != warp || sb >= c.nsb) continue;  // warp-uniform
    // Every row of the tile has the same 4-byte phase here (the tile's stride makes it so).
    if (((offA + q * kBB) & 3) == 0)
      super_block<kType, true>(c, bA + q * kBB, bB + q * kBB, sb, bm, acc[q / kW]);
    else super_block<kType, false>(c, bA + q * kBB, bB + q * kBB, sb, bm, acc[q / kW]);
  }
}

// End of a tile: every warp hands its chains to warp 0 through shared memory (red[parity]); warp
// 0 replays the butterfly's tree (levels 16 and 8 over the classes sb % 4, 4 over h inside the
// lane, 2 and 1 by shuffles over c) and lane c = 0 writes rows g and g + 8.
template <int kW>
__device__ __forceinline__ void finish_tile(const Ctx& c, const Cursor& tp,
                                            const float (&acc)[4 / kW][2][2], int parity) {
  const int lane = lane_id(), gid = lane >> 2, tig = lane & 3;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  float4* red = reinterpret_cast<float4*>(c.smem + c.L.red) + parity * 4 * kWarpSize;
#pragma unroll
  for (int i = 0; i < 4 / kW; ++i)
    red[(warp + kW * i) * kWarpSize + lane] =
        make_float4(acc[i][0][0], acc[i][0][1], acc[i][1][0], acc[i][1][1]);
  __syncthreads();
  if (warp != 0) return;
  float v[4][2][2];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 f = red[q * kWarpSize + lane];
    v[q][0][0] = f.x;
    v[q][0][1] = f.y;
    v[q][1][0] = f.z;
    v[q][1][1] = f.w;
  }
  const int64_t out = static_cast<int64_t>(out_row(c.p, tp.group, 0)) * c.p.rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float x[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float w0 = add_rn(v[0][h][r], v[2][h][r]);  // level 16: sb % 4 bit 1
      const float w1 = add_rn(v[1][h][r], v[3][h][r]);
      x[h] = add_rn(w0, w1);  // level 8: sb % 4 bit 0
    }
    float y = add_rn(x[0], x[1]);                       // level 4: h
    y = add_rn(y, __shfl_xor_sync(0xFFFFFFFFu, y, 2));  // level 2
    y = add_rn(y, __shfl_xor_sync(0xFFFFFFFFu, y, 1));  // level 1
    const int64_t row = c.row0(tp) + static_cast<int64_t>(c.stride) * (gid + 8 * r);
    if (tig == 0 && row < c.p.rows) c.p.y[out + row] = y;
  }
}

// kW warps share a tile; every warp computes the classes sb % 4 = w (mod kW) of every stage and
// releases the stage on its empty barrier. kMode: 0, bulk copies issued by warp 0 lanes 0-15; 1,
// 16-byte cp.async from every thread; 2 and 3, the same copies without any arithmetic or output
// (diagnostics of the copy pipeline alone, for docs/performance.md).
template <GgmlType kType, int kStages, int kW, int kMode>
__global__ void __launch_bounds__(kW* kWarpSize, 20 / kW) mmvq_tc_kernel(MmvqParams p) {
  uint8_t* smem = tc_smem;
  constexpr bool kAsync = kMode == 1 || kMode == 3, kCompute = kMode < 2;
  constexpr int kThreads = kW * kWarpSize;
  const int lane = lane_id(), gid = lane >> 2, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int units = static_cast<int>(p.K / kQK8_1);
  const int nsb = static_cast<int>(p.K / kQK_K);
  const int stride = (p.row_bytes & 3) == 2 ? 2 : 1;
  const int64_t tpg = stride == 1 ? (p.rows + kTileRows - 1) / kTileRows : 2 * ((p.rows + 31) / 32);
  const int64_t tiles = tpg * live_groups(p);
  const int64_t t_begin = tiles * blockIdx.x / gridDim.x;
  const int64_t t_end = tiles * (blockIdx.x + 1) / gridDim.x;
  const Ctx c{p,      smem, BlockLayout(kBlockBytes<kType>, units, kStages), nsb, (nsb + 3) / 4,
              stride, tpg};
  const int steps = static_cast<int>(t_end - t_begin) * c.nchunk;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + c.L.full);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + c.L.empty);
  if (threadIdx.x == 0) {
    for (int k = 0; k < kStages; ++k) {
      bulk::bar_init(full + k, kAsync ? kThreads : 1);
      bulk::bar_init(empty + k, kW);
    }
    bulk::fence_bar_init();
  }
  __syncthreads();
  BMasks bm;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    bm.m0[s] = gid == 2 * s ? 0xFFFFFFFFu : 0u;
    bm.m1[s] = gid == 2 * s + 1 ? 0xFFFFFFFFu : 0u;
  }
  Cursor ic = c.at(t_begin), cc = ic;  // the issuing and the computing step
  GroupCache gc;
  const bool producer = kAsync || warp == 0;
  if (producer) {
    for (int s = 0; s < kStages - 1 && s < steps; ++s, c.advance(ic)) {
      if constexpr (kAsync) issue_async<kType, kThreads>(c, ic, s, gc);
      else issue<kType>(c, ic, s, gc);
    }
  }
  float acc[4 / kW][2][2];
  GroupInfo gi{nullptr, 0};
  int staged = -1, tile = 0;
  for (int s = 0; s < steps; ++s, c.advance(cc)) {
    if (producer && s + kStages - 1 < steps) {
      const int k = (s + kStages - 1) % kStages;  // the buffer step s - 1 used
      if (s >= 1) bulk::bar_wait(empty + k, static_cast<uint32_t>(((s - 1) / kStages) & 1));
      if constexpr (kAsync) issue_async<kType, kThreads>(c, ic, k, gc);
      else issue<kType>(c, ic, k, gc);
      c.advance(ic);
    }
    if (cc.chunk == 0) {
      gi = group_info(p, cc.group);
      const int ar = gi.n > 0 ? act_row(p, cc.group, 0) : staged;
      if (kCompute && ar != staged) {  // block-uniform; every warp is past the previous tile's end
        __syncthreads();
        stage_act<kThreads>(c, ar);
        __syncthreads();
        staged = ar;
      }
#pragma unroll
      for (int i = 0; i < 4 / kW; ++i)
        for (int h = 0; h < 2; ++h) acc[i][h][0] = acc[i][h][1] = 0.0f;
    }
    const int k = s % kStages;
    bulk::bar_wait(full + k, static_cast<uint32_t>((s / kStages) & 1));
    if (kCompute && gi.n > 0) compute_stage<kType, kW>(c, k * c.L.stage_bytes, gi, cc, bm, acc);
    __syncwarp();
    if (lane == 0) bulk::bar_arrive(empty + k);
    if (kCompute && cc.chunk == c.nchunk - 1) {
      if (gi.n > 0) finish_tile<kW>(c, cc, acc, tile & 1);
      ++tile;
    }
  }
}

template <GgmlType kType, int kStages, int kW, int kMode>
void launch_typed(const MmvqParams& p, void* stream) {
  const int units = static_cast<int>(p.K / kQK8_1);
  const int smem = BlockLayout(kBlockBytes<kType>, units, kStages).bytes;
  auto* kern = mmvq_tc_kernel<kType, kStages, kW, kMode>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kern), smem);
  const int resident =
      resident_blocks_per_sm(reinterpret_cast<const void*>(kern), kW * kWarpSize, smem) *
      current_sm_count();
  const int stride = (p.row_bytes & 3) == 2 ? 2 : 1;
  const int64_t tpg = stride == 1 ? (p.rows + kTileRows - 1) / kTileRows : 2 * ((p.rows + 31) / 32);
  const int64_t tiles = tpg * p.n_groups;
  // As few blocks as give every block the same number of tiles (within one) at full residency.
  const int64_t per_block = (tiles + resident - 1) / resident;
  const int64_t grid = (tiles + per_block - 1) / per_block;
  kern<<<static_cast<unsigned>(grid), kW * kWarpSize, smem, as_stream(stream)>>>(p);
  MOECHECK_CUDA_CHECK(cudaGetLastError());
}

// Four warps per tile when the super-blocks split evenly over the four classes, else two (K =
// 2304: 9 super-blocks, 5 and 4 per warp).
template <GgmlType kType, int kStages, int kMode>
void launch_stages(const MmvqParams& p, void* stream) {
  if ((p.K / kQK_K) % 4 == 0) launch_typed<kType, kStages, 4, kMode>(p, stream);
  else launch_typed<kType, kStages, 2, kMode>(p, stream);
}

template <GgmlType kType, int kMode>
void launch_mode(const MmvqParams& p, int stages, void* stream) {
  if (stages == 6) launch_stages<kType, 6, kMode>(p, stream);
  else launch_stages<kType, 4, kMode>(p, stream);
}

template <GgmlType kType>
void launch_type(const MmvqParams& p, int stages, int mode, void* stream) {
  switch (mode) {
    case 1: launch_mode<kType, 1>(p, stages, stream); break;
    case 2: launch_mode<kType, 2>(p, stages, stream); break;
    case 3: launch_mode<kType, 3>(p, stages, stream); break;
    default: launch_mode<kType, 0>(p, stages, stream); break;
  }
}

}  // namespace

bool supported(GgmlType t, int64_t K, int max_n) {
  return max_n == 1 && (t == GgmlType::kQ2K || t == GgmlType::kQ3K) && K > 0 && K % kQK_K == 0 &&
         K <= 16384;
}

void launch(const MmvqParams& p, GgmlType t, int stages, int mode, void* stream) {
  if (stages == 0) stages = 4;
  if (stages != 4 && stages != 6)
    throw InputError("cuda::mmvq (tensor-core engine): stages must be 4 or 6, found " +
                     std::to_string(stages));
  if (mode < 0 || mode > 3)
    throw InputError("cuda::mmvq (tensor-core engine): mode must be 0..3, found " +
                     std::to_string(mode));
  if (t == GgmlType::kQ2K) launch_type<GgmlType::kQ2K>(p, stages, mode, stream);
  else launch_type<GgmlType::kQ3K>(p, stages, mode, stream);
}

}  // namespace moecheck::cuda::mmvq_tc
