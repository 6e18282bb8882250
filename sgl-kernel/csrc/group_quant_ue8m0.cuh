// SGLang 0.5.23's per-token-group e4m3 quantization with power-of-two scales
// (per_token_group_quant_8bit_v2 with scale_ue8m0, row-major fp32 scales), for kernels whose
// threads hold 8 consecutive bf16 values of a row and GROUP / 8 adjacent lanes a group:
//   amax = fmaxf over 1e-10 and |y| (NaN ignored), then e = ceil(log2(amax * RN(1/448))) from
//   the bits, the scale 2^e stored as fp32 from bits (exponent field e + 127, as SGLang's
//   fast_pow2: e = 128 stores +Inf, its multiplier 2^-128 the bits of -Inf), and
//   q = cvt.rn.satfinite.e4m3(fminf(fmaxf(y * 2^-e, -448), 448)) (a NaN y becomes -448).
// The products with a power of two and the clamps are exact whatever the flush mode (a product
// that would be subnormal is an e4m3 zero of its sign either way), so these are the bits of
// SGLang's kernel under its fast math.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

#include "float_bits.cuh"
#include "tensor_view.cuh"

constexpr float kAmaxFloor = 1e-10f;
constexpr float kE4m3Max = 448.0f;
constexpr float kInvE4m3Max = 1.0f / 448.0f;  // RN(1/448), as SGLang's constant folds

// SGLang's fast_log2_ceil and fast_pow2 (DeepEP's): the exponent from the bits.
__device__ __forceinline__ int log2_ceil_bits(float v) {
  const uint32_t bits = __float_as_uint(v);
  return static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0u);
}
__device__ __forceinline__ float pow2_bits(int e) {
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// The amax of the lane's group: its 8 values, then a butterfly over the group's GROUP / 8
// lanes. Every lane of the warp takes part (lanes past the row hold zeros, under the floor).
template <int GROUP>
__device__ __forceinline__ float group_amax(const float (&y)[8]) {
  float amax = kAmaxFloor;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(y[j]));
#pragma unroll
  for (int offset = 1; offset < GROUP / 8; offset <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  }
  return amax;
}

// The lane's 8 e4m3 codes (in column order, the first in the lowest byte) under its group's
// amax, and the group's scale 2^e in `scale`.
__device__ __forceinline__ uint2 e4m3_codes_ue8m0(const float (&y)[8], float amax, float& scale) {
  const int e = log2_ceil_bits(amax * kInvE4m3Max);
  const float multiplier = pow2_bits(-e);
  scale = pow2_bits(e);
  uint32_t codes[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const float lo = fminf(fmaxf(y[j] * multiplier, -kE4m3Max), kE4m3Max);
    const float hi = fminf(fmaxf(y[j + 1] * multiplier, -kE4m3Max), kE4m3Max);
    codes[j / 4] |= e4m3x2_rn(lo, hi) << (16 * ((j / 2) % 2));
  }
  return make_uint2(codes[0], codes[1]);
}

// The same of the lane's 8 stored bf16 values of a row, as four bf16x2 words (low half first).
template <int GROUP>
__device__ __forceinline__ uint2 e4m3_codes_of_words(const uint32_t (&words)[4], float& scale) {
  float y[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    y[2 * i] = bf16_lo(words[i]);
    y[2 * i + 1] = bf16_hi(words[i]);
  }
  return e4m3_codes_ue8m0(y, group_amax<GROUP>(y), scale);
}

// Host: whether the caller passed the groups of `rows` rows of width h, checked (ValueError
// naming the one that is off): q [rows, h] (1-byte, contiguous, 16-byte aligned) and q_scales
// fp32 [rows, h / GROUP] (contiguous); both with no rows: no groups.
template <int GROUP>
inline bool fp8_groups_given(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& q_scales,
                             int64_t rows, int64_t h, int device) {
  const bool given = q.ndim() != 2 || q.size(0) != 0;
  const int64_t q_rows = given ? rows : 0;
  check_tensor(q, "q", {q_rows, h}, {kByte}, device, Layout::kContiguous, 16);
  check_tensor(q_scales, "q_scales", {q_rows, h / GROUP}, {kFloat32}, device, Layout::kContiguous);
  return given;
}
