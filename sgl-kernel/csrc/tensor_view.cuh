// Host side shared by the modules of this folder: a tvm-ffi tensor view's data, dtype and
// device, one declarative check of a tensor argument, the stream tvm-ffi reports for a device,
// and function attributes set once.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <sstream>

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

// A scalar dtype a check accepts; kAnyCode: any type of that width (e4m3 data seen as bytes).
struct DType {
  uint8_t code;
  uint8_t bits;
  const char* name;
};
constexpr uint8_t kAnyCode = 255;
constexpr DType kInt32{kDLInt, 32, "int32"}, kInt64{kDLInt, 64, "int64"};
constexpr DType kFloat32{kDLFloat, 32, "float32"}, kFloat16{kDLFloat, 16, "float16"};
constexpr DType kBfloat16{kDLBfloat, 16, "bfloat16"}, kByte{kAnyCode, 8, "1-byte"};

constexpr int64_t kAnySize = -1;  // a shape entry that takes any size
constexpr int kAnyDevice = -1;    // any CUDA device (the first tensor's, which sets it)

// How the elements must lie: kRows, unit stride along the last axis (rows may be strided);
// kContiguous, dense row-major (axes of size 1 may have any stride, as torch's rule).
enum class Layout { kAny, kRows, kContiguous };

inline bool is_row_major(const tvm::ffi::TensorView& t) {
  int64_t expected = 1;
  for (int axis = t.ndim() - 1; axis >= 0; --axis) {
    if (t.size(axis) != 1 && t.stride(axis) != expected) return false;
    expected *= t.size(axis);
  }
  return true;
}

// Throws a ValueError naming `name` unless `t` has this shape (ndim included), one of these
// dtypes, lies on CUDA `device`, has this layout, and its first element and (for a layout
// with rows) each row start at a multiple of `align` bytes. One statement per argument.
inline void check_tensor(const tvm::ffi::TensorView& t, const char* name,
                         std::initializer_list<int64_t> shape, std::initializer_list<DType> dtypes,
                         int device, Layout layout = Layout::kAny, int align = 1) {
  bool ok = t.ndim() == static_cast<int>(shape.size()) && t.device().device_type == kDLCUDA &&
            (device == kAnyDevice || t.device().device_id == device);
  for (int axis = 0; ok && axis < t.ndim(); ++axis) {
    const int64_t size = shape.begin()[axis];
    ok = size == kAnySize || t.size(axis) == size;
  }
  bool dtype_ok = false;
  for (const DType& d : dtypes) {
    dtype_ok = dtype_ok || ((d.code == kAnyCode || t.dtype().code == d.code) &&
                            t.dtype().bits == d.bits && t.dtype().lanes == 1);
  }
  ok = ok && dtype_ok;
  const int last = t.ndim() - 1;
  if (ok && layout == Layout::kRows) ok = t.size(last) <= 1 || t.stride(last) == 1;
  if (ok && layout == Layout::kContiguous) ok = is_row_major(t);
  const int64_t row_bytes =
      layout != Layout::kAny && last > 0 ? t.stride(0) * t.dtype().bits / 8 : 0;
  if (ok) ok = address(t) % align == 0 && row_bytes % align == 0;
  if (ok) return;
  std::ostringstream want;
  want << name << " must be";
  for (const DType& d : dtypes) want << (&d == dtypes.begin() ? " " : "/") << d.name;
  want << " [";
  for (const int64_t* size = shape.begin(); size != shape.end(); ++size) {
    if (size != shape.begin()) want << ", ";
    *size == kAnySize ? want << "*" : want << *size;
  }
  want << "] on " << (device == kAnyDevice ? "a CUDA device" : "the CUDA device of the inputs");
  if (layout == Layout::kRows) want << ", last-dim stride 1";
  if (layout == Layout::kContiguous) want << ", contiguous";
  if (align > 1) want << ", " << align << "-byte aligned";
  TVM_FFI_THROW(ValueError) << want.str();
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
