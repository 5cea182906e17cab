// The streamed MMVQ engine (cuda/mmvq_sb.cu), taken by cuda/mmvq.cu's launcher when
// cuda::MmvqEngine::kStreamed is set (the default) for the plain form at T = 1, mmvq_experts and
// the groups forms of layers of up to 8 tokens (cuda/kernels.h layer_tokens). Same contract and
// bits as the dp4a kernel: docs/numerics.md "mmvq_q2k, mmvq_q3k"; the schedule is described in
// cuda/mmvq_sb.cu and docs/performance.md.
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "cuda/mmvq_tiles.cuh"

namespace moecheck::cuda::mmvq_sb {

// True when the engine can take this launch (cuda/mmvq.cu launch() has filled row_bytes, max_n
// and n_groups): Q2_K or Q3_K, groups of up to 8 tokens (at most 4096 groups when they hold
// several), and a block of four warps with two stages fits in shared memory (K up to about
// 29 000).
bool supported(const mmvq_tiles::MmvqParams& p, GgmlType t);

// Launches the engine on validated parameters (cuda/mmvq.cu launch() has checked shapes and
// filled row_bytes, max_n, n_groups; cuda::set_mmvq_stream_shape the shape). warps (4, 8, 12 or
// 16) and stages per warp (2..8): 0 for the defaults (16 warps, 3 stages, fewer where shared
// memory is short).
void launch(const mmvq_tiles::MmvqParams& p, GgmlType t, int warps, int stages, void* stream);

// The blocks' split of a launch of several-token groups by work, not by count. Items are
// (chunk ci, pass) in chunk-major order (ci passes + pass); a chunk of t tokens (kTok tokens,
// the group's last one the rest) weighs t + w0 a pass: the row decode, the step's copies and its
// bookkeeping are paid once a pass, the dots once a token (a two-token pass cost about 1.3 (Q2_K)
// and 1.5 (Q3_K) one-token passes in ncu's instruction counts, docs/performance.md). pre[0..G]
// and cpre[0..G] are the groups' token and chunk prefixes, so the work before group g is
// passes (pre[g] + w0 cpre[g]) and before item (ci, pass) of group g, chunk j = ci - cpre[g], it
// is that plus passes j (kTok + w0) + pass (its chunk's weight). first_item(X) is the first item
// whose work starts at or after X: monotone, 0 at 0 and every item (passes cpre[G]) at the total
// work, so the blocks' ranges [first_item(W b / B), first_item(W (b + 1) / B)) meet and cover
// every item once. Which block computes an item never changes its arithmetic. A block's chunks
// are bounded by max_chunks_per_block (the bound of its activation slots).
__host__ __device__ constexpr int64_t pass_weight(GgmlType t) {
  return t == GgmlType::kQ2K ? 3 : 2;
}

__host__ __device__ inline int64_t first_item(int64_t X, int64_t kTok, int64_t w0, int64_t G,
                                              const int32_t* pre, const int32_t* cpre,
                                              int64_t passes) {
  const auto before = [&](int64_t g) { return passes * (pre[g] + w0 * cpre[g]); };
  if (X >= before(G)) return passes * cpre[G];
  int64_t lo = 0, hi = G;  // before(lo) <= X < before(hi): lo ends at a group holding X
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (before(mid) <= X) lo = mid;
    else hi = mid;
  }
  const int64_t n = pre[lo + 1] - pre[lo], nch = cpre[lo + 1] - cpre[lo];
  const int64_t wf = kTok + w0;  // a full chunk's weight a pass
  int64_t off = X - before(lo);
  int64_t j = off / (passes * wf);
  if (j > nch - 1) j = nch - 1;
  off -= j * passes * wf;
  const int64_t w = (j == nch - 1 ? n - j * kTok : kTok) + w0;  // chunk j's weight a pass
  const int64_t pass = (off + w - 1) / w;  // the first pass starting at or after X
  return (cpre[lo] + j) * passes + pass;   // pass == passes: the next chunk's first item
}

// The most chunks a block's range under first_item can touch, for a launch of at most `pairs`
// pairs (group, token) and B blocks: pairs / B + 2. With D = passes (1 + w0), the lightest a
// chunk can weigh (a chunk holds a token or more), the total work is at most D pairs, so a
// block's share is at most ceil(D pairs / B) <= (q + 1) D, q = pairs / B. The chunks its range
// touches are consecutive; the first and the last each have at least one pass inside it
// (1 + w0 of work or more), and the ones between lie inside whole, so there are at most
// ((q + 1) D - 2 (1 + w0)) / D < q + 1 of those. This bounds a block's activation slots.
__host__ __device__ constexpr int64_t max_chunks_per_block(int64_t pairs, int64_t B) {
  return pairs / B + 2;
}

// cuda::set_mmvq_stream_pass_shape (cuda/kernels.h).
void set_pass_shape(int pass_tokens, bool whole_sm);
// cuda::set_mmvq_stream_step (cuda/kernels.h).
void set_step(int blocks);

}  // namespace moecheck::cuda::mmvq_sb
