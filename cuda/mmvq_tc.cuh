// The one-token MMVQ engine on tensor cores (cuda/mmvq_tc.cu), taken by cuda/mmvq.cu's launcher
// when cuda::MmvqEngine::kTensorCore is set (not the default: measured slower than the dp4a
// kernel) for every launch whose groups hold one token (the layer's one-token path,
// mmvq_experts, the plain form at T = 1). Same contract and bits as the dp4a kernel:
// docs/numerics.md "mmvq_q2k, mmvq_q3k"; the schedule is described in cuda/mmvq_tc.cu and
// docs/performance.md.
#pragma once

#include "core/blocks.h"
#include "cuda/mmvq_tiles.cuh"

namespace moecheck::cuda::mmvq_tc {

// True when the engine takes this launch: Q2_K or Q3_K, one token per group, K small enough for
// one warp's staged activation row (K <= 16384).
bool supported(GgmlType t, int64_t K, int max_n);

// Launches the engine on validated parameters (cuda/mmvq.cu launch() has checked shapes and
// filled row_bytes, max_n, n_groups). stages: 4 or 6 tile stages per block (0: the default, 4).
// mode: 0, bulk copies (cp.async.bulk); 1, 16-byte cp.async; 2 and 3, those copies alone with no
// arithmetic and no output (diagnostics: what the copy pipeline moves by itself).
void launch(const mmvq_tiles::MmvqParams& p, GgmlType t, int stages, int mode, void* stream);

}  // namespace moecheck::cuda::mmvq_tc
