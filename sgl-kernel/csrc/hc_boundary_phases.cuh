// The two phases of the small-row kernel (hc_boundary.cu, whose header comment says what each
// computes and in which order): its constants and parameters, phase 1 (a CTA's K slice: the
// staging, the post when fused, the slice's sums) and phase 2 (a row's statistics from the
// slices' sums, a row's combine + RMSNorm), each launched by the kernels there.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (hc_boundary.cu).
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "group_quant_ue8m0.cuh"
#include "hc_combine_norm_row.cuh"
#include "hc_mix_stats_finish.cuh"
#include "hc_post_row.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kHidden = 5120;
constexpr int kStreamCount = 4;
constexpr int kK = kStreamCount * kHidden;
constexpr int kSlices = 128;
constexpr int kThreads = kHidden / 8;  // 640: the combine's one 16-byte vector a thread
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = kSlices / 2;          // CTAs r and 127 - r: the combine and the statistics
constexpr int kSliceCols = kHidden / kSlices;  // 40
constexpr int kSliceK = kStreamCount * kSliceCols;  // 160
constexpr int kSliceVecs = kSliceCols / 8;          // 5
constexpr int kStride = kSliceK + 1;  // staged rows of fn and x: odd, so 16 parts 10 columns
                                      // apart fall in 16 banks
constexpr int kFnFloats = kMixCols * kStride;
constexpr int kParts = 16;  // a half-warp: the K parts of one sum
constexpr int kPartK = kSliceK / kParts;
constexpr int kGroupCols = 5;  // sums a half-warp holds per row
constexpr int kGroups = kSumCols / kGroupCols;
constexpr int kRowSlots = kThreads / kParts / kGroups;  // 8
constexpr int kFnQuads = kMixCols * kSliceK / 4;
constexpr int kFnQuadsPerThread = (kFnQuads + kThreads - 1) / kThreads;
constexpr int kSumGroup = 16;  // lanes adding one column's slice sums in phase 2
constexpr int kSumThreads = (kSumCols * kSumGroup + 31) / 32 * 32;
constexpr int kMaxRowTile = 4 * kRowSlots;
constexpr int kQuantGroup = 32;  // the FP8 groups of the normed rows (V4.1's [32, 32] blocks)
constexpr int kQuantGroups = kHidden / kQuantGroup;

static_assert(kHidden % (8 * kSlices) == 0 && kSlices % kSumGroup == 0 &&
              kStreamCount == kPostStreams);
static_assert(kSliceK % kParts == 0 && kSumCols % kGroupCols == 0 && kSumThreads <= kThreads);
static_assert(kRowSlots * kGroups * kParts == kThreads && kMaxRows * kSliceVecs <= kThreads);

struct BoundaryParams {
  const uint16_t* x;         // statistics alone: [m, 4H] bf16, rows x_stride apart
  const uint16_t* y;         // fused: the sublayer's output [m, H] bf16, rows y_stride apart
  const uint16_t* residual;  // fused: [m, 4, H] bf16 contiguous
  const float* post_mix;     // fused: [m, 4] contiguous
  const float* comb_in;      // fused: [m, 4, 4] contiguous
  const float* pre_in;       // fused: the combine's gates [m, 4] contiguous
  const uint16_t* weight;    // fused: the norm's weight [H] bf16
  uint16_t* updated;         // fused: the post's result [m, 4, H] contiguous
  uint16_t* normed;          // fused: [m, H] bf16, rows normed_stride apart
  uint8_t* q;                // fused, quantized: normed's e4m3 groups [m, H] contiguous
  float* q_scales;           // fused, quantized: their scales [m, H / 32] contiguous
  const float* fn;           // [24, 4H] contiguous
  float* part;               // [m, 128, 25]: each slice's sums
  FinishParams finish;
  int64_t x_stride;
  int64_t y_stride;
  int64_t normed_stride;
  int m;
  int row_tile;
  float norm_eps;
};

// fn's 24 staged rows, then x's rows up to m rounded up to the row tile.
size_t shared_bytes(int m, int row_tile) {
  const size_t rows = static_cast<size_t>((m + row_tile - 1) / row_tile * row_tile);
  return (kFnFloats + rows * kStride) * sizeof(float);
}

__device__ __forceinline__ uint4 load16(const uint16_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Written by other CTAs of this grid before the barrier: read at L2, never from an L1 line.
__device__ __forceinline__ uint4 load16_after_barrier(const uint16_t* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

// The slice's fn lines into L2 before the previous kernel has finished (a dependent launch):
// the loads after the wait then hit L2, not DRAM. A prefetch moves no data into the CTA and
// L2 is where every write lands, so it never reads a stale fn, whatever that kernel writes.
// Thread t < 96 takes segment t (fn row t / 4, stream t % 4: 40 floats, 160 bytes) and
// prefetches each 128-byte line it touches.
__device__ __forceinline__ void prefetch_fn_slice(const BoundaryParams& p, int h0) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid >= kMixCols * kStreamCount) return;
  const float* first =
      p.fn + int64_t{tid / kStreamCount} * kK + (tid % kStreamCount) * kHidden + h0;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(first) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(first + kSliceCols);
  for (uintptr_t line = begin; line < end; line += 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// fn's 24 rows of the slice into fs[n][k], and the slice's x (the post's result when fused,
// written out too) into xs[r][k], as fp32. Every global load is issued before the first store.
// DEPENDENT: in a dependent launch, fn's lines are prefetched and the previous grid awaited
// first.
template <bool FUSED, bool DEPENDENT>
__device__ void stage_slice(const BoundaryParams& p, float* fs, float* xs, int h0) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kQuads = kSliceK / 4;  // float4s of a staged fn row
  if constexpr (DEPENDENT) {
    prefetch_fn_slice(p, h0);
    wait_for_previous_grid();  // the inputs are the previous kernel's
  }
  float4 w[kFnQuadsPerThread];
#pragma unroll
  for (int i = 0; i < kFnQuadsPerThread; ++i) {
    const int quad = tid + i * kThreads;
    if (quad < kFnQuads) {
      const int q = quad % kQuads, n = quad / kQuads;
      const int stream = q / (kSliceCols / 4), col = h0 + 4 * (q % (kSliceCols / 4));
      w[i] =
          __ldg(reinterpret_cast<const float4*>(p.fn + int64_t{n} * kK + stream * kHidden + col));
    }
  }
  // One 8-column vector of one row a thread (m * 5 <= 640): r = tid % m, vector tid / m.
  const bool staged = tid < p.m * kSliceVecs;
  const int r = staged ? tid % p.m : 0, v = staged ? tid / p.m : 0, col = h0 + 8 * v;
  uint4 xv[kStreamCount];
  uint4 yv = {}, rv[kStreamCount] = {};
  float post_c[kStreamCount] = {}, comb[16] = {};
  if (staged) {
    if constexpr (FUSED) {
      yv = load16(p.y + r * p.y_stride + col);
#pragma unroll
      for (int s = 0; s < kStreamCount; ++s) {
        rv[s] = load16(p.residual + (int64_t{r} * kStreamCount + s) * kHidden + col);
      }
#pragma unroll
      for (int c = 0; c < kStreamCount; ++c) post_c[c] = __ldg(p.post_mix + r * 4 + c);
#pragma unroll
      for (int j = 0; j < 16; ++j) comb[j] = __ldg(p.comb_in + r * 16 + j);
    } else {
#pragma unroll
      for (int s = 0; s < kStreamCount; ++s) {
        xv[s] = load16(p.x + r * p.x_stride + s * kHidden + col);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kFnQuadsPerThread; ++i) {
    const int quad = tid + i * kThreads;
    if (quad < kFnQuads) {
      float* dst = fs + (quad / kQuads) * kStride + 4 * (quad % kQuads);
      dst[0] = w[i].x;
      dst[1] = w[i].y;
      dst[2] = w[i].z;
      dst[3] = w[i].w;
    }
  }
  if (!staged) return;
  if constexpr (FUSED) {
#pragma unroll
    for (int c = 0; c < kStreamCount; ++c) {
      xv[c] = post_vector(yv, rv, post_c[c], comb, c);
      *reinterpret_cast<uint4*>(p.updated + (int64_t{r} * kStreamCount + c) * kHidden + col) =
          xv[c];
    }
  }
  float* x_row = xs + r * kStride + 8 * v;
#pragma unroll
  for (int s = 0; s < kStreamCount; ++s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x_row[s * kSliceCols + 2 * i] = bf16_lo(vector_word(xv[s], i));
      x_row[s * kSliceCols + 2 * i + 1] = bf16_hi(vector_word(xv[s], i));
    }
  }
}

// The slice's 25 sums of every row (phase 1's order), stored to part[r, slice, :]. Thread t:
// part t % 16, sums [5g, 5g + 5) with g = (t / 16) % 5, rows row_slot·RT + i of each pass of
// 8·RT rows (row_slot = t / 80). Every lane runs every shuffle (idle rows add zeros).
template <int RT>
__device__ void project_slice(const BoundaryParams& p, const float* fs, const float* xs,
                              int slice) {
  const int tid = static_cast<int>(threadIdx.x), part = tid % kParts;
  const int group = (tid / kParts) % kGroups, row_slot = tid / (kParts * kGroups);
  const int k0 = part * kPartK;
  for (int first = 0; first < p.m; first += kRowSlots * RT) {
    int rows[RT];
    float acc[RT][kGroupCols];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      rows[i] = first + row_slot * RT + i;
#pragma unroll
      for (int c = 0; c < kGroupCols; ++c) acc[i][c] = 0.0f;
    }
#pragma unroll
    for (int k = k0; k < k0 + kPartK; ++k) {
      float xk[RT];
#pragma unroll
      for (int i = 0; i < RT; ++i) xk[i] = rows[i] < p.m ? xs[rows[i] * kStride + k] : 0.0f;
#pragma unroll
      for (int c = 0; c < kGroupCols; ++c) {
        const int n = group * kGroupCols + c;
        const float wk = n < kMixCols ? fs[n * kStride + k] : 0.0f;
#pragma unroll
        for (int i = 0; i < RT; ++i)
          acc[i][c] = fma_rn(xk[i], n < kMixCols ? wk : xk[i], acc[i][c]);
      }
    }
#pragma unroll
    for (int i = 0; i < RT; ++i) {
#pragma unroll
      for (int c = 0; c < kGroupCols; ++c) {
        float v = acc[i][c];
#pragma unroll
        for (int offset = kParts / 2; offset > 0; offset >>= 1) {
          v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
        }
        if (part == 0 && rows[i] < p.m) {
          p.part[(int64_t{rows[i]} * kSlices + slice) * kSumCols + group * kGroupCols + c] = v;
        }
      }
    }
  }
}

// Row r's statistics from the 128 slices' sums (phase 2's order).
__device__ void finish_stats_row(const BoundaryParams& p, int r, float* sums, float* gate_params) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kGateParams) {
    gate_params[tid] =
        tid < kMixCols ? __ldg(p.finish.base + tid) : __ldg(p.finish.scale + (tid - kMixCols));
  }
  if (tid < kSumThreads) {  // whole warps, so every lane of a butterfly takes part
    const int n = tid / kSumGroup, j = tid % kSumGroup;
    float v = 0.0f;
    if (n < kSumCols) {
      const float* src = p.part + int64_t{r} * kSlices * kSumCols + n;
      v = __ldcg(src + j * kSumCols);
#pragma unroll
      for (int q = 1; q < kSlices / kSumGroup; ++q) {
        v = add_rn(v, __ldcg(src + (j + q * kSumGroup) * kSumCols));
      }
    }
#pragma unroll
    for (int offset = kSumGroup / 2; offset > 0; offset >>= 1) {
      v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    if (n < kSumCols && j == 0) sums[n] = v;
  }
  __syncthreads();
  if (tid == 0) finish_row(p.finish, r, sums, gate_params);
}

// Row r's combine + RMSNorm over the updated residual (hc_combine_norm.cu's one-CTA shape);
// QUANT: and the e4m3 groups of 32 of the normed row with their power-of-two scales
// (group_quant_ue8m0.cuh: SGLang's quantizer of the stored bf16 row, 4 lanes a group).
template <bool QUANT>
__device__ void combine_norm_row(const BoundaryParams& p, int r, float* slots) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const uint16_t* x_row = p.updated + int64_t{r} * kK + 8 * tid;
  uint4 xv[kStreamCount];
#pragma unroll
  for (int s = 0; s < kStreamCount; ++s) xv[s] = load16_after_barrier(x_row + s * kHidden);
  float gate[kStreamCount];
#pragma unroll
  for (int s = 0; s < kStreamCount; ++s) gate[s] = __ldg(p.pre_in + r * 4 + s);
  const uint4 wv = load16(p.weight + 8 * tid);
  uint32_t xin[4];
  float ss = 0.0f;
  combine_vector(xv, gate, xin, ss);
  ss = warp_sum(ss);
  if (lane == 0) slots[warp] = ss;
  __syncthreads();
  const float total = sum_slots(slots, kWarps, lane);
  const float inv =
      div_rn(1.0f, sqrt_rn(add_rn(div_rn(total, static_cast<float>(kHidden)), p.norm_eps)));
  uint32_t yw[4], keys[4], top = 0u;
  normalize_vector(xin, inv, wv, yw, keys, top);
  if (any_nonfinite(top)) canonical_nans(yw, keys);
  *reinterpret_cast<uint4*>(p.normed + r * p.normed_stride + 8 * tid) =
      make_uint4(yw[0], yw[1], yw[2], yw[3]);
  if constexpr (QUANT) {
    float scale;
    const uint2 codes = e4m3_codes_of_words<kQuantGroup>(yw, scale);
    *reinterpret_cast<uint2*>(p.q + int64_t{r} * kHidden + 8 * tid) = codes;
    if (tid % (kQuantGroup / 8) == 0)
      p.q_scales[r * kQuantGroups + tid / (kQuantGroup / 8)] = scale;
  }
}

// Phase 1 of CTA `slice`: stage, then the slice's sums into part.
template <bool FUSED, int RT, bool DEPENDENT>
__device__ __forceinline__ void slice_phase(const BoundaryParams& p, int slice) {
  extern __shared__ float4 shared4[];
  float* fs = reinterpret_cast<float*>(shared4);
  float* xs = fs + kFnFloats;
  stage_slice<FUSED, DEPENDENT>(p, fs, xs, slice * kSliceCols);
  __syncthreads();
  project_slice<RT>(p, fs, xs, slice);
}

// 0 <= r < m, as one unsigned compare.
__device__ __forceinline__ bool is_row(const BoundaryParams& p, int r) {
  return static_cast<unsigned>(r) < static_cast<unsigned>(p.m);
}

// Phase 2 of a CTA: row stats_row's statistics and (fused) row combine_row's combine + norm,
// each where it is a row (0 <= row < m).
template <bool FUSED, bool QUANT>
__device__ __forceinline__ void row_phase(const BoundaryParams& p, int stats_row, int combine_row) {
  __shared__ float sums[kSumCols];
  __shared__ float gate_params[kGateParams];
  __shared__ float slots[kWarps];
  if (is_row(p, stats_row)) finish_stats_row(p, stats_row, sums, gate_params);
  if constexpr (FUSED) {
    if (is_row(p, combine_row)) combine_norm_row<QUANT>(p, combine_row, slots);
  }
}

}  // namespace
