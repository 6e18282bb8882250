// A row's mHC statistics from its projection sums, the epilogue of the fused wgmma kernel
// (hc_mix_stats.cu) and of the small-row kernels (hc_boundary.cu), and the cluster primitives
// the wgmma kernel's exchange uses.
//
// In the unnamed namespace, as every symbol of each translation unit that includes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hc_mix_stats_common.cuh"
#include "tensor_view.cuh"

namespace {

// ---- The statistics of a row from its sums (the fused wgmma kernel's epilogue): mix = the
// projection times rsqrt(Σx² / K + rms_eps), the gates and Sinkhorn (docs/specs.md C.3), one
// row a thread with every value in its own register, so Sinkhorn's 40 normalisations need no
// cross-lane step. IEEE divisions in the RMS factor and the sigmoids; Sinkhorn's normalisations
// are one dependent chain and multiply by an approximate reciprocal (rcp.approx.ftz, 1 ulp;
// every sum is at least eps, far above the subnormals), as the Triton finisher does.
constexpr int kSumCols = kMixCols + 1;     // a row's 24 projection sums, then its Σx²
constexpr int kGateParams = kMixCols + 3;  // base (24), then scale (pre, post, comb)

struct FinishParams {
  const float* scale;  // [3]: pre, post, comb
  const float* base;   // [24]
  float* pre;          // [m, 4]
  float* post;         // [m, 4]
  float* comb;         // [m, 4, 4]
  float* mix;          // [m, 24]
  int iters;
  float k;
  float rms_eps;
  float eps;
  float post_mult;
};

__device__ __forceinline__ float approx_reciprocal(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

__device__ __forceinline__ float sigmoid(float z) { return __fdiv_rn(1.0f, 1.0f + expf(-z)); }

// v / (Σv + eps) for one comb row or column, as v · (1 / (Σv + eps)).
__device__ __forceinline__ void normalize4(float& a, float& b, float& c, float& d, float eps) {
  const float inv = approx_reciprocal((((a + b) + c) + d) + eps);
  a *= inv;
  b *= inv;
  c *= inv;
  d *= inv;
}

__device__ __forceinline__ void store4(float* dst, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
}

// Row `row`'s outputs from its kSumCols sums; gate_params: base then scale (shared memory).
__device__ __forceinline__ void finish_row(const FinishParams& f, int row, const float* sums,
                                           const float* gate_params) {
  const float* base = gate_params;
  const float rms = rsqrtf(__fdiv_rn(sums[kMixCols], f.k) + f.rms_eps);
  float mix[kMixCols];
#pragma unroll
  for (int n = 0; n < kMixCols; ++n) mix[n] = sums[n] * rms;
  float* mix_row = f.mix + static_cast<int64_t>(row) * kMixCols;
#pragma unroll
  for (int n = 0; n < kMixCols; n += 4) {
    store4(mix_row + n, mix[n], mix[n + 1], mix[n + 2], mix[n + 3]);
  }
  const float pre_scale = gate_params[kMixCols], post_scale = gate_params[kMixCols + 1];
  const float comb_scale = gate_params[kMixCols + 2];
  float gate[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    gate[j] = sigmoid(mix[j] * pre_scale + base[j]) + f.eps;
    gate[4 + j] = sigmoid(mix[4 + j] * post_scale + base[4 + j]) * f.post_mult;
  }
  const int64_t at = static_cast<int64_t>(row) * 4;
  store4(f.pre + at, gate[0], gate[1], gate[2], gate[3]);
  store4(f.post + at, gate[4], gate[5], gate[6], gate[7]);

  // Sinkhorn: each comb row's softmax + eps, a column step, then iters - 1 rounds of rows and
  // columns.
  float c[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float z[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) z[j] = mix[8 + 4 * i + j] * comb_scale + base[8 + 4 * i + j];
    const float top = fmaxf(fmaxf(z[0], z[1]), fmaxf(z[2], z[3]));
#pragma unroll
    for (int j = 0; j < 4; ++j) z[j] = expf(z[j] - top);
    const float inv = approx_reciprocal(((z[0] + z[1]) + z[2]) + z[3]);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[i][j] = z[j] * inv + f.eps;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) normalize4(c[0][j], c[1][j], c[2][j], c[3][j], f.eps);
  for (int round = 1; round < f.iters; ++round) {
#pragma unroll
    for (int i = 0; i < 4; ++i) normalize4(c[i][0], c[i][1], c[i][2], c[i][3], f.eps);
#pragma unroll
    for (int j = 0; j < 4; ++j) normalize4(c[0][j], c[1][j], c[2][j], c[3][j], f.eps);
  }
  float* comb_row = f.comb + static_cast<int64_t>(row) * 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) store4(comb_row + 4 * i, c[i][0], c[i][1], c[i][2], c[i][3]);
}

// The statistics' gate parameters and outputs for m rows on `device` (ValueError naming the
// first that is off): scale [3], base [24], pre and post [m, 4], comb [m, 4, 4], mix [m, 24],
// fp32 and contiguous, the outputs 16-byte aligned (finish_row stores float4s).
inline void check_statistics_outputs(int64_t m, int device, const TensorView& scale,
                                     const TensorView& base, const TensorView& pre,
                                     const TensorView& post, const TensorView& comb,
                                     const TensorView& mix) {
  check_tensor(scale, "scale", {3}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(base, "base", {kMixCols}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(pre, "pre", {m, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(post, "post", {m, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(comb, "comb", {m, 4, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(mix, "mix", {m, kMixCols}, {kFloat32}, device, Layout::kContiguous, 16);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)  // the fused kernel's only
// Every thread of every CTA of the cluster arrives (release), then waits (acquire): shared
// memory written before it is visible to any CTA of the cluster after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// The float at shared address `address` of the cluster's CTA `rank`.
__device__ __forceinline__ float load_from_rank(uint32_t address, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

#endif

}  // namespace
