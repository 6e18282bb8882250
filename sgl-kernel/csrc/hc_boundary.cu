// The mHC boundary at decode and verify sizes (m = 1..64 rows, H = 5120): SGLang's post of
// sublayer l, the statistics of its result for sublayer l + 1, and sublayer l + 1's combine +
// RMSNorm (hc_boundary_cuda); and the statistics of a given x alone (hc_mix_stats_rows_cuda),
// the small-row path of hc_mix_stats, with the same bits.
//
// Why: at these sizes each step is a few hundred nanoseconds of memory traffic behind a launch,
// a grid-wide dependency and a serial Sinkhorn; here the launches and the dependency are paid
// once, and the projection runs on CUDA cores in fp32 (every product rounded once, which is
// more exact than the split TF32 passes and fast enough below 128 rows).
//
// Two phases over 128 slices; CTA c of phase 1 owns the hidden columns [40c, 40c + 40) of each
// of the 4 streams: K slice c, 160 of the K = 4H columns. The caller's plan launches them as
//  - one cooperative grid of 128 CTAs of 640 threads, all resident, phase 2 after a grid-wide
//    barrier (cooperative_groups; it orders every CTA's global writes before it); or
//  - a dependent pair: the slices grid (phase 1), then the rows grid (phase 2), each a
//    programmatic dependent launch, the kernel boundary the barrier. No CTA waits on another,
//    so neither grid needs the GPU to itself (a side stream shares it with the sublayer), and
//    the slices grid pulls its fn lines into L2 while the previous kernel finishes.
// Both run the same phase code, so they have the same bits.
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
// The barrier. Phase 2 (in the cooperative grid CTA 127 - r and CTA r; in the rows grid CTAs
// m + r and r when fused, else CTA r):
//  - the statistics of row r: each of the 25 columns over the 128 slices, lane j
//    of a 16-lane group adding slices j, j + 16, ..., j + 112 in that order, then a butterfly
//    over the 16 lanes (xor 8, 4, 2, 1); then finish_row (hc_mix_stats_finish.cuh): the RMS
//    factor, the gates and Sinkhorn -> pre, post, comb and mix of row r.
//  - fused, the combine + RMSNorm of row r, with `pre` (the gates SGLang's lag gives
//    the next combine: the previous triplet's) over the updated rows, in hc_combine_norm.cu's
//    one-CTA shape for H = 5120 (thread t owns columns [8t, 8t + 8); 20 warp sums; the helpers
//    of hc_combine_norm_row.cuh): the same bits as hc_combine_norm on the updated residual;
//    where the caller passes q, also the normed row's e4m3 groups of 32 and their power-of-two
//    scales (group_quant_ue8m0.cuh, 4 lanes a group): the bits of SGLang's quantizer of the
//    stored normed row, so that the next sublayer's FP8 linear need not quantize it again.
// Deterministic: fixed orders, no atomics; a row's bits depend on the row alone (not on m).
//
// Launch: on tvm-ffi's stream for the inputs' device; no allocation, no host sync (CUDA-graph
// capturable). A cooperative grid must be resident at once: CUDA refuses one that does not fit,
// and the host checks the occupancy first (a GPU with fewer than 128 SMs is refused).

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "hc_boundary_phases.cuh"
#include "tensor_view.cuh"

namespace {

namespace cg = cooperative_groups;

// One cooperative grid: phase 1, a grid-wide barrier, phase 2 (CTA c: statistics of row
// 127 - c, combine of row c).
template <bool FUSED, int RT, bool QUANT>
__global__ void __launch_bounds__(kThreads, 1)
    hc_boundary_kernel(const __grid_constant__ BoundaryParams p) {
  const int slice = static_cast<int>(blockIdx.x);
  slice_phase<FUSED, RT, false>(p, slice);
  cg::this_grid().sync();
  row_phase<FUSED, QUANT>(p, kSlices - 1 - slice, slice);
}

// The same two phases as a dependent pair: the slices grid, then the rows grid (CTA b: fused,
// the combine of row b for b < m and the statistics of row b - m; else the statistics of row
// b), each a dependent launch. The kernel boundary is the barrier; no CTA waits on another, so
// neither grid needs the whole GPU at once.
template <bool FUSED, int RT>
__global__ void __launch_bounds__(kThreads, 1)
    hc_boundary_slices_kernel(const __grid_constant__ BoundaryParams p) {
  allow_next_grid();  // one wave: the rows grid's CTAs take their SMs as these leave
  slice_phase<FUSED, RT, true>(p, static_cast<int>(blockIdx.x));
}

template <bool FUSED, bool QUANT>
__global__ void __launch_bounds__(kThreads, 1)
    hc_boundary_rows_kernel(const __grid_constant__ BoundaryParams p) {
  wait_for_previous_grid();  // the slices' sums and the post's rows
  allow_next_grid();
  const int b = static_cast<int>(blockIdx.x);
  if constexpr (FUSED) {
    row_phase<FUSED, QUANT>(p, b - p.m, b);
  } else {
    row_phase<FUSED, QUANT>(p, b, -1);
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

template <bool FUSED, int RT, bool QUANT>
void launch_rows(const BoundaryParams& p, int device, bool dependent) {
  const size_t smem = shared_bytes(p.m, p.row_tile);
  const int max_smem = static_cast<int>(shared_bytes(kMaxRows, kMaxRowTile));
  const cudaStream_t stream = env_stream(device);
  if (dependent) {
    const auto slices = hc_boundary_slices_kernel<FUSED, RT>;
    set_attribute_at_least<hc_boundary_slices_kernel<FUSED, RT>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize>(max_smem, device,
                                                                        "hc_boundary");
    launch_with_smem("hc_boundary", slices, dim3(kSlices), dim3(kThreads), smem, /*cluster=*/0,
                     /*dependent=*/true, stream, p);
    const unsigned rows = static_cast<unsigned>(FUSED ? 2 * p.m : p.m);
    launch_in_clusters("hc_boundary", hc_boundary_rows_kernel<FUSED, QUANT>, dim3(rows),
                       dim3(kThreads),
                       /*cluster=*/0, /*dependent=*/true, stream, p);
    return;
  }
  const auto kernel = hc_boundary_kernel<FUSED, RT, QUANT>;
  set_attribute_at_least<hc_boundary_kernel<FUSED, RT, QUANT>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize>(max_smem, device,
                                                                      "hc_boundary");
  const int64_t resident = resident_ctas(kernel, kThreads, smem, 0);
  if (resident < kSlices) {
    TVM_FFI_THROW(RuntimeError) << "hc_boundary needs " << kSlices << " CTAs of " << kThreads
                                << " threads resident at once; this GPU holds " << resident;
  }
  launch_cooperative("hc_boundary", kernel, dim3(kSlices), dim3(kThreads), smem, stream, p);
}

template <bool FUSED, bool QUANT = false>
void launch(const BoundaryParams& p, int device, bool dependent) {
  if (p.m == 0) return;
  tvm::ffi::CUDADeviceGuard guard(device);
  switch (p.row_tile / kRowSlots) {
    case 1:
      return launch_rows<FUSED, 1, QUANT>(p, device, dependent);
    case 2:
      return launch_rows<FUSED, 2, QUANT>(p, device, dependent);
    default:
      return launch_rows<FUSED, 4, QUANT>(p, device, dependent);
  }
}

}  // namespace

// x bf16 [m, 4H] (rows 16-byte aligned, unit stride), fn fp32 [24, 4H], scale [3], base [24]
// -> pre, post [m, 4], comb [m, 4, 4], mix [m, 24] (fp32, contiguous), with part fp32
// [m, 128, 25] as the slices' scratch. H = 5120, m <= 64; row_tile (8, 16 or 32: rows a
// pass) and dependent (the pair, else the cooperative grid) the caller's plan.
void hc_mix_stats_rows_cuda(TensorView x, TensorView fn, TensorView scale, TensorView base,
                            TensorView pre, TensorView post, TensorView comb, TensorView mix,
                            TensorView part, int64_t row_tile, bool dependent, double rms_eps,
                            double eps, double post_mult, int64_t iters) {
  check_tensor(x, "x", {kAnySize, kK}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0);
  const int device = x.device().device_id;
  check_statistics(m, device, fn, scale, base, pre, post, comb, mix, part, row_tile, iters);
  BoundaryParams p = statistics_params(m, fn, scale, base, pre, post, comb, mix, part, row_tile,
                                       rms_eps, eps, post_mult, iters);
  p.x = data_as<const uint16_t>(x);
  p.x_stride = x.stride(0);
  launch<false>(p, device, dependent);
}

// The boundary: y bf16 [m, H] (the sublayer's output), residual bf16 [m, 4, H], post_mix fp32
// [m, 4], comb_in fp32 [m, 4, 4] (the post's triplet), pre_in fp32 [m, 4] (the next combine's
// gates), weight bf16 [H] (the next norm's), fn/scale/base (the next statistics') -> updated
// bf16 [m, 4, H] (the post's result), normed bf16 [m, H], and the statistics of updated as
// hc_mix_stats_rows_cuda writes them; q float8_e4m3fn [m, H] and q_scales fp32 [m, H / 32]
// (contiguous): normed's e4m3 groups of 32 and their power-of-two scales, as SGLang's
// sglang_per_token_group_quant_fp8(normed, 32, scale_ue8m0=True) returns them, or both with
// no rows: not written. Inputs contiguous (y and normed: unit-stride rows) and 16-byte aligned;
// outputs must not overlap inputs (the caller checks).
void hc_boundary_cuda(TensorView y, TensorView residual, TensorView post_mix, TensorView comb_in,
                      TensorView pre_in, TensorView weight, TensorView fn, TensorView scale,
                      TensorView base, TensorView updated, TensorView normed, TensorView q,
                      TensorView q_scales, TensorView pre, TensorView post, TensorView comb,
                      TensorView mix, TensorView part, int64_t row_tile, bool dependent,
                      double rms_eps, double eps, double post_mult, double norm_eps,
                      int64_t iters) {
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
  const bool quantize = fp8_groups_given<kQuantGroup>(q, q_scales, m, kHidden, device);
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
  if (!quantize) return launch<true>(p, device, dependent);
  p.q = data_as<uint8_t>(q);
  p.q_scales = data_as<float>(q_scales);
  launch<true, true>(p, device, dependent);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_stats_rows_cuda, hc_mix_stats_rows_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_boundary_cuda, hc_boundary_cuda);
