// The one-token bf16 GEMV (bf16_gemv and bf16_gemv_pair at T = 1) with its weight rows streamed
// into shared memory: each warp owns a contiguous range of output rows (the pair's two matrices
// form one list) and a ring of S row stages that its lane 0 refills by bulk copies
// (cp.async.bulk, completing on the stage's mbarrier), so S - 1 rows of every warp are in flight
// while it computes one, with no register cost and no block-wide barrier after the start. The
// token's x is staged once per block. One block per multiprocessor, by default 4 warps with 2
// stages each (92 KB at K = 5120, 41 KB at K = 2304: room for MMVQ blocks beside it; deeper
// rings measured slower, docs/performance.md). Arithmetic: the plain schedule of docs/numerics.md
// "bf16_gemv", unchanged (lane l: chunks l, l + 32, ... in order, fma_rn over each chunk's 8
// values from +0, then the butterfly); twin emu::bf16_gemv. The loads never change the order.
#include <string>

#include "core/error.h"
#include "cuda/bulk_copy.cuh"
#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/gemv_plain.cuh"
#include "cuda/gemv_stream_layout.cuh"
#include "cuda/kernels.h"
#include "cuda/pdl.cuh"

namespace moecheck::cuda {
namespace {

bool g_stream = true;

using gemv_stream::kDefaultMaxK;
using gemv_stream::kDefaultStages;
using gemv_stream::kDefaultWarps;
using gemv_stream::kSmemMax;
using gemv_stream::stream_layout;
using gemv_stream::StreamLayout;

// set_bf16_gemv_stream_shape per launch form ([0] one matrix, [1] a pair); 0: the default.
int g_warps[2] = {0, 0}, g_stages[2] = {0, 0};

// Flat row r of the pair's list: matrix r / rows (a ternary, not an index into the parameter
// array, which would copy it to local memory).
__device__ __forceinline__ const uint16_t* row_src(const detail::GemvArgs& p, int64_t r) {
  return r < p.rows ? p.w[0] + r * p.K : p.w[1] + (r - p.rows) * p.K;
}

// Two warps: at most 64 registers (launch bounds of 16 blocks), so that one block fits beside
// three MMVQ blocks of 80 registers (61440 of the 65536 registers of an sm_90 multiprocessor).
template <int kWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize, kWarps == 2 ? 16 : 1)
    gemv_stream_kernel(detail::GemvArgs p, int64_t total_rows, StreamLayout L, bool early) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int S = L.stages;
  uint8_t* ring = smem + warp * S * L.row_bytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L.bar_off) + warp * S;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t nw = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t r0 = total_rows * gw / nw;
  const int n = static_cast<int>(total_rows * (gw + 1) / nw - r0);
  const uint32_t rb = static_cast<uint32_t>(L.row_bytes);
  // Programmatic launch (cuda/pdl.cuh): x is the predecessor's output; the weights are constants,
  // so under kEarlyReads the first rows are in flight before the wait.
  if (!early) {
    pdl::wait();
    pdl::launch_dependents();
  }
  if (lane == 0) {
    for (int s = 0; s < S; ++s) bulk::bar_init(bar + s, 1);
    bulk::fence_bar_init();
    for (int s = 0; s < S && s < n; ++s) {
      bulk::bar_expect_tx(bar + s, rb);
      bulk::copy(ring + s * L.row_bytes, row_src(p, r0 + s), rb, bar + s);
    }
  }
  if (early) {
    pdl::wait();
    pdl::launch_dependents();
  }
  const int nchunks = static_cast<int>(p.K / kGemvChunk);
  uint4* xs = reinterpret_cast<uint4*>(smem + L.x_off);
  for (int c = static_cast<int>(threadIdx.x); c < nchunks; c += kWarps * kWarpSize)
    xs[c] = __ldg(reinterpret_cast<const uint4*>(p.x) + c);
  __syncthreads();
  int s = 0;
  uint32_t parity = 0;
  for (int i = 0; i < n; ++i) {
    bulk::bar_wait(bar + s, parity);
    const uint4* wr = reinterpret_cast<const uint4*>(ring + s * L.row_bytes);
    float acc = 0.0f;
#pragma unroll 4
    for (int c = lane; c < nchunks; c += kWarpSize) acc = bf16_chunk_fma<false>(wr[c], xs[c], acc);
    const float v = warp_butterfly(acc);
    const int64_t r = r0 + i;
    if (lane == 0) {
      if (r < p.rows) p.y[0][r] = v;
      else p.y[1][r - p.rows] = v;
    }
    __syncwarp();  // every lane is done with stage s
    if (lane == 0 && i + S < n) {
      bulk::fence_proxy_async();
      bulk::bar_expect_tx(bar + s, rb);
      bulk::copy(ring + s * L.row_bytes, row_src(p, r0 + i + S), rb, bar + s);
    }
    if (++s == S) {
      s = 0;
      parity ^= 1u;
    }
  }
}

template <int kWarps>
void launch_warps(const detail::GemvArgs& a, int n_mat, const StreamLayout& L, void* stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(gemv_stream_kernel<kWarps>), L.bytes);
  const int64_t total = a.rows * n_mat;
  const int64_t warps = (total + 1) / 2;  // at least two rows per warp where it fills the device
  const int64_t blocks_needed = (warps + kWarps - 1) / kWarps;
  const int64_t sms = current_sm_count();
  const unsigned grid = static_cast<unsigned>(blocks_needed < sms ? blocks_needed : sms);
  pdl::launch(gemv_stream_kernel<kWarps>, dim3(grid), dim3(kWarps * kWarpSize),
              static_cast<size_t>(L.bytes), as_stream(stream), a, total, L,
              pdl::mode() == pdl::Mode::kEarlyReads);
}

}  // namespace

void set_bf16_gemv_stream(bool on) { g_stream = on; }

void set_bf16_gemv_stream_shape(int warps, int stages, int n_mat) {
  if ((warps != 0 && warps != 2 && warps != 4 && warps != 8) ||
      (stages != 0 && (stages < 2 || stages > 8)))
    throw InputError(
        "cuda::set_bf16_gemv_stream_shape: need warps 0, 2, 4 or 8 and stages 0 or 2..8, found "
        "warps=" +
        std::to_string(warps) + " stages=" + std::to_string(stages));
  if (n_mat < 0 || n_mat > 2)
    throw InputError("cuda::set_bf16_gemv_stream_shape: need n_mat 0, 1 or 2, found " +
                     std::to_string(n_mat));
  for (int f = 0; f < 2; ++f) {
    if (n_mat != 0 && n_mat != f + 1) continue;
    g_warps[f] = warps;
    g_stages[f] = stages;
  }
}

namespace detail {

// The default shape (4 warps x 2 stages, K up to kDefaultMaxK) or the one set by
// set_bf16_gemv_stream_shape (stages lowered to what fits a block's shared memory, or as many
// as fit when 0). Fewer than two stages fit: not taken.
bool launch_gemv_stream(const GemvArgs& a, int n_mat, void* stream) {
  if (!g_stream || a.T != 1 || a.K > kSmemMax / 2) return false;
  const int f = n_mat == 2 ? 1 : 0;
  const bool set = g_warps[f] != 0 || g_stages[f] != 0;
  if (!set && a.K > kDefaultMaxK) return false;
  const int warps = g_warps[f] != 0 ? g_warps[f] : kDefaultWarps;
  const int most = stream_layout(a.K, warps, kSmemMax).stages;
  const int want = !set ? kDefaultStages : g_stages[f] != 0 ? g_stages[f] : most;
  if (most < 2) return false;  // not two row stages per warp in a block's shared memory
  const StreamLayout L = stream_layout(a.K, warps, kSmemMax, want < most ? want : most);
  if (warps == 8) launch_warps<8>(a, n_mat, L, stream);
  else if (warps == 4) launch_warps<4>(a, n_mat, L, stream);
  else launch_warps<2>(a, n_mat, L, stream);
  return true;
}

}  // namespace detail
}  // namespace moecheck::cuda
