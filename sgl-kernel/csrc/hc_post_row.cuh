// SGLang 0.5.23's mHC post of one thread's 16-byte vectors, shared by the kernels that write the
// updated residual (hc_boundary.cu, hc_post_combine_norm.cu), so that both have its bits:
//   out[c][h] = bf16_rn(fma(comb[3][c], R3[h], fma(comb[2][c], R2[h], fma(comb[1][c], R1[h],
//               fma(post[c], y[h], comb[0][c]·R0[h])))))
// in fp32 (the first product rounded, each fma rounded once), as mhc_post_split_h and the
// TileLang mhc_post compute it; comb is [4 (input stream j), 4 (output stream c)] row-major.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "hc_combine_norm_row.cuh"

constexpr int kPostStreams = 4;

// The 32-bit word i of a 16-byte vector.
__device__ __forceinline__ uint32_t vector_word(const uint4& v, int i) {
  return reinterpret_cast<const uint32_t*>(&v)[i];
}

// The post of one vector (8 columns) into output stream c: four bf16x2 words. yv is the
// sublayer's output, rv the four input streams, post_c = post[c].
__device__ __forceinline__ uint4 post_vector(const uint4& yv, const uint4 (&rv)[kPostStreams],
                                             float post_c, const float (&comb)[16], int c) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float acc[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const auto value = [half](uint32_t w) { return half ? bf16_hi(w) : bf16_lo(w); };
      float a =
          fma_rn(post_c, value(vector_word(yv, i)), mul_rn(comb[c], value(vector_word(rv[0], i))));
#pragma unroll
      for (int s = 1; s < kPostStreams; ++s) {
        a = fma_rn(comb[4 * s + c], value(vector_word(rv[s], i)), a);
      }
      acc[half] = a;
    }
    out[i] = bf16x2_rn(acc[0], acc[1]);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}
