// Probe (session 12): sqrt.rn(x > 20 ? x : log1pf(expf(x))) as straight-line
// code, to be bitwise the CUDA math library's (score_of) for every fp32 x. The
// library's log1pf and sqrt branch to their special cases, which keeps a
// thread's values from interleaving; here every case is computed and selected.
// log1pf's main path and sqrt's both paths are the library's own operations
// (read from its SASS under nvcc 13.0), in PTX that nothing contracts.
#pragma once
__device__ __forceinline__ float ptx_mul_ftz(float a, float b) {
  float d;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float ptx_add_ftz(float a, float b) {
  float d;
  asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float ptx_rsqrt(float a) {
  float d;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
}

// log1pf(y) for y = expf(x) (y >= +0, +inf or NaN; other y as the library too).
__device__ __forceinline__ float log1p_straight(float y) {
  const int y_bits = __float_as_int(y);
  const int e_bits =
      (__float_as_int(__fadd_rz(y, 1.0f)) - 0x3f400000) & 0xff800000;
  const float scale = __int_as_float(0x40800000 - e_bits);
  const float m = __fadd_rn(__int_as_float(y_bits - e_bits),
                            __fmaf_rn(scale, 0.25f, -1.0f));
  const float e = __fmul_rn(__int2float_rn(e_bits), 1.1920928955078125e-07f);
  float p = __fmaf_rn(m, -__int_as_float(0x3d39bf78), 0.10546888411045074463f);
  p = __fmaf_rn(m, p, -0.13229703903198242188f);
  p = __fmaf_rn(m, p, 0.14491446316242218018f);
  p = __fmaf_rn(m, p, -0.16641564667224884033f);
  p = __fmaf_rn(m, p, 0.19988867640495300293f);
  p = __fmaf_rn(m, p, -0.25000196695327758789f);
  p = __fmaf_rn(m, p, 0.33333510160446166992f);
  p = __fmaf_rn(m, p, -0.5f);
  p = __fmul_rn(m, p);
  float r = __fmaf_rn(e, 0.69314718246459960938f, __fmaf_rn(m, p, m));
  // y >= +inf by its unsigned bits (inf, NaN, negative): the library's special
  // case
  const float special =
      y_bits >= -0x407fffff
          ? __fmaf_rn(y, __int_as_float(0x7f800000), __int_as_float(0x7f800000))
          : r;
  const float special_zero = y != 0.0f ? special : -0.0f;
  return static_cast<unsigned>(y_bits) >= 0x7f800000u ? special_zero : r;
}

// sqrt.rn(s): the fast path on s, or on s · 2^64 for s below 2^-101 (then ·
// 2^-32), and the library's answers for ±0, inf, NaN and negatives.
__device__ __forceinline__ float sqrt_straight(float s) {
  const unsigned bits = __float_as_uint(s);
  const bool tiny = bits < 0x0d000000u;
  const float scaled = tiny ? __fmaf_rn(s, 18446744073709551616.0f, 0.0f) : s;
  const float r = ptx_rsqrt(scaled);
  const float a = ptx_mul_ftz(r, scaled);
  const float h = ptx_mul_ftz(r, 0.5f);
  const float root = __fmaf_rn(__fmaf_rn(-a, a, scaled), h, a);
  float out = tiny ? ptx_mul_ftz(root, 2.3283064365386962891e-10f) : root;
  out = (bits & 0x7fffffffu) == 0 ? s : out; // +-0
  out = bits == 0x7f800000u ? s : out;       // +inf
  out = (bits > 0x80000000u && bits <= 0xff800000u) ? __int_as_float(0x7fffffff)
                                                    : out;               // < 0
  out = (bits & 0x7fffffffu) > 0x7f800000u ? ptx_add_ftz(s, 1.0f) : out; // NaN
  return out;
}

__device__ __forceinline__ float score_straight(float x) {
  const float softplus = log1p_straight(expf(x));
  return sqrt_straight(x > 20.0f ? x : softplus);
}
