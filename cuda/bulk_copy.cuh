// Copies into shared memory for sm_90: bulk copies (cp.async.bulk, completing on an mbarrier),
// the mbarrier operations they need, and the per-thread 16-byte cp.async with its commit groups.
// Loads only: nothing here touches the arithmetic of docs/numerics.md. Used by
// cuda/gemv_stream.cu, the tensor-core MMVQ engine (cuda/mmvq_tc_pipeline.cuh, cuda/mmvq_tc.cu),
// the shared expert's GEMM (cuda/bf16_gemm.cu, the 2-D tile copies), MMQ (cuda/mmq.cu) and the
// staged router's GEMM form (cuda/router_gemv.cu).
#pragma once

#include <cstdint>

namespace moecheck::cuda::bulk {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The 128-byte line holding p into this multiprocessor's L1 (a hint: no wait, no fault semantics
// relied on; p must lie in an allocation).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p) : "memory");
}
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// The barrier inits visible to the async proxy (the bulk copies' completions).
__device__ __forceinline__ void fence_bar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Generic-proxy accesses of shared memory ordered before later async-proxy ones (a stage read by
// the lanes, then refilled by a bulk copy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void bar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// bytes (a multiple of 16) from 16-byte aligned global src to 16-byte aligned shared dst,
// completing as transaction bytes on bar.
__device__ __forceinline__ void copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The box of a 2-D tensor map (a CUtensorMap, given by its address: a __grid_constant__ kernel
// parameter or global memory) whose first element is (c0 along the inner dimension, c1 along
// the outer), to 128-byte aligned shared dst, completing as the box's bytes on bar; elements
// past the map's bounds arrive as the map's fill (zeros for FLOAT_OOB_FILL_NONE).
__device__ __forceinline__ void tile_copy_2d(void* dst, const void* map, int c0, int c1,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// 16 bytes from 16-byte aligned global src to 16-byte aligned shared dst by the issuing thread
// (cp.async.cg: cached in L2 only), part of the thread's open commit group.
__device__ __forceinline__ void async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

// Closes the thread's open group of async16 copies (an empty group if it issued none).
__device__ __forceinline__ void async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most kPending of the thread's committed groups are still in flight; the bytes
// of the others are then visible to this thread (other threads need a barrier after it).
template <int kPending>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// One arrival on bar once every async16 copy this thread issued so far has landed; the arrival
// does not count towards bar's expected count (.noinc: the count includes it already).
__device__ __forceinline__ void async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

}  // namespace moecheck::cuda::bulk
