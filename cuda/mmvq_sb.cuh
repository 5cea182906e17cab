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

// A pass's steps and a row's slot in a stage (shared with the host tests,
// tests/gpu/mmvq_sb_host_test.cu).
constexpr int kChunkSb = 4;  // super-blocks of a row in a step of one a class (sb % 4)

// The engine's shapes (cuda/mmvq_sb.cu's kernel, the launch's geometry below and the host tests).
constexpr int kPassRows = 8;  // rows per pass: lane = 4 row + class
constexpr int kSmemMax = 227 * 1024;
constexpr int kDefaultWarps = 16, kDefaultStages = 3;
// The one-token shape of 14 warps (cuda::stream_warps_allowed): with 2 stages of 8 Q2_K rows of K
// = 5120 a block takes 99.3 KB, and at most 120 registers a thread (the kernel's launch bound; 96
// with nvcc 13.0) leave at least 11776 registers, so one block of the shared expert's pair GEMV
// (4 warps of 80 registers, 10240, and 92.2 KB) fits beside it; the one-token gate / up launch's
// 3456 passes then take at most two a warp on 132 multiprocessors (1848 warps), where 12 warps
// (1584) leave some warps three.
constexpr int kOneTokenWarps = 14, kOneTokenStages = 2;
// What a launch asked for 14 warps takes where that is not the one-token shape (groups of several
// tokens, forced steps of 8): the next shape the kernel is instantiated for.
constexpr int kOneTokenFallbackWarps = 12;
// Steps a warp issues before its block stages the activations (Settings::head; measured against
// the whole ring first in docs/performance.md "The ring's head").
constexpr int kDefaultHead = 1;
// Launches with groups of several tokens: the most tokens a pass computes (its chunk).
constexpr int kPassTokens = 2;
// Groups of several tokens: the most groups a launch may have (the blocks' prefix of their token
// counts, 16 KB of shared memory).
constexpr int64_t kMaxPrefixGroups = 4096;

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

// The block's shared memory: the warps' rings (warp w's S stages at w S stage), then the
// activation slots, one per pair (group, token) the block's passes touch: per unit g (super-block
// sb = g / 8, position b = g % 8) the 32 quants at q + 272 sb + 32 b and {d8, half sums as two
// 16-bit halves, -4 a0, -4 a1} at m + 144 sb + 16 b (16 bytes of padding per super-block put the
// four classes' units on different banks); then the stage barriers, then (groups of several
// tokens) the prefix of the groups' token counts.
constexpr int kActQSb = 8 * 32 + 16, kActMSb = 8 * 16 + 16;
struct Layout {
  int slot, stage, acts, act_bytes, act_m, bar, bytes;
  __host__ __device__ Layout(int pitch, int units, int warps, int stages, int n_act) {
    slot = pitch;
    stage = kPassRows * pitch;
    acts = warps * stages * stage;
    act_m = kActQSb * (units / 8);  // within a slot
    act_bytes = act_m + kActMSb * (units / 8);
    bar = acts + n_act * act_bytes;
    bytes = bar + warps * stages * 8;
  }
};

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

// Block b of B's items [b0, b1): by count (one-token passes: every pass weighs the same), or by
// work through first_item (passes of several tokens), the total work W = passes (pre[G] +
// w0 cpre[G]). The kernel and the host tests take their ranges from here.
struct ItemRange {
  int64_t b0, b1;
};
// b and B as blockIdx.x and gridDim.x are (unsigned; b + 1 is formed before the widening).
__host__ __device__ inline ItemRange block_items(uint32_t b, uint32_t B, int64_t total) {
  return {total * b / B, total * (b + 1) / B};
}
__host__ __device__ inline ItemRange block_items_by_work(uint32_t b, uint32_t B, int64_t kTok,
                                                         int64_t w0, int64_t G, const int32_t* pre,
                                                         const int32_t* cpre, int64_t passes) {
  const int64_t W = passes * (pre[G] + w0 * cpre[G]);
  return {first_item(W * b / B, kTok, w0, G, pre, cpre, passes),
          first_item(W * (b + 1) / B, kTok, w0, G, pre, cpre, passes)};
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

// The launch's geometry: warps, stages per warp, grid and activation slots per block, chosen on
// the host from upper bounds (every group at max_n tokens); the kernel's live ranges are within
// them (it traps on a block whose pairs exceed n_act). Host code, here so that the host tests
// (tests/gpu/mmvq_sb_host_test.cu, run in CI without a GPU) check the choices at any multiprocessor
// count.
struct Geometry {
  int stages, n_act, bytes;
  int64_t grid;
  int tok;        // tokens a pass (chunk)
  bool one_wave;  // a block per multiprocessor at most (the activation slots did not add blocks)
  int per = 1;    // super-blocks a class a step (StepPlan)
  int warps = 0;  // warps a block (choose())
};

// The process's settings that steer the choice (diagnostics: cuda::set_mmvq_stream_pass_shape,
// cuda::set_mmvq_stream_step). pass_tokens: tokens a pass in launches of several-token groups (0:
// the launch's own, MmvqParams::pass_tokens); whole_sm: those launches take a multiprocessor's
// whole shared memory; step: super-blocks a row a step, 4 or 8, 0 the default (choose()).
struct Settings {
  int pass_tokens = 0;
  bool whole_sm = false;
  int step = 0;
  int head = -1;  // steps a warp issues before the activation staging (-1: kDefaultHead)
};

// Groups of several tokens: the blocks' token and chunk prefixes (cuda/mmvq_sb.cu's Pairs).
inline bool prefixed(const mmvq_tiles::MmvqParams& p) {
  return p.form == mmvq_tiles::Form::kGroups && p.max_n > 1;
}

inline int extra_bytes(const mmvq_tiles::MmvqParams& p, int n_act) {
  const int prefix = prefixed(p) ? static_cast<int>(8 * (p.n_groups + 1)) : 0;
  return (4 * n_act + prefix + 15) / 16 * 16;
}

// Fits W warps on `sms` multiprocessors: the most stages up to `want` (at least 2) with which one
// block per multiprocessor holds the activation slots of its chunks, else the fewest blocks (more
// than one per multiprocessor) over every stage count. False: does not fit at all.
inline bool geometry(const mmvq_tiles::MmvqParams& p, int slot, int warps, int want, int64_t sms,
                     const Settings& set, Geometry& g) {
  using mmvq_tiles::Form;
  const int units = static_cast<int>(p.K / kQK8_1);
  const int tok = !prefixed(p) ? 1 : set.pass_tokens != 0 ? set.pass_tokens : p.pass_tokens;
  // Upper bounds of the launch's pairs (group, token) and chunks: every group at max_n tokens;
  // the device-planned form has at most proj_stride pairs a projection (mmvq_groups_planned).
  int64_t pairs = p.form == Form::kPlain ? p.T : p.n_groups * p.max_n;
  if (p.form == Form::kGroups && p.dev_count != nullptr && p.n_proj * p.proj_stride < pairs)
    pairs = p.n_proj * p.proj_stride;
  int64_t chunks = pairs;
  if (tok > 1 && p.n_groups * ((p.max_n + tok - 1) / tok) < chunks)
    chunks = p.n_groups * ((p.max_n + tok - 1) / tok);
  const int64_t passes = (p.rows + kPassRows - 1) / kPassRows;
  const int64_t items = passes * chunks;
  int64_t grid = (items + warps - 1) / warps;
  grid = grid < 1 ? 1 : grid < sms ? grid : sms;
  // A block's pairs: its chunks times tok. Split by count (one-token passes): its items over
  // passes, plus one chunk split by the range. Split by work (several-token passes,
  // first_item): max_chunks_per_block.
  auto acts = [&](int64_t gg) {
    int64_t a;
    if (tok > 1) {
      a = max_chunks_per_block(pairs, gg) * tok;
    } else {
      const int64_t ipb = (items + gg - 1) / gg;
      a = ((ipb + passes - 1) / passes + 1) * tok;
    }
    return a < pairs ? a : pairs;
  };
  // The fewest blocks whose activation slots fit in room (each a block per multiprocessor or
  // more), from the bounds above.
  auto grid_for = [&](int64_t room) {
    const int64_t c = room / tok - (tok > 1 ? 2 : 1);  // whole chunks a block may hold
    if (c < 1) return items + 1;                       // none: does not fit
    if (tok > 1) return (pairs + c - 1) / c;
    return (items + c * passes - 1) / (c * passes);
  };
  bool found = false;
  for (int s = want; s >= 2; --s) {
    const Layout L0(slot, units, warps, s, 0);
    const int per_act = L0.act_bytes + 4;
    const int64_t room = (kSmemMax - L0.bytes - extra_bytes(p, 0) - 16) / per_act;
    if (room < 2 * tok) continue;
    int64_t gr = grid;
    if (acts(gr) > room) gr = grid_for(room);
    if (gr > items) continue;
    if (found && gr >= g.grid) continue;
    const int n_act = static_cast<int>(acts(gr));
    const int bytes = Layout(slot, units, warps, s, n_act).bytes + extra_bytes(p, n_act);
    if (bytes > kSmemMax) continue;
    g.stages = s;
    g.n_act = n_act;
    g.grid = gr;
    g.bytes = set.whole_sm && prefixed(p) ? kSmemMax : bytes;
    g.tok = tok;
    g.one_wave = gr <= grid;
    found = true;
    if (gr <= grid) break;  // one block per multiprocessor at the most stages that fit
  }
  return found;
}

// The launch's whole choice (cuda/mmvq_sb.cu launch()): warps (0: kDefaultWarps) and stages (0:
// kDefaultStages) as asked, fewer warps where the rings do not fit (16 or 14, then 12, 8, 4), and
// the step. 14 warps is a one-token shape with 2 stages unless asked (kOneTokenWarps); launches
// of several-token groups and forced steps of 8 take 12 in its place.
// Double steps (8 super-blocks a row) halve the steps' copies and bookkeeping but double the
// rings. The default takes them for launches of several-token groups (the layers of 2 - 32
// tokens) where the rings fit at the shape's warps, 2 stages or more, with a block per
// multiprocessor; not for one-token launches, which gain nothing alone and, with rings that
// large, keep the shared expert's GEMV blocks off the multiprocessors they run beside
// (docs/performance.md "Double steps"). Settings::step forces a form (8: where it fits at all).
// False: K does not fit the engine's shared memory.
inline bool choose(const mmvq_tiles::MmvqParams& p, GgmlType t, int warps, int stages, int64_t sms,
                   const Settings& set, Geometry& g) {
  g = Geometry{};  // every field the choice's own (per keeps its default where no branch sets it)
  const int nsb = static_cast<int>(p.K / kQK_K);
  const bool one_token_shape = warps == kOneTokenWarps && !prefixed(p) && set.step != 8;
  const int want = stages != 0 ? stages : one_token_shape ? kOneTokenStages : kDefaultStages;
  const int w0 = warps == 0                                    ? kDefaultWarps
                 : warps == kOneTokenWarps && !one_token_shape ? kOneTokenFallbackWarps
                                                               : warps;
  int w = w0;
  auto fit_warps = [&](int slot) {
    bool ok;
    while (!(ok = geometry(p, slot, w, want, sms, set, g)) && w > 4)
      w = w > 12 ? 12 : w > 8 ? 8 : 4;
    return ok;
  };
  bool fits = false;
  if (set.step == 8 || (set.step == 0 && prefixed(p) && nsb >= 2 * kChunkSb)) {
    const int slot2 = slot_bytes(t, nsb, 2);
    fits =
        set.step == 8 ? fit_warps(slot2) : geometry(p, slot2, w, want, sms, set, g) && g.one_wave;
    if (fits) g.per = 2;
    else w = w0;
  }
  if (!fits) fits = fit_warps(slot_bytes(t, nsb));
  g.warps = w;
  return fits;
}

// cuda::set_mmvq_stream_pass_shape (cuda/kernels.h).
void set_pass_shape(int pass_tokens, bool whole_sm);
// cuda::set_mmvq_stream_step (cuda/kernels.h).
void set_step(int blocks);
void set_head(int steps);
// cuda::set_mmvq_stream_diagnostic (cuda/kernels.h).
void set_diagnostic(int mode, uint64_t* buffer, int64_t capacity_warps);

}  // namespace moecheck::cuda::mmvq_sb
