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

// cuda::set_mmvq_stream_pass_shape (cuda/kernels.h).
void set_pass_shape(int pass_tokens, bool whole_sm);

}  // namespace moecheck::cuda::mmvq_sb
