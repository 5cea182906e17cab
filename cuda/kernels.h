// Host-callable wrappers of the token-path kernels (moecheck::cuda), one per op stem, each the
// twin of the moecheck::emu function of the same name and bit-for-bit equal to it
// (docs/numerics.md). All pointers are device pointers; `stream` is a cudaStream_t passed as
// void* (nullptr: the legacy default stream) so that this header needs no CUDA header.
// Preconditions (shapes, alignment, token counts, warps) are checked before launch and thrown
// as moecheck::InputError; CUDA failures abort through MOECHECK_CUDA_CHECK (cuda/check.h).
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "core/layer_plan.h"
#include "core/schedule.h"

namespace moecheck::cuda {

// ---- router_gemv, bf16_gemv (cuda/router_gemv.cu, cuda/bf16_gemv.cu) ----
// w [rows, K] (router_gemv: BF16 or F16 by w_type; bf16_gemv: bf16), x bf16 [T, K], y f32
// [T, rows]. K a positive multiple of 8 (kGemvChunk); w and x 16-byte aligned. Any T (launched in
// groups of kMaxGroupRows tokens; bf16_gemv and bf16_gemv_pair above kMaxGroupRows tokens as a
// GEMM, cuda/bf16_gemm.cu, the staged router as one too, cuda/router_gemv.cu; no bit depends on
// the grouping or the kernel).
// x_q8 (optional, K a multiple of 32): also q8_1 of x [T, K / 32], the bytes of
// quantize_q8_1_bf16; the staged variant writes them in its own launch (one launch fewer on the
// device route): up to 8 tokens from the warps that would otherwise idle while warp 0 folds a
// row's partials, above 8 tokens (the GEMM) from every warp after its folds; the plain variant by
// a quantize_q8_1_bf16 launch after its own.
void router_gemv(RouterVariant v, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                 int64_t K, int64_t T, void* stream, GgmlType w_type = GgmlType::kBF16,
                 BlockQ8_1* x_q8 = nullptr);
// The staged variant above kMaxGroupRows tokens runs as a GEMM of 8 rows x 8 tokens a block
// (cuda/router_gemv.cu, the same bits); false selects the groups-of-8 kernel at every T (for the
// benchmarks' comparison). Process-wide; default true.
void set_router_gemm(bool on);
// Above kMaxGroupRows tokens and for K up to 6144, the GEMM's persistent form (at most one block
// a multiprocessor walking the tiles, a token tile's x resident in shared memory, the weights
// streamed through a ring; the same bits); false keeps the form of a block a tile. Process-wide;
// default true.
void set_router_gemm_resident(bool on);
void bf16_gemv(const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t K, int64_t T,
               void* stream);
// Two matrices of one shape on the same x in one launch (the shared expert's gate and up);
// each output equals bf16_gemv of its matrix.
void bf16_gemv_pair(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, float* y0, float* y1,
                    int64_t rows, int64_t K, int64_t T, void* stream);

// ---- quantize_q8_1 (cuda/quantize_q8_1.cu) ----
// x f32 [R, K] (or bf16, widened exactly) -> y [R, K / 32]; K a multiple of 32.
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t R, int64_t K, void* stream);
void quantize_q8_1_bf16(const uint16_t* x, BlockQ8_1* y, int64_t R, int64_t K, void* stream);

// ---- mmvq (cuda/mmvq.cu): Q2_K / Q3_K rows x q8_1 rows, f32 out ----
// Launch groups are core/layer_plan.h's MmvqGroup: the matrix table[slot] ([rows, K], rows of
// K / 256 blocks) against n <= kMaxGroupRows activation rows a[a_row[i]], to y[y_row[i] * rows +
// r].

// Plain form (emu::mmvq): w [rows, K], a [T, K / 32], y [T, rows]; any T.
void mmvq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
          int64_t T, int warps, void* stream);
// One-token form over n experts in one launch (emu::mmvq_experts): expert_w is a DEVICE array
// of n base pointers (slot pointers, 2-byte aligned); a is [n or 1, K / 32]; y [n, rows].
void mmvq_experts(GgmlType t, const uint8_t* const* expert_w, int64_t n, const BlockQ8_1* a,
                  bool a_per_expert, float* y, int64_t rows, int64_t K, int warps, void* stream);
// The layer's form (emu::mmvq_groups): n_groups DEVICE groups against the DEVICE slot table;
// max_n (1..8) bounds every group's n and sizes the shared memory (a larger group traps).
// layer_tokens (both groups forms): the forward's token count when the caller knows it, 0 when
// not. The streamed engine (the default) takes every groups launch it supports (up to 4096
// groups; the device route bounds its launches' groups by n_routed, see mmvq_groups_planned),
// except Q2_K launches of layers above 341 tokens, in passes of one token for layers of up to 32
// tokens and of two above or when layer_tokens is 0 (a pass reads a group's rows once for its
// tokens); other launches take the dp4a kernel, which shares a row's decode among all its
// tokens (set_mmvq_stream_layer_tokens moves the limits). No bit depends on it.
void mmvq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                 int max_n, const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps,
                 void* stream, int64_t layer_tokens = 0);

// The layer's form with the plan built on the device (route_plan): projection j's groups are
// stored at groups + j * proj_stride (proj_stride = the plan's capacity per projection), their
// live count G is read from the DEVICE word *count when the kernel starts, and the launch computes
// the n_proj * G groups (gate and up: n_proj 2). Bits equal mmvq_groups on the same groups.
// Each projection's live groups hold at most proj_stride tokens in all (route_plan's groups
// partition the picks); the launch sizes its shared memory by that and traps past it.
// stream_warps (0, 4, 8, 12, 14 or 16): the streamed engine's warps per block for this launch (0:
// set_mmvq_stream_shape's). warm, warm_bytes (optional): a device range holding the plan (the
// count, the groups, the slot table), which the streamed engine's blocks prefetch into L1 when
// they start, so that the chain count -> group -> slot pointer -> copy costs one round trip to
// L2 instead of three. No bit depends on either. max_groups (optional, 0: proj_stride): a bound
// on each projection's live count that the caller can promise (the driver's MMVQ groups are one
// per used expert, so at most n_routed); the launch sizes the streamed engine's group prefix by
// it, so that large layers keep the streamed engine, and the kernels trap on a count above it.
void mmvq_groups_planned(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                         const int32_t* count, int n_proj, int64_t proj_stride, int max_n,
                         const BlockQ8_1* a, float* y, int64_t rows, int64_t K, int warps,
                         void* stream, int64_t layer_tokens = 0, int stream_warps = 0,
                         const void* warm = nullptr, int64_t warm_bytes = 0,
                         int64_t max_groups = 0);

// ---- mmq (cuda/mmq.cu): the batched form, for experts with more rows than one group ----
// The same bits as mmvq_groups on the same groups (docs/numerics.md "mmvq_q2k, mmvq_q3k"),
// integer parts on the int8 tensor cores. Weight rows are read as the 16-byte-aligned chunks
// covering them: a matrix's allocation must extend to the 16-byte boundary after its last row
// (the driver allocates 16 bytes of slack); matrix bases 16-byte aligned for Q2_K, 2 for Q3_K
// (the plain form checks 16). a 16-byte aligned.
// Plain form: w [rows, K], a [T, K / 32], y [T, rows]; any T.
void mmq(GgmlType t, const uint8_t* w, const BlockQ8_1* a, float* y, int64_t rows, int64_t K,
         int64_t T, void* stream);
// Groups form: n_groups DEVICE groups against the DEVICE slot table (as mmvq_groups), for each
// of n_proj projections: projection j's groups at groups + j * proj_stride (one launch).
void mmq_groups(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups, int64_t n_groups,
                int n_proj, int64_t proj_stride, const BlockQ8_1* a, float* y, int64_t rows,
                int64_t K, void* stream);
// Planned form (the device route): projection j's groups at groups + j * proj_stride, the live
// range [counts[3], counts[1]) read from the DEVICE plan counts {2G, G, U, Gs} when the kernel
// starts (core/route_header.h DevicePlanLayout: the MMVQ groups come first, then these).
void mmq_groups_planned(GgmlType t, const uint8_t* const* slots, const MmvqGroup* groups,
                        const int32_t* counts, int n_proj, int64_t proj_stride, const BlockQ8_1* a,
                        float* y, int64_t rows, int64_t K, void* stream);

// The MMVQ engines (docs/performance.md "GPU"). kStreamed (the default): the streamed engine
// (cuda/mmvq_sb.cu: a thread per row and super-block class, weight rows streamed into per-warp
// rings by bulk copies, one pass per (group, token)) for every launch whose K fits its shared
// memory (about 29 000): the plain form at T = 1, mmvq_experts, and the groups forms of layers of
// up to 8 tokens (layer_tokens above); the dp4a kernel of cuda/mmvq.cu otherwise. kDp4a: the
// dp4a kernel for every launch. kTensorCore: the tensor-core engine (cuda/mmvq_tc.cu) for every launch whose
// groups hold one token (K <= 16384), the dp4a kernel otherwise; measured slower than kDp4a on the
// H200 (docs/performance.md), kept as a tested alternative. No bit depends on the engine,
// tc_stages (4 or 6 tile stages per block; 0 = the default) or tc_mode 0 (bulk copies) / 1
// (16-byte cp.async). tc_mode 2 and 3 are diagnostics for benchmarks only: the copies alone, no
// arithmetic, no output. Process-wide, for benchmarks and tests; not thread-safe.
enum class MmvqEngine { kDp4a, kTensorCore, kStreamed };
void set_mmvq_engine(MmvqEngine e, int tc_stages = 0, int tc_mode = 0);
MmvqEngine mmvq_engine();
// The streamed engine's warps per block: 4, 8, 12, 14 or 16, or 0 for its default. 14 is a
// one-token shape (launches of several-token groups and steps of 8 take 12 in its place): 2 stages
// unless asked, at most 120 registers a thread, so that a block sits beside one block of the
// shared expert's pair GEMV (cuda/mmvq_sb.cuh choose()).
constexpr bool stream_warps_allowed(int w) {
  return w == 0 || w == 4 || w == 8 || w == 12 || w == 14 || w == 16;
}
// The same list as the refusals spell it (change the two together).
inline constexpr char kStreamWarpsAllowedText[] = "0, 4, 8, 12, 14 or 16";
// The streamed engine's shape: warps per block (4, 8, 12, 14 or 16) and ring stages per warp
// (2..8); 0 for the defaults (16 warps, 3 stages, fewer where shared memory is short). No bit
// depends on it. Process-wide, for benchmarks and tests; not thread-safe.
void set_mmvq_stream_shape(int warps, int stages);
// Caps the dp4a kernel's persistent grid at `cap` blocks per multiprocessor (0: as many as fit),
// leaving room for a concurrent kernel (the shared expert on the side stream). No bit depends on
// it. Process-wide, for benchmarks; not thread-safe.
void set_mmvq_blocks_per_sm(int cap);
// The largest layer_tokens (the groups forms' argument) whose launches take the streamed engine:
// n >= 1, or 0 for the defaults (Q2_K: 341; Q3_K: every layer; 8 gives the layers above 8
// tokens the dp4a kernel).
// For benchmarks; no bit depends on it. Process-wide, not thread-safe.
void set_mmvq_stream_layer_tokens(int64_t n);
// The same limit for the launches of one weight type only (Q2_K or Q3_K; else InputError).
void set_mmvq_stream_layer_tokens(int64_t n, GgmlType t);
// The streamed engine's launches of several-token groups: pass_tokens (1 or 2; 0 the default:
// one for layers of up to 32 tokens, two above) tokens a pass (the group's rows are read once
// per pass), and whole_sm: request a multiprocessor's whole shared memory, so that no other
// kernel's block runs beside one of theirs. For benchmarks and tests; no bit depends on either.
// Process-wide, not thread-safe.
void set_mmvq_stream_pass_shape(int pass_tokens, bool whole_sm);
// The streamed engine's tokens a pass for the groups launches of a layer of layer_tokens tokens
// when set_mmvq_stream_pass_shape has not forced one: 1 up to 32 tokens, else 2.
int mmvq_stream_pass_tokens(int64_t layer_tokens);
// The streamed engine's super-blocks a row a step: 4 (a block a class), 8 (two a class: half the
// steps, each step's copies and bookkeeping paid once for twice the arithmetic, in rings twice the
// size), or 0, the default: 8 for launches of several-token groups where those rings fit at the
// shape's warps with a block per multiprocessor and rows hold 8 super-blocks or more, 4 otherwise
// (one-token launches among them). 8 falls back to 4 where it fits no shape. For benchmarks and
// tests; no bit depends on it (each chain still meets its super-blocks in increasing order).
// Process-wide, not thread-safe.
void set_mmvq_stream_step(int blocks);
// The streamed engine's ring head: the steps each warp issues before the block stages its
// activations (0 .. stages; more than the launch's stages: all of them, the engine's order before
// 2026-12-05), the rest of its ring issued right after the staging; -1 the default (one step).
// For benchmarks and tests; no bit depends on it. Process-wide, not thread-safe.
void set_mmvq_stream_head(int steps);
// Diagnostics of the streamed engine's one-token launches (tests/bench/mmvq_bench.cu "The
// one-token launch, warp by warp"): mode 0 (the default) off; 1: every warp of each launch
// records its timeline (MmvqTimelineSlot) while computing exactly as always; 2: the same with the
// products and the output left out (the copies, their waits, the activation staging and the
// bookkeeping alone; y is not written). Warp w of block b writes kMmvqTimelineWords words at
// buffer + kMmvqTimelineWords (b warps + w); a launch whose warps exceed capacity_warps, a launch
// of several-token groups or one of steps of 8 throws InputError while a mode is set. Records are
// clock64() cycles of the warp's multiprocessor and %globaltimer nanoseconds; a slot a warp
// never reaches keeps what the buffer held. Process-wide, for benchmarks; not thread-safe.
enum MmvqTimelineSlot : int {
  kTlEntryNs = 0,       // %globaltimer at the warp's start
  kTlEntryClk = 1,      // clock64 at the warp's start
  kTlIssuedClk = 2,     // its first steps issued (the ring's stages)
  kTlPdlClk = 3,        // past the programmatic-launch wait
  kTlStagedClk = 4,     // the block's activation slots staged (a block barrier)
  kTlFirstDataClk = 5,  // the first step's bytes landed
  kTlPasses = 6,        // the warp's passes
  kTlSmBlock = 7,       // %smid | blockIdx.x << 32
  kTlPassEnd0 = 8,      // slots 8 .. 23: the end of pass j (its output formed), j < kTlPassEnds
  kTlPassEnds = 16,
  kTlExitClk = 24,     // clock64 at the warp's end
  kTlExitNs = 25,      // %globaltimer at the warp's end
  kTlWaitClk = 26,     // cycles spent waiting for steps' bytes (the mbarrier waits)
  kTlComputeClk = 27,  // cycles from each step's bytes to its end (products, output)
  kTlSteps = 28,       // the warp's steps
  kTlStagedNs = 29,    // %globaltimer at kTlStagedClk
  kMmvqTimelineWords = 32
};
void set_mmvq_stream_diagnostic(int mode, uint64_t* buffer, int64_t capacity_warps);
// The dp4a kernel's rows per warp: 0 (the default) two wherever the doubled tiles fit in shared
// memory, 1 always one (the kernel's fallback, so that tests reach it). No bit depends on it.
// Process-wide, for tests and benchmarks; not thread-safe.
void set_mmvq_rows_per_warp(int r);
// The one-token bf16_gemv / bf16_gemv_pair: true (the default) streams the weight rows into
// shared memory by bulk copies (cuda/gemv_stream.cu; K up to 6016 by default), false always
// takes the register-staged kernel (cuda/bf16_gemv.cu). No bit depends
// on it. Process-wide, for tests and benchmarks; not thread-safe.
void set_bf16_gemv_stream(bool on);
// The bf16 GEMVs of 2 - 8 tokens (the shared expert's, the plain router's): true (the default)
// stages the tokens' x rows in each block's shared memory (cuda/bf16_gemv.cu gemv_tokens_kernel,
// where n x K bf16 fit), false reads them from L2 for every weight row (gemv_plain_kernel, as
// before). No bit depends on it. Process-wide, for tests and benchmarks.
void set_bf16_gemv_x_staged(bool on);
// The 2 - 8 token GEMV's blocks per multiprocessor: 0 (the default) as many as fit while one
// block of the device route's selection still fits beside them, n at most n (32: as many as
// fit). No bit depends on it. Process-wide, for tests and benchmarks; InputError outside
// [0, 32].
void set_bf16_gemv_tokens_blocks(int per_sm);
// The layer's kernels (the router, the selection, the streaming GEMVs, SwiGLU, the streamed MMVQ,
// the accumulation) ask for the largest shared-memory carveout (true, the default) or the
// driver's default (false, as before), so that their blocks can share a multiprocessor (cuda/
// device_util.cuh prefer_shared_carveout). No bit depends on it. Process-wide, for benchmarks.
void set_max_shared_carveout(bool on);
// The streaming kernel's shape: warps per block (2, 4 or 8; two warps at most 64 registers)
// and row stages per warp (2 to 8, lowered to what fits a block's shared memory; 0: as many as
// fit, up to 8); two stages must fit (K up to about 23 000 on 2 warps, 11 600 on 4, 5 800 on
// 8). warps = stages = 0 restores the default: 4 warps x 2 stages for K up to 6016, the
// register-staged kernel above. n_mat: 1 for bf16_gemv's
// launches, 2 for bf16_gemv_pair's, 0 both. No bit depends on it. Process-wide, for tests and
// benchmarks; not thread-safe.
void set_bf16_gemv_stream_shape(int warps, int stages, int n_mat = 0);

// ---- route_select, route_plan (cuda/route_select.cu, cuda/route_plan.cu): the device route ----
// The most routed experts the device route takes (route_plan's shared memory: 16 bytes each).
constexpr int64_t kMaxRouteExperts = 2048;
// The routing scalars route_select needs (core/config.h MoeConfig's routing fields).
struct RouteParams {
  int64_t n_routed = 0, topk = 0;
  float gate_temp = 1.0f, route_scale = 1.0f;
  int score_func = 0;  // static_cast<int>(ScoreFunc)
  bool norm_topk_prob = true;
  int mmvq_max_rows = kMaxGroupRows;  // route_plan: experts with more pairs go to MMQ groups
};
// One layer's route header (core/route_header.h, RouteHeaderLayout{T, topk}) from logits
// [T, n_routed] f32, bias / bias_vl (nullable) [n_routed], image_mask [T] (nullable) and the
// layer's slot-table row slots [n_routed] i32; every pointer DEVICE. Equal to emu::route_select.
void route_select(const float* logits, int64_t T, const float* bias, const float* bias_vl,
                  const uint8_t* image_mask, const RouteParams& rp, const int32_t* slots,
                  int32_t* hdr, void* stream);
// One token's route_select and route_plan in one launch (the one-token layer's device route):
// the header and the plan (DevicePlanLayout{1, topk}, scratch included) equal those of
// route_select with T = 1 followed by route_plan. Every pointer DEVICE.
void route_select_plan_one(const float* logits, const float* bias, const float* bias_vl,
                           const uint8_t* image_mask, const RouteParams& rp, const int32_t* slots,
                           int32_t* hdr, const uint8_t* const* slot_gate,
                           const uint8_t* const* slot_up, const uint8_t* const* slot_down,
                           uint8_t* plan, void* stream);
// The device plan (core/route_header.h DevicePlanLayout{T, topk}) from a route header: slot
// pointers (slot_gate / slot_up / slot_down [n_slots], indexed by the slot table's value), the
// groups (per projection the Gs MMVQ groups, then the MMQ groups, as build_layer_plan with
// rp.mmvq_max_rows), accumulation rows and weights, counts {2G, G, U, Gs}. A header with a nonzero
// status gives counts 0 and zero rows and weights (the forward computes nothing and the host
// raises).
void route_plan(const int32_t* hdr, int64_t T, const RouteParams& rp, const int32_t* slots,
                const uint8_t* const* slot_gate, const uint8_t* const* slot_up,
                const uint8_t* const* slot_down, uint8_t* plan, void* stream);

// ---- swiglu_q8 (cuda/swiglu_q8.cu) ----
// g, u, h f32 [R, inter]; hq [R, inter / 32] (nullable: h only); inter a multiple of 32.
void swiglu_q8(const float* g, const float* u, float* h, BlockQ8_1* hq, int64_t R, int64_t inter,
               float limit, void* stream);
// The bf16 shared expert's SwiGLU: h f32 (nullable) and hb = f32_to_bf16(h) [R, inter].
void swiglu_bf16(const float* g, const float* u, float* h, uint16_t* hb, int64_t R, int64_t inter,
                 float limit, void* stream);

// ---- accumulate, finish (cuda/accumulate.cu) ----
// For token t: acc = +0; for k = 0..topk-1: acc = fma_rn(weights[t, k], down[rows[t, k], :],
// acc); acc = add_rn(acc, shared[t, :]). The caller orders each token's picks by ascending
// expert id (emu::accumulate sorts them itself). down [*, dim], shared [T, dim] (nullable: no
// shared term), acc f32 [T, dim]; y bf16 [T, dim] (nullable) = f32_to_bf16(acc).
void accumulate(const int32_t* rows, const float* weights, int64_t topk, const float* down,
                const float* shared, float* acc, uint16_t* y, int64_t T, int64_t dim, void* stream);
// accumulate runs four elements a thread (16-byte loads; the same chains and bits) where T > 8,
// dim % 4 == 0, topk <= 8 and down, shared, acc are 16-byte and y 8-byte aligned; false keeps
// one element a thread everywhere (for the tests and benchmarks). Process-wide; default true.
void set_accumulate_vector(bool on);
void finish(const float* acc, uint16_t* y, int64_t n, void* stream);

// Device pointer alignment check used by the wrappers (InputError naming `what`).
void require_aligned(const void* p, int bytes, const char* op, const char* what);

}  // namespace moecheck::cuda
