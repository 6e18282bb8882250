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
// With a tail (the static verify epilogue, accept_greedy_epilogue.py) the same arrival also
// writes commit = correct + 1, the new sequence length, the request's n output tokens (lane k:
// the bonus at k == correct, else the draft candidates[b, k + 1], else 0) and the gated commit
// length; its inputs are read by every leader alongside its ticket add, as the slots are.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (row_argmax.cu, or the benchmark's sweep module).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kMaxDraft = 16;  // rows a request: 16 match bits and slots

// The static verify epilogue's tensors; commit null: the accept alone.
struct AcceptTail {
  const void* seq_lens;  // [bs] int32 or int64: the prefix lengths
  bool seq_64;
  const void* verify_lens;  // [bs] int32 or int64, with gated
  bool verify_64;
  const int32_t* gate;  // [1], with gated
  int32_t* commit;      // [bs]
  void* new_seq;        // [bs], seq_lens' type
  int64_t* tokens;      // [bs, n], rows tokens_stride apart
  int64_t tokens_stride;
  int32_t* gated;  // [bs] min(commit, int32(verify)) * gate, or null
};

struct AcceptParams {
  const void* candidates;  // [bs, n] int32 or int64, last-dim stride 1
  int64_t candidate_stride;
  bool candidates_64;
  const void* cutoff;  // [bs] int32 or int64, or null
  bool cutoff_64;
  int n;
  unsigned long long* slots;    // [bs, 16] workspace: generation << 32 | argmax of row k
  unsigned long long* tickets;  // [bs] workspace: generation << 32 | count << 16 | match bits
  int32_t* correct;             // or null, and correct_64
  int64_t* correct_64;          // the length widened, as the epilogue's buffer holds it
  int64_t* bonus;
  int32_t* trim;
  AcceptTail tail;
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

// The tail's inputs, one a lane of every leader's warp 0 as its ticket add is in flight: lane j
// < n - 1 the draft candidates[b, j + 1]; lanes 16, 17, 18 the prefix length, the verify
// length and the gate (write_tail gathers them).
__device__ __forceinline__ int64_t read_tail_input(const AcceptParams& a, int b, int lane) {
  const AcceptTail& t = a.tail;
  if (lane < a.n - 1) {
    return load_index(a.candidates, a.candidates_64, b * a.candidate_stride + lane + 1);
  }
  if (lane == 16) return load_index(t.seq_lens, t.seq_64, b);
  if (t.gated == nullptr) return 0;
  if (lane == 17) return load_index(t.verify_lens, t.verify_64, b);
  if (lane == 18) return __ldg(t.gate);
  return 0;
}

// The tail of request b, by the last arrival's whole warp 0 (SGLang 0.5.23's FinalizeAcceptLens,
// BuildOutTokens, the static buffers' copies and the gate): every lane has `correct` (capped),
// the bonus token and its read_tail_input.
__device__ __forceinline__ void write_tail(const AcceptParams& a, int b, int correct, int64_t bonus,
                                           int64_t input) {
  const AcceptTail& t = a.tail;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t seq = __shfl_sync(0xFFFFFFFFu, input, 16);
  const int64_t verify = __shfl_sync(0xFFFFFFFFu, input, 17);
  const int64_t gate = __shfl_sync(0xFFFFFFFFu, input, 18);
  if (lane < a.n) {
    t.tokens[b * t.tokens_stride + lane] = lane == correct ? bonus : lane < a.n - 1 ? input : 0;
  }
  if (lane != 0) return;
  const int32_t commit = correct + 1;
  t.commit[b] = commit;
  if (t.seq_64) {
    static_cast<int64_t*>(t.new_seq)[b] =
        static_cast<int64_t>(static_cast<uint64_t>(seq) + static_cast<uint64_t>(commit));
  } else {  // both wrap as torch's integer sums do
    static_cast<int32_t*>(t.new_seq)[b] =
        static_cast<int32_t>(static_cast<uint32_t>(seq) + static_cast<uint32_t>(commit));
  }
  if (t.gated != nullptr) {
    // torch's .to(int32) keeps the low 32 bits; the product wraps as torch's int32 one does.
    const int32_t limit = static_cast<int32_t>(static_cast<uint32_t>(verify));
    const uint32_t product =
        static_cast<uint32_t>(min(commit, limit)) * static_cast<uint32_t>(gate);
    t.gated[b] = static_cast<int32_t>(product);
  }
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
  const bool tail = a.tail.commit != nullptr;
  int64_t tail_input = 0;
  if (tail) tail_input = read_tail_input(a, b, lane);
  seen = __shfl_sync(0xFFFFFFFFu, seen, 0) + add;
  if (static_cast<int>((seen >> kCountShift) & 0xFFu) != a.n) return;
  const uint32_t matches = static_cast<uint32_t>(seen) & 0xFFFFu;
  const int correct = __ffs(~matches) - 1;  // bit n - 1 is never set
  const int capped = min(correct, q.limit);
  // SGLang reads the bonus with Python indexing: a negative index wraps.
  const int take = min(max(capped < 0 ? capped + a.n : capped, 0), a.n - 1);
  unsigned long long bonus = __shfl_sync(0xFFFFFFFFu, early, take);
  if (lane != 0 && !tail) return;
  if (lane == 0) {
    // This row's own slot was stored by lane 0, which another lane's read may have missed.
    if (take == k) bonus = tag | static_cast<uint32_t>(argmax);
    while ((bonus & 0xFFFFFFFF00000000ull) != tag) bonus = load_relaxed(slots + take);
    if (a.correct_64 != nullptr) {
      a.correct_64[b] = capped;
    } else {
      a.correct[b] = capped;
    }
    a.trim[b] = correct - capped;
    a.bonus[b] = static_cast<int64_t>(static_cast<uint32_t>(bonus));
    const unsigned long long next = (q.generation + 1u) % kGenerations;
    store_relaxed(a.tickets + b, next << kGenerationShift);
  }
  if (tail) {  // the whole warp: lane 0's bonus reaches the others here
    const int64_t token = static_cast<uint32_t>(__shfl_sync(0xFFFFFFFFu, bonus, 0));
    write_tail(a, b, capped, token, tail_input);
  }
}

}  // namespace
