// Device side of the cluster kernels' exchange: values sent into another CTA's shared memory
// by st.async, each completing its bytes on the receiver's mbarrier, which the receiver waits
// on (as for a TMA load), so no GPU-scope fence is needed.
//
// Protocol: the receiver initialises its mbarrier for one arrival (init_exchange) and posts
// the bytes it expects (expect_bytes); every thread of the cluster arrives at the cluster
// barrier on entry (cluster_arrive_relaxed) and waits on it before its first send
// (cluster_wait), which makes every mbarrier visible and proves every CTA started; the
// receiver then waits for its bytes (wait_exchange). st.async needs clusters of 2+ CTAs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void init_exchange(uint64_t* arrived) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(arrived)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait;" ::: "memory");
}
__device__ __forceinline__ void expect_bytes(uint64_t* arrived, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(arrived)),
      "r"(bytes)
      : "memory");
}

// `slot` and `arrived` as addresses in CTA `rank`'s shared memory.
__device__ __forceinline__ void remote_addresses(const void* slot, uint64_t* arrived, uint32_t rank,
                                                 uint32_t& remote_slot, uint32_t& remote_barrier) {
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_slot)
               : "r"(shared_address(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_barrier)
               : "r"(shared_address(arrived)), "r"(rank));
}
// Store v at `slot` of CTA `rank`, completing 4 bytes on its `arrived`.
__device__ __forceinline__ void send_to_rank(void* slot, uint64_t* arrived, uint32_t rank,
                                             uint32_t v) {
  uint32_t remote_slot, remote_barrier;
  remote_addresses(slot, arrived, rank, remote_slot, remote_barrier);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                   remote_slot),
               "r"(v), "r"(remote_barrier)
               : "memory");
}
// The same with 8 bytes.
__device__ __forceinline__ void send_to_rank(void* slot, uint64_t* arrived, uint32_t rank,
                                             uint64_t v) {
  uint32_t remote_slot, remote_barrier;
  remote_addresses(slot, arrived, rank, remote_slot, remote_barrier);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(
                   remote_slot),
               "l"(v), "r"(remote_barrier)
               : "memory");
}
__device__ __forceinline__ void wait_exchange(uint64_t* arrived) {
  uint32_t done;
  do {
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(arrived))
        : "memory");
  } while (done == 0u);
}
