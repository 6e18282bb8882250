// Host side shared by the modules of this folder: a tvm-ffi tensor view's data, dtype and
// device, the stream tvm-ffi reports for a device, and function attributes set once.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

// The address of t's first element (data pointer plus byte offset).
inline uintptr_t address(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) + t.byte_offset();
}
template <typename T>
T* data_as(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<T*>(address(t));
}

// A scalar (one-lane) dtype of this code and width, e.g. (kDLInt, 64).
inline bool is_dtype(const tvm::ffi::TensorView& t, uint8_t code, uint8_t bits) {
  return t.dtype().code == code && t.dtype().bits == bits && t.dtype().lanes == 1;
}

inline bool on_cuda_device(const tvm::ffi::TensorView& t, int device) {
  return t.device().device_type == kDLCUDA && t.device().device_id == device;
}

// The stream tvm-ffi reports for the device: torch's current one when called from torch.
inline cudaStream_t env_stream(int device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
}

// Sets Attribute of Kernel on the current device (`device`) to `value` unless an earlier call
// set it to at least that: attributes are per function and device, and setting one inside
// CUDA-graph capture is best avoided, so only the first call (or a larger value) pays.
// Throws a RuntimeError naming `what` if CUDA refuses.
template <auto Kernel, cudaFuncAttribute Attribute>
void set_attribute_at_least(int value, int device, const char* what) {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> set{};  // per device, the value set (0: none)
  static std::mutex setting;
  const bool known = device >= 0 && device < kDevices;
  if (known && set[device].load() >= value) return;
  std::lock_guard<std::mutex> lock(setting);
  if (known && set[device].load() >= value) return;
  const cudaError_t err = cudaFuncSetAttribute(Kernel, Attribute, value);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << ": setting function attribute " << Attribute << " to "
                                << value << " failed: " << cudaGetErrorString(err);
  }
  if (known) set[device].store(value);
}
