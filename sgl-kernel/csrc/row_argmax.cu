// Row argmax, and DSpark's greedy accept, with one thread-block cluster per row (Hopper and
// Blackwell).
//
// torch.argmax gives each row one block; at [6, 129280] that leaves most SMs idle. Here a row
// is cut into up to 16 chunks, one CTA each, and the CTAs of a row form a cluster. Each warp
// reduces its part of the chunk and sends its winner into the leader CTA's shared memory with
// st.async, which completes on the leader's mbarrier; only the leader waits, and it writes the
// index. No global atomics and no second launch for the argmax. From kRowKernelMinRows rows,
// while they fit the GPU at once, the argmax and the accept take one CTA a row instead
// (row_argmax_rows_kernel): with a row for every SM the cluster's exchange buys nothing.
//
// Contract: bitwise identical to torch.argmax(logits, -1): the first NaN if the row has one,
// else the first maximum (-0.0 == +0.0, an all -Inf row gives 0). Each thread visits its
// columns in increasing order keeping its first winner; above the thread a winner is the
// largest order key (order_key) and, among equal keys, the smallest index, each one redux.sync.
//
// Accept (accept_greedy_cluster): rows b*n .. b*n+n-1 are request b's verify rows (n <= 16).
// Request b has a 64-bit ticket, generation << 32 | count << 16 | match bits, and 16 slots
// (slot k: generation << 32 | argmax of row k). The leader CTA of row k (the row's only CTA in
// the one-CTA-a-row kernel) reads the generation, candidates[b, k+1] and the cutoff while its
// logits load; with the argmax it stores its slot and adds 1 << 16 | match << k to the ticket
// (match: the candidate equals the argmax). The n-th arrival has every match bit: correct =
// the leading matches, capped at cutoff - 1 (the cap goes to trim). It takes the bonus from
// slot `take` once that slot holds this generation: every leader reads its request's slots
// alongside its ticket add, and as a slot store is not ordered before its add, a stale slot
// is read again (the arrival's own row it takes from its argmax). It then writes
// the outputs and moves the ticket to the next generation. Slots k >= n, which no row of the
// launch takes, are marked stale (-1) by the first row's leader CTA as it starts. A slot thus
// holds this generation, the previous one or -1, so a stale value is never taken for a fresh
// one. About one round trip to L2 is the accept's critical path; no fences; the
// kernel stays reentrant on a stream and CUDA-graph safe.
//
// Launch: both kernels are programmatic dependent launches (as SGLang's own kernels on Hopper):
// every CTA waits for the previous kernel before its first global access (so the accept reads
// its tickets and slots only once the previous launch has completed), and a cluster grid of one
// wave lets the next launch start at once; a one-CTA-a-row grid only when it leaves the GPU
// almost full (kRowEarlyStartMaxIdle).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>

#include "cluster_exchange.cuh"
#include "cluster_launch.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kThreads = 256;    // the default launch shape; the sweep export tries others
constexpr int kMaxCluster = 16;  // non-portable cluster size, available on sm_90 and sm_100
constexpr int kMaxDraft = 16;    // accept: rows per request (match bits, slots)
constexpr uint32_t kNoIndex = 0xFFFFFFFFu;
// The argmax takes one CTA a row (row_argmax_rows_kernel, kRowThreads x kRowUnroll) from
// kRowKernelMinRows rows while its grid is one wave; on the H200 (session 10, fp32, vocab
// 129280) it measured 11.84 / 17.87 / 25.09 us at 96 / 128 / 192 rows against the cluster
// kernel's 13.55 / 18.47 / 25.42 and 8.60 against 7.54 at 64; at 384 rows (two waves) the
// cluster kernel's 47.11 beat it. The accept follows the same choice.
constexpr int kRowKernelMinRows = 96;
constexpr int kRowThreads = 1024;
constexpr int kRowUnroll = 2;
// While the rows fit one CTA an SM, twice the loads in flight a thread: at two CTAs an SM
// (kRowUnroll) a thread's 32 registers hold two batches of 2 vectors, 128 KiB an SM in flight,
// at one CTA an SM the same shape would hold half that.
constexpr int kRowDeepUnroll = 4;
// The one-CTA-a-row grid lets the next launch start early only while it leaves at most this
// many CTA slots of the GPU idle: on the H200 (session 15) the next grid's CTAs started early on
// idle SMs made 96 rows (36 SMs idle) 1.58x and 192 rows (72 slots) 1.18x slower, where 128 and
// 256 rows (4 and 8 idle) measured 0.47 us faster and the same.
constexpr int64_t kRowEarlyStartMaxIdle = 8;
// The op's shape at two CTAs an SM, so that 256 rows are one wave, the accept's too (which
// without the bound took 46 registers a thread, one CTA an SM); the sweep's shapes unbounded.
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

struct AcceptParams {
  const void* candidates;  // [bs, n] int32 or int64, last-dim stride 1
  int64_t candidate_stride;
  bool candidates_64;
  const void* cutoff;  // [bs] int32 or int64, or null
  bool cutoff_64;
  int n;
  unsigned long long* slots;    // [bs, 16] workspace: generation << 32 | argmax of row k
  unsigned long long* tickets;  // [bs] workspace: generation << 32 | count << 16 | match bits
  int32_t* correct;
  int64_t* bonus;
  int32_t* trim;
};

// What a row's leader reads while its logits load.
struct RowRequest {
  int64_t drafted;  // candidates[b, k + 1]: the token this row's argmax must equal (k < n - 1)
  int limit;        // clamp(cutoff[b], 1 - n, n) - 1, or n - 1 without a cutoff
  uint32_t generation;
};

__device__ __forceinline__ int64_t load_index(const void* base, bool is64, int64_t at) {
  return is64 ? __ldg(static_cast<const long long*>(base) + at)
              : static_cast<int64_t>(__ldg(static_cast<const int*>(base) + at));
}
__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

constexpr int kGenerationShift = 32;
constexpr uint32_t kGenerations = 1u << 31;  // a slot of -1 (tag 0xFFFFFFFF) is never current
constexpr int kCountShift = 16;

__device__ RowRequest read_request(const AcceptParams& a, int row) {
  const int b = row / a.n, k = row % a.n;
  RowRequest q;
  q.drafted =
      k < a.n - 1 ? load_index(a.candidates, a.candidates_64, b * a.candidate_stride + k + 1) : -1;
  // The verify length clamped to [1 - n, n] in 64 bits (VERIFY_LENS_RULE in accept_greedy.py):
  // exact for every value, and the bonus index stays within the request's rows.
  const int64_t verify =
      a.cutoff != nullptr ? load_index(a.cutoff, a.cutoff_64, b) : static_cast<int64_t>(a.n) + 1;
  const int64_t lowest = 1 - a.n, highest = a.n;
  q.limit = static_cast<int>(min(max(verify, lowest), highest)) - 1;
  q.generation = static_cast<uint32_t>(load_relaxed(a.tickets + b) >> kGenerationShift);
  return q;
}

// Run by every thread of the CTA that finishes row `row` (its leader), as it starts: warp 0
// reads the request (one load an address for the warp; the other warps get an empty one).
// Slots k >= n are never taken in this launch, so the first row of each request marks them
// stale now, one store a thread of the second warp, off the accept's critical path (at the
// end, ten stores of one thread measured 0.1 us).
__device__ __forceinline__ RowRequest begin_accept(const AcceptParams& a, int row, int tid) {
  RowRequest q{};
  if (tid < 32) q = read_request(a, row);
  const int slot = tid - 32;
  if (row % a.n == 0 && slot >= a.n && slot < kMaxDraft) {
    store_relaxed(a.slots + row / a.n * kMaxDraft + slot, ~0ull);
  }
  return q;
}

// Called by the whole of the leader's warp 0 of row `row`, every lane with the row's argmax
// and request (see the accept notes above). Lane j < 16 reads slot j while lane 0's ticket add
// is in flight, so the last arrival usually has the bonus row's slot when the add returns; a
// slot a lane read stale is read again. One slot a lane, where one thread held all 16.
__device__ void accept_row(const AcceptParams& a, int row, int64_t argmax, const RowRequest& q) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int b = row / a.n, k = row % a.n;
  unsigned long long* slots = a.slots + b * kMaxDraft;
  const unsigned long long tag = static_cast<unsigned long long>(q.generation) << kGenerationShift;
  const bool match = k < a.n - 1 && q.drafted == argmax;
  const unsigned long long add =
      (1ull << kCountShift) | (static_cast<unsigned long long>(match) << k);
  unsigned long long seen = 0;
  if (lane == 0) {
    store_relaxed(slots + k, tag | static_cast<uint32_t>(argmax));
    asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;"
                 : "=l"(seen)
                 : "l"(a.tickets + b), "l"(add)
                 : "memory");
  }
  const unsigned long long early = lane < kMaxDraft ? load_relaxed(slots + lane) : 0ull;
  seen = __shfl_sync(0xFFFFFFFFu, seen, 0) + add;
  if (static_cast<int>((seen >> kCountShift) & 0xFFu) != a.n) return;
  const uint32_t matches = static_cast<uint32_t>(seen) & 0xFFFFu;
  const int correct = __ffs(~matches) - 1;  // bit n - 1 is never set
  const int capped = min(correct, q.limit);
  // SGLang reads the bonus with Python indexing: a negative index wraps.
  const int take = min(max(capped < 0 ? capped + a.n : capped, 0), a.n - 1);
  unsigned long long bonus = __shfl_sync(0xFFFFFFFFu, early, take);
  if (lane != 0) return;
  // This row's own slot was stored by lane 0, which another lane's read may have missed.
  if (take == k) bonus = tag | static_cast<uint32_t>(argmax);
  while ((bonus & 0xFFFFFFFF00000000ull) != tag) bonus = load_relaxed(slots + take);
  a.correct[b] = capped;
  a.trim[b] = correct - capped;
  a.bonus[b] = static_cast<int64_t>(static_cast<uint32_t>(bonus));
  const unsigned long long next = (q.generation + 1u) % kGenerations;
  store_relaxed(a.tickets + b, next << kGenerationShift);
}

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
  // The exchange's set-up comes first: placed after the loads it measured 0.2 us slower.
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

template <typename T, int THREADS, int ITEMS, bool ACCEPT>
void launch_items(const TensorView& logits, int64_t* out, const AcceptParams& a,
                  cudaStream_t stream) {
  constexpr int kChunk = THREADS * kVecOf<T> * ITEMS;
  const int rows = static_cast<int>(logits.size(0));
  const int vocab = static_cast<int>(logits.size(1));
  // At least 2 CTAs: st.async is defined only in clusters of more than one CTA. A CTA past
  // the row's end reports (-Inf, vocab - 1), which never wins.
  const unsigned cluster = static_cast<unsigned>(std::max(2, (vocab + kChunk - 1) / kChunk));
  if (cluster > kMaxCluster) {
    TVM_FFI_THROW(ValueError) << "row_argmax: " << cluster << " CTAs per row > " << kMaxCluster;
  }
  constexpr auto kernel = row_argmax_cluster_kernel<T, THREADS, ITEMS, ACCEPT>;
  if (cluster > 8) {  // clusters of 9..16 CTAs are not portable: opted into per device
    set_attribute_at_least<kernel, cudaFuncAttributeNonPortableClusterSizeAllowed>(
        1, logits.device().device_id, "row_argmax");
  }
  const bool early_start = one_wave(kernel, int64_t{rows} * cluster, THREADS, 0, cluster);
  launch_in_clusters("row_argmax", kernel, dim3(cluster, rows), dim3(THREADS), cluster,
                     /*dependent=*/true, stream, data_as<const T>(logits), logits.stride(0), vocab,
                     out, a, early_start);
}

template <typename T, int THREADS, int UNROLL, bool ACCEPT>
void launch_rows(const TensorView& logits, int64_t* out, const AcceptParams& a,
                 cudaStream_t stream) {
  constexpr auto kernel = row_argmax_rows_kernel<T, THREADS, UNROLL, ACCEPT>;
  const int64_t idle = resident_ctas(kernel, THREADS, 0, 0) - logits.size(0);
  const bool early_start = idle >= 0 && idle <= kRowEarlyStartMaxIdle;
  launch_in_clusters("row_argmax", kernel, dim3(static_cast<unsigned>(logits.size(0))),
                     dim3(THREADS), /*cluster=*/0, /*dependent=*/true, stream,
                     data_as<const T>(logits), logits.stride(0), static_cast<int>(logits.size(1)),
                     out, a, early_start);
}

// The argmax: one CTA a row where that kernel wins (kRowKernelMinRows). Otherwise clusters of
// the fewest items per thread that keep the cluster within kMaxCluster CTAs.
template <typename T, bool ACCEPT>
void launch(const TensorView& logits, int64_t* out, const AcceptParams& a, cudaStream_t stream) {
  const int64_t rows = logits.size(0);
  if (rows >= kRowKernelMinRows) {
    constexpr auto deep = row_argmax_rows_kernel<T, kRowThreads, kRowDeepUnroll, ACCEPT>;
    if (one_wave(deep, rows, kRowThreads)) {
      return launch_rows<T, kRowThreads, kRowDeepUnroll, ACCEPT>(logits, out, a, stream);
    }
    constexpr auto rows_kernel = row_argmax_rows_kernel<T, kRowThreads, kRowUnroll, ACCEPT>;
    if (one_wave(rows_kernel, rows, kRowThreads)) {
      return launch_rows<T, kRowThreads, kRowUnroll, ACCEPT>(logits, out, a, stream);
    }
  }
  const int64_t per_item = int64_t{kThreads} * kVecOf<T> * kMaxCluster;
  const int64_t vocab = logits.size(1);
  if (vocab <= 2 * per_item) return launch_items<T, kThreads, 2, ACCEPT>(logits, out, a, stream);
  if (vocab <= 4 * per_item) return launch_items<T, kThreads, 4, ACCEPT>(logits, out, a, stream);
  if (vocab <= 8 * per_item) return launch_items<T, kThreads, 8, ACCEPT>(logits, out, a, stream);
  if (vocab <= 16 * per_item) return launch_items<T, kThreads, 16, ACCEPT>(logits, out, a, stream);
  TVM_FFI_THROW(ValueError) << "row_argmax: vocab " << vocab << " > " << 16 * per_item;
}

template <bool ACCEPT>
void launch_dtype(const TensorView& logits, int64_t* out, const AcceptParams& a,
                  cudaStream_t stream) {
  const DLDataType dt = logits.dtype();
  if (dt.code == kDLFloat && dt.bits == 32) return launch<float, ACCEPT>(logits, out, a, stream);
  if (dt.code == kDLBfloat && dt.bits == 16) {
    return launch<__nv_bfloat16, ACCEPT>(logits, out, a, stream);
  }
  if (dt.code == kDLFloat && dt.bits == 16) return launch<__half, ACCEPT>(logits, out, a, stream);
  TVM_FFI_THROW(ValueError) << "logits must be float32, bfloat16 or float16";
}

cudaStream_t checked_stream(const TensorView& logits) {
  check_tensor(logits, "logits", {kAnySize, kAnySize}, {kFloat32, kBfloat16, kFloat16}, kAnyDevice,
               Layout::kRows, 16);
  if (logits.size(0) < 1 || logits.size(0) > 65535 || logits.size(1) < 1) {
    TVM_FFI_THROW(ValueError) << "logits must have 1..65535 non-empty rows";
  }
  return env_stream(logits.device().device_id);
}

int64_t* checked_out(const TensorView& out, const TensorView& logits) {
  check_tensor(out, "out", {logits.size(0)}, {kInt64}, logits.device().device_id,
               Layout::kContiguous);
  return data_as<int64_t>(out);
}

}  // namespace

// logits: [rows, vocab] fp32/bf16/fp16 CUDA, last-dim stride 1, 16-byte aligned rows;
// out: int64 [rows] contiguous on the same device. Checked here too: a wrong call throws.
void row_argmax_cuda(TensorView logits, TensorView out) {
  cudaStream_t stream = checked_stream(logits);
  tvm::ffi::CUDADeviceGuard guard(logits.device().device_id);  // the launch and the attribute
  launch_dtype<false>(logits, checked_out(out, logits), AcceptParams{}, stream);
}

// The greedy accept in one launch. candidates: int32/int64 [bs, n] (last-dim stride 1, n <= 16,
// bs * n == rows); cutoff: int32/int64 [bs] or an empty tensor for none; correct int32 [bs],
// bonus int64 [bs], trim int32 [bs]; slots int64 [>= 16 * bs] and tickets int64 [>= bs] are the
// workspace: made as all -1 and all 0, then only ever changed by this kernel.
void accept_greedy_cluster(TensorView candidates, TensorView logits, TensorView cutoff,
                           TensorView correct, TensorView bonus, TensorView trim, TensorView slots,
                           TensorView tickets) {
  cudaStream_t stream = checked_stream(logits);
  const int device = logits.device().device_id;
  check_tensor(candidates, "candidates", {kAnySize, kAnySize}, {kInt32, kInt64}, device,
               Layout::kRows);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  if (n < 1 || n > kMaxDraft || bs * n != logits.size(0)) {
    TVM_FFI_THROW(ValueError) << "candidates must be [bs, n] with 1 <= n <= " << kMaxDraft
                              << " and bs * n == logits rows";
  }
  const bool has_cutoff = cutoff.numel() > 0;
  const Layout contiguous = Layout::kContiguous;
  if (has_cutoff) check_tensor(cutoff, "cutoff", {bs}, {kInt32, kInt64}, device, contiguous);
  check_tensor(correct, "correct", {bs}, {kInt32}, device, contiguous);
  check_tensor(bonus, "bonus", {bs}, {kInt64}, device, contiguous);
  check_tensor(trim, "trim", {bs}, {kInt32}, device, contiguous);
  check_tensor(slots, "slots", {kAnySize}, {kInt64}, device, contiguous, 16);
  check_tensor(tickets, "tickets", {kAnySize}, {kInt64}, device, contiguous);
  if (slots.size(0) < bs * kMaxDraft || tickets.size(0) < bs) {
    TVM_FFI_THROW(ValueError) << "slots and tickets must be workspaces of >= 16 * bs, bs";
  }
  tvm::ffi::CUDADeviceGuard guard(device);  // the launch and the attribute
  AcceptParams a{};
  a.candidates = data_as<const void>(candidates);
  a.candidate_stride = candidates.stride(0);
  a.candidates_64 = is_dtype(candidates, kDLInt, 64);
  a.cutoff = has_cutoff ? data_as<const void>(cutoff) : nullptr;
  a.cutoff_64 = has_cutoff && is_dtype(cutoff, kDLInt, 64);
  a.n = static_cast<int>(n);
  a.slots = data_as<unsigned long long>(slots);
  a.tickets = data_as<unsigned long long>(tickets);
  a.correct = data_as<int32_t>(correct);
  a.bonus = data_as<int64_t>(bonus);
  a.trim = data_as<int32_t>(trim);
  launch_dtype<true>(logits, nullptr, a, stream);
}

// fp32 only, with an explicit launch shape: what benchmark/kernels/bench_row_argmax.py --sweep
// times to choose kThreads and the items per thread.
void row_argmax_cluster_shape(TensorView logits, TensorView out, int threads, int items) {
  cudaStream_t stream = checked_stream(logits);
  tvm::ffi::CUDADeviceGuard guard(logits.device().device_id);  // the launch and the attribute
  int64_t* dst = checked_out(out, logits);
  if (logits.dtype().code != kDLFloat || logits.dtype().bits != 32) {
    TVM_FFI_THROW(ValueError) << "the sweep takes float32 logits";
  }
  const AcceptParams a{};
  if (threads == 128 && items == 16)
    return launch_items<float, 128, 16, false>(logits, dst, a, stream);
  if (threads == 256 && items == 8)
    return launch_items<float, 256, 8, false>(logits, dst, a, stream);
  if (threads == 256 && items == 16)
    return launch_items<float, 256, 16, false>(logits, dst, a, stream);
  if (threads == 512 && items == 4)
    return launch_items<float, 512, 4, false>(logits, dst, a, stream);
  if (threads == 512 && items == 8)
    return launch_items<float, 512, 8, false>(logits, dst, a, stream);
  if (threads == 1024 && items == 2)
    return launch_items<float, 1024, 2, false>(logits, dst, a, stream);
  TVM_FFI_THROW(ValueError) << "no launch shape " << threads << " threads x " << items << " items";
}

// fp32 only: the one-CTA-a-row kernel with an explicit shape, for the same sweep.
void row_argmax_rows_shape(TensorView logits, TensorView out, int threads, int unroll) {
  cudaStream_t stream = checked_stream(logits);
  tvm::ffi::CUDADeviceGuard guard(logits.device().device_id);
  int64_t* dst = checked_out(out, logits);
  if (logits.dtype().code != kDLFloat || logits.dtype().bits != 32) {
    TVM_FFI_THROW(ValueError) << "the sweep takes float32 logits";
  }
  const AcceptParams a{};
  if (threads == 256 && unroll == 4)
    return launch_rows<float, 256, 4, false>(logits, dst, a, stream);
  if (threads == 256 && unroll == 8)
    return launch_rows<float, 256, 8, false>(logits, dst, a, stream);
  if (threads == 512 && unroll == 2)
    return launch_rows<float, 512, 2, false>(logits, dst, a, stream);
  if (threads == 512 && unroll == 4)
    return launch_rows<float, 512, 4, false>(logits, dst, a, stream);
  if (threads == 1024 && unroll == 2)
    return launch_rows<float, 1024, 2, false>(logits, dst, a, stream);
  if (threads == 128 && unroll == 8)
    return launch_rows<float, 128, 8, false>(logits, dst, a, stream);
  if (threads == 512 && unroll == 8)
    return launch_rows<float, 512, 8, false>(logits, dst, a, stream);
  if (threads == 1024 && unroll == 4)
    return launch_rows<float, 1024, 4, false>(logits, dst, a, stream);
  TVM_FFI_THROW(ValueError) << "no launch shape " << threads << " threads x " << unroll
                            << " unroll";
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_cuda, row_argmax_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(accept_greedy_cluster, accept_greedy_cluster);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_cluster_shape, row_argmax_cluster_shape);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_rows_shape, row_argmax_rows_shape);
