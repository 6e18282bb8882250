// The mHC projection's shared pieces (hc_mix_stats.cu): constants, the kernel parameters, the
// K slices, the cp.async copies and the store of a slice's partial row.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (hc_mix_stats.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace {

using tvm::ffi::TensorView;

constexpr int kBlockK = 64;         // K columns per chunk: one fresh MMA chain
constexpr int kPartCols = 32;       // part columns: [hi + lo 24 | 0 8]
constexpr int kMixCols = 24;        // rows of fn and of lo, useful columns of part
constexpr int kStagedWRows = 48;    // fn's rows then lo's, together in shared memory
constexpr int kXRowBytes = 128;     // 64 bf16
constexpr int kWRowBytes = 256;     // 64 fp32
constexpr int kSmemPerSm = 233472;  // 228 KB on sm_90 and sm_100
constexpr int kSmemPerCta = 1024;   // reserved by the system per resident CTA

// Two CTAs a SM when their shared memory fits (the register cap then follows).
constexpr int min_blocks(int smem_bytes) {
  return 2 * (smem_bytes + kSmemPerCta) <= kSmemPerSm ? 2 : 1;
}

struct Params {
  const __nv_bfloat16* x;  // [m, K], row stride x_stride elements
  const float* fn;         // [24, K] contiguous: read as hi
  const float* lo;         // [24, K] contiguous: fn - hi
  float* part;             // [S, m, 32] contiguous
  float* sqsum;            // [S, m] contiguous
  int64_t x_stride;
  int m;
  int k;
};

// The 64-column blocks of K slice `split` of `splits`: [first, first + count).
struct Slice {
  int first;
  int count;
};

__device__ __forceinline__ Slice slice_of(const Params& p, int split, int splits) {
  const int n_blocks = p.k / kBlockK;
  return {split * (n_blocks / splits) + min(split, n_blocks % splits),
          n_blocks / splits + (split < n_blocks % splits ? 1 : 0)};
}

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// x is read exactly once; rows past m copy nothing (src_bytes 0) and zero-fill.
__device__ __forceinline__ void copy_x(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// w is read by every row tile of the slice: normal L2 priority.
__device__ __forceinline__ void copy_w(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// This thread's x copies of a chunk: copy i is the 16 bytes at src + i·ROW_STEP rows to dst +
// i·ROW_STEP rows; rows past m (i·ROW_STEP >= rows_left) copy nothing and zero-fill, their
// source kept a valid address.
template <int COPIES, int ROW_STEP>
__device__ __forceinline__ void copy_x_rows(const Params& p, uint32_t dst, const __nv_bfloat16* src,
                                            int rows_left) {
#pragma unroll
  for (int i = 0; i < COPIES; ++i) {
    const bool real = i * ROW_STEP < rows_left;
    copy_x(dst + i * ROW_STEP * kXRowBytes, real ? src + i * ROW_STEP * p.x_stride : p.x,
           real ? 16u : 0u);
  }
}

// Staged w row `row` (0-23: fn, 24-47: lo) at K column `column`.
__device__ __forceinline__ const float* w_source(const Params& p, int row, int64_t column) {
  return (row < kMixCols ? p.fn + static_cast<int64_t>(row) * p.k
                         : p.lo + static_cast<int64_t>(row - kMixCols) * p.k) +
         column;
}

// The quad's sum of its lanes' squares (a fixed tree): every lane gets it.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// One row of slice `split`'s partial from lane t of its quad: columns 8·tile + 2t (+1) of
// hi[tile] + lo[tile], the zeros 24 + 2t (+1), and (lane 0) the row's Σx².
__device__ __forceinline__ void store_partial_row(const Params& p, int split, int row, int t,
                                                  float sq, const float2 (&hi)[3],
                                                  const float2 (&lo)[3]) {
  if (row >= p.m) return;
  const int64_t out = static_cast<int64_t>(split) * p.m + row;
  if (t == 0) p.sqsum[out] = sq;
  float* part_row = p.part + out * kPartCols + 2 * t;
#pragma unroll
  for (int tile = 0; tile < 3; ++tile) {
    *reinterpret_cast<float2*>(part_row + 8 * tile) =
        make_float2(hi[tile].x + lo[tile].x, hi[tile].y + lo[tile].y);  // IEEE fp32 adds
  }
  *reinterpret_cast<float2*>(part_row + kMixCols) = make_float2(0.0f, 0.0f);
}

}  // namespace
