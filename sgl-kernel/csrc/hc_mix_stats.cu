// Split-K partials of the compensated mHC projection: part = x·hi^T + x·lo^T and Σx², per K
// slice, read from fn itself (its TF32 part hi is what the tensor core takes from fn's bits) and
// the stored residual lo = fn - hi: no copy of hi is kept. Two kernels give them: wgmma on
// Hopper (sm_90a), mma.sync elsewhere (sm_80+, the SM100 family).
//
// The Triton projection converts bf16 x to fp32 in registers before its TF32 MMA, so its x
// loads are not pipelined and the kernel waits on DRAM once per K step. Here x and w go
// straight from global to shared memory (cp.async 16-byte copies in the mma.sync kernel, TMA
// boxes in the wgmma one), STAGES chunks of 64 K columns in the ring, so the next chunks are
// in flight while one is multiplied, and every warp converts its x fragment in registers
// right before the MMA.
//
// One CTA = kRows rows x one K slice, grid (ceil(m / kRows), S). A stage holds x [kRows x 64]
// bf16 (128 bytes a row) and 48 rows of w: fn's 24 (read as hi) then lo's 24, 64 fp32 each
// (the wgmma kernel puts w first, as two 32-column atoms of the 48 rows; its section says how).
// Each thread holds the hi and the lo products of the same (row, column), so it adds them
// into the slice's one partial.
//
// Numerics contract (what the finisher in hc_mix_stats_triton.py relies on):
// - part[s, r, n] = Σ_{k in slice s} x[r, k]·hi[n, k] + Σ_{k in slice s} x[r, k]·lo[n, k] for
//   n in 0-23 (the two sums kept apart to the end of the slice, then one IEEE fp32 add);
//   columns 24-31 are written as 0.0. sqsum[s, r] = Σ_{k in slice s} float(x[r, k])² in fp32.
// - Products run on tensor cores (TF32 MMAs): bf16 -> fp32 is exact and exact in TF32, and
//   fn/lo are passed as raw fp32 bits. The tensor core reads their top 19 bits, so fn's
//   product is hi's (split_tf32: hi = fn with the low 13 bits cleared, fn itself where not
//   finite), bit for bit; the GPU tier checks it against a staged hi, for both kernels.
// - The tensor core's internal accumulation is not round-to-nearest and drifts over long K,
//   so each 64-column chunk is one fresh 8-step chain from zero, added to the running sums
//   with an IEEE fp32 add. The two kernels' tensor cores round inside a chain differently,
//   and their lanes take different x elements into their sqsum chains: the two kernels'
//   partials and sums of squares differ in the last bits.
// - Slice s covers the 64-column blocks [first, first + count) with nb = K / 64, first =
//   s·(nb / S) + min(s, nb % S), count = nb / S + (s < nb % S), as the Triton kernel.
// - Deterministic: a fixed order everywhere (no atomics). sqsum: per lane, each chunk's squares
//   in one fma chain added to a running sum (chains of ~count, not 16·count, roundings), then
//   a fixed shuffle tree over the quad.
//
// Launch: one kernel on tvm-ffi's stream for x's device; no allocation, no host sync (it is
// captured in CUDA graphs). The wgmma kernel's tensor maps are encoded on the host each call
// and passed by value with the parameters. On Hopper the wgmma kernel can also finish the
// statistics itself (hc_mix_stats_fused; its section says how).
//
// The kernels are in headers, one job each: hc_mix_stats_common.cuh (parameters, slices, copies,
// the partials' store), hc_mix_stats_mma.cuh (mma.sync), hc_mix_stats_finish.cuh (a row's
// statistics, the fused kernel's epilogue), hc_mix_stats_wgmma.cuh (wgmma, fused or not) and
// hc_mix_stats_launch.cuh (argument checks, tensor maps, launches). The launch shape (rows a
// CTA, K slices, fused or not) is the caller's plan (hc_mix_stats_plan.py).

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "hc_mix_stats_common.cuh"
#include "hc_mix_stats_finish.cuh"
#include "hc_mix_stats_launch.cuh"
#include "hc_mix_stats_mma.cuh"
#include "hc_mix_stats_wgmma.cuh"
#include "tensor_view.cuh"

// x: bf16 [m, K] (last-dim stride 1, 16-byte aligned rows, K % 64 == 0); fn and its TF32
// residual lo: fp32 [24, K] each; part: fp32 [S, m, 32]; sqsum: fp32 [S, m] (all four
// contiguous, fn and lo 16-byte aligned). wgmma: the Hopper kernel (sm_90 only), else the
// mma.sync one. rows_per_cta: 128, or 256 with wgmma. Writes every row < m of every slice; the
// grid is (ceil(m / rows_per_cta), S).
void hc_mix_partials_tf32(TensorView x, TensorView fn, TensorView lo, TensorView part,
                          TensorView sqsum, bool wgmma, int64_t rows_per_cta) {
  const Params p = checked_params(x, fn, lo, part, sqsum);
  const int device = x.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const int splits = static_cast<int>(part.size(0));
  if (!(rows_per_cta == 128 || (wgmma && rows_per_cta == 256))) {
    TVM_FFI_THROW(ValueError) << "rows_per_cta: " << rows_per_cta
                              << " is not 128, or 256 with wgmma";
  }
  if (wgmma) check_wgmma(p, device);
  if (p.m == 0) return;  // nothing to write (and no tensor map has zero rows)
  if (!wgmma) {
    launch<SyncShape, hc_mix_partials_kernel<SyncShape>>(p, p.m, splits, device, "hc_mix_partials",
                                                         SyncShape::kSmemBytes);
  } else if (rows_per_cta == 128) {
    launch_wgmma<WgmmaShape128, false>(p, FinishParams{}, splits, device);
  } else {
    launch_wgmma<WgmmaShape256, false>(p, FinishParams{}, splits, device);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_partials_tf32, hc_mix_partials_tf32);

// The whole statistics in one launch on sm_90 (the wgmma kernel at 256 rows a CTA, fused): x,
// fn, lo as above; scale fp32 [3], base fp32 [24]; pre, post fp32 [m, 4], comb fp32 [m, 4, 4],
// mix fp32 [m, 24] (contiguous, 16-byte aligned). splits: S = 1..8 K slices, the CTAs of a
// cluster; rms_eps, eps, post_mult, iters (1..1000): V4's 1e-6, 1e-6, 2.0, 20. Each slice's
// partial is the partials entry's, bit for bit; the S CTAs of a row tile exchange them through
// distributed shared memory after a cluster barrier, each row's sums adding the slices in
// order, and CTA s finishes rows [s, s + 1) · ceil(256 / S) of the tile: no partials in global
// memory and no second launch.
void hc_mix_stats_fused(TensorView x, TensorView fn, TensorView lo, TensorView scale,
                        TensorView base, TensorView pre, TensorView post, TensorView comb,
                        TensorView mix, int64_t splits, double rms_eps, double eps,
                        double post_mult, int64_t iters) {
  const Params p = checked_inputs(x, fn, lo);
  const int device = x.device().device_id;
  const int64_t m = p.m;
  check_statistics_outputs(m, device, scale, base, pre, post, comb, mix);
  if (splits < 1 || splits > kMaxClusterSlices) {
    TVM_FFI_THROW(ValueError) << "splits: " << splits << " is not in 1.." << kMaxClusterSlices;
  }
  if (iters < 1 || iters > 1000) {
    TVM_FFI_THROW(ValueError) << "iters: " << iters << " is not in 1..1000";
  }
  tvm::ffi::CUDADeviceGuard guard(device);
  check_wgmma(p, device);
  if (m == 0) return;
  FinishParams f;
  f.scale = data_as<const float>(scale);
  f.base = data_as<const float>(base);
  f.pre = data_as<float>(pre);
  f.post = data_as<float>(post);
  f.comb = data_as<float>(comb);
  f.mix = data_as<float>(mix);
  f.iters = static_cast<int>(iters);
  f.k = static_cast<float>(p.k);
  f.rms_eps = static_cast<float>(rms_eps);
  f.eps = static_cast<float>(eps);
  f.post_mult = static_cast<float>(post_mult);
  launch_wgmma<WgmmaShape256, true>(p, f, static_cast<int>(splits), device);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_stats_fused, hc_mix_stats_fused);
