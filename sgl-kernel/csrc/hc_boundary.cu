// The mHC boundary at decode and verify sizes (m = 1..64 rows, H = 5120) in one launch:
// SGLang's post of sublayer l, the statistics of its result for sublayer l + 1, and sublayer
// l + 1's combine + RMSNorm (hc_boundary_cuda); and the statistics of a given x alone
// (hc_mix_stats_rows_cuda), the small-row path of hc_mix_stats, with the same bits.
//
// Why: at these sizes each step is a few hundred nanoseconds of memory traffic behind a launch,
// a grid-wide dependency and a serial Sinkhorn; one cooperative grid pays the launch once and
// the dependency as one barrier, and the projection runs on CUDA cores in fp32 (every product
// rounded once, which is more exact than the split TF32 passes and fast enough below 128 rows).
//
// Grid: 128 CTAs of 640 threads, all resident (a cooperative launch). CTA c owns the hidden
// columns [40c, 40c + 40) of each of the 4 streams: K slice c, 160 of the K = 4H columns.
//
// Phase 1, every CTA over its slice of every row:
//  - fused, the post (SGLang 0.5.23's: mhc_post_split_h, and the TileLang mhc_post it matches):
//      out[r, c, h] = bf16_rn(fma(comb[r,3,c], R[r,3,h], fma(comb[r,2,c], R[r,2,h],
//                     fma(comb[r,1,c], R[r,1,h], fma(post[r,c], y[r,h], comb[r,0,c]·R[r,0,h])))))
//    in fp32 (the first product rounded, each fma rounded once), stored as the updated residual;
//    the slice's x is those bf16 values. Statistics alone: x is read.
//  - the slice's sums, fp32 on CUDA cores: for each row r, Σ_k x[r,k]·fn[n,k] (n < 24) and
//    Σ_k x[r,k]² (column 24). The slice's 160 columns (stream-major: k = 40·stream + column)
//    are 16 parts of 10, part j the lane j of a half-warp: the lane adds its 10 products in
//    column order by one fma each into a chain from +0, then a butterfly over the 16 lanes
//    (xor 8, 4, 2, 1) adds the parts; the result is stored as part[r, c, :]. A half-warp holds
//    5 of the 25 sums of RT rows (RT = 1, 2 or 4 as m needs: the caller's row tile 8·RT is the
//    rows of one pass of the CTA's 8 row slots); neither RT nor m changes a row's bits.
// A grid-wide barrier (cooperative_groups; it orders every CTA's global writes before it).
// Phase 2:
//  - the statistics of row r, in CTA 127 - r: each of the 25 columns over the 128 slices, lane j
//    of a 16-lane group adding slices j, j + 16, ..., j + 112 in that order, then a butterfly
//    over the 16 lanes (xor 8, 4, 2, 1); then finish_row (hc_mix_stats_finish.cuh): the RMS
//    factor, the gates and Sinkhorn -> pre, post, comb and mix of row r.
//  - fused, the combine + RMSNorm of row r, in CTA r, with `pre` (the gates SGLang's lag gives
//    the next combine: the previous triplet's) over the updated rows, in hc_combine_norm.cu's
//    one-CTA shape for H = 5120 (thread t owns columns [8t, 8t + 8); 20 warp sums; the helpers
//    of hc_combine_norm_row.cuh): the same bits as hc_combine_norm on the updated residual.
// Deterministic: fixed orders, no atomics; a row's bits depend on the row alone (not on m).
//
// Launch: on tvm-ffi's stream for the inputs' device; no allocation, no host sync (CUDA-graph
// capturable). The grid must be resident at once: CUDA refuses a cooperative launch that does
// not fit, and the host checks the occupancy first (a GPU with fewer than 128 SMs is refused).

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "hc_combine_norm_row.cuh"
#include "hc_mix_stats_finish.cuh"
#include "hc_post_row.cuh"
#include "tensor_view.cuh"

namespace {

namespace cg = cooperative_groups;
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

// fn's 24 rows of the slice into fs[n][k], and the slice's x (the post's result when fused,
// written out too) into xs[r][k], as fp32. Every global load is issued before the first store.
template <bool FUSED>
__device__ void stage_slice(const BoundaryParams& p, float* fs, float* xs, int h0) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kQuads = kSliceK / 4;  // float4s of a staged fn row
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

// Row r's combine + RMSNorm over the updated residual (hc_combine_norm.cu's one-CTA shape).
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
}

template <bool FUSED, int RT>
__global__ void __launch_bounds__(kThreads, 1)
    hc_boundary_kernel(const __grid_constant__ BoundaryParams p) {
  extern __shared__ float4 shared4[];
  float* fs = reinterpret_cast<float*>(shared4);
  float* xs = fs + kFnFloats;
  __shared__ float sums[kSumCols];
  __shared__ float gate_params[kGateParams];
  __shared__ float slots[kWarps];
  const int slice = static_cast<int>(blockIdx.x);
  stage_slice<FUSED>(p, fs, xs, slice * kSliceCols);
  __syncthreads();
  project_slice<RT>(p, fs, xs, slice);
  cg::this_grid().sync();
  const int stats_row = kSlices - 1 - slice;
  if (stats_row < p.m) finish_stats_row(p, stats_row, sums, gate_params);
  if constexpr (FUSED) {
    if (slice < p.m) combine_norm_row(p, slice, slots);
  }
}

// ---- host side

// The statistics' arguments (ValueError naming the first that is off); m from fn's caller.
void check_statistics(int64_t m, int device, const TensorView& fn, const TensorView& scale,
                      const TensorView& base, const TensorView& pre, const TensorView& post,
                      const TensorView& comb, const TensorView& mix, const TensorView& part,
                      int64_t row_tile, int64_t iters) {
  if (m < 0 || m > kMaxRows) {
    TVM_FFI_THROW(ValueError) << "m = " << m << " rows: this kernel takes 0 to " << kMaxRows;
  }
  if (row_tile != kRowSlots && row_tile != 2 * kRowSlots && row_tile != 4 * kRowSlots) {
    TVM_FFI_THROW(ValueError) << "row_tile = " << row_tile << " must be " << kRowSlots << ", "
                              << 2 * kRowSlots << " or " << 4 * kRowSlots;
  }
  if (iters < 1) TVM_FFI_THROW(ValueError) << "iters = " << iters << " must be >= 1";
  check_tensor(fn, "fn", {kMixCols, kK}, {kFloat32}, device, Layout::kContiguous, 16);
  check_statistics_outputs(m, device, scale, base, pre, post, comb, mix);
  check_tensor(part, "part", {m, kSlices, kSumCols}, {kFloat32}, device, Layout::kContiguous);
}

BoundaryParams statistics_params(int64_t m, const TensorView& fn, const TensorView& scale,
                                 const TensorView& base, const TensorView& pre,
                                 const TensorView& post, const TensorView& comb,
                                 const TensorView& mix, const TensorView& part, int64_t row_tile,
                                 double rms_eps, double eps, double post_mult, int64_t iters) {
  BoundaryParams p{};
  p.fn = data_as<const float>(fn);
  p.part = data_as<float>(part);
  p.finish.scale = data_as<const float>(scale);
  p.finish.base = data_as<const float>(base);
  p.finish.pre = data_as<float>(pre);
  p.finish.post = data_as<float>(post);
  p.finish.comb = data_as<float>(comb);
  p.finish.mix = data_as<float>(mix);
  p.finish.iters = static_cast<int>(iters);
  p.finish.k = static_cast<float>(kK);
  p.finish.rms_eps = static_cast<float>(rms_eps);
  p.finish.eps = static_cast<float>(eps);
  p.finish.post_mult = static_cast<float>(post_mult);
  p.m = static_cast<int>(m);
  p.row_tile = static_cast<int>(row_tile);
  return p;
}

template <bool FUSED, int RT>
void launch_rows(const BoundaryParams& p, int device) {
  const auto kernel = hc_boundary_kernel<FUSED, RT>;
  const size_t smem = shared_bytes(p.m, p.row_tile);
  set_attribute_at_least<hc_boundary_kernel<FUSED, RT>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize>(
      static_cast<int>(shared_bytes(kMaxRows, kMaxRowTile)), device, "hc_boundary");
  const int64_t resident = resident_ctas(kernel, kThreads, smem, 0);
  if (resident < kSlices) {
    TVM_FFI_THROW(RuntimeError) << "hc_boundary needs " << kSlices << " CTAs of " << kThreads
                                << " threads resident at once; this GPU holds " << resident;
  }
  launch_cooperative("hc_boundary", kernel, dim3(kSlices), dim3(kThreads), smem, env_stream(device),
                     p);
}

template <bool FUSED>
void launch(const BoundaryParams& p, int device) {
  if (p.m == 0) return;
  tvm::ffi::CUDADeviceGuard guard(device);
  switch (p.row_tile / kRowSlots) {
    case 1:
      return launch_rows<FUSED, 1>(p, device);
    case 2:
      return launch_rows<FUSED, 2>(p, device);
    default:
      return launch_rows<FUSED, 4>(p, device);
  }
}

}  // namespace

// x bf16 [m, 4H] (rows 16-byte aligned, unit stride), fn fp32 [24, 4H], scale [3], base [24]
// -> pre, post [m, 4], comb [m, 4, 4], mix [m, 24] (fp32, contiguous), with part fp32
// [m, 128, 25] as the slices' scratch. H = 5120, m <= 64; row_tile (8, 16 or 32: rows a
// pass) the caller's plan.
void hc_mix_stats_rows_cuda(TensorView x, TensorView fn, TensorView scale, TensorView base,
                            TensorView pre, TensorView post, TensorView comb, TensorView mix,
                            TensorView part, int64_t row_tile, double rms_eps, double eps,
                            double post_mult, int64_t iters) {
  check_tensor(x, "x", {kAnySize, kK}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0);
  const int device = x.device().device_id;
  check_statistics(m, device, fn, scale, base, pre, post, comb, mix, part, row_tile, iters);
  BoundaryParams p = statistics_params(m, fn, scale, base, pre, post, comb, mix, part, row_tile,
                                       rms_eps, eps, post_mult, iters);
  p.x = data_as<const uint16_t>(x);
  p.x_stride = x.stride(0);
  launch<false>(p, device);
}

// The boundary: y bf16 [m, H] (the sublayer's output), residual bf16 [m, 4, H], post_mix fp32
// [m, 4], comb_in fp32 [m, 4, 4] (the post's triplet), pre_in fp32 [m, 4] (the next combine's
// gates), weight bf16 [H] (the next norm's), fn/scale/base (the next statistics') -> updated
// bf16 [m, 4, H] (the post's result), normed bf16 [m, H], and the statistics of updated as
// hc_mix_stats_rows_cuda writes them. Inputs contiguous (y and normed: unit-stride rows) and
// 16-byte aligned; outputs must not overlap inputs (the caller checks).
void hc_boundary_cuda(TensorView y, TensorView residual, TensorView post_mix, TensorView comb_in,
                      TensorView pre_in, TensorView weight, TensorView fn, TensorView scale,
                      TensorView base, TensorView updated, TensorView normed, TensorView pre,
                      TensorView post, TensorView comb, TensorView mix, TensorView part,
                      int64_t row_tile, double rms_eps, double eps, double post_mult,
                      double norm_eps, int64_t iters) {
  check_tensor(y, "y", {kAnySize, kHidden}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = y.size(0);
  const int device = y.device().device_id;
  check_tensor(residual, "residual", {m, kStreamCount, kHidden}, {kBfloat16}, device,
               Layout::kContiguous, 16);
  check_tensor(post_mix, "post_mix", {m, 4}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(comb_in, "comb_in", {m, 4, 4}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(pre_in, "pre_in", {m, 4}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(weight, "weight", {kHidden}, {kBfloat16}, device, Layout::kContiguous, 16);
  check_tensor(updated, "updated", {m, kStreamCount, kHidden}, {kBfloat16}, device,
               Layout::kContiguous, 16);
  check_tensor(normed, "normed", {m, kHidden}, {kBfloat16}, device, Layout::kRows, 16);
  check_statistics(m, device, fn, scale, base, pre, post, comb, mix, part, row_tile, iters);
  BoundaryParams p = statistics_params(m, fn, scale, base, pre, post, comb, mix, part, row_tile,
                                       rms_eps, eps, post_mult, iters);
  p.y = data_as<const uint16_t>(y);
  p.y_stride = y.stride(0);
  p.residual = data_as<const uint16_t>(residual);
  p.post_mix = data_as<const float>(post_mix);
  p.comb_in = data_as<const float>(comb_in);
  p.pre_in = data_as<const float>(pre_in);
  p.weight = data_as<const uint16_t>(weight);
  p.updated = data_as<uint16_t>(updated);
  p.normed = data_as<uint16_t>(normed);
  p.normed_stride = normed.stride(0);
  p.norm_eps = static_cast<float>(norm_eps);
  launch<true>(p, device);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_stats_rows_cuda, hc_mix_stats_rows_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_boundary_cuda, hc_boundary_cuda);
