// Bit-level conversions of packed floats shared by the kernels of this folder.
#pragma once

#include <cstdint>

// The bf16 in the low / high half of a 32-bit word, as fp32 (exact).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7FFF (what __float2bfloat16 compiles to).
__device__ __forceinline__ uint16_t bf16_rn(float v) {
  uint16_t d;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(v));
  return d;
}

// Two fp32 -> e4m3x2 codes (lo in the low byte), RNE, finite overflow and ±Inf saturated,
// NaN -> 0x7F.
__device__ __forceinline__ uint32_t e4m3x2_rn(float lo, float hi) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
