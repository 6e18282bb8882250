// fp32 arithmetic with exactly the rounding written, whatever the compiler flags, shared by the
// kernels of this folder: PTX instructions with an explicit rounding mode are never contracted
// into FMAs, and without .ftz they keep subnormals.
#pragma once

__device__ __forceinline__ float mul_rn(float a, float b) {
  float d;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  float d;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
// a * b + c rounded once (fma.rn: subnormals kept whatever -ftz says).
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}
__device__ __forceinline__ float div_rn(float a, float b) {
  float d;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float sqrt_rn(float a) {
  float d;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
}
// Subnormal inputs and results flush to zero (FlashInfer's scaling multiply, for one).
__device__ __forceinline__ float mul_ftz(float a, float b) {
  float d;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float add_ftz(float a, float b) {
  float d;
  asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float fma_ftz(float a, float b, float c) {
  float d;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}
// The hardware reciprocal (MUFU.RCP), subnormals flushed: what fast math's `a / b` multiplies
// a by (div.approx.ftz).
__device__ __forceinline__ float rcp_approx_ftz(float a) {
  float d;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
}
// The hardware reciprocal square root (MUFU.RSQ), subnormals flushed.
__device__ __forceinline__ float rsqrt_approx(float a) {
  float d;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
}
