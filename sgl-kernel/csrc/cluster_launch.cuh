// Launching a kernel in thread-block clusters, shared by the cluster kernels of this folder.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/error.h>

#include <utility>

// `kernel` over `grid` CTAs of `block` threads in clusters of `cluster` CTAs along x (1 is a
// valid cluster: the attribute is always set), on `stream`; a failed launch throws a
// RuntimeError naming `what`.
template <typename... Params, typename... Args>
void launch_in_clusters(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        unsigned cluster, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << " launch failed: " << cudaGetErrorString(err);
  }
}
