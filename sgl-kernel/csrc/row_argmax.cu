// Row argmax, and DSpark's greedy accept, on Hopper and Blackwell: the exports of the kernels in
// row_argmax_kernels.cuh. Each launch runs the kernel and shape its caller's plan names
// (python/dsv41_kernels/ops/speculative/argmax_plan.py), which row_argmax_resident_ctas
// serves; the arguments are checked here too, so a wrong call throws.

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "row_argmax_launch.cuh"

namespace {

template <bool ACCEPT>
void launch_plan(const TensorView& logits, int64_t* out, const AcceptParams& a,
                 const LaunchShape& shape, cudaStream_t stream) {
  with_element_type(logits, [&](auto element) {
    using T = decltype(element);
    with_compiled_shape(
        shape, [&](auto kernel) { launch<T, ACCEPT>(kernel, logits, out, a, shape, stream); });
  });
}

}  // namespace

// logits: [rows, vocab] fp32/bf16/fp16 CUDA, last-dim stride 1, 16-byte aligned rows;
// out: int64 [rows] contiguous on the same device. kernel, threads, vectors, cluster and
// early_start: the plan's launch shape (LaunchShape).
void row_argmax_cuda(TensorView logits, TensorView out, int kernel, int threads, int vectors,
                     int cluster, bool early_start) {
  cudaStream_t stream = checked_stream(logits);
  tvm::ffi::CUDADeviceGuard guard(logits.device().device_id);  // the launch and the attribute
  const LaunchShape shape{kernel, threads, vectors, cluster, early_start};
  launch_plan<false>(logits, checked_out(out, logits), AcceptParams{}, shape, stream);
}

// The greedy accept in one launch. candidates: int32/int64 [bs, n] (last-dim stride 1, n <= 16,
// bs * n == rows); cutoff: int32/int64 [bs] or an empty tensor for none; correct int32 [bs],
// bonus int64 [bs], trim int32 [bs]; slots int64 [>= 16 * bs] and tickets int64 [>= bs] are the
// workspace: made as all -1 and all 0, then only ever changed by this kernel. The launch shape
// as for row_argmax_cuda.
void accept_greedy_cuda(TensorView candidates, TensorView logits, TensorView cutoff,
                        TensorView correct, TensorView bonus, TensorView trim, TensorView slots,
                        TensorView tickets, int kernel, int threads, int vectors, int cluster,
                        bool early_start) {
  cudaStream_t stream = checked_stream(logits);
  const int device = logits.device().device_id;
  check_tensor(candidates, "candidates", {kAnySize, kAnySize}, {kInt32, kInt64}, device,
               Layout::kRows);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  if (n < 1 || n > kMaxDraft || bs * n != logits.size(0)) {
    TVM_FFI_THROW(ValueError) << "candidates must be [bs, n] with 1 <= n <= " << kMaxDraft
                              << " and bs * n == logits rows";
  }
  const bool has_cutoff = cutoff.numel() > 0;
  const Layout contiguous = Layout::kContiguous;
  if (has_cutoff) check_tensor(cutoff, "cutoff", {bs}, {kInt32, kInt64}, device, contiguous);
  check_tensor(correct, "correct", {bs}, {kInt32}, device, contiguous);
  check_tensor(bonus, "bonus", {bs}, {kInt64}, device, contiguous);
  check_tensor(trim, "trim", {bs}, {kInt32}, device, contiguous);
  check_tensor(slots, "slots", {kAnySize}, {kInt64}, device, contiguous, 16);
  check_tensor(tickets, "tickets", {kAnySize}, {kInt64}, device, contiguous);
  if (slots.size(0) < bs * kMaxDraft || tickets.size(0) < bs) {
    TVM_FFI_THROW(ValueError) << "slots and tickets must be workspaces of >= 16 * bs, bs";
  }
  tvm::ffi::CUDADeviceGuard guard(device);  // the launch and the attribute
  AcceptParams a{};
  a.candidates = data_as<const void>(candidates);
  a.candidate_stride = candidates.stride(0);
  a.candidates_64 = is_dtype(candidates, kDLInt, 64);
  a.cutoff = has_cutoff ? data_as<const void>(cutoff) : nullptr;
  a.cutoff_64 = has_cutoff && is_dtype(cutoff, kDLInt, 64);
  a.n = static_cast<int>(n);
  a.slots = data_as<unsigned long long>(slots);
  a.tickets = data_as<unsigned long long>(tickets);
  a.correct = data_as<int32_t>(correct);
  a.bonus = data_as<int64_t>(bonus);
  a.trim = data_as<int32_t>(trim);
  const LaunchShape shape{kernel, threads, vectors, cluster, early_start};
  launch_plan<true>(logits, nullptr, a, shape, stream);
}

// How many CTAs of the kernel a launch shape names (with `accept`, the accept's instance) for
// logits of this dtype the logits' device holds at once, by the occupancy calculator
// (resident_ctas; 0 if it cannot say): what the plan is chosen from. Only metadata of logits
// is read.
int64_t row_argmax_resident_ctas(TensorView logits, bool accept, int kernel, int threads,
                                 int vectors, int cluster) {
  const int device = logits.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);  // resident_ctas asks the current device
  const LaunchShape shape{kernel, threads, vectors, cluster, false};
  int64_t ctas = 0;
  with_element_type(logits, [&](auto element) {
    using T = decltype(element);
    with_compiled_shape(shape, [&](auto tag) {
      ctas =
          accept ? resident<T, true>(tag, shape, device) : resident<T, false>(tag, shape, device);
    });
  });
  return ctas;
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_cuda, row_argmax_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(accept_greedy_cuda, accept_greedy_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_resident_ctas, row_argmax_resident_ctas);
