// The layer's skeleton (`layer_bench skeleton`): the one-token and several-token layer's launch
// structure with every kernel replaced by a plain read of the bytes that kernel reads, so that
// what the structure alone costs (its dependent launches, the fork and join of the shared
// expert's stream, the selection between the router and the routed experts) is measured on the
// card, apart from what the kernels cost. No arithmetic of docs/numerics.md is involved: the
// skeleton reads bytes and xor-folds them, and its check is that fold against the host's (every
// byte read exactly once).
//
// Bytes (ds41 at T tokens with U distinct experts, the layer's own routing of each input): the
// router's bf16 rows; the U experts' gate and up (Q2_K) and down (Q3_K) from a pool of all
// n_routed experts laid out as the GGUF stacks' sizes; the shared expert's bf16 gate, up and
// down. Exactly layer_bench's floor bytes.
//
// Seven forms, each captured once as a graph and replayed, queued behind a hold as the layer's
// own rows are (bench::Submit::kQueued):
//  - kOneRead: every byte of the layer in one launch with no dependency (the routed spans
//    straight from the input's list): the read floor a single launch reaches.
//  - kLaunches: the driver's launch chain on two streams. Main: router read -> selection (one
//    warp: reads the router's fold, then the input's expert list from a device table) -> gate / up
//    read of the selected experts (addresses from the selection's output) -> a small SwiGLU-sized
//    kernel -> down read -> a small accumulation-sized kernel; side stream forked after the
//    router: shared gate + up read -> shared down read, joined before the accumulation.
//  - kLaunchesPdl: the same with programmatic dependent launch on the main chain (each kernel
//    waits before its first dependent read, then lets its dependent launch).
//  - kPersistent: one kernel, every block co-resident (cooperative launch), the phases separated
//    by grid barriers: router | selection (block 0) and shared gate + up | routed gate / up |
//    routed down and shared down | accumulation-sized writes. The same bytes and the same
//    dependencies with no launch between them: what one persistent layer kernel with this phase
//    order and this barrier costs (measured on an H100: the barrier is not cheap, see
//    docs/performance.md "The layer beside its skeleton").
//  - kBarriersOnly: that kernel with no bytes (its launch, the selection and the four barriers).
//  - kFlow: the same phases in one block of 1024 threads a multiprocessor, driven by counters
//    that wait only for the layer's own dependencies (flow_kernel); kFlowOnly: without its bytes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/pdl.cuh"
#include "tests/bench/bench_util.h"

namespace moecheck::bench::skeleton {

// count spans of `words` 16-byte words: span j at base + id_j * stride + offset, id_j = ids[j]
// (ids == nullptr: id_j = j; count_dev != nullptr: the count is read from the device, else
// count_fixed). sel != nullptr: the ids and the count are those of input *sel of a table, ids +
// *sel * sel_stride and count_dev[*sel].
struct SpanSet {
  const uint8_t* base = nullptr;
  int64_t stride = 0, offset = 0;
  uint32_t words = 0;
  const int32_t* ids = nullptr;
  const int32_t* count_dev = nullptr;
  int32_t count_fixed = 0;
  const int32_t* sel = nullptr;
  int32_t sel_stride = 0;
};

// The most experts a set's ids may name (the block stages them in shared memory).
constexpr int kMaxIds = 512;

// Loads through the L1-bypassing path (ld.global.cg): the selection's ids and counts are written
// by another block or kernel of the same graph replay.
__device__ __forceinline__ int32_t load_cg(const int32_t* p) { return __ldcg(p); }

// Every thread of the block reads its share of the set's words (thread `tid` of `nth`, four loads
// in flight), xor-folded. Called by all threads of a block together (the ids are staged in shared
// memory first).
__device__ __forceinline__ uint32_t read_set(const SpanSet& s, uint32_t tid, uint32_t nth) {
  __shared__ int32_t sids[kMaxIds];
  int32_t count = s.count_fixed;
  const int32_t* ids = s.ids;
  if (s.sel != nullptr) {
    const int32_t in = load_cg(s.sel);
    ids += static_cast<int64_t>(in) * s.sel_stride;
    count = load_cg(s.count_dev + in);
  } else if (s.count_dev != nullptr) {
    count = load_cg(s.count_dev);
  }
  if (count > kMaxIds) __trap();
  if (ids != nullptr) {  // uniform in the block: every thread holds the same set
    __syncthreads();     // a previous set's ids are no longer read
    for (int j = threadIdx.x; j < count; j += blockDim.x) sids[j] = load_cg(ids + j);
    __syncthreads();
  }
  const uint32_t words = s.words;
  // Span of word i: a float estimate of i / words, corrected by one step (|i| < 2^28 and words
  // above 2^16 keep the estimate within one); no division a word.
  const float inv = words != 0 ? 1.0f / static_cast<float>(words) : 0.0f;
  const bool multi = count > 1;
  auto word = [&](uint32_t i) {
    uint32_t j = 0;
    if (multi) {
      j = __float2uint_rz(__uint2float_rz(i) * inv);
      if (j * words > i) --j;
      else if ((j + 1) * words <= i) ++j;
    }
    const int64_t id = ids != nullptr ? sids[j] : j;
    return reinterpret_cast<const uint4*>(s.base + id * s.stride + s.offset) + (i - j * words);
  };
  const uint32_t total = static_cast<uint32_t>(count) * words;
  if (total >= (1u << 28)) __trap();  // the estimate's bound (kMaxIds x the largest span is below)
  uint32_t acc = 0, i = tid;
  for (; i + 3 * nth < total; i += 4 * nth) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __ldg(word(i + k * nth));
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < total; i += nth) {
    const uint4 v = __ldg(word(i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}

// The selection's inputs: the expert lists of n_inputs inputs ([n_inputs][max_u] ids, counts),
// the current input's index (advanced by the accumulation-sized step), and its outputs.
struct Plan {
  const int32_t* table = nullptr;
  const int32_t* counts = nullptr;
  int32_t max_u = 0, n_inputs = 0;
  int32_t* input = nullptr;
  int32_t* ids = nullptr;
  int32_t* count = nullptr;
};

// One read launch: its sets in order; block b's fold to sink[b]. advance != 0: the last block to
// finish moves the plan to the next input (done: a zeroed counter).
constexpr int kMaxSets = 5;
struct Sets {
  SpanSet s[kMaxSets];
  int n = 0;
};
__global__ void __launch_bounds__(512)
    read_kernel(Sets sets, uint32_t* sink, Plan p, unsigned* done, int advance) {
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, nth = gridDim.x * blockDim.x;
  uint32_t acc = 0;
  for (int k = 0; k < sets.n; ++k) acc ^= read_set(sets.s[k], tid, nth);
  const uint32_t f = block_fold(acc);
  if (threadIdx.x == 0) {
    sink[blockIdx.x] = f;
    if (advance != 0) {
      __threadfence();
      if (atomicAdd(done, 1) == gridDim.x - 1) {
        atomicExch(done, 0);
        *p.input = (load_cg(p.input) + 1) % p.n_inputs;
      }
    }
  }
}

// The selection: one warp reads the router's first fold (the dependency) and the current input's
// expert list, and writes the ids and their count.
__device__ __forceinline__ void select_experts(const Plan& p, const uint32_t* router_sink,
                                               uint32_t* scratch) {
  const int32_t in = load_cg(p.input);
  const int32_t n = p.counts[in];
  for (int j = threadIdx.x; j < n; j += 32) p.ids[j] = p.table[in * p.max_u + j];
  if (threadIdx.x == 0) {
    *p.count = n;
    scratch[0] = __ldcg(router_sink);  // keeps the router's fold a real input of the selection
  }
}

__global__ void select_kernel(Plan p, const uint32_t* router_sink, uint32_t* scratch) {
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  select_experts(p, router_sink, scratch);
}

// n floats written (the SwiGLU's and the accumulation's outputs are this size); advance != 0:
// thread 0 of block 0 moves the plan to the next input (after the whole graph's reads).
__global__ void write_kernel(float* out, int64_t n, Plan p, int advance) {
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i);
  if (advance != 0 && i == 0) *p.input = (load_cg(p.input) + 1) % p.n_inputs;
}

// A grid barrier for co-resident blocks (the persistent form's launch is cooperative): count
// arrivals, the last one resets the count and opens the next generation; the others poll the
// generation with plain (volatile) loads, so that the polls do not queue behind the arrivals'
// atomics at the same address.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* vgen = gen;
    const unsigned g = *vgen;
    __threadfence();
    if (atomicAdd(count, 1) == gridDim.x - 1) {
      atomicExch(count, 0);
      __threadfence();
      atomicAdd(gen, 1);
    } else {
      while (*vgen == g) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

struct PersistentArgs {
  SpanSet router, shared_pair, routed_gu, routed_down, shared_down;
  Plan plan;
  float* swiglu_out;
  int64_t swiglu_n;
  float* acc_out;
  int64_t acc_n;
  unsigned* bar;  // [count, gen]
  uint32_t* sink;
  uint32_t* scratch;
};

__global__ void __launch_bounds__(512) persistent_kernel(PersistentArgs a) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, nth = gridDim.x * blockDim.x;
  uint32_t acc = read_set(a.router, tid, nth);
  // The router's fold of this block, where the selection reads it (block 0's own).
  {
    const uint32_t f = block_fold(acc);
    if (threadIdx.x == 0 && blockIdx.x == 0) a.scratch[1] = f;
  }
  grid_barrier(a.bar, a.bar + 1);
  if (blockIdx.x == 0 && threadIdx.x < 32) select_experts(a.plan, a.scratch + 1, a.scratch);
  acc ^= read_set(a.shared_pair, tid, nth);
  grid_barrier(a.bar, a.bar + 1);
  acc ^= read_set(a.routed_gu, tid, nth);
  for (int64_t i = tid; i < a.swiglu_n; i += nth) a.swiglu_out[i] = static_cast<float>(i);
  grid_barrier(a.bar, a.bar + 1);
  acc ^= read_set(a.routed_down, tid, nth);
  acc ^= read_set(a.shared_down, tid, nth);
  grid_barrier(a.bar, a.bar + 1);
  for (int64_t i = tid; i < a.acc_n; i += nth) a.acc_out[i] = static_cast<float>(i);
  block_fold_to(acc, a.sink);
  if (tid == 0) *a.plan.input = (load_cg(a.plan.input) + 1) % a.plan.n_inputs;
}

// Waits (one thread) until the counter at p has reached target (counters only grow; the signed
// difference keeps the test right across wrap-around).
__device__ __forceinline__ void wait_at_least(const unsigned* p, unsigned target) {
  const volatile unsigned* v = p;
  while (static_cast<int>(*v - target) < 0) __nanosleep(20);
}

// The persistent form driven by counters in place of grid barriers, one block of 1024 threads a
// multiprocessor (cooperative launch). flow = [epoch, router done, selection, gate / up done,
// down done, writes done], each counting arrivals over every replay (replay E's targets are
// (E + 1) x blocks, its selection flag E + 1; the epoch, the replays completed, is read at the
// start and moved by the last block). Only the dependencies the layer has are waited for: block
// 0 alone waits for the whole router before it selects, every block reads its share of the
// shared gate + up meanwhile and waits for the selection only before the routed gate / up; the
// routed down waits for every block's gate / up, the accumulation-sized writes for every down.
__global__ void __launch_bounds__(1024) flow_kernel(PersistentArgs a, unsigned* flow) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, nth = gridDim.x * blockDim.x;
  const unsigned G = gridDim.x;
  __shared__ unsigned epoch;
  if (threadIdx.x == 0) epoch = *static_cast<volatile unsigned*>(flow);
  __syncthreads();
  const unsigned E = epoch, all = (E + 1) * G;
  auto arrive = [&](int k) {  // after a __syncthreads: the block's work of phase k is done
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(flow + k, 1);
    }
  };
  uint32_t acc = read_set(a.router, tid, nth);
  {
    const uint32_t f = block_fold(acc);  // ends with every thread past its reads
    if (threadIdx.x == 0 && blockIdx.x == 0) a.scratch[1] = f;
  }
  arrive(1);
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) wait_at_least(flow + 1, all);
    __syncthreads();
    if (threadIdx.x < 32) select_experts(a.plan, a.scratch + 1, a.scratch);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicExch(flow + 2, E + 1);
    }
  }
  acc ^= read_set(a.shared_pair, tid, nth);
  if (threadIdx.x == 0) wait_at_least(flow + 2, E + 1);
  __syncthreads();
  acc ^= read_set(a.routed_gu, tid, nth);
  for (int64_t i = tid; i < a.swiglu_n; i += nth) a.swiglu_out[i] = static_cast<float>(i);
  __syncthreads();
  arrive(3);
  if (threadIdx.x == 0) wait_at_least(flow + 3, all);
  __syncthreads();
  acc ^= read_set(a.routed_down, tid, nth);
  acc ^= read_set(a.shared_down, tid, nth);
  __syncthreads();
  arrive(4);
  if (threadIdx.x == 0) wait_at_least(flow + 4, all);
  __syncthreads();
  for (int64_t i = tid; i < a.acc_n; i += nth) a.acc_out[i] = static_cast<float>(i);
  const uint32_t f = block_fold(acc);
  if (threadIdx.x == 0) {
    a.sink[blockIdx.x] = f;
    __threadfence();
    if (atomicAdd(flow + 5, 1) == all - 1) {  // the last block: next input, next epoch
      *a.plan.input = (load_cg(a.plan.input) + 1) % a.plan.n_inputs;
      __threadfence();
      atomicExch(flow, E + 1);
    }
  }
}

enum class Form { kLaunches, kLaunchesPdl, kPersistent, kOneRead, kBarriersOnly, kFlow, kFlowOnly };

inline const char* form_name(Form f) {
  switch (f) {
    case Form::kLaunches: return "launch chain, plain launches";
    case Form::kLaunchesPdl: return "launch chain, programmatic launches";
    case Form::kPersistent: return "one persistent kernel, grid barriers";
    case Form::kOneRead: return "every byte in one read launch, no dependency";
    case Form::kBarriersOnly:
      return "the persistent kernel without its bytes (barriers, selection)";
    case Form::kFlow: return "one persistent kernel, a block a multiprocessor, counters";
    case Form::kFlowOnly: return "the counters' kernel without its bytes";
  }
  return "?";
}

// The layer's bytes, laid out for the skeleton, and its expert lists.
struct Bytes {
  int64_t router_bytes, gu_bytes, down_bytes, shared_pair_bytes, shared_down_bytes;
  int64_t swiglu_n, acc_n;
  std::vector<std::vector<int32_t>> experts;  // per input, sorted distinct ids
};

class Skeleton {
 public:
  Skeleton(const Bytes& b, int64_t n_routed) : b_(b) {
    int dev = 0;
    MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
    MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
    stride_ = b.gu_bytes + b.down_bytes;
    check16({b.router_bytes, b.gu_bytes, b.down_bytes, b.shared_pair_bytes, b.shared_down_bytes});
    pool_bytes_ = n_routed * stride_;
    other_bytes_ = b.router_bytes + b.shared_pair_bytes + b.shared_down_bytes;
    MOECHECK_CUDA_CHECK(cudaMalloc(&pool_, static_cast<size_t>(pool_bytes_)));
    MOECHECK_CUDA_CHECK(cudaMalloc(&other_, static_cast<size_t>(other_bytes_)));
    fill_random(pool_, static_cast<size_t>(pool_bytes_), 0x5EED1);
    fill_random(other_, static_cast<size_t>(other_bytes_), 0x5EED2);
    max_u_ = 1;
    for (const auto& e : b.experts)
      max_u_ = std::max<int32_t>(max_u_, static_cast<int32_t>(e.size()));
    std::vector<int32_t> table(b.experts.size() * max_u_, 0), counts;
    for (size_t i = 0; i < b.experts.size(); ++i) {
      counts.push_back(static_cast<int32_t>(b.experts[i].size()));
      std::copy(b.experts[i].begin(), b.experts[i].end(), table.begin() + i * max_u_);
    }
    table_ = upload(table);
    counts_ = upload(counts);
    MOECHECK_CUDA_CHECK(cudaMalloc(&ints_, 4 * (max_u_ + 2)));  // input, count, ids
    MOECHECK_CUDA_CHECK(cudaMemset(ints_, 0, 4 * (max_u_ + 2)));
    // count, gen; done; the flow kernel's six counters
    MOECHECK_CUDA_CHECK(cudaMalloc(&bar_, 9 * sizeof(unsigned)));
    MOECHECK_CUDA_CHECK(cudaMemset(bar_, 0, 9 * sizeof(unsigned)));
    done_ = bar_ + 2;
    flow_ = bar_ + 3;
    MOECHECK_CUDA_CHECK(cudaMalloc(&scratch_, 16));
    int per_sm = 0;
    MOECHECK_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, 512, 0));
    persistent_grid_ = sms_ * std::max(per_sm, 1);
    read_grid_ = 4 * sms_;
    sink_n_ = 6 * read_grid_ + persistent_grid_;
    MOECHECK_CUDA_CHECK(cudaMalloc(&sink_, 4 * sink_n_));
    MOECHECK_CUDA_CHECK(cudaMalloc(&out_, 4 * (b.swiglu_n + b.acc_n)));
    MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    MOECHECK_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  }
  ~Skeleton() {
    cudaStreamDestroy(s_);
    cudaStreamDestroy(side_);
    cudaEventDestroy(fork_);
    cudaEventDestroy(join_);
    for (void* p : std::initializer_list<void*>{pool_, other_, table_, counts_, ints_, bar_,
                                                scratch_, sink_, out_})
      cudaFree(p);
  }
  Skeleton(const Skeleton&) = delete;
  Skeleton& operator=(const Skeleton&) = delete;

  int persistent_grid() const { return persistent_grid_; }

  // The form's graph: checked first (input 0: the sinks' fold equals the host's fold of the
  // bytes input 0 reads, or exit 1), then median device microseconds of `reps` replays queued
  // behind a hold after `warm`, the inputs rotating. -1 (printed) when the graph could not be
  // made (the persistent forms' cooperative launch refused in a capture).
  double time_form(Form f, int warm, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    launch_error_ = cudaSuccess;
    enqueue(f);
    const cudaError_t end = cudaStreamEndCapture(s_, &g);
    cudaError_t inst = cudaSuccess;
    if (launch_error_ == cudaSuccess && end == cudaSuccess) inst = cudaGraphInstantiate(&ge, g, 0);
    if (launch_error_ != cudaSuccess || end != cudaSuccess || inst != cudaSuccess) {
      // The cooperative launch is the one step a driver may refuse in a graph: report, go on.
      std::printf("skeleton '%s' not timed: launch %s, capture %s, instantiate %s\n", form_name(f),
                  cudaGetErrorString(launch_error_), cudaGetErrorString(end),
                  cudaGetErrorString(inst));
      (void)cudaGetLastError();
      if (end == cudaSuccess) MOECHECK_CUDA_CHECK(cudaGraphDestroy(g));
      return -1;
    }
    set_input(0);
    MOECHECK_CUDA_CHECK(cudaMemset(sink_, 0, 4 * sink_n_));
    MOECHECK_CUDA_CHECK(cudaGraphLaunch(ge, s_));
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s_));
    const uint32_t got = xor_fold(sink_, static_cast<size_t>(4 * sink_n_));
    const uint32_t want = f == Form::kBarriersOnly || f == Form::kFlowOnly ? 0 : host_fold(0);
    if (got != want) {
      std::fprintf(stderr, "bench: skeleton '%s' folded %08x, the host %08x; not timing it\n",
                   form_name(f), got, want);
      std::exit(1);
    }
    std::printf("validated skeleton '%s': xor-fold of input 0's bytes %08x equal to the host's\n",
                form_name(f), want);
    set_input(0);
    const double ms = time_ms([&] { MOECHECK_CUDA_CHECK(cudaGraphLaunch(ge, s_)); }, warm, reps, s_,
                              Submit::kQueued);
    MOECHECK_CUDA_CHECK(cudaGraphExecDestroy(ge));
    MOECHECK_CUDA_CHECK(cudaGraphDestroy(g));
    return ms * 1e3;
  }

 private:
  static void check16(std::initializer_list<int64_t> v) {
    for (int64_t x : v)
      if (x % 16 != 0) {
        std::fprintf(stderr, "bench: skeleton span of %lld bytes is not a multiple of 16\n",
                     static_cast<long long>(x));
        std::exit(1);
      }
  }
  template <class T>
  static T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    MOECHECK_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  void set_input(int32_t i) {
    MOECHECK_CUDA_CHECK(cudaMemcpy(ints_, &i, 4, cudaMemcpyHostToDevice));
  }
  int32_t* input() const { return ints_; }
  int32_t* count() const { return ints_ + 1; }
  int32_t* ids() const { return ints_ + 2; }
  Plan plan() const {
    return Plan{table_,  counts_, max_u_, static_cast<int32_t>(b_.experts.size()),
                input(), ids(),   count()};
  }
  SpanSet fixed(int64_t off, int64_t bytes) const {
    SpanSet s;
    s.base = other_ + off;
    s.words = static_cast<uint32_t>(bytes / 16);
    s.count_fixed = 1;
    return s;
  }
  SpanSet router() const { return fixed(0, b_.router_bytes); }
  SpanSet shared_pair() const { return fixed(b_.router_bytes, b_.shared_pair_bytes); }
  SpanSet shared_down() const {
    return fixed(b_.router_bytes + b_.shared_pair_bytes, b_.shared_down_bytes);
  }
  SpanSet routed(bool down) const {
    SpanSet s;
    s.base = pool_;
    s.stride = stride_;
    s.offset = down ? b_.gu_bytes : 0;
    s.words = static_cast<uint32_t>((down ? b_.down_bytes : b_.gu_bytes) / 16);
    s.ids = ids();
    s.count_dev = count();
    return s;
  }

  void enqueue(Form f) {
    uint32_t* sk = sink_;
    const int64_t rg = read_grid_;
    auto read = [&](cudaStream_t st, std::initializer_list<SpanSet> list, bool pdl,
                    int advance = 0) {
      Sets sets;
      for (const SpanSet& x : list) sets.s[sets.n++] = x;
      cuda::pdl::Scope scope(pdl ? cuda::pdl::Mode::kLaunch : cuda::pdl::Mode::kOff);
      cuda::pdl::launch(read_kernel, dim3(static_cast<unsigned>(rg)), dim3(512), 0, st, sets, sk,
                        plan(), done_, advance);
      sk += rg;
    };
    auto write = [&](float* out, int64_t n, int advance, bool pdl) {
      cuda::pdl::Scope scope(pdl ? cuda::pdl::Mode::kLaunch : cuda::pdl::Mode::kOff);
      cuda::pdl::launch(write_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0,
                        s_, out, n, plan(), advance);
    };
    if (f == Form::kOneRead) {
      // The routed spans straight from the table (the current input's list, no selection), and
      // the last block to finish advances the input.
      SpanSet gu = routed(false), down = routed(true);
      for (SpanSet* x : {&gu, &down}) {
        x->ids = table_;
        x->count_dev = counts_;
        x->sel = input();
        x->sel_stride = max_u_;
      }
      read(s_, {router(), shared_pair(), gu, down, shared_down()}, false, 1);
      return;
    }
    if (f == Form::kPersistent || f == Form::kBarriersOnly || f == Form::kFlow ||
        f == Form::kFlowOnly) {
      const bool flow = f == Form::kFlow || f == Form::kFlowOnly;
      PersistentArgs a{router(), shared_pair(), routed(false), routed(true),       shared_down(),
                       plan(),   out_,          b_.swiglu_n,   out_ + b_.swiglu_n, b_.acc_n,
                       bar_,     sink_,         scratch_};
      if (f == Form::kBarriersOnly || f == Form::kFlowOnly)
        for (SpanSet* x : {&a.router, &a.shared_pair, &a.routed_gu, &a.routed_down, &a.shared_down})
          x->words = 0;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(static_cast<unsigned>(flow ? sms_ : persistent_grid_));
      cfg.blockDim = dim3(flow ? 1024 : 512);
      cfg.stream = s_;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      launch_error_ = flow ? cudaLaunchKernelEx(&cfg, flow_kernel, a, flow_)
                           : cudaLaunchKernelEx(&cfg, persistent_kernel, a);
      return;
    }
    const bool pdl = f == Form::kLaunchesPdl;
    read(s_, {router()}, false);
    MOECHECK_CUDA_CHECK(cudaEventRecord(fork_, s_));
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_));
    read(side_, {shared_pair()}, false);
    read(side_, {shared_down()}, false);
    MOECHECK_CUDA_CHECK(cudaEventRecord(join_, side_));
    {
      cuda::pdl::Scope scope(pdl ? cuda::pdl::Mode::kLaunch : cuda::pdl::Mode::kOff);
      cuda::pdl::launch(select_kernel, dim3(1), dim3(32), 0, s_, plan(),
                        static_cast<const uint32_t*>(sink_), scratch_);
    }
    read(s_, {routed(false)}, pdl);
    write(out_, b_.swiglu_n, 0, pdl);
    read(s_, {routed(true)}, pdl);
    MOECHECK_CUDA_CHECK(cudaStreamWaitEvent(s_, join_));
    write(out_ + b_.swiglu_n, b_.acc_n, 1, false);
  }

  // The xor of every 32-bit word input i's forward reads.
  uint32_t host_fold(size_t i) const {
    uint32_t f = xor_fold(other_, static_cast<size_t>(other_bytes_));
    for (int32_t e : b_.experts[i])
      f ^= xor_fold(pool_ + e * stride_, static_cast<size_t>(stride_));
    return f;
  }

  Bytes b_;
  int sms_ = 0;
  int64_t stride_ = 0, pool_bytes_ = 0, other_bytes_ = 0;
  uint8_t *pool_ = nullptr, *other_ = nullptr;
  int32_t *table_ = nullptr, *counts_ = nullptr, *ints_ = nullptr;
  int32_t max_u_ = 1;
  unsigned *bar_ = nullptr, *done_ = nullptr, *flow_ = nullptr;
  uint32_t *scratch_ = nullptr, *sink_ = nullptr;
  int64_t persistent_grid_ = 0, read_grid_ = 0, sink_n_ = 0;
  float* out_ = nullptr;
  cudaStream_t s_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cudaError_t launch_error_ = cudaSuccess;
};

}  // namespace moecheck::bench::skeleton
