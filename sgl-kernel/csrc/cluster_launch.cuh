// Launching kernels with attributes (thread-block clusters, programmatic dependent launch,
// cooperative grids), shared by the kernels of this folder.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

// `kernel` over `grid` CTAs of `block` threads in clusters of `cluster` CTAs along x (1 is a
// valid cluster; 0: no cluster attribute, an ordinary grid: a large dependent launch in
// clusters of 1 is several times slower than one without the attribute), on `stream`; a failed
// launch throws a RuntimeError naming `what`. With `dependent`, a programmatic dependent launch
// (sm_90+): its CTAs may start while the previous kernel on `stream` finishes, so the kernel
// must call wait_for_previous_grid() before its first global memory access, read or write, and
// may call allow_next_grid() right after it. SGLang's own JIT kernels launch this way
// on Hopper; in a chain of launches (a CUDA graph included) it hides most of the gap between two
// kernels. launch_with_smem: the same with `smem` bytes of dynamic shared memory a CTA.
template <typename... Params, typename... Args>
void launch_with_smem(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                      size_t smem, unsigned cluster, bool dependent, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
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

template <typename... Params, typename... Args>
void launch_in_clusters(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        unsigned cluster, bool dependent, cudaStream_t stream, Args&&... args) {
  launch_with_smem(what, kernel, grid, block, 0, cluster, dependent, stream,
                   std::forward<Args>(args)...);
}

// `kernel` over `grid` CTAs of `block` threads with `smem` bytes of dynamic shared memory as a
// cooperative launch on `stream`: every CTA is resident at once, so the kernel may synchronise
// the whole grid (cooperative_groups::this_grid().sync()); CUDA refuses the launch, never hangs,
// when the grid does not fit. Capturable in CUDA graphs. A failed launch throws a RuntimeError
// naming `what`.
template <typename... Params, typename... Args>
void launch_cooperative(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << " launch failed: " << cudaGetErrorString(err);
  }
}

// In a kernel of a dependent launch: wait until the previous grid on the stream has completed
// and its memory is visible (PTX griddepcontrol.wait; a no-op in an ordinary launch and before
// sm_90, which has no dependent launches).
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the next dependent launch on the stream start once every CTA of this grid has called this
// or exited (PTX griddepcontrol.launch_dependents), so its launch overlaps this grid's work
// rather than following it. Its CTAs still wait in wait_for_previous_grid() until this grid has
// completed, so the call changes timing, never results. Called as a kernel starts, it pays only
// in a grid of one wave (one_wave below): in a grid of several waves it slows the grid down.
__device__ __forceinline__ void allow_next_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// How many CTAs of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory, in
// clusters of `cluster` CTAs along x, 0 or 1 for none) the current device holds at once, by the
// occupancy calculator (for clusters, the clusters the GPU places at once, fewer than SMs x CTAs
// an SM / cluster when they do not tile the GPCs); 0 if it cannot say. Asked once per kernel,
// shape and device (the answer depends on nothing else), then cached: launches ask every time.
template <typename... Params>
int64_t resident_ctas(void (*kernel)(Params...), int threads, size_t smem, unsigned cluster) {
  using Key = std::tuple<const void*, int, int, size_t, unsigned>;
  static std::map<Key, int64_t> known;
  static std::mutex guard;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const Key key{reinterpret_cast<const void*>(kernel), device, threads, smem, cluster};
  std::lock_guard<std::mutex> lock(guard);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int per_unit = 0, units = 0;  // clusters the GPU places at once and CTAs a cluster, or
  cudaError_t err;              // CTAs an SM and SMs
  if (cluster > 1) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(cluster);
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&units, kernel, &config);
    per_unit = static_cast<int>(cluster);
  } else {
    err = cudaDeviceGetAttribute(&units, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_unit, kernel, threads, smem);
    }
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next launch to report
    return 0;                  // not cached: asked again next time
  }
  return known[key] = int64_t{units} * per_unit;
}

// Whether every CTA of a `ctas`-CTA grid of `kernel` fits on the current device at once (one
// wave; resident_ctas). Host-side only (no stream work, so it is allowed during graph capture).
template <typename... Params>
bool one_wave(void (*kernel)(Params...), int64_t ctas, int threads, size_t smem = 0,
              unsigned cluster = 0) {
  return ctas <= resident_ctas(kernel, threads, smem, cluster);
}
