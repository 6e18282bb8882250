// Row argmax with one thread-block cluster a row, or one CTA a row (Hopper and Blackwell), and
// with ACCEPT DSpark's greedy accept in the same launch (row_argmax_accept.cuh).
//
// torch.argmax gives each row one block; at [6, 129280] that leaves most SMs idle. Here a row
// is cut into up to 16 chunks, one CTA each, and the CTAs of a row form a cluster. Each warp
// reduces its part of the chunk and sends its winner into the leader CTA's shared memory with
// st.async, which completes on the leader's mbarrier; only the leader waits, and it writes the
// index. No global atomics and no second launch for the argmax. With a row for every SM the
// cluster's exchange buys nothing: row_argmax_rows_kernel takes one CTA a row. Which kernel
// and shape run is the caller's plan (python/dsv41_kernels/ops/speculative/argmax_plan.py);
// row_argmax_launch.cuh launches it.
//
// Contract: bitwise identical to torch.argmax(logits, -1): the first NaN if the row has one,
// else the first maximum (-0.0 == +0.0, an all -Inf row gives 0). Each thread visits its
// columns in increasing order keeping its first winner; above the thread a winner is the
// largest order key (order_key) and, among equal keys, the smallest index, each one redux.sync.
//
// Both kernels are programmatic dependent launches (as SGLang's own kernels on Hopper): every
// CTA waits for the previous kernel before its first global access (so the accept reads its
// tickets and slots only once the previous launch has completed), and with early_start lets
// the next launch start at once.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (row_argmax.cu, or the benchmark's sweep module).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cluster_exchange.cuh"
#include "cluster_launch.cuh"
#include "row_argmax_accept.cuh"

namespace {

constexpr int kThreads = 256;    // the cluster kernel's CTA: the sweep's best at 1 to 64 rows
constexpr int kMaxCluster = 16;  // non-portable cluster size, available on sm_90 and sm_100
constexpr uint32_t kNoIndex = 0xFFFFFFFFu;
// The one-CTA-a-row kernel's CTA and vectors a thread a batch: the sweep's best at 96-384 rows.
constexpr int kRowThreads = 1024;
constexpr int kRowUnroll = 2;
// While the rows fit one CTA an SM, twice the loads in flight a thread: at two CTAs an SM
// (kRowUnroll) a thread's 32 registers hold two batches of 2 vectors, 128 KiB an SM in flight;
// at one CTA an SM the same shape would hold half that.
constexpr int kRowDeepUnroll = 4;
// The op's shape at two CTAs an SM, so that two rows an SM are one wave, the accept's too
// (which without the bound takes more than 32 registers a thread); the sweep's shapes unbounded.
template <int THREADS, int UNROLL>
constexpr int kRowBlocksPerSM = THREADS == kRowThreads && UNROLL == kRowUnroll ? 2 : 1;

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

// Element j of a 16-byte vector of T, as float (exact).
template <typename T>
__device__ __forceinline__ float element(const uint4& raw, int j);
template <>
__device__ __forceinline__ float element<float>(const uint4& raw, int j) {
  return __uint_as_float(reinterpret_cast<const uint32_t*>(&raw)[j]);
}
template <>
__device__ __forceinline__ float element<__nv_bfloat16>(const uint4& raw, int j) {
  const uint32_t w = reinterpret_cast<const uint32_t*>(&raw)[j / 2];
  return __uint_as_float(j % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
}
template <>
__device__ __forceinline__ float element<__half>(const uint4& raw, int j) {
  const uint32_t w = reinterpret_cast<const uint32_t*>(&raw)[j / 2];
  return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 == 0 ? w : w >> 16)));
}

// Increases with torch.argmax's preference: every NaN on top, -0.0 and +0.0 equal. Real values
// map to keys >= 0x007FFFFF (-Inf), so key 0 means "no column".
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0xFFFFFFFFu;
  const uint32_t bits = v == 0.0f ? 0u : __float_as_uint(v);
  return (bits & 0x80000000u) != 0u ? ~bits : bits | 0x80000000u;
}

// The warp's winner in every lane: the largest key, then the smallest index holding it.
__device__ __forceinline__ void warp_winner(uint32_t& key, uint32_t& index) {
  const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key);
  index = __reduce_min_sync(0xFFFFFFFFu, key == top ? index : kNoIndex);
  key = top;
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// T values in a 16-byte vector.
template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));

// ITEMS vectors per thread, all loaded before any compare so the loads overlap.
template <typename T, int THREADS, int ITEMS, bool ACCEPT>
__global__ void __launch_bounds__(THREADS)
    row_argmax_cluster_kernel(const T* __restrict__ logits, int64_t row_stride, int vocab,
                              int64_t* __restrict__ out, const __grid_constant__ AcceptParams a,
                              bool early_start) {
  constexpr int kVec = kVecOf<T>;
  constexpr int kWarps = THREADS / 32;
  constexpr int kChunk = THREADS * kVec * ITEMS;
  static_assert(kMaxCluster * kWarps % 32 == 0, "the leader reads the winners 32 at a time");
  // In the leader: (key << 32 | index) of every warp of the cluster, slot rank * kWarps + warp.
  __shared__ uint64_t warp_winners[kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t arrived;

  const int rank = static_cast<int>(cluster_rank());
  const int ranks = static_cast<int>(gridDim.x);  // the cluster spans the row
  const int row = blockIdx.y;
  const int tid = threadIdx.x;
  // The exchange's set-up comes first: after the loads it measured slower.
  if (rank == 0 && tid == 0) {
    init_exchange(&arrived);
    expect_bytes(&arrived, static_cast<uint32_t>(ranks * kWarps * sizeof(uint64_t)));
  }
  cluster_arrive_relaxed();
  wait_for_previous_grid();  // a dependent launch: no global access before
  if (early_start) allow_next_grid();

  const T* x = logits + static_cast<int64_t>(row) * row_stride;
  const int begin = rank * kChunk;
  // Column of item k for this thread: begin + (k * THREADS + tid) * kVec + lane-in-vector,
  // increasing in k, so a strict '>' keeps the thread's first maximum. Items are the row's
  // whole 16-byte vectors (columns < full_end), loaded under a predicate rather than a branch
  // so that all loads issue back to back; the partial vector at full_end (vocab % kVec
  // columns) is read by the thread that owns it, with the same predicated loads, and compared
  // after its whole vectors, which keeps that thread's column order.
  const int full_end = vocab / kVec * kVec;
  uint4 items[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int col = begin + (k * THREADS + tid) * kVec;
    items[k] = col < full_end ? __ldg(reinterpret_cast<const uint4*>(x + col)) : uint4{};
  }
  const int tail_slot = (full_end - begin) / kVec;  // the partial vector's slot in this chunk
  const bool tail_owner = full_end < vocab && full_end >= begin && full_end - begin < kChunk &&
                          tail_slot % THREADS == tid;
  float tail[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    tail[j] = tail_owner && full_end + j < vocab ? to_float(x[full_end + j]) : -INFINITY;
  }
  RowRequest request{};
  if constexpr (ACCEPT) {
    if (rank == 0) request = begin_accept(a, row, tid);
  }
  // A thread without columns keeps (-Inf, vocab - 1), which never beats a real column.
  float best = -INFINITY;
  int best_i = min(begin + tid * kVec, vocab - 1);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v = element<T>(items[k], j);
      const int col = begin + (k * THREADS + tid) * kVec + j;
      // Bitwise & and |: short circuits compile to a branch per value.
      const bool take =
          (col < full_end) & ((v > best) | ((v != v) & (best == best)) | (k + j == 0));
      best = take ? v : best;
      best_i = take ? col : best_i;
    }
  }
  if (tail_owner) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v = tail[j];
      const bool first = full_end == begin + tid * kVec && j == 0;  // the thread's only vector
      const bool take = (full_end + j < vocab) & ((v > best) | ((v != v) & (best == best)) | first);
      best = take ? v : best;
      best_i = take ? full_end + j : best_i;
    }
  }
  uint32_t key = order_key(best);
  uint32_t index = static_cast<uint32_t>(best_i);
  warp_winner(key, index);
  // Each warp sends its winner straight to the leader: no block barrier on the way.
  cluster_wait();  // every CTA started, and the leader's mbarrier is initialised
  if (tid % 32 == 0) {
    send_to_rank(&warp_winners[rank * kWarps + tid / 32], &arrived, 0,
                 static_cast<uint64_t>(key) << 32 | index);
  }
  if (rank != 0 || tid >= 32) return;
  wait_exchange(&arrived);
  // The winner is the largest key, then the smallest index: any grouping gives the same one.
  // Unrolled over the largest cluster, with a predicate: a loop bounded by `ranks` branches.
  // A missing slot reads as (key 0, kNoIndex), which is never taken.
  key = 0u;
  index = kNoIndex;
#pragma unroll
  for (int j = 0; j < kMaxCluster * kWarps / 32; ++j) {
    const int slot = j * 32 + tid;
    const uint64_t w = slot < ranks * kWarps ? warp_winners[slot] : uint64_t{kNoIndex};
    const uint32_t k = static_cast<uint32_t>(w >> 32), i = static_cast<uint32_t>(w);
    const bool take = (k > key) | ((k == key) & (i < index));
    key = take ? k : key;
    index = take ? i : index;
  }
  warp_winner(key, index);
  if constexpr (ACCEPT) {
    accept_row(a, row, index, request);
  } else if (tid == 0) {
    out[row] = index;
  }
}

// One CTA a row, for batches with a row for every SM: the cluster's exchange and its
// co-scheduling buy nothing there. The CTA streams its row in batches of UNROLL vectors a
// thread, the next batch's loads in flight while the current one is compared. Vector v of the
// row is batch v / (THREADS * UNROLL), item (v / THREADS) % UNROLL of thread v % THREADS, so a
// thread meets its columns in increasing order and a strict '>' keeps its first maximum; the
// partial vector past the row's whole vectors goes to the thread that owns that vector's slot,
// after its whole vectors. Same contract, and the same winner rule above the thread, as the
// cluster kernel.
template <typename T, int THREADS, int UNROLL, bool ACCEPT>
__global__ void __launch_bounds__(THREADS, kRowBlocksPerSM<THREADS, UNROLL>)
    row_argmax_rows_kernel(const T* __restrict__ logits, int64_t row_stride, int vocab,
                           int64_t* __restrict__ out, const __grid_constant__ AcceptParams a,
                           bool early_start) {
  constexpr int kVec = kVecOf<T>;
  constexpr int kWarps = THREADS / 32;
  constexpr int kBatch = THREADS * UNROLL;
  static_assert(kWarps <= 32, "one warp reduces the warp winners");
  __shared__ uint64_t warp_winners[kWarps];
  wait_for_previous_grid();  // a dependent launch: no global access before
  if (early_start) allow_next_grid();

  const int tid = threadIdx.x;
  const int row = blockIdx.x;
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * row_stride;
  const uint4* vectors = reinterpret_cast<const uint4*>(x);
  const int whole = vocab / kVec;
  // A thread without columns keeps (-Inf, vocab - 1), which never beats a real column; one with
  // columns starts at its first, which it keeps if every value is -Inf.
  float best = -INFINITY;
  int best_i = min(tid * kVec, vocab - 1);
  auto load = [&](uint4(&batch)[UNROLL], int first) {
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int v = first + k * THREADS + tid;
      batch[k] = v < whole ? __ldg(vectors + v) : uint4{};
    }
  };
  auto compare = [&](const uint4(&batch)[UNROLL], int first) {
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int v = first + k * THREADS + tid;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float value = element<T>(batch[k], j);
        // Bitwise & and |: short circuits compile to a branch per value.
        const bool take = (v < whole) & ((value > best) | ((value != value) & (best == best)));
        best = take ? value : best;
        best_i = take ? v * kVec + j : best_i;
      }
    }
  };
  uint4 even[UNROLL], odd[UNROLL];
  load(even, 0);
  RowRequest request{};
  if constexpr (ACCEPT) request = begin_accept(a, row, tid);
  for (int first = 0; first < whole; first += 2 * kBatch) {
    load(odd, first + kBatch);
    compare(even, first);
    if (first + 2 * kBatch < whole) load(even, first + 2 * kBatch);
    compare(odd, first + kBatch);
  }
  const int tail_begin = whole * kVec;
  if (tail_begin < vocab && whole % THREADS == tid) {
    for (int c = tail_begin; c < vocab; ++c) {
      const float value = to_float(x[c]);
      const bool take = (value > best) | ((value != value) & (best == best));
      best = take ? value : best;
      best_i = take ? c : best_i;
    }
  }
  uint32_t key = order_key(best);
  uint32_t index = static_cast<uint32_t>(best_i);
  warp_winner(key, index);
  if (tid % 32 == 0) warp_winners[tid / 32] = static_cast<uint64_t>(key) << 32 | index;
  __syncthreads();
  if (tid >= 32) return;
  const uint64_t w = tid < kWarps ? warp_winners[tid] : uint64_t{kNoIndex};
  key = static_cast<uint32_t>(w >> 32);
  index = static_cast<uint32_t>(w);
  warp_winner(key, index);
  if constexpr (ACCEPT) {
    accept_row(a, row, index, request);
  } else if (tid == 0) {
    out[row] = index;
  }
}

}  // namespace
