// The mHC post of sublayer l followed by sublayer l + 1's combine + RMSNorm, one row per
// thread-block cluster: the boundary without the statistics, for where they run beside the
// sublayer on a side stream (SGLang's stats stream) and so are not on the critical path.
//
// Why: the post and the combine read the same row of the residual streams; here each thread
// holds its columns of the four updated streams in registers from the post to the combine, so
// the updated residual is written once and never read back, and the boundary is one launch.
//
// Contract (bitwise; sublayer y [m, H] bf16, residual [m, 4, H] bf16, post_mix [m, 4] and comb
// [m, 4, 4] fp32 (this boundary's triplet), pre [m, 4] fp32 (the next combine's gates), weight
// [H] bf16 (the next norm's)):
//   updated[r, c, h] is SGLang 0.5.23's post (hc_post_row.cuh: the fma chain of
//     mhc_post_split_h, rounded to nearest even to bf16; a NaN's payload is the conversion's);
//   normed is hc_combine_norm.cu's y of updated, with its bits for the same launch shape (the
//     same kernel template, hc_combine_norm_kernel.cuh, computes both from the updated words a
//     thread holds; the combine never sees a NaN's payload);
//   where the caller passes q, q and q_scales are normed's e4m3 groups of 32 and their
//     power-of-two scales: SGLang's sglang_per_token_group_quant_fp8(normed, 32,
//     scale_ue8m0=True) of the stored bf16 row (group_quant_ue8m0.cuh, 4 lanes a group), so
//     that the next sublayer's FP8 linear need not quantize it again.
//
// Launch: hc_combine_norm.cu's grid, cluster and programmatic dependent launch, chosen by the
// caller (hc_combine_norm_plan.py), at most 640 threads a CTA with one vector a thread; on
// tvm-ffi's stream for the inputs' device; no allocation, no host sync (CUDA-graph capturable).

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "hc_combine_norm_kernel.cuh"
#include "tensor_view.cuh"

namespace {

using namespace combine_norm;
using tvm::ffi::TensorView;

// The post's inputs and outputs and the shared arguments -> the kernel parameters (ValueError
// naming the first argument that is off). The outputs must not overlap an input (the caller's).
Params checked_params(const TensorView& sublayer, const TensorView& residual,
                      const TensorView& post_mix, const TensorView& comb, const TensorView& pre,
                      const TensorView& weight, const TensorView& updated, const TensorView& normed,
                      double eps, int64_t cluster) {
  check_tensor(residual, "residual", {kAnySize, kStreams, kAnySize}, {kBfloat16}, kAnyDevice,
               Layout::kContiguous, 16);
  const int64_t m = residual.size(0), h = residual.size(2);
  const int device = residual.device().device_id;
  Params p = common_params("residual", m, h, device, pre, weight, normed, "normed", eps, cluster);
  check_tensor(sublayer, "sublayer", {m, h}, {kBfloat16}, device, Layout::kRows, 16);
  check_tensor(post_mix, "post_mix", {m, kStreams}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(comb, "comb", {m, kStreams, kStreams}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(updated, "updated", {m, kStreams, h}, {kBfloat16}, device, Layout::kContiguous, 16);
  p.sublayer = data_as<const uint16_t>(sublayer);
  p.residual = data_as<const uint16_t>(residual);
  p.post_mix = data_as<const float>(post_mix);
  p.comb = data_as<const float>(comb);
  p.updated = data_as<uint16_t>(updated);
  p.sublayer_row_stride = sublayer.stride(0);
  return p;
}

}  // namespace

// sublayer bf16 [m, H] (unit-stride rows), residual bf16 [m, 4, H], post_mix fp32 [m, 4], comb
// fp32 [m, 4, 4] (contiguous), pre fp32 [m, 4], weight bf16 [H] -> updated bf16 [m, 4, H]
// (contiguous) and normed bf16 [m, H]; 16-byte aligned rows; q float8_e4m3fn [m, H] and
// q_scales fp32 [m, H / 32] (contiguous, q 16-byte aligned): normed's e4m3 groups of 32 and
// their power-of-two scales, or both with no rows: not written. The launch shape as
// hc_combine_norm_cuda's (cluster 1, 2 or 4; threads with one vector a thread at most 640).
void hc_post_combine_norm_cuda(TensorView sublayer, TensorView residual, TensorView post_mix,
                               TensorView comb, TensorView pre, TensorView weight,
                               TensorView updated, TensorView normed, TensorView q,
                               TensorView q_scales, double eps, int64_t cluster, int64_t threads) {
  Params p = checked_params(sublayer, residual, post_mix, comb, pre, weight, updated, normed, eps,
                            cluster);
  const int device = residual.device().device_id;
  if (groups_params(p, q, q_scales, device)) {
    run_checked<Epilogue::kGroups, /*POST=*/true>(p, device, cluster, threads);
  } else {
    run_checked<Epilogue::kNone, /*POST=*/true>(p, device, cluster, threads);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_post_combine_norm_cuda, hc_post_combine_norm_cuda);
