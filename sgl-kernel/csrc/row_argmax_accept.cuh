// DSpark's greedy accept applied by the row argmax kernels (row_argmax_kernels.cuh) as each
// row's argmax is known: the leader CTA of every row takes part, the last one of a request
// applies the rule.
//
// Rows b*n .. b*n+n-1 are request b's verify rows (n <= 16). Request b has a 64-bit ticket,
// generation << 32 | count << 16 | match bits, and 16 slots (slot k: generation << 32 | argmax
// of row k). The leader CTA of row k (the row's only CTA in the one-CTA-a-row kernel) reads the
// generation, candidates[b, k+1] and the cutoff while its logits load; with the argmax it
// stores its slot and adds 1 << 16 | match << k to the ticket (match: the candidate equals the
// argmax). The n-th arrival has every match bit: correct = the leading matches, capped at
// cutoff - 1 (the cap goes to trim). It takes the bonus from slot `take` once that slot holds
// this generation: every leader reads its request's slots alongside its ticket add, and as a
// slot store is not ordered before its add, a stale slot is read again (the arrival's own row
// it takes from its argmax). It then writes the outputs and moves the ticket to the next
// generation. Slots k >= n, which no row of the launch takes, are marked stale (-1) by the
// first row's leader CTA as it starts. A slot thus holds this generation, the previous one or
// -1, so a stale value is never taken for a fresh one. About one round trip to L2 is the
// accept's critical path; no fences; the kernels stay reentrant on a stream and CUDA-graph
// safe.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (row_argmax.cu, or the benchmark's sweep module).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kMaxDraft = 16;  // rows a request: 16 match bits and slots

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
// stale now, one store a thread of the second warp, off the accept's critical path.
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
// slot a lane read stale is read again.
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

}  // namespace
