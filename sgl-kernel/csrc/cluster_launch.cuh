// Launching kernels with attributes (thread-block clusters, programmatic dependent launch),
// shared by the kernels of this folder.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/error.h>

#include <utility>

// `kernel` over `grid` CTAs of `block` threads in clusters of `cluster` CTAs along x (1 is a
// valid cluster; 0: no cluster attribute, an ordinary grid: on the H200 a dependent launch of
// 24576 CTAs of 128 threads took 4x longer as clusters of 1 than without the attribute), on
// `stream`; a failed launch throws a RuntimeError naming `what`. With `dependent`, a programmatic
// dependent launch (sm_90+): its CTAs may start while the previous kernel on `stream` finishes, so
// the kernel must call wait_for_previous_grid() before its first global memory access, read or
// write. SGLang's own JIT kernels launch this way on Hopper; in a chain of launches (a CUDA graph
// included) it hides most of the gap between two kernels.
template <typename... Params, typename... Args>
void launch_in_clusters(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        unsigned cluster, bool dependent, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned count = 0;
  if (cluster != 0) {
    attr[count].id = cudaLaunchAttributeClusterDimension;
    attr[count].val.clusterDim.x = cluster;
    attr[count].val.clusterDim.y = 1;
    attr[count].val.clusterDim.z = 1;
    ++count;
  }
  if (dependent) {
    attr[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attr;
  config.numAttrs = count;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << " launch failed: " << cudaGetErrorString(err);
  }
}

// In a kernel of a dependent launch: wait until the previous grid on the stream has completed
// and its memory is visible (PTX griddepcontrol.wait; a no-op in an ordinary launch). The next
// dependent launch may start once every CTA of this one has exited.
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
