// FlashInfer's RMSNorm as sgl_kernel.rmsnorm runs it on Hopper (FlashInfer's
// RMSNorm<bf16> from its own flashinfer/norm.cuh, built with -use_fast_math as
// sgl_kernel's SM90 build and FlashInfer's JIT are): the reference of
// rmsnorm_quant_fp8's y, and the norm of SGLang's arm in
// bench_rmsnorm_quant_fp8.py. Benchmark and test only, never shipped; the
// headers come from an installed FlashInfer, staged by
// tools/flashinfer_norm/stage.py.

#include <cuda_bf16.h>
#include <flashinfer/norm.cuh>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include "tensor_view.cuh"

using tvm::ffi::TensorView;

// x bf16 [rows, d] (unit last stride), weight bf16 [d] -> y bf16 [rows, d]
// (unit last stride).
void flashinfer_rmsnorm(TensorView x, TensorView weight, TensorView y,
                        double eps) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice,
               Layout::kRows, 16);
  const int64_t rows = x.size(0), d = x.size(1);
  const int device = x.device().device_id;
  check_tensor(weight, "weight", {d}, {kBfloat16}, device, Layout::kContiguous,
               16);
  check_tensor(y, "y", {rows, d}, {kBfloat16}, device, Layout::kRows, 16);
  tvm::ffi::CUDADeviceGuard guard(device);
  const cudaError_t err = flashinfer::norm::RMSNorm<__nv_bfloat16>(
      data_as<__nv_bfloat16>(x), data_as<__nv_bfloat16>(weight),
      data_as<__nv_bfloat16>(y), static_cast<uint32_t>(rows),
      static_cast<uint32_t>(d), static_cast<uint32_t>(x.stride(0)),
      static_cast<uint32_t>(y.stride(0)), static_cast<float>(eps),
      /*enable_pdl=*/false, env_stream(device));
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError)
        << "FlashInfer RMSNorm failed: " << cudaGetErrorString(err);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(flashinfer_rmsnorm, flashinfer_rmsnorm);
