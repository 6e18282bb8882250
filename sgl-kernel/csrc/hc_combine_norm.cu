// mHC combine + RMSNorm (and optionally its MXFP8 quantization or its FP8 groups), one row per
// thread-block cluster.
//
// Why: at decode sizes (m = 1..128 rows, H = 5120) the Triton kernel, one CTA per row, is bound by
// instruction issue (about 1300 SASS instructions a thread for 20 values). Here a row is split
// over a cluster of C CTAs (C = 1, 2 or 4): CTA `rank` owns columns [rank·H/C, (rank+1)·H/C), so
// each CTA issues 1/C of the work, and the row's sum of squares is combined through distributed
// shared memory. A thread owns ITEMS 16-byte vectors (8 columns each): vector v = k·threads + tid
// of its CTA's columns for k < ITEMS (consecutive threads read consecutive 16 bytes of each of the
// 4 streams), so a 32-value MXFP8 block lies in 4 consecutive lanes. Every global load (x, pre,
// weight) is issued before the first reduction; the whole row lives in registers.
//
// Contract (bitwise; x [m, 4H] bf16, pre [m, 4] fp32, weight [H] bf16, H % (32·C) == 0):
//   x_in[h] = bf16_rn(((p0·x0[h] + p1·x1[h]) + p2·x2[h]) + p3·x3[h]), xs[h] = x[r, s·H + h], each
//             product and sum one fp32 rounding (mul.rn / add.rn in PTX: no FMA, no flush);
//   ss      = Σ x_in² in fp32 (each square exact), in the fixed order below;
//   inv     = div.rn(1, sqrt.rn(add.rn(div.rn(ss, H), eps)));
//   y[h]    = bf16_rn(mul.rn(mul.rn(x_in[h], inv), w[h]));
//   bf16_rn is round to nearest even (cvt.rn.bf16x2.f32) with every NaN stored as 0x7FC0.
// With quantize, per 32-value block of y (FlashInfer's cuda backend, as mxfp8_encode_blocks in
// mxfp8_quantize.py with HW_CVT): NaN-ignoring integer maxima of |y| over the even and the odd
// positions, vmax = max of the two, S = mul.rn(vmax, 0x3B124925); scale = S's exponent field E,
// 0 if E == 0, else min(E + (mantissa != 0), 254); 255 if every odd position is NaN; osc =
// 2^(127 - scale) (0 for scale 0 and 254, NaN for 255); code = cvt.rn.satfinite.e4m3x2.f32 of
// mul.rn.ftz(y, osc), NaN products replaced by +448. Scales go to the 128x4 swizzled buffer of
// rup(m, 128) x rup(H/32, 4) bytes; every byte is written (padding columns and rows 0).
//
// Reduction order of ss (fixed by H, C and the thread count; never by m or the row's position,
// so rows are batch-invariant, and the same with or without quantize):
//   1. a thread adds its squares to +0 in column order (item k = 0.., within it 8 columns);
//   2. a butterfly over the warp (shfl_xor 16, 8, 4, 2, 1): every lane ends with the same bits;
//   3. the warp sums of the cluster are slots n = rank·warps + warp (n < N = C·warps): each CTA
//      gets all N in its shared memory (lane j < C of each warp stores its warp's sum into CTA j
//      by st.async, completing on CTA j's mbarrier; with C = 1 a plain store and
//      __syncthreads); then every warp sums them: lane l takes slot l (+0 for l >= N), plus
//      slot l + 32 when N > 32, then a butterfly over the warp as in 2. Every CTA of the
//      cluster thus computes the identical ss. (The lanes >= N add +0, so this is the same
//      sum, bit for bit, as a butterfly over N rounded up to a power of two.)
// Adding +0 never changes a sum of squares, so idle vectors (past the CTA's columns) are
// computed on zeros and only their stores are skipped.
//
// Padding of the scale buffer: in the 128x4 layout each 4-byte word holds one row's 4
// consecutive scale columns, so extra CTAs after the row clusters zero the words of the last
// 128-row tile that belong to rows >= m; the last CTA of each row cluster writes the row's
// padding columns [H/32, rup(H/32, 4)).
//
// Launch: grid (m·C + padding CTAs), cluster (C, 1, 1), a programmatic dependent launch (as
// SGLang's own kernels on Hopper; every CTA waits for the previous kernel before its first global
// access, and a grid of one wave lets the next launch start at once), on tvm-ffi's stream for x's
// device; no allocation, no host sync (CUDA-graph capturable).

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "hc_combine_norm_kernel.cuh"
#include "tensor_view.cuh"

namespace {

using namespace combine_norm;
using tvm::ffi::TensorView;

// x bf16 [m, 4H] and the shared arguments -> the kernel parameters (ValueError naming the first
// argument that is off).
Params checked_params(const TensorView& x, const TensorView& pre, const TensorView& weight,
                      const TensorView& y, const TensorView& data, const TensorView& scales,
                      double eps, bool quantize, int64_t cluster) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0), width = x.size(1);
  if (width % kStreams != 0) {
    TVM_FFI_THROW(ValueError) << "x must be [m, 4*H], got width " << width;
  }
  const int device = x.device().device_id;
  Params p = common_params("x", m, width / kStreams, device, pre, weight, y, "y", eps, cluster);
  if (quantize) {
    check_tensor(data, "data", {m, p.h}, {kByte}, device, Layout::kRows, 8);
    const int64_t size = (m + 127) / 128 * 128 * int64_t{p.padded_cols};
    check_tensor(scales, "scales", {size}, {kByte}, device, Layout::kContiguous, 4);
    p.data = data_as<uint8_t>(data);
    p.scales = data_as<uint8_t>(scales);
    p.data_row_stride = data.stride(0);
  }
  p.x = data_as<const uint16_t>(x);
  p.x_row_stride = x.stride(0);
  return p;
}

}  // namespace

// x bf16 [m, 4H], pre fp32 [m, 4], weight bf16 [H] contiguous -> y bf16 [m, H]; with quantize
// also data (1-byte view of e4m3) [m, H] and scales (1-byte, rup(m,128)·rup(H/32,4), 128x4
// swizzled). data and scales are not read without quantize. q (1-byte view of e4m3) [m, H] and
// q_scales fp32 [m, H / 32], contiguous, q 16-byte aligned: y's FP8 groups of 32 and their
// power-of-two scales (SGLang's per-token-group quantizer with scale_ue8m0, of the stored y),
// or both with no rows: not written; not with quantize. The launch shape: cluster CTAs a row
// (1, 2 or 4; H % (32·cluster) == 0) of threads threads (a multiple of 32 up to 1024, at most 5
// vectors of 8 columns a thread), chosen by the caller (hc_combine_norm_plan.py); y's bits depend
// on it, never on m.
void hc_combine_norm_cuda(TensorView x, TensorView pre, TensorView weight, TensorView y,
                          TensorView data, TensorView scales, TensorView q, TensorView q_scales,
                          double eps, bool quantize, int64_t cluster, int64_t threads) {
  Params p = checked_params(x, pre, weight, y, data, scales, eps, quantize, cluster);
  const int device = x.device().device_id;
  const bool groups = groups_params(p, q, q_scales, device);
  if (quantize && groups) {
    TVM_FFI_THROW(ValueError) << "quantize (MXFP8) and q (FP8 groups): one epilogue a launch";
  }
  if (quantize) {
    run_checked<Epilogue::kMxfp8, /*POST=*/false>(p, device, cluster, threads);
  } else if (groups) {
    run_checked<Epilogue::kGroups, /*POST=*/false>(p, device, cluster, threads);
  } else {
    run_checked<Epilogue::kNone, /*POST=*/false>(p, device, cluster, threads);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_combine_norm_cuda, hc_combine_norm_cuda);
