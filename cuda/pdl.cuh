// Programmatic dependent launch (PDL, sm_90): a kernel launched with the programmatic stream
// serialisation attribute may start while the kernel before it in its stream still runs; it
// must execute pdl::wait() before it reads anything that kernel (or one before it) writes.
// Launch order and memory only: nothing here touches the arithmetic of docs/numerics.md.
//
// The rules every kernel launched through pdl::launch keeps (docs/gpu.md "Programmatic
// dependent launch"):
//  1. every thread executes pdl::wait() before its first read of data written in the stream,
//     and before it exits (so that its grid's completion implies its predecessors');
//  2. pdl::launch_dependents() only after pdl::wait(), so a dependent that starts early may rely
//     on everything two launches back being complete;
//  3. work before the wait reads only what was complete before the predecessor started (the
//     weights, and under Mode::kEarlyReads the device plan of a kernel two launches back) and
//     writes only shared memory.
// pdl::wait() is a no-op in a kernel launched without the attribute (tests, the host route).
#pragma once

#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/device_util.cuh"

namespace moecheck::cuda::pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// How the launches made through pdl::launch on this host thread are issued: kOff as plain
// launches; kLaunch with the attribute (nothing read before the wait but constants); kEarlyReads
// with the attribute, and the kernel may read weights and the device plan before its wait
// (rule 3; the driver sets it only where the plan's writer is at least two launches back).
enum class Mode { kOff, kLaunch, kEarlyReads };

Mode mode();

// Sets the mode for the launches made in its lifetime on this thread (the layer driver wraps
// single launch calls in one).
class Scope {
 public:
  explicit Scope(Mode m);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Mode prev_;
};

// The launch-completion event of the next pdl::launch on this thread: while a StartEvent lives,
// the first launch made through pdl::launch records `ev` when all its blocks have begun
// (cudaLaunchAttributeLaunchCompletionEvent; ev made with cudaEventDisableTiming). A stream that
// waits on ev may then start beside that kernel, after its blocks hold their multiprocessors.
// Launch order only.
class StartEvent {
 public:
  explicit StartEvent(cudaEvent_t ev);
  ~StartEvent();
  StartEvent(const StartEvent&) = delete;
  StartEvent& operator=(const StartEvent&) = delete;

 private:
  cudaEvent_t prev_;
  bool prev_used_;
};

// The pending StartEvent's event (nullptr: none, or already taken by a launch); marks it taken.
cudaEvent_t take_start_event();

// kernel<<<grid, block, smem, stream>>>(args...), with the attribute unless mode() is kOff, the
// launch-completion event of a pending StartEvent (and the kernel's shared-memory carveout
// preference, cuda/device_util.cuh).
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args... args) {
  prefer_shared_carveout(reinterpret_cast<const void*>(kernel));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (mode() != Mode::kOff) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cudaEvent_t ev = take_start_event(); ev != nullptr) {
    attr[n].id = cudaLaunchAttributeLaunchCompletionEvent;
    attr[n].val.launchCompletionEvent.event = ev;
    attr[n].val.launchCompletionEvent.flags = 0;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  MOECHECK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace moecheck::cuda::pdl
