// Host side of the row argmax kernels (row_argmax_kernels.cuh): a launch shape as the caller's
// plan gives it (python/dsv41_kernels/ops/speculative/argmax_plan.py), checked to be one this
// translation unit compiled, and launched; and the occupancy the plan is chosen from. Nothing
// here chooses a kernel or a shape.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (row_argmax.cu, or the benchmark's sweep module).
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdint>

#include "cluster_launch.cuh"
#include "row_argmax_kernels.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

// The kernels a plan names (argmax_plan.py's CUDA_KERNEL_IDS).
constexpr int kClusterARow = 0;  // row_argmax_cluster_kernel
constexpr int kCtaARow = 1;      // row_argmax_rows_kernel

// A launch shape, field by field the plan's CudaLaunch.
struct LaunchShape {
  int kernel;        // kClusterARow or kCtaARow
  int threads;       // threads a CTA
  int vectors;       // 16-byte vectors a thread: the cluster kernel's ITEMS, the other's UNROLL
  int cluster;       // CTAs a row's cluster; 0 for one CTA a row
  bool early_start;  // the next dependent launch may start as this grid starts
};

// The kernel instances, as types to dispatch on.
template <int THREADS, int ITEMS>
struct ClusterARow {};
template <int THREADS, int UNROLL>
struct CtaARow {};

// Clusters of 9..16 CTAs are not portable: opted into per kernel and device.
template <auto Kernel>
void allow_cluster(unsigned cluster, int device) {
  if (cluster > 8) {
    set_attribute_at_least<Kernel, cudaFuncAttributeNonPortableClusterSizeAllowed>(1, device,
                                                                                   "row_argmax");
  }
}

template <typename T, bool ACCEPT, int THREADS, int ITEMS>
void launch(ClusterARow<THREADS, ITEMS>, const TensorView& logits, int64_t* out,
            const AcceptParams& a, const LaunchShape& shape, cudaStream_t stream) {
  constexpr int kChunk = THREADS * kVecOf<T> * ITEMS;
  const int rows = static_cast<int>(logits.size(0));
  const int vocab = static_cast<int>(logits.size(1));
  // The fewest CTAs that cover the row, and at least 2: st.async is defined only in clusters of
  // more than one CTA. A CTA past the row's end reports (-Inf, vocab - 1), which never wins.
  if (shape.cluster != std::max(2, (vocab + kChunk - 1) / kChunk) || shape.cluster > kMaxCluster) {
    TVM_FFI_THROW(ValueError) << "row_argmax: a cluster of " << shape.cluster << " CTAs for "
                              << vocab << " columns in chunks of " << kChunk;
  }
  const unsigned cluster = static_cast<unsigned>(shape.cluster);
  constexpr auto kernel = row_argmax_cluster_kernel<T, THREADS, ITEMS, ACCEPT>;
  allow_cluster<kernel>(cluster, logits.device().device_id);
  launch_in_clusters("row_argmax", kernel, dim3(cluster, rows), dim3(THREADS), cluster,
                     /*dependent=*/true, stream, data_as<const T>(logits), logits.stride(0), vocab,
                     out, a, shape.early_start);
}

template <typename T, bool ACCEPT, int THREADS, int UNROLL>
void launch(CtaARow<THREADS, UNROLL>, const TensorView& logits, int64_t* out, const AcceptParams& a,
            const LaunchShape& shape, cudaStream_t stream) {
  if (shape.cluster != 0) {
    TVM_FFI_THROW(ValueError) << "row_argmax: one CTA a row takes no cluster, got "
                              << shape.cluster;
  }
  constexpr auto kernel = row_argmax_rows_kernel<T, THREADS, UNROLL, ACCEPT>;
  launch_in_clusters("row_argmax", kernel, dim3(static_cast<unsigned>(logits.size(0))),
                     dim3(THREADS), /*cluster=*/0, /*dependent=*/true, stream,
                     data_as<const T>(logits), logits.stride(0), static_cast<int>(logits.size(1)),
                     out, a, shape.early_start);
}

// CTAs of the kernel the current device holds at once (resident_ctas), in its clusters.
template <typename T, bool ACCEPT, int THREADS, int ITEMS>
int64_t resident(ClusterARow<THREADS, ITEMS>, const LaunchShape& shape, int device) {
  constexpr auto kernel = row_argmax_cluster_kernel<T, THREADS, ITEMS, ACCEPT>;
  const unsigned cluster = static_cast<unsigned>(shape.cluster);
  allow_cluster<kernel>(cluster, device);  // the occupancy of a larger cluster needs it too
  return resident_ctas(kernel, THREADS, 0, cluster);
}

template <typename T, bool ACCEPT, int THREADS, int UNROLL>
int64_t resident(CtaARow<THREADS, UNROLL>, const LaunchShape&, int) {
  return resident_ctas(row_argmax_rows_kernel<T, THREADS, UNROLL, ACCEPT>, THREADS, 0, 0);
}

// Calls visit with the tag of the production kernel `shape` names; throws for any other.
template <typename Visit>
void with_compiled_shape(const LaunchShape& shape, Visit&& visit) {
  const bool rows = shape.kernel == kCtaARow && shape.threads == kRowThreads;
  const bool clusters = shape.kernel == kClusterARow && shape.threads == kThreads;
  if (rows && shape.vectors == kRowDeepUnroll) return visit(CtaARow<kRowThreads, kRowDeepUnroll>{});
  if (rows && shape.vectors == kRowUnroll) return visit(CtaARow<kRowThreads, kRowUnroll>{});
  if (clusters && shape.vectors == 2) return visit(ClusterARow<kThreads, 2>{});
  if (clusters && shape.vectors == 4) return visit(ClusterARow<kThreads, 4>{});
  if (clusters && shape.vectors == 8) return visit(ClusterARow<kThreads, 8>{});
  if (clusters && shape.vectors == 16) return visit(ClusterARow<kThreads, 16>{});
  TVM_FFI_THROW(ValueError) << "row_argmax: no kernel " << shape.kernel << " of " << shape.threads
                            << " threads x " << shape.vectors << " vectors";
}

// Calls visit with a value of the logits' element type (float, __nv_bfloat16 or __half).
template <typename Visit>
void with_element_type(const TensorView& logits, Visit&& visit) {
  const DLDataType dt = logits.dtype();
  if (dt.code == kDLFloat && dt.bits == 32) return visit(float{});
  if (dt.code == kDLBfloat && dt.bits == 16) return visit(__nv_bfloat16{});
  if (dt.code == kDLFloat && dt.bits == 16) return visit(__half{});
  TVM_FFI_THROW(ValueError) << "logits must be float32, bfloat16 or float16";
}

// The checks every entry point makes of the logits; their device's current stream.
cudaStream_t checked_stream(const TensorView& logits) {
  check_tensor(logits, "logits", {kAnySize, kAnySize}, {kFloat32, kBfloat16, kFloat16}, kAnyDevice,
               Layout::kRows, 16);
  if (logits.size(0) < 1 || logits.size(0) > 65535 || logits.size(1) < 1) {
    TVM_FFI_THROW(ValueError) << "logits must have 1..65535 non-empty rows";
  }
  return env_stream(logits.device().device_id);
}

int64_t* checked_out(const TensorView& out, const TensorView& logits) {
  check_tensor(out, "out", {logits.size(0)}, {kInt64}, logits.device().device_id,
               Layout::kContiguous);
  return data_as<int64_t>(out);
}

}  // namespace
