// The row argmax kernels of sgl-kernel/csrc at launch shapes other than the production ones
// (fp32, no accept): what row_argmax_variants.py times to choose them. Built only when the
// sweep runs, never prebuilt. The plan (cluster size, early start) comes from the same Python
// rule as the op's, through row_argmax_sweep_resident_ctas.

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "row_argmax_launch.cuh"

namespace {

// Calls visit with the tag of the sweep's kernel `shape` names; throws for any other.
template <typename Visit>
void with_sweep_shape(const LaunchShape& shape, Visit&& visit) {
  const bool c = shape.kernel == kClusterARow, r = shape.kernel == kCtaARow;
  const int t = shape.threads, v = shape.vectors;
  if (c && t == 128 && v == 16) return visit(ClusterARow<128, 16>{});
  if (c && t == 256 && v == 8) return visit(ClusterARow<256, 8>{});
  if (c && t == 256 && v == 16) return visit(ClusterARow<256, 16>{});
  if (c && t == 512 && v == 4) return visit(ClusterARow<512, 4>{});
  if (c && t == 512 && v == 8) return visit(ClusterARow<512, 8>{});
  if (c && t == 1024 && v == 2) return visit(ClusterARow<1024, 2>{});
  if (r && t == 128 && v == 8) return visit(CtaARow<128, 8>{});
  if (r && t == 256 && v == 4) return visit(CtaARow<256, 4>{});
  if (r && t == 256 && v == 8) return visit(CtaARow<256, 8>{});
  if (r && t == 512 && v == 2) return visit(CtaARow<512, 2>{});
  if (r && t == 512 && v == 4) return visit(CtaARow<512, 4>{});
  if (r && t == 512 && v == 8) return visit(CtaARow<512, 8>{});
  if (r && t == 1024 && v == 2) return visit(CtaARow<1024, 2>{});
  if (r && t == 1024 && v == 4) return visit(CtaARow<1024, 4>{});
  TVM_FFI_THROW(ValueError) << "the sweep has no kernel " << shape.kernel << " of " << t
                            << " threads x " << v << " vectors";
}

void check_float32(const TensorView& logits) {
  if (logits.dtype().code != kDLFloat || logits.dtype().bits != 32) {
    TVM_FFI_THROW(ValueError) << "the sweep takes float32 logits";
  }
}

}  // namespace

// row_argmax_cuda at a sweep shape.
void row_argmax_sweep(TensorView logits, TensorView out, int kernel, int threads, int vectors,
                      int cluster, bool early_start) {
  cudaStream_t stream = checked_stream(logits);
  check_float32(logits);
  tvm::ffi::CUDADeviceGuard guard(logits.device().device_id);
  int64_t* dst = checked_out(out, logits);
  const LaunchShape shape{kernel, threads, vectors, cluster, early_start};
  with_sweep_shape(shape, [&](auto tag) {
    launch<float, false>(tag, logits, dst, AcceptParams{}, shape, stream);
  });
}

// row_argmax_resident_ctas at a sweep shape.
int64_t row_argmax_sweep_resident_ctas(TensorView logits, int kernel, int threads, int vectors,
                                       int cluster) {
  check_float32(logits);
  const int device = logits.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const LaunchShape shape{kernel, threads, vectors, cluster, false};
  int64_t ctas = 0;
  with_sweep_shape(shape, [&](auto tag) { ctas = resident<float, false>(tag, shape, device); });
  return ctas;
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_sweep, row_argmax_sweep);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_sweep_resident_ctas, row_argmax_sweep_resident_ctas);
