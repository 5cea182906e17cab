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

// A pass's steps and a row's slot in a stage (shared with the host tests, tests/gpu/mmvq_test.cu).
constexpr int kChunkSb = 4;  // super-blocks of a row in a step of one a class (sb % 4)

// Steps of kPer super-blocks a class (kPer = 2: double steps, 8 blocks a row; docs/performance.md
// "Double steps"). A row's nsb super-blocks go as `full` steps of 4 kPer blocks, then (kPer = 2)
// `a4` steps of 4 (0 or 1), and the rem = nsb % 4 left over travel with the last of those (one
// copy a row and one step a pass fewer than a step of their own), or alone when there is none.
// Step q starts at super-block 4 kPer q and holds class_blocks(q) of each class, then the rem if
// it is the last.
struct StepPlan {
  int per, full, a4, rem, nq;
  __host__ __device__ constexpr StepPlan(int nsb, int per_)
      : per(per_),
        full(nsb / (kChunkSb * per_)),
        a4(nsb % (kChunkSb * per_) / kChunkSb),
        rem(nsb % kChunkSb),
        nq(full + a4 != 0 ? full + a4 : 1) {}
  __host__ __device__ constexpr int class_blocks(int q) const {
    return q < full ? per : q < full + a4 ? 1 : 0;
  }
  __host__ __device__ constexpr int blocks(int q) const {
    return kChunkSb * class_blocks(q) + (q == nq - 1 ? rem : 0);
  }
};

// A row's slot in a stage: the largest step's blocks (at least 4) after up to 14 bytes of
// alignment slack, the covering copy's tail and the funnel's one-word over-read, as an odd
// multiple of 16 bytes, so that the 32 lanes' word reads fall on distinct banks for Q2_K (rows
// 4 r banks apart mod 4 words, classes c offset by 21 c words on the residues between) and on at
// most two lanes a bank for Q3_K (counted over every row alignment; no slot pitch or per-row skew
// gets Q3_K's 110-byte blocks to one).
__host__ __device__ constexpr int slot_for_blocks(GgmlType t, int blocks) {
  const int need = 14 + blocks * (t == GgmlType::kQ2K ? 84 : 110) + 2 + 4;
  const int n16 = (need + 15) / 16;
  return 16 * (n16 % 2 == 1 ? n16 : n16 + 1);
}
__host__ __device__ constexpr int slot_bytes(GgmlType t, int nsb, int per = 1) {
  // Steps of one a class: the closed form of the loop below (4 blocks, or 4 + rem in the last
  // step of a row of 4 or more), which the kernels evaluate at run time.
  if (per == 1) {
    const int rem = nsb % kChunkSb;
    if (rem == 0 || nsb < kChunkSb) return t == GgmlType::kQ2K ? 368 : 464;
    return slot_for_blocks(t, kChunkSb + rem);
  }
  const StepPlan sp(nsb, per);
  int most = kChunkSb;
  for (int q = 0; q < sp.nq; ++q) most = sp.blocks(q) > most ? sp.blocks(q) : most;
  return slot_for_blocks(t, most);
}
// The closed form's 4-block pitches are the general rule's, and the pitches the bank counts above
// were made for: 4 blocks (368, 464), 4 + rem, 8 and 8 + rem.
static_assert(slot_for_blocks(GgmlType::kQ2K, 4) == 368 &&
              slot_for_blocks(GgmlType::kQ3K, 4) == 464);
static_assert(slot_bytes(GgmlType::kQ3K, 9) == 592 && slot_bytes(GgmlType::kQ2K, 20) == 368 &&
              slot_bytes(GgmlType::kQ3K, 8) == 464 && slot_bytes(GgmlType::kQ2K, 7) == 624);
static_assert(slot_bytes(GgmlType::kQ2K, 20, 2) == 720 &&
              slot_bytes(GgmlType::kQ3K, 9, 2) == 1040 && slot_bytes(GgmlType::kQ3K, 7, 2) == 816 &&
              slot_bytes(GgmlType::kQ2K, 2, 2) == 368);
static_assert(StepPlan(20, 2).nq == 3 && StepPlan(20, 2).blocks(2) == 4 && StepPlan(9, 2).nq == 1 &&
              StepPlan(9, 2).blocks(0) == 9 && StepPlan(7, 2).nq == 1 &&
              StepPlan(7, 2).blocks(0) == 7 && StepPlan(3, 2).blocks(0) == 3 &&
              StepPlan(20, 1).nq == 5 && StepPlan(9, 1).blocks(1) == 5 &&
              StepPlan(2, 1).blocks(0) == 2);

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
