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
//    of `group` columns (group / 8 lanes): group_quant_ue8m0.cuh.
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
#include "group_quant_ue8m0.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kVec = 8;  // bf16 a thread: one 16-byte vector
constexpr int kMaxColumns = 1024 * kVec;

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
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    yb[j] = bf16_rn(mul_ftz(mul_ftz(x[j], rms), add_ftz(0.0f, w[j])));
    y[j] = __uint_as_float(static_cast<uint32_t>(yb[j]) << 16);
  }
  const float amax = group_amax<GROUP>(y);
  if (!active) return;
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) packed[i] = yb[2 * i] | static_cast<uint32_t>(yb[2 * i + 1]) << 16;
  *reinterpret_cast<uint4*>(p.y + row * p.y_stride + tid * kVec) =
      make_uint4(packed[0], packed[1], packed[2], packed[3]);
  float scale;
  const uint2 codes = e4m3_codes_ue8m0(y, amax, scale);
  if (tid % (GROUP / kVec) == 0) p.scales[row * p.scale_stride + tid * kVec / GROUP] = scale;
  *reinterpret_cast<uint2*>(p.q + row * p.q_stride + tid * kVec) = codes;
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
