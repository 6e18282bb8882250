// Host side of the mHC projection (hc_mix_stats.cu): argument checks, the kernels' launch, the
// wgmma kernel's tensor maps and the launch shapes this translation unit compiles. The shape
// a call takes is the caller's plan (hc_mix_stats_plan.py): nothing here chooses one.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (hc_mix_stats.cu).
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <atomic>
#include <cstdint>

#include "hc_mix_stats_common.cuh"
#include "hc_mix_stats_finish.cuh"
#include "hc_mix_stats_mma.cuh"
#include "hc_mix_stats_wgmma.cuh"
#include "tensor_view.cuh"

namespace {

// Checks x, fn and lo; returns the kernel parameters without outputs.
Params checked_inputs(const TensorView& x, const TensorView& fn, const TensorView& lo) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0);
  const int64_t k = x.size(1);
  if (k <= 0 || k % kBlockK != 0 || k > (int64_t{1} << 30)) {
    TVM_FFI_THROW(ValueError) << "x: K = " << k << " must be a positive multiple of " << kBlockK;
  }
  if (m > (int64_t{1} << 30)) TVM_FFI_THROW(ValueError) << "x: " << m << " rows is too many";
  const int device = x.device().device_id;
  check_tensor(fn, "fn", {kMixCols, k}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(lo, "lo", {kMixCols, k}, {kFloat32}, device, Layout::kContiguous, 16);
  Params p = {};
  p.x = data_as<const __nv_bfloat16>(x);
  p.fn = data_as<const float>(fn);
  p.lo = data_as<const float>(lo);
  p.x_stride = x.stride(0);
  p.m = static_cast<int>(m);
  p.k = static_cast<int>(k);
  return p;
}

// Checks every argument of the partials' entry and returns the kernel parameters (part.size(0)
// slices).
Params checked_params(const TensorView& x, const TensorView& fn, const TensorView& lo,
                      const TensorView& part, const TensorView& sqsum) {
  Params p = checked_inputs(x, fn, lo);
  const int device = x.device().device_id;
  check_tensor(part, "part", {kAnySize, p.m, kPartCols}, {kFloat32}, device, Layout::kContiguous,
               8);
  const int64_t splits = part.size(0);
  if (splits < 1 || splits > 65535) {
    TVM_FFI_THROW(ValueError) << "part: S = " << splits << " must be in 1..65535";
  }
  check_tensor(sqsum, "sqsum", {splits, p.m}, {kFloat32}, device, Layout::kContiguous);
  p.part = data_as<float>(part);
  p.sqsum = data_as<float>(sqsum);
  return p;
}

// Kernel on its parameters, grid (ceil(m / kRows), splits), on tvm-ffi's stream (m > 0); with
// `cluster`, each column of `splits` CTAs (a row tile's slices) is one cluster.
template <class S, auto Kernel, class P>
void launch(const P& params, int m, int splits, int device, const char* name, int smem_bytes,
            bool cluster = false) {
  // The opt-in above 48 KB of shared memory.
  set_attribute_at_least<Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(smem_bytes, device,
                                                                              name);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((m + S::kRows - 1) / S::kRows, splits, 1);
  config.blockDim = dim3(S::kThreads, 1, 1);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = env_stream(device);
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = static_cast<unsigned>(splits);
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, Kernel, params);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << name << " launch failed: " << cudaGetErrorString(err);
  }
}

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry,
                                                             12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry)
               : nullptr;
  }();
  if (encode == nullptr) TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled is not available";
  return encode;
}

// A row-major [rows, columns] tensor (rows row_bytes apart) read in [box_rows x box_columns]
// boxes in the 128-byte swizzle, rows past the end read as zeros.
CUtensorMap tile_map(const void* base, CUtensorMapDataType type, uint64_t columns, uint64_t rows,
                     uint64_t row_bytes, uint32_t box_columns, uint32_t box_rows,
                     const char* name) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {columns, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_columns, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult err = tensor_map_encoder()(
      &map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (err != CUDA_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << name << ": cuTensorMapEncodeTiled failed (" << err << ")";
  }
  return map;
}

// The wgmma kernel; FUSED: the statistics too (f), each row tile's `splits` CTAs one cluster.
template <class S, bool FUSED>
void launch_wgmma(const Params& p, const FinishParams& f, int splits, int device) {
  // setmaxnreg's hand-over assumes the registers a thread the build gave the kernel (the
  // __launch_bounds__ cap, all of which ptxas takes for such a kernel); with fewer, the
  // consumers' increase would never be granted. Asked until the runtime answers.
  static std::atomic<int> launch_regs{0};
  if (launch_regs.load() == 0) {
    cudaFuncAttributes attributes = {};
    const cudaError_t err =
        cudaFuncGetAttributes(&attributes, hc_mix_partials_wgmma_kernel<S, FUSED>);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not left for a later launch's check
      TVM_FFI_THROW(RuntimeError) << "hc_mix_partials_wgmma: " << cudaGetErrorString(err);
    }
    launch_regs.store(attributes.numRegs);
  }
  if (launch_regs.load() != S::kLaunchRegs) {
    TVM_FFI_THROW(RuntimeError) << "hc_mix_partials_wgmma: built with " << launch_regs.load()
                                << " registers a thread, its register hand-over assumes "
                                << S::kLaunchRegs;
  }
  const uint64_t w_row_bytes = static_cast<uint64_t>(p.k) * 4;
  TmaParams tp;
  // One row's stride is never read: a whole-row box stands in for it.
  tp.x = tile_map(p.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.k, p.m,
                  2 * static_cast<uint64_t>(p.m > 1 ? p.x_stride : p.k), kBlockK, S::kRows, "x");
  tp.fn = tile_map(p.fn, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.k, kMixCols, w_row_bytes, 32, kMixCols,
                   "fn");
  tp.lo = tile_map(p.lo, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.k, kMixCols, w_row_bytes, 32, kMixCols,
                   "lo");
  tp.p = p;
  tp.f = f;
  launch<S, hc_mix_partials_wgmma_kernel<S, FUSED>>(
      tp, p.m, splits, device, FUSED ? "hc_mix_stats_fused" : "hc_mix_partials_wgmma",
      FUSED ? S::kFusedSmemBytes : S::kSmemBytes, FUSED);
}

// The launch shapes: 128 rows a CTA and two CTAs an SM (mma.sync: 4 warps of 32 rows, the
// fastest of the H200 sweep; wgmma: two consumer warpgroups), or for wgmma 256 rows and one CTA
// an SM (four: w's copies per row halve). 4 stages each: on the H200 the wgmma pair is within a
// few percent of the best of 2-4 warpgroups and 3-6 stages at every row count swept.
using SyncShape = Shape<128, 32, 4>;
using WgmmaShape128 = WgmmaShape<2, 4>;
using WgmmaShape256 = WgmmaShape<4, 4>;
constexpr int kMaxClusterSlices = 8;  // the portable cluster size
static_assert(WgmmaShape256::kFusedSmemBytes + kSmemPerCta <= kSmemPerSm, "fused: one CTA an SM");

// The wgmma kernel's conditions: sm_90, and x's rows apart (a tensor map cannot overlap them).
void check_wgmma(const Params& p, int device) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) TVM_FFI_THROW(ValueError) << "wgmma: the kernel runs on sm_90 only";
  if (p.m > 1 && p.x_stride < p.k) {
    TVM_FFI_THROW(ValueError) << "x: rows overlap (row stride " << p.x_stride << " < K = " << p.k
                              << "); the wgmma kernel reads x through a tensor map";
  }
}

}  // namespace
