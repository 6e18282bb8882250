// RMSNorm and e4m3 per-token-group quantization of its bf16 output in one launch: the pair
// DeepSeek-V4.1's attention runs on SM90 between its q_norm and wq_b (FlashInfer's RMSNorm, as
// sgl_kernel and FlashInfer's JIT build it with -use_fast_math, then SGLang 0.5.23's
// per_token_group_quant_8bit_v2 with power-of-two scales), with their bits.
//
// One CTA a row, FlashInfer's launch for d <= 8192: 8 bf16 a thread (one 16-byte vector),
// 32 * ceil(d / 256) threads, those past d holding zeros.
//  - the norm (FlashInfer's RMSNormKernel, one round): the thread's Σx² as a chain of
//    fma.rn.ftz from 0 in column order, a butterfly over the warp (xor 16 .. 1, add.rn.ftz),
//    the warps' sums the same way in warp 0 (lanes past the warps adding 0);
//    rms = rsqrt.approx.ftz(fma.rn.ftz(Σ, rcp.approx.ftz(d), eps)): FlashInfer's
//    `Σ / d + eps` is div.approx.ftz then add.ftz in PTX, which ptxas lowers to MUFU.RCP and
//    fuses into one FFMA.FTZ (nvcc 13.0, sm_90a); written here as that FFMA, not left to ptxas;
//    y = bf16_rn(mul.ftz(mul.ftz(x, rms), add.ftz(0, w)))  (cvt.rn.bf16.f32: NaN -> 0x7FFF);
//  - the quantization of y (SGLang's kernel with scale_ue8m0, row-major fp32 scales), per group
//    of `group` columns (group / 8 lanes): amax = fmaxf over 1e-10 and |y| (NaN ignored), then
//    e = ceil(log2(amax * RN(1/448))) from the bits, the scale 2^e stored as fp32 from bits
//    (exponent field e + 127, as SGLang's fast_pow2), and
//    q = cvt.rn.satfinite.e4m3(fminf(fmaxf(y * 2^-e, -448), 448)) (a NaN y becomes -448).
// The products with a power of two and the clamps are exact whatever the flush mode, so the
// quantization reads as SGLang's does under its fast math.
//
// Launch: a programmatic dependent launch (as FlashInfer's and SGLang's kernels are on Hopper)
// on tvm-ffi's stream for the inputs' device; no allocation, no host sync (CUDA-graph
// capturable); rows of x, y and q any stride (unit last stride, aligned rows).

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kVec = 8;  // bf16 a thread: one 16-byte vector
constexpr int kMaxColumns = 1024 * kVec;
constexpr float kAmaxFloor = 1e-10f;
constexpr float kE4m3Max = 448.0f;
constexpr float kInvE4m3Max = 1.0f / 448.0f;  // RN(1/448), as SGLang's constant folds

struct Params {
  const uint16_t* x;  // [rows, d] bf16
  int64_t x_stride;
  const uint16_t* weight;  // [d] bf16
  uint16_t* y;             // [rows, d] bf16
  int64_t y_stride;
  uint8_t* q;  // [rows, d] e4m3
  int64_t q_stride;
  float* scales;  // [rows, d / group] fp32
  int64_t scale_stride;
  int d;
  float eps;
  bool one_wave;  // the grid is resident at once: let the next launch start early
};

__device__ __forceinline__ float warp_sum_ftz(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = add_ftz(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  }
  return v;
}

// SGLang's fast_log2_ceil and fast_pow2 (DeepEP's): the exponent from the bits.
__device__ __forceinline__ int log2_ceil_bits(float v) {
  const uint32_t bits = __float_as_uint(v);
  return static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0u);
}
__device__ __forceinline__ float pow2_bits(int e) {
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

template <int GROUP>
__global__ void __launch_bounds__(1024) rmsnorm_quant_fp8_kernel(const __grid_constant__ Params p) {
  __shared__ float partial[32];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  const int64_t row = blockIdx.x;
  const bool active = tid * kVec < p.d;
  uint4 xv = make_uint4(0u, 0u, 0u, 0u), wv = xv;
  wait_for_previous_grid();
  if (p.one_wave) allow_next_grid();
  if (active) {
    xv = *reinterpret_cast<const uint4*>(p.x + row * p.x_stride + tid * kVec);
    wv = __ldg(reinterpret_cast<const uint4*>(p.weight + tid * kVec));
  }
  float x[kVec], w[kVec];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t xw = reinterpret_cast<const uint32_t*>(&xv)[i];
    const uint32_t ww = reinterpret_cast<const uint32_t*>(&wv)[i];
    x[2 * i] = bf16_lo(xw);
    x[2 * i + 1] = bf16_hi(xw);
    w[2 * i] = bf16_lo(ww);
    w[2 * i + 1] = bf16_hi(ww);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) ss = fma_ftz(x[j], x[j], ss);
  ss = warp_sum_ftz(ss);
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    const float total = warp_sum_ftz(lane < warps ? partial[lane] : 0.0f);
    if (lane == 0) partial[0] = total;
  }
  __syncthreads();
  const float rms =
      rsqrt_approx(fma_ftz(partial[0], rcp_approx_ftz(static_cast<float>(p.d)), p.eps));
  float y[kVec];
  uint16_t yb[kVec];
  float amax = kAmaxFloor;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    yb[j] = bf16_rn(mul_ftz(mul_ftz(x[j], rms), add_ftz(0.0f, w[j])));
    y[j] = __uint_as_float(static_cast<uint32_t>(yb[j]) << 16);
    amax = fmaxf(amax, fabsf(y[j]));
  }
#pragma unroll
  for (int offset = 1; offset < GROUP / kVec; offset <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  }
  if (!active) return;
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) packed[i] = yb[2 * i] | static_cast<uint32_t>(yb[2 * i + 1]) << 16;
  *reinterpret_cast<uint4*>(p.y + row * p.y_stride + tid * kVec) =
      make_uint4(packed[0], packed[1], packed[2], packed[3]);
  const int e = log2_ceil_bits(amax * kInvE4m3Max);
  const float multiplier = pow2_bits(-e);
  if (tid % (GROUP / kVec) == 0) {
    p.scales[row * p.scale_stride + tid * kVec / GROUP] = pow2_bits(e);
  }
  uint32_t codes[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < kVec; j += 2) {
    const float lo = fminf(fmaxf(y[j] * multiplier, -kE4m3Max), kE4m3Max);
    const float hi = fminf(fmaxf(y[j + 1] * multiplier, -kE4m3Max), kE4m3Max);
    codes[j / 4] |= e4m3x2_rn(lo, hi) << (16 * ((j / 2) % 2));
  }
  *reinterpret_cast<uint2*>(p.q + row * p.q_stride + tid * kVec) = make_uint2(codes[0], codes[1]);
}

}  // namespace

// x bf16 [rows, d] (unit last stride, 16-byte aligned rows), weight bf16 [d] contiguous ->
// y bf16 [rows, d], q float8_e4m3fn [rows, d] (unit last stride, 16- and 8-byte aligned rows),
// scales fp32 [rows, d / group] (unit last stride). d a multiple of 8 and of group, at most
// 8192; group 32, 64 or 128; eps the norm's.
void rmsnorm_quant_fp8_cuda(TensorView x, TensorView weight, TensorView y, TensorView q,
                            TensorView scales, int64_t group, double eps) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t rows = x.size(0), d = x.size(1);
  const int device = x.device().device_id;
  if (group != 32 && group != 64 && group != 128) {
    TVM_FFI_THROW(ValueError) << "group = " << group << " must be 32, 64 or 128";
  }
  if (d < kVec || d > kMaxColumns || d % group != 0) {
    TVM_FFI_THROW(ValueError) << "x has " << d << " columns: a multiple of group = " << group
                              << " up to " << kMaxColumns << " is taken";
  }
  check_tensor(weight, "weight", {d}, {kBfloat16}, device, Layout::kContiguous, 16);
  check_tensor(y, "y", {rows, d}, {kBfloat16}, device, Layout::kRows, 16);
  check_tensor(q, "q", {rows, d}, {kByte}, device, Layout::kRows, 8);
  check_tensor(scales, "scales", {rows, d / group}, {kFloat32}, device, Layout::kRows);
  if (rows == 0) return;
  Params p{};
  p.x = data_as<const uint16_t>(x);
  p.x_stride = x.stride(0);
  p.weight = data_as<const uint16_t>(weight);
  p.y = data_as<uint16_t>(y);
  p.y_stride = y.stride(0);
  p.q = data_as<uint8_t>(q);
  p.q_stride = q.stride(0);
  p.scales = data_as<float>(scales);
  p.scale_stride = scales.stride(0);
  p.d = static_cast<int>(d);
  p.eps = static_cast<float>(eps);
  tvm::ffi::CUDADeviceGuard guard(device);
  const dim3 grid(static_cast<unsigned>(rows)), block(32 * ((d / kVec + 31) / 32));
  const auto kernel = group == 32   ? rmsnorm_quant_fp8_kernel<32>
                      : group == 64 ? rmsnorm_quant_fp8_kernel<64>
                                    : rmsnorm_quant_fp8_kernel<128>;
  p.one_wave = one_wave(kernel, rows, static_cast<int>(block.x));
  launch_in_clusters("rmsnorm_quant_fp8", kernel, grid, block, /*cluster=*/0, /*dependent=*/true,
                     env_stream(device), p);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_quant_fp8_cuda, rmsnorm_quant_fp8_cuda);
