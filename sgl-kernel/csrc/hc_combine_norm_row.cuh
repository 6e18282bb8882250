// The mHC combine + RMSNorm of one thread's 16-byte vectors, shared by the kernels that write
// the normed rows (hc_combine_norm.cu, hc_boundary.cu), so that a row normed by either has the
// same bits for the same thread layout. The arithmetic is hc_combine_norm.cu's contract:
//   x_in = bf16_rn(((p0·x0 + p1·x1) + p2·x2) + p3·x3), each product and sum one fp32 rounding;
//   the thread's Σ x_in² in column order; y = bf16_rn(mul.rn(mul.rn(x_in, inv), w)), every NaN
//   stored as 0x7FC0. The reduction of the threads' sums is the caller's (warp_sum, sum_slots).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "float_bits.cuh"
#include "fp32_ops.cuh"

constexpr uint32_t kBf16CanonicalNan = 0x7FC07FC0u;

// Two fp32 -> bf16x2 (lo in the low half), round to nearest even; NaN becomes some NaN.
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ uint32_t max_s16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.s16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Per bf16 half: |h| + 0x7F. Bit 15 of a half is set iff the half is NaN (|h| > 0x7F80), so as
// a signed 16-bit key NaN sorts below every number, and numbers keep the order of |h|.
__device__ __forceinline__ uint32_t magnitude_keys(uint32_t w) {
  return (w & 0x7FFF7FFFu) + 0x007F007Fu;
}

// NaN halves of a bf16x2 word -> 0x7FC0, the others unchanged.
__device__ __forceinline__ uint32_t canonical_nan(uint32_t w, uint32_t keys) {
  const uint32_t mask = ((keys >> 15) & 0x00010001u) * 0xFFFFu;
  return (w & ~mask) | (kBf16CanonicalNan & mask);
}

// A butterfly over the warp (shfl_xor 16, 8, 4, 2, 1): every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The sum of slots [0, n), the same bits in every lane: lane l takes slot l (+0 past n), plus
// slot l + 32 when n > 32, then warp_sum. The butterfly is always over 32 lanes: a width set by
// n at run time made it a loop, slower at decode sizes.
__device__ __forceinline__ float sum_slots(const float* slots, int n, int lane) {
  float v = lane < n ? slots[lane] : 0.0f;
  if (n > 32) v = add_rn(v, lane + 32 < n ? slots[lane + 32] : 0.0f);
  return warp_sum(v);
}

// One vector (8 columns) of the four streams combined with the gates: x_in as four bf16x2
// words, and its squares added to the thread's running `ss` in column order.
__device__ __forceinline__ void combine_vector(const uint4 (&xv)[4], const float (&gate)[4],
                                               uint32_t (&xin)[4], float& ss) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t words[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) words[s] = reinterpret_cast<const uint32_t*>(&xv[s])[i];
    float lo = mul_rn(gate[0], bf16_lo(words[0]));
    float hi = mul_rn(gate[0], bf16_hi(words[0]));
#pragma unroll
    for (int s = 1; s < 4; ++s) {
      lo = add_rn(lo, mul_rn(gate[s], bf16_lo(words[s])));
      hi = add_rn(hi, mul_rn(gate[s], bf16_hi(words[s])));
    }
    // A NaN x_in makes ss, hence every y, NaN; its payload never reaches an output.
    const uint32_t packed = bf16x2_rn(lo, hi);
    xin[i] = packed;
    const float a = bf16_lo(packed), b = bf16_hi(packed);
    ss = add_rn(ss, mul_rn(a, a));
    ss = add_rn(ss, mul_rn(b, b));
  }
}

// y = bf16((x_in · inv) · w) of one vector, with each half's magnitude key and the thread's
// running per-half maximum key `top` (unsigned: NaN keys are largest).
__device__ __forceinline__ void normalize_vector(const uint32_t (&xin)[4], float inv, uint4 wv,
                                                 uint32_t (&yw)[4], uint32_t (&keys)[4],
                                                 uint32_t& top) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&wv)[i];
    const float lo = mul_rn(mul_rn(bf16_lo(xin[i]), inv), bf16_lo(w));
    const float hi = mul_rn(mul_rn(bf16_hi(xin[i]), inv), bf16_hi(w));
    yw[i] = bf16x2_rn(lo, hi);
    keys[i] = magnitude_keys(yw[i]);
    top = max_u16x2(top, keys[i]);
  }
}

// Whether a thread's `top` holds a ±Inf or NaN half (a key >= 0x7FFF): only then do NaNs need
// canonical bits, and e4m3 products the NaN -> 448 rule (a NaN product needs a NaN or infinite y
// in the thread: the scale-255 NaN factor is chosen only when all odd positions are NaN).
__device__ __forceinline__ bool any_nonfinite(uint32_t top) {
  return ((top + 0x00010001u) & 0x80008000u) != 0u;
}

__device__ __forceinline__ void canonical_nans(uint32_t (&yw)[4], const uint32_t (&keys)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) yw[i] = canonical_nan(yw[i], keys[i]);
}
