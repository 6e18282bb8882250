// FlashMLA's split-KV decoding schedule (docs/specs.md section A), computed on the device.
//
// Two kernels with the same output, bit for bit:
// - sched_meta_warp_kernel keeps FlashMLA's structure: one warp gathers the per-request data,
//   lane 0 walks every partition and stores each record to global memory. It is the "before"
//   arm of the benchmark and a second oracle in the tests.
// - sched_meta_closed_form_kernel (the block-parallel kernel, one block of 256 threads) replaces
//   the walk over partitions by a short recurrence over requests (see below) and derives every
//   record independently, one thread per partition. Batches whose staging exceeds 48 KB of
//   shared memory (over ~4 000 requests) take sched_meta_in_place_kernel, the walk on one
//   thread with the request in registers, staged in the outputs themselves. The caller's plan
//   names which of the two runs (python/dsv41_kernels/ops/attention/decoding_sched_meta.py).
//
// Exported functions take the outputs and the (optional) length tensors as TensorViews plus
// ints, launch on tvm-ffi's stream for the device (torch's current stream), never sync the
// host and never allocate, so they can be captured in a CUDA graph.

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

struct SchedParams {
  int* metadata;                 // int32 [num_sm_parts, 8], 16-byte aligned, contiguous
  int* num_splits;               // int32 [batch_size + 1]
  const int* topk_length;        // int32 [batch_size] or nullptr (every request has topk)
  const int* extra_topk_length;  // int32 [batch_size] or nullptr (every request has extra_topk)
  const int* seqlens_k;          // int32 [batch_size], dense mode (topk == -1) only
  int batch_size;
  int num_sm_parts;
  int block_size_n;
  int fixed_overhead;  // blocks' worth of cost charged per chunk of a request
  int topk;            // -1: dense decode
  int extra_topk;      // 0: no extra cache
};

// Tokens request i attends to, as FlashMLA counts them (C int arithmetic, truncating division).
__device__ __forceinline__ int request_tokens(const SchedParams& p, int i) {
  if (p.topk == -1) return p.seqlens_k[i];
  int tokens = p.topk_length != nullptr ? p.topk_length[i] : p.topk;
  if (tokens == 0) tokens = 1;  // the main loop is never empty
  if (p.extra_topk != 0) {
    // The main part is rounded up to a whole block before the extra part is added.
    tokens = (tokens + p.block_size_n - 1) / p.block_size_n * p.block_size_n;
    tokens += p.extra_topk_length != nullptr ? p.extra_topk_length[i] : p.extra_topk;
  }
  return tokens;
}

__device__ __forceinline__ int last_block_of(int tokens, int block_size_n) {
  return max(tokens - 1, 0) / block_size_n;
}

// ------------------------------------------------------------------------------------------
// Baseline: FlashMLA's structure (one warp, lane 0 walks, one global store per record).

struct alignas(16) Record {  // stored as two 16-byte vectors
  int begin_req_idx, end_req_idx, begin_block_idx, end_block_idx;
  int begin_split_idx, is_first_req_splitted, is_last_req_splitted, pad;
};

__global__ void __launch_bounds__(32, 1) sched_meta_warp_kernel(SchedParams p) {
  extern __shared__ int warp_smem[];
  const int b = p.batch_size;
  // FlashMLA's shared arrays in its order (sgl-flash-mla 1.0.0's scheduler: three).
  int* num_blocks = warp_smem;
  int* splits = num_blocks + b;
  int* s_k = splits + b + 1;

  const int lane = threadIdx.x;
  int total = 0;
  for (int i = lane; i < b; i += 32) {
    const int tokens = request_tokens(p, i);
    s_k[i] = tokens;
    num_blocks[i] = last_block_of(tokens, p.block_size_n) + 1;
    total += num_blocks[i] + p.fixed_overhead;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  __syncwarp();

  if (lane == 0) {
    const int overhead = p.fixed_overhead;
    const int payload = (total + p.num_sm_parts - 1) / p.num_sm_parts + overhead;
    int req = 0, blk = 0, nsplit = 0, cum = 0;
    splits[0] = 0;
    for (int part = 0; part < p.num_sm_parts; ++part) {
      Record rec;
      rec.begin_req_idx = req;
      rec.begin_block_idx = blk;
      rec.begin_split_idx = nsplit;
      rec.is_first_req_splitted = blk != 0;
      int rem = payload;
      while (req < b) {
        const int left = num_blocks[req] - blk;
        if (rem >= left + overhead) {
          cum += nsplit + 1;
          splits[req + 1] = cum;
          rem -= left + overhead;
          ++req;
          blk = 0;
          nsplit = 0;
        } else {
          if (rem - overhead > 0) {
            blk += rem - overhead;
            ++nsplit;
          }
          break;
        }
      }
      if (blk > 0) {
        rec.end_req_idx = req;
        rec.end_block_idx = blk;
      } else {
        rec.end_req_idx = req - 1;
        rec.end_block_idx = s_k[req - 1] == 0 ? 0 : num_blocks[req - 1];
      }
      const int e = rec.end_req_idx;
      rec.is_last_req_splitted = rec.end_block_idx != num_blocks[e] && s_k[e] != 0;
      if (rec.begin_req_idx == rec.end_req_idx) {
        const int split = rec.is_first_req_splitted | rec.is_last_req_splitted;
        rec.is_first_req_splitted = rec.is_last_req_splitted = split;
      }
      rec.pad = 0;
      reinterpret_cast<Record*>(p.metadata)[part] = rec;
    }
  }
  __syncwarp();
  for (int i = lane; i <= b; i += 32) p.num_splits[i] = splits[i];
}

// ------------------------------------------------------------------------------------------
// Block-parallel kernel.
//
// The walk has a closed form. Lay the blocks of every partition end to end on one "virtual"
// axis, D = payload - fixed_overhead slots per partition (partition p owns [p * D, (p + 1) * D)):
// the overhead a partition pays for its first chunk is not on the axis, a request that starts
// inside a partition pays its overhead on the axis, and a partition whose leftover is no more
// than the overhead leaves it unused. Request i then occupies [v_i, v_i + n_i) with v_0 = 0 and
//   v_{i+1} = min(v_i + n_i + overhead, round_up(v_i + n_i, D)),
// and partition p begins where p * D falls: in request i = max{i : v_i <= p * D} at block
// p * D - v_i. Only the recurrence is serial; it runs on one thread over v mod D in a handful of
// register operations per request (the divisions by D are done beforehand, in parallel), and
// every record is then derived independently, one thread per partition.

constexpr int kThreads = 256;  // one pass writes the records of up to 256 partitions (any SM count)
constexpr int kWarps = kThreads / 32;
// Staging beyond this takes the global-memory variant rather than an opt-in attribute call.
constexpr size_t kDefaultSmemLimit = 48 * 1024;

// What the phases hand to each other (head of shared memory).
struct alignas(16) WalkSummary {
  int warp_total[kWarps];  // per-warp sums of num_blocks + fixed_overhead
  int virtual_end;         // v_{b-1} + n_{b-1}: partitions from ceil(virtual_end / D) on are idle
  int unused[3];
};

// Shared staging after the summary, 4 * (3b + 1) bytes:
//   end_block[b]: end block of request i once finished (0 for an empty dense request, else its
//     block count n_i = max(end_block, 1)).
//   start[b]: n_i / D, then v_i.
//   splits[b + 1]: splits[i + 1] holds n_i % D, then num_splits[i + 1].
// Largest i < b with start[i] <= x (start[0] = 0 <= x, start[] nondecreasing).
__device__ __forceinline__ int request_at(const int* start, int b, int x) {
  int lo = 0, hi = b - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The per-request pass of both block kernels (docs/specs.md A.3), spread over the block: writes
// each request's end block (0 for an empty dense request, else its block count) and returns the
// total cost, sum of (blocks + fixed_overhead), to every thread. Ends with a __syncthreads.
__device__ __forceinline__ int block_request_pass(const SchedParams& p, int* end_block,
                                                  int* warp_total) {
  const int tid = threadIdx.x;
  int partial = 0;
  for (int i = tid; i < p.batch_size; i += kThreads) {
    const int tokens = request_tokens(p, i);
    const int num_blocks = last_block_of(tokens, p.block_size_n) + 1;
    end_block[i] = tokens == 0 ? 0 : num_blocks;
    partial += num_blocks + p.fixed_overhead;
  }
  partial = __reduce_add_sync(0xffffffffu, partial);
  if (tid % 32 == 0) warp_total[tid / 32] = partial;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_total[w];
  return total;
}

__global__ void __launch_bounds__(kThreads, 1) sched_meta_closed_form_kernel(SchedParams p) {
  extern __shared__ int4 block_smem[];
  WalkSummary& summary = *reinterpret_cast<WalkSummary*>(block_smem);
  int* end_block = reinterpret_cast<int*>(block_smem + sizeof(WalkSummary) / sizeof(int4));
  int* start = end_block + p.batch_size;
  int* splits = start + p.batch_size;
  const int b = p.batch_size;
  const int parts = p.num_sm_parts;
  const int overhead = p.fixed_overhead;
  const int tid = threadIdx.x;

  const int total = block_request_pass(p, end_block, summary.warp_total);
  const int slots = (total + parts - 1) / parts;  // D = payload - overhead >= 1
  for (int i = tid; i < b; i += kThreads) {
    const int num_blocks = max(end_block[i], 1);
    start[i] = num_blocks / slots;
    splits[i + 1] = num_blocks % slots;
  }
  __syncthreads();

  // The recurrence, v = q * D + o with o in [0, D). Only o feeds back; q and the split count
  // ride along. Entry i + 1 is read before entry i is overwritten.
  if (tid == 0) {
    int o = 0, q = 0, cum = 0, v = 0, n = 1;
    int whole = start[0], rest = splits[1];
    for (int i = 0; i < b; ++i) {
      const int next_whole = i + 1 < b ? start[i + 1] : 0;
      const int next_rest = i + 1 < b ? splits[i + 2] : 0;
      v = q * slots + o;
      n = whole * slots + rest;
      start[i] = v;
      const int raw = o + rest;  // (v + n) = (q + whole) * D + raw
      // Chunks of request i: partitions its blocks [v, v + n) touch.
      cum += whole + (raw > slots ? 2 : (raw > 0 ? 1 : 0));
      splits[i + 1] = cum;
      const bool carry = raw >= slots;
      const int s = carry ? raw - slots : raw;  // (v + n) mod D
      const int t = s + overhead;
      const bool same_partition = s != 0 && t < slots;
      q += whole + carry + (s != 0 && !same_partition);
      o = same_partition ? t : 0;
      whole = next_whole;
      rest = next_rest;
    }
    summary.virtual_end = v + n;
  }
  __syncthreads();

  // Records, one thread per partition. A partition's end state is the next one's begin state.
  const int virtual_end = summary.virtual_end;
  int4* out = reinterpret_cast<int4*>(p.metadata);
  for (int part = tid; part < parts; part += kThreads) {
    const int x = part * slots;
    int4 lo, hi;
    if (x < virtual_end) {
      const int begin_req = request_at(start, b, x);
      const int begin_block = x - start[begin_req];
      const int begin_split = (begin_block + slots - 1) / slots;
      int end_req, end_blk, last_split;
      const int y = x + slots;
      const int next_req = y < virtual_end ? request_at(start, b, y) : b;
      const int next_block = y < virtual_end ? y - start[next_req] : 0;
      if (next_block > 0) {  // cut inside next_req (only requests with tokens > 0 are cut)
        end_req = next_req;
        end_blk = next_block;
        last_split = 1;
      } else {
        end_req = next_req - 1;
        end_blk = end_block[end_req];
        last_split = 0;
      }
      int first_split = begin_block != 0;
      if (begin_req == end_req) first_split = last_split = first_split | last_split;
      lo = make_int4(begin_req, end_req, begin_block, end_blk);
      hi = make_int4(begin_split, first_split, last_split, 0);
    } else {  // left over: FlashMLA's values once the walk is done
      lo = make_int4(b, b - 1, 0, end_block[b - 1]);
      hi = make_int4(0, 0, 0, 0);
    }
    out[2 * part] = lo;
    out[2 * part + 1] = hi;
  }
  if (tid == 0) p.num_splits[0] = 0;
  for (int i = tid + 1; i <= b; i += kThreads) p.num_splits[i] = splits[i];
}

// What the per-request pass and the walk hand to the next phase (head of shared memory).
struct alignas(16) InPlaceSummary {
  int warp_total[kWarps];
  int walked;           // partitions the walk visited; the rest are left over
  int final_end_block;  // end_block_idx of every left-over partition
  int unused[2];
};

// Batches too large to stage in shared memory: the walk itself, on one thread, staged in the
// outputs. stage is num_splits (request i's end block, overwritten with num_splits[i + 1] once
// the walk has read it); rows is the metadata, where the walk writes each visited partition's
// begin state (req, blk, nsplit, -) and end state (req, blk, end block of the last finished
// request, -), each row rewritten in place by the thread that reads it.
__global__ void __launch_bounds__(kThreads, 1) sched_meta_in_place_kernel(SchedParams p) {
  __shared__ InPlaceSummary summary;
  int4* rows = reinterpret_cast<int4*>(p.metadata);
  int* stage = p.num_splits;
  const int b = p.batch_size;
  const int parts = p.num_sm_parts;
  const int overhead = p.fixed_overhead;
  const int tid = threadIdx.x;

  const int total = block_request_pass(p, stage, summary.warp_total);

  // The walk (docs/specs.md A.5), one thread. The request being consumed lives in registers.
  if (tid == 0) {
    const int payload = (total + parts - 1) / parts + overhead;
    int req = 0, blk = 0, nsplit = 0, cum = 0;
    int end_cur = stage[0];
    int num_blocks_cur = max(end_cur, 1);
    int end_next = stage[1];  // read ahead: the walk overwrites stage[req + 1] before moving on
    int end_done = 0;         // end block of the last finished request
    int part = 0;
    while (part < parts) {
      const int4 begin = make_int4(req, blk, nsplit, 0);
      int rem = payload;
      while (true) {
        const int need = num_blocks_cur - blk + overhead;
        if (rem < need) {
          if (rem > overhead) {  // room for at least one block: cut the request here
            blk += rem - overhead;
            ++nsplit;
          }
          break;
        }
        rem -= need;
        cum += nsplit + 1;
        stage[req + 1] = cum;  // num_splits[req + 1]
        end_done = end_cur;
        ++req;
        blk = 0;
        nsplit = 0;
        if (req == b) break;
        end_cur = end_next;
        num_blocks_cur = max(end_cur, 1);
        end_next = stage[req + 1];
      }
      rows[2 * part] = begin;
      rows[2 * part + 1] = make_int4(req, blk, end_done, 0);
      ++part;
      if (req == b) break;
    }
    summary.walked = part;
    summary.final_end_block = end_done;
  }
  __syncthreads();

  // Write-out, spread over the block: one 32-byte record per thread and partition.
  const int walked = summary.walked;
  int4* out = reinterpret_cast<int4*>(p.metadata);
  for (int part = tid; part < parts; part += kThreads) {
    int4 lo, hi;
    if (part < walked) {
      const int4 begin = rows[2 * part];
      const int4 end = rows[2 * part + 1];
      // A partition that stops inside a request has cut it (blk < its block count, and only
      // requests of 2+ blocks, so with tokens > 0, are ever cut): is_last_req_splitted = 1.
      // One that stops on a boundary ends its last request exactly: is_last_req_splitted = 0.
      const bool cut = end.y > 0;
      const int end_req = cut ? end.x : end.x - 1;
      const int end_block = cut ? end.y : end.z;
      int first_split = begin.y != 0;
      int last_split = cut;
      if (begin.x == end_req) first_split = last_split = first_split | last_split;
      lo = make_int4(begin.x, end_req, begin.y, end_block);
      hi = make_int4(begin.z, first_split, last_split, 0);
    } else {
      lo = make_int4(b, b - 1, 0, summary.final_end_block);
      hi = make_int4(0, 0, 0, 0);
    }
    out[2 * part] = lo;
    out[2 * part + 1] = hi;
  }
  if (tid == 0) p.num_splits[0] = 0;
}

// ------------------------------------------------------------------------------------------
// Host side.

SchedParams make_params(const TensorView& metadata, const TensorView& num_splits,
                        const TensorView& topk_length, const TensorView& extra_topk_length,
                        const TensorView& seqlens_k, bool has_topk_length,
                        bool has_extra_topk_length, bool has_seqlens_k, int64_t block_size_n,
                        int64_t fixed_overhead, int64_t topk, int64_t extra_topk) {
  // Records are stored as int4: 16-byte aligned rows of 8 int32.
  check_tensor(metadata, "tile_scheduler_metadata", {kAnySize, 8}, {kInt32}, kAnyDevice,
               Layout::kContiguous, 16);
  const int device_id = metadata.device().device_id;
  check_tensor(num_splits, "num_splits", {kAnySize}, {kInt32}, device_id, Layout::kContiguous);
  const int64_t parts = metadata.size(0);
  const int64_t b = num_splits.size(0) - 1;
  if (parts < 1 || b < 1) {
    TVM_FFI_THROW(ValueError) << "tile_scheduler_metadata must be [num_sm_parts >= 1, 8] and "
                                 "num_splits [batch_size + 1] with batch_size >= 1";
  }
  const Layout contiguous = Layout::kContiguous;
  if (has_topk_length)
    check_tensor(topk_length, "topk_length", {b}, {kInt32}, device_id, contiguous);
  if (has_extra_topk_length) {
    check_tensor(extra_topk_length, "extra_topk_length", {b}, {kInt32}, device_id, contiguous);
  }
  if (has_seqlens_k) check_tensor(seqlens_k, "seqlens_k", {b}, {kInt32}, device_id, contiguous);
  if (topk == -1 && !has_seqlens_k) TVM_FFI_THROW(ValueError) << "dense mode needs seqlens_k";
  if (block_size_n < 1 || fixed_overhead < 0 || (topk != -1 && (topk < 1 || extra_topk < 0))) {
    TVM_FFI_THROW(ValueError) << "block_size_n, fixed_overhead_num_blocks, topk or extra_topk "
                                 "out of range";
  }
  SchedParams p;
  p.metadata = data_as<int>(metadata);
  p.num_splits = data_as<int>(num_splits);
  p.topk_length = has_topk_length ? data_as<int>(topk_length) : nullptr;
  p.extra_topk_length = has_extra_topk_length ? data_as<int>(extra_topk_length) : nullptr;
  p.seqlens_k = has_seqlens_k ? data_as<int>(seqlens_k) : nullptr;
  p.batch_size = static_cast<int>(b);
  p.num_sm_parts = static_cast<int>(parts);
  p.block_size_n = static_cast<int>(block_size_n);
  p.fixed_overhead = static_cast<int>(fixed_overhead);
  p.topk = static_cast<int>(topk);
  p.extra_topk = static_cast<int>(extra_topk);
  return p;
}

void check_launch() {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << "decoding_sched_meta launch failed: " << cudaGetErrorString(err);
  }
}

// The block kernel the caller names: the closed form (in_place false), whose staging must fit
// the 48 KB a launch gets with no attribute call (about 4 000 requests), or the walk in place in
// the outputs (any batch).
void decoding_sched_meta(TensorView metadata, TensorView num_splits, TensorView topk_length,
                         TensorView extra_topk_length, TensorView seqlens_k, bool has_topk_length,
                         bool has_extra_topk_length, bool has_seqlens_k, int64_t block_size_n,
                         int64_t fixed_overhead, int64_t topk, int64_t extra_topk, bool in_place) {
  const SchedParams p = make_params(metadata, num_splits, topk_length, extra_topk_length, seqlens_k,
                                    has_topk_length, has_extra_topk_length, has_seqlens_k,
                                    block_size_n, fixed_overhead, topk, extra_topk);
  const int device_id = metadata.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device_id);
  const cudaStream_t stream = env_stream(device_id);
  const size_t staged_bytes =
      sizeof(WalkSummary) + sizeof(int) * (3 * static_cast<size_t>(p.batch_size) + 1);
  if (in_place) {
    sched_meta_in_place_kernel<<<1, kThreads, 0, stream>>>(p);
  } else if (staged_bytes <= kDefaultSmemLimit) {
    sched_meta_closed_form_kernel<<<1, kThreads, staged_bytes, stream>>>(p);
  } else {
    TVM_FFI_THROW(ValueError) << "decoding_sched_meta: the closed form stages " << staged_bytes
                              << " bytes for batch_size " << p.batch_size << ", over "
                              << kDefaultSmemLimit << ": the in-place kernel takes it";
  }
  check_launch();
}

// FlashMLA-structured baseline. Its 4 * (3b + 1) bytes of shared memory need the opt-in
// attribute past 48 KB (about 2 400 requests), set once per device and size.
void baseline_decoding_sched_meta(TensorView metadata, TensorView num_splits,
                                  TensorView topk_length, TensorView extra_topk_length,
                                  TensorView seqlens_k, bool has_topk_length,
                                  bool has_extra_topk_length, bool has_seqlens_k,
                                  int64_t block_size_n, int64_t fixed_overhead, int64_t topk,
                                  int64_t extra_topk) {
  const SchedParams p = make_params(metadata, num_splits, topk_length, extra_topk_length, seqlens_k,
                                    has_topk_length, has_extra_topk_length, has_seqlens_k,
                                    block_size_n, fixed_overhead, topk, extra_topk);
  const int device_id = metadata.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device_id);
  const cudaStream_t stream = env_stream(device_id);
  const size_t smem_bytes = sizeof(int) * (3 * static_cast<size_t>(p.batch_size) + 1);
  if (smem_bytes > kDefaultSmemLimit) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id);
    if (smem_bytes > static_cast<size_t>(optin)) {
      TVM_FFI_THROW(ValueError) << "baseline_decoding_sched_meta: batch_size " << p.batch_size
                                << " needs " << smem_bytes << " bytes of shared memory, over "
                                << optin;
    }
    set_attribute_at_least<sched_meta_warp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(
        static_cast<int>(smem_bytes), device_id, "baseline_decoding_sched_meta");
  }
  sched_meta_warp_kernel<<<1, 32, smem_bytes, stream>>>(p);
  check_launch();
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(decoding_sched_meta, decoding_sched_meta);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(baseline_decoding_sched_meta, baseline_decoding_sched_meta);
