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

// The accept's arguments checked, into AcceptParams (without its outputs): candidates int32/int64
// [bs, n] (last-dim stride 1, n <= 16, bs * n == rows); cutoff int32/int64 [bs], or null or an
// empty tensor for none; slots int64 [>= 16 * bs] and tickets int64 [>= bs], the workspace: made as
// all -1 and all 0, then only ever changed by this kernel.
AcceptParams accept_params(const TensorView& candidates, const TensorView& logits,
                           const TensorView* cutoff, const TensorView& slots,
                           const TensorView& tickets, int device) {
  check_tensor(candidates, "candidates", {kAnySize, kAnySize}, {kInt32, kInt64}, device,
               Layout::kRows);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  if (n < 1 || n > kMaxDraft || bs * n != logits.size(0)) {
    TVM_FFI_THROW(ValueError) << "candidates must be [bs, n] with 1 <= n <= " << kMaxDraft
                              << " and bs * n == logits rows";
  }
  const bool has_cutoff = cutoff != nullptr && cutoff->numel() > 0;
  const Layout contiguous = Layout::kContiguous;
  if (has_cutoff) check_tensor(*cutoff, "cutoff", {bs}, {kInt32, kInt64}, device, contiguous);
  check_tensor(slots, "slots", {kAnySize}, {kInt64}, device, contiguous, 16);
  check_tensor(tickets, "tickets", {kAnySize}, {kInt64}, device, contiguous);
  if (slots.size(0) < bs * kMaxDraft || tickets.size(0) < bs) {
    TVM_FFI_THROW(ValueError) << "slots and tickets must be workspaces of >= 16 * bs, bs";
  }
  AcceptParams a{};
  a.candidates = data_as<const void>(candidates);
  a.candidate_stride = candidates.stride(0);
  a.candidates_64 = is_dtype(candidates, kDLInt, 64);
  a.cutoff = has_cutoff ? data_as<const void>(*cutoff) : nullptr;
  a.cutoff_64 = has_cutoff && is_dtype(*cutoff, kDLInt, 64);
  a.n = static_cast<int>(n);
  a.slots = data_as<unsigned long long>(slots);
  a.tickets = data_as<unsigned long long>(tickets);
  return a;
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

// The greedy accept in one launch: accept_params' arguments, and the outputs correct int32
// [bs], bonus int64 [bs], trim int32 [bs]. The launch shape as for row_argmax_cuda.
void accept_greedy_cuda(TensorView candidates, TensorView logits, TensorView cutoff,
                        TensorView correct, TensorView bonus, TensorView trim, TensorView slots,
                        TensorView tickets, int kernel, int threads, int vectors, int cluster,
                        bool early_start) {
  cudaStream_t stream = checked_stream(logits);
  const int device = logits.device().device_id;
  AcceptParams a = accept_params(candidates, logits, &cutoff, slots, tickets, device);
  const int64_t bs = candidates.size(0);
  const Layout contiguous = Layout::kContiguous;
  check_tensor(correct, "correct", {bs}, {kInt32}, device, contiguous);
  check_tensor(bonus, "bonus", {bs}, {kInt64}, device, contiguous);
  check_tensor(trim, "trim", {bs}, {kInt32}, device, contiguous);
  a.correct = data_as<int32_t>(correct);
  a.bonus = data_as<int64_t>(bonus);
  a.trim = data_as<int32_t>(trim);
  tvm::ffi::CUDADeviceGuard guard(device);  // the launch and the attribute
  const LaunchShape shape{kernel, threads, vectors, cluster, early_start};
  launch_plan<true>(logits, nullptr, a, shape, stream);
}

// DSpark's static verify epilogue in one launch: the accept (accept_params' arguments, no
// cutoff) and its tail (AcceptTail). seq_lens int32/int64 [bs]; verify_lens int32/int64 [bs]
// and gate int32 [1], or empty tensors with an empty gated; outputs correct int64 [bs], bonus
// int64 [bs], trim int32 [bs], commit int32 [bs], new_seq [bs] of seq_lens' type, tokens int64
// [bs, n] (last-dim stride 1), gated int32 [bs] or empty. The launch shape as for
// row_argmax_cuda.
void accept_greedy_epilogue_cuda(TensorView candidates, TensorView logits, TensorView seq_lens,
                                 TensorView verify_lens, TensorView gate, TensorView correct,
                                 TensorView bonus, TensorView trim, TensorView commit,
                                 TensorView new_seq, TensorView tokens, TensorView gated,
                                 TensorView slots, TensorView tickets, int kernel, int threads,
                                 int vectors, int cluster, bool early_start) {
  cudaStream_t stream = checked_stream(logits);
  const int device = logits.device().device_id;
  AcceptParams a = accept_params(candidates, logits, nullptr, slots, tickets, device);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  const Layout contiguous = Layout::kContiguous;
  check_tensor(seq_lens, "seq_lens", {bs}, {kInt32, kInt64}, device, contiguous);
  const bool has_gated = gated.numel() > 0;
  if (has_gated) {
    check_tensor(verify_lens, "verify_lens", {bs}, {kInt32, kInt64}, device, contiguous);
    check_tensor(gate, "gate", {1}, {kInt32}, device, contiguous);
    check_tensor(gated, "gated", {bs}, {kInt32}, device, contiguous);
  }
  const bool seq_64 = is_dtype(seq_lens, kDLInt, 64);
  check_tensor(correct, "correct", {bs}, {kInt64}, device, contiguous);
  check_tensor(bonus, "bonus", {bs}, {kInt64}, device, contiguous);
  check_tensor(trim, "trim", {bs}, {kInt32}, device, contiguous);
  check_tensor(commit, "commit", {bs}, {kInt32}, device, contiguous);
  check_tensor(new_seq, "new_seq", {bs}, {seq_64 ? kInt64 : kInt32}, device, contiguous);
  check_tensor(tokens, "tokens", {bs, n}, {kInt64}, device, Layout::kRows);
  a.correct_64 = data_as<int64_t>(correct);
  a.bonus = data_as<int64_t>(bonus);
  a.trim = data_as<int32_t>(trim);
  AcceptTail& t = a.tail;
  t.seq_lens = data_as<const void>(seq_lens);
  t.seq_64 = seq_64;
  t.verify_lens = has_gated ? data_as<const void>(verify_lens) : nullptr;
  t.verify_64 = has_gated && is_dtype(verify_lens, kDLInt, 64);
  t.gate = has_gated ? data_as<const int32_t>(gate) : nullptr;
  t.commit = data_as<int32_t>(commit);
  t.new_seq = data_as<void>(new_seq);
  t.tokens = data_as<int64_t>(tokens);
  t.tokens_stride = tokens.stride(0);
  t.gated = has_gated ? data_as<int32_t>(gated) : nullptr;
  tvm::ffi::CUDADeviceGuard guard(device);  // the launch and the attribute
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
TVM_FFI_DLL_EXPORT_TYPED_FUNC(accept_greedy_epilogue_cuda, accept_greedy_epilogue_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_resident_ctas, row_argmax_resident_ctas);
