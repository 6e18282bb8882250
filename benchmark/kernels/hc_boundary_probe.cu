// Floors of hc_boundary.cu's launch shape, for bench_hc_boundary.py --probe (never shipped):
// 128 CTAs of 640 threads, ordinary or cooperative, doing nothing, one grid barrier, or
// staging their fn slice (the kernel's first DRAM round) before the barrier. What each adds
// over the one before is what that step of the real kernel costs at least.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "tensor_view.cuh"

namespace {

namespace cg = cooperative_groups;
using tvm::ffi::TensorView;

constexpr int kCtas = 128, kThreads = 640, kSliceFloats = 24 * 160;

// step 0: nothing; 1: one grid barrier; 2: stage the fn slice, then the barrier; 3: as 2, then
// one L2 round (each CTA reads 128 x 25 floats another CTA wrote).
template <int STEP>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(const float* fn, float* scratch) {
  __shared__ float staged[kSliceFloats];
  if constexpr (STEP >= 2) {
    const float* slice = fn + static_cast<int64_t>(blockIdx.x) * kSliceFloats;
    for (int i = threadIdx.x; i < kSliceFloats / 4; i += kThreads) {
      reinterpret_cast<float4*>(staged)[i] = __ldg(reinterpret_cast<const float4*>(slice) + i);
    }
    __syncthreads();
    if (threadIdx.x < 25) scratch[blockIdx.x * 25 + threadIdx.x] = staged[threadIdx.x * 7];
  }
  if constexpr (STEP >= 1) cg::this_grid().sync();
  if constexpr (STEP >= 3) {
    float v = 0.0f;
    for (int i = threadIdx.x; i < kCtas * 25; i += kThreads) v += __ldcg(scratch + i);
    if (v == 12345.0f) scratch[0] = v;  // keeps the loads
  }
}

template <int STEP>
void launch(const float* fn, float* scratch, bool cooperative, cudaStream_t stream) {
  if (cooperative) {
    launch_cooperative("probe", probe_kernel<STEP>, dim3(kCtas), dim3(kThreads), 0, stream, fn,
                       scratch);
  } else {
    launch_in_clusters("probe", probe_kernel<STEP>, dim3(kCtas), dim3(kThreads), 0, false,
                       stream, fn, scratch);
  }
}

}  // namespace

// fn: fp32 of at least 128 * 24 * 160 floats; scratch: fp32 of at least 128 * 25. step 0-3
// (see the kernel); step 0 may run ordinary (cooperative false), steps 1-3 need cooperative.
void hc_boundary_probe(TensorView fn, TensorView scratch, int64_t step, bool cooperative) {
  const int device = fn.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const cudaStream_t stream = env_stream(device);
  const float* f = data_as<const float>(fn);
  float* s = data_as<float>(scratch);
  if (step > 0 && !cooperative) TVM_FFI_THROW(ValueError) << "steps 1-3 need cooperative";
  switch (step) {
    case 0:
      return launch<0>(f, s, cooperative, stream);
    case 1:
      return launch<1>(f, s, cooperative, stream);
    case 2:
      return launch<2>(f, s, cooperative, stream);
    default:
      return launch<3>(f, s, cooperative, stream);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_boundary_probe, hc_boundary_probe);
