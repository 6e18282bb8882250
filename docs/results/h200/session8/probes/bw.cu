// Read-bandwidth probe: the mHC projection's x access patterns, no math.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// CTA: R rows x L bytes of each row (L = slice), chunk = R rows x SEG bytes; 512 threads.
// W: also copy 48 x 256 B of w per 64 columns of x covered (the real kernel's w stream).
template <int R, int SEG, int STAGES, bool W>
__global__ void __launch_bounds__(512, 1) probe(const char* x, int64_t row_bytes, int slice_bytes,
                                               const char* w, int64_t w_row_bytes, float* out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  constexpr int kX = R * SEG;
  constexpr int kWB = W ? 48 * 256 * (SEG / 128) : 0;
  constexpr int kStage = kX + kWB;
  const int tid = threadIdx.x;
  const char* base = x + (int64_t)blockIdx.x * R * row_bytes + (int64_t)blockIdx.y * slice_bytes;
  const char* wbase = w + (int64_t)blockIdx.y * slice_bytes * 2;  // fp32: 2x the bf16 bytes
  const int chunks = slice_bytes / SEG;
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
  auto load = [&](int st, int c) {
    const uint32_t d = s0 + st * kStage;
#pragma unroll
    for (int i = 0; i < kX / 16 / 512; ++i) {
      const int u = tid + i * 512;
      const int row = u / (SEG / 16), col = u % (SEG / 16);
      cp16(d + u * 16, base + row * row_bytes + (int64_t)c * SEG + col * 16);
    }
    if (W) {
#pragma unroll
      for (int i = 0; i < (kWB / 16 + 511) / 512; ++i) {
        const int u = tid + i * 512;
        if (u < kWB / 16) {
          const int row = u / (SEG / 8), col = u % (SEG / 8);
          cp16(d + kX + u * 16, wbase + row * w_row_bytes + (int64_t)c * SEG * 2 + col * 16);
        }
      }
    }
  };
  float acc = 0.f;
  for (int s = 0; s < STAGES - 1; ++s) { if (s < chunks) load(s, s); commit(); }
  for (int c = 0; c < chunks; ++c) {
    waitg<STAGES - 2>();
    __syncthreads();
    if (c + STAGES - 1 < chunks) load((c + STAGES - 1) % STAGES, c + STAGES - 1);
    commit();
    acc += reinterpret_cast<const float*>(smem + (c % STAGES) * kStage)[tid];
  }
  if (acc == 12345.f) out[0] = acc;
}

__global__ void plain(const float4* x, int64_t n, float* out) {
  float acc = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float4 v = __ldcs(x + i); acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.f) out[0] = acc;
}

template <class F>
float time_it(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> ts;
  for (int r = 0; r < 15; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < 20; ++i) f();
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000.f / 20);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

template <int R, int SEG, int STAGES, bool W>
void run(const char* x, const char* w, float* out, int m, int k, int tiles_x_slices, const char* name) {
  const int64_t row_bytes = (int64_t)k * 2;
  const int tiles = m / R;
  const int slices = std::max(1, tiles_x_slices / tiles);
  const int slice_bytes = row_bytes / slices;
  constexpr int kStage = R * SEG + (W ? 48 * 256 * (SEG / 128) : 0);
  auto kern = probe<R, SEG, STAGES, W>;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGES * kStage);
  auto f = [&] { kern<<<dim3(tiles, slices), 512, STAGES * kStage>>>(x, row_bytes, slice_bytes, w, (int64_t)k * 4, out); };
  float us = time_it(f);
  cudaError_t e = cudaGetLastError();
  printf("%-28s m=%6d grid %3dx%-3d smem %6d: %8.2f us  %.3f TB/s %s\n", name, m, tiles, slices,
         STAGES * kStage, us, (double)m * row_bytes / us / 1e6, e ? cudaGetErrorString(e) : "");
}

int main() {
  const int k = 20480;
  const int mmax = 16384;
  char *x, *w; float* out;
  cudaMalloc(&x, (size_t)mmax * k * 2); cudaMalloc(&w, (size_t)48 * k * 4); cudaMalloc(&out, 64);
  cudaMemset(x, 0, (size_t)mmax * k * 2); cudaMemset(w, 0, (size_t)48 * k * 4);
  for (int m : {4096, 16384}) {
    const int64_t n = (int64_t)m * k * 2 / 16;
    for (int blocks : {132 * 4, 132 * 8, 132 * 16}) {
      float us = time_it([&] { plain<<<blocks, 512>>>(reinterpret_cast<const float4*>(x), n, out); });
      printf("plain float4 blocks %5d      m=%6d: %8.2f us  %.3f TB/s\n", blocks, m, us, (double)m * k * 2 / us / 1e6);
    }
    run<256, 128, 4, false>(x, w, out, m, k, 128, "R256 SEG128 st4");
    run<256, 128, 4, true>(x, w, out, m, k, 128, "R256 SEG128 st4 +w");
    run<256, 128, 5, false>(x, w, out, m, k, 128, "R256 SEG128 st5");
    run<256, 128, 4, false>(x, w, out, m, k, 132, "R256 SEG128 st4 g132");
    run<128, 256, 4, false>(x, w, out, m, k, 128, "R128 SEG256 st4");
    run<128, 256, 3, true>(x, w, out, m, k, 128, "R128 SEG256 st3 +w");
    run<64, 512, 4, false>(x, w, out, m, k, 128, "R64 SEG512 st4");
    run<64, 512, 2, true>(x, w, out, m, k, 128, "R64 SEG512 st2 +w");
    run<32, 1024, 4, false>(x, w, out, m, k, 128, "R32 SEG1024 st4");
    run<128, 128, 6, false>(x, w, out, m, k, 128, "R128 SEG128 st6");
    run<128, 128, 8, false>(x, w, out, m, k, 128, "R128 SEG128 st8");
  }
  return 0;
}
