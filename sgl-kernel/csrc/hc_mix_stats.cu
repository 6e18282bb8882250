// Split-K partials of the compensated mHC projection: part = x·[hi | lo]^T and Σx², per K slice,
// read from fn itself (its TF32 part hi is what the tensor core takes from fn's bits) and the
// stored residual lo = fn - hi: no copy of hi is kept.
//
// The Triton projection converts bf16 x to fp32 in registers before its TF32 MMA, so its x
// loads are not pipelined and the kernel waits on DRAM once per K step. Here x and w go
// straight from global to shared memory with cp.async (16-byte copies, STAGES chunks of
// 64 K columns in the ring, so STAGES - 1 chunks are in flight while one is multiplied), and
// every warp converts its x fragment in registers right before the MMA.
//
// Tiling (one CTA = kRows rows x one K slice, grid (ceil(m / kRows), S)):
// - a stage holds x [kRows x 64] bf16 (128 bytes a row) and 48 rows of w: fn's 24 (read as
//   hi) then lo's 24, 64 fp32 each;
// - a warp owns WARP_ROWS rows x WARP_COLS of those 48 columns (both halves, or hi or lo),
//   as m16n8k8 tiles; its B fragments serve all its row tiles, its A fragments all its
//   column tiles;
// - k permutation: inside each 32-column group q of a chunk, lane t of a quad owns physical
//   columns 32q + 8t .. 32q + 8t + 7 and feeds columns 2j, 2j + 1 of them to MMA step j as
//   the logical k = t and k = t + 4 of both A and B. So one 16-byte shared load gives a lane
//   a row's x for four MMAs, two give it a column's w for four MMAs;
// - shared rows are XOR-swizzled at 16-byte granularity (x: chunk ^ 4·(row & 1), w: chunk ^
//   (row & 1)) so those loads, and the cp.async stores, are free of bank conflicts.
//
// Numerics contract (what the finisher in hc_mix_stats.py relies on):
// - part[s, r, n] = Σ_{k in slice s} x[r, k]·hi[n, k] for n in 0-23 and x[r, k]·lo[n - 32, k]
//   for n in 32-55; columns 24-31 and 56-63 are written as 0.0. sqsum[s, r] =
//   Σ_{k in slice s} float(x[r, k])² in fp32.
// - Products run on tensor cores (mma.sync m16n8k8 tf32): bf16 -> fp32 is exact and exact in
//   TF32, and fn/lo are passed as raw fp32 bits. The tensor core reads their top 19 bits, so
//   fn's product is hi's (split_tf32: hi = fn with the low 13 bits cleared, fn itself where
//   not finite), bit for bit; the GPU tier checks it against a staged hi.
// - The tensor core's internal accumulation is not round-to-nearest and drifts over long K,
//   so each 64-column chunk is one fresh 8-MMA chain from zero, added to the running sum
//   with an IEEE fp32 add. hi and lo columns accumulate separately.
// - Slice s covers the 64-column blocks [first, first + count) with nb = K / 64, first =
//   s·(nb / S) + min(s, nb % S), count = nb / S + (s < nb % S), as the Triton kernel.
// - Deterministic: a fixed order everywhere (no atomics). sqsum: per lane, each chunk's squares
//   in one fma chain added to a running sum (chains of ~count, not 16·count, roundings), then
//   a fixed shuffle tree over the quad, then (when two warps split the 32-column groups of a
//   chunk) half 0 + half 1.
//
// Launch: one kernel on tvm-ffi's stream for x's device; no allocation, no host sync (it is
// captured in CUDA graphs).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kBlockK = 64;         // K columns per chunk: one fresh MMA chain
constexpr int kPackedCols = 64;     // part columns: [hi 24 | 0 8 | lo 24 | 0 8]
constexpr int kHalfCols = 32;       // the lo half of part starts here
constexpr int kMixCols = 24;        // rows of fn and of lo, useful columns per half
constexpr int kStagedWRows = 48;    // fn's rows then lo's, together in shared memory
constexpr int kXRowBytes = 128;     // 64 bf16
constexpr int kWRowBytes = 256;     // 64 fp32
constexpr int kSmemPerSm = 233472;  // 228 KB on sm_90 and sm_100
constexpr int kSmemPerCta = 1024;   // reserved by the system per resident CTA

// A launch shape. WARP_ROWS x WARP_COLS per warp (WARP_COLS 48: hi and lo; 24: one of them).
template <int ROWS, int WARP_ROWS, int WARP_COLS, int STAGES>
struct Shape {
  static constexpr int kRows = ROWS;
  static constexpr int kStages = STAGES;
  static constexpr int kMTiles = WARP_ROWS / 16;  // m16 tiles per warp
  static constexpr int kNTiles = WARP_COLS / 8;   // n8 tiles per warp
  static constexpr int kWarpsM = ROWS / WARP_ROWS;
  static constexpr int kWarpsN = kStagedWRows / WARP_COLS;  // 1: both halves, 2: one each
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kXStageBytes = ROWS * kXRowBytes;
  static constexpr int kStageBytes = kXStageBytes + kStagedWRows * kWRowBytes;
  static constexpr int kSqBytes = kWarpsN == 2 ? ROWS * 4 : 0;  // half 1's row sums for half 0
  static constexpr int kSmemBytes = STAGES * kStageBytes + kSqBytes;
  // Two CTAs a SM when their shared memory fits (the register cap then follows).
  static constexpr int kMinBlocks = 2 * (kSmemBytes + kSmemPerCta) <= kSmemPerSm ? 2 : 1;
  static constexpr int kXCopies = ROWS * (kXRowBytes / 16) / kThreads;  // per thread per stage
  static constexpr int kWCopies = kStagedWRows * (kWRowBytes / 16) / kThreads;

  static_assert(WARP_ROWS % 16 == 0 && ROWS % WARP_ROWS == 0, "rows in m16 tiles");
  static_assert(WARP_COLS == 24 || WARP_COLS == 48, "a warp takes one half or both");
  static_assert(kXCopies * kThreads == ROWS * 8 && kWCopies * kThreads == kStagedWRows * 16,
                "whole 16-byte copies per thread");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "threads");
  static_assert(STAGES >= 2, "a ring of at least two chunks");
};

struct Params {
  const __nv_bfloat16* x;  // [m, K], row stride x_stride elements
  const float* fn;         // [24, K] contiguous: read as hi
  const float* lo;         // [24, K] contiguous: fn - hi
  float* part;             // [S, m, 64] contiguous
  float* sqsum;            // [S, m] contiguous
  int64_t x_stride;
  int m;
  int k;
};

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// x is read exactly once; rows past m copy nothing (src_bytes 0) and zero-fill.
__device__ __forceinline__ void copy_x(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// w is read by every row tile of the slice: normal L2 priority.
__device__ __forceinline__ void copy_w(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// d += a·b on a tensor core, fp32 accumulate; a and b are fp32 bit patterns read as TF32.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Column of part that n8 tile `tile` (of the 6 staged ones) lands in: hi tiles 0-2 -> 0-23,
// lo tiles 3-5 -> 32-55.
__device__ __forceinline__ int part_column(int tile) {
  return tile * 8 + (tile >= kMixCols / 8 ? kHalfCols - kMixCols : 0);
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    hc_mix_partials_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int g = lane / 4;  // MMA group: row (A, C) or column (B) within the tile
  const int t = lane % 4;  // thread in group: which 8 physical k of a 32-column group
  const int warp_m = warp % S::kWarpsM;
  const int warp_n = warp / S::kWarpsM;

  const int row0 = blockIdx.x * S::kRows;
  const int split = blockIdx.y;
  const int splits = gridDim.y;
  const int n_blocks = p.k / kBlockK;
  const int first = split * (n_blocks / splits) + min(split, n_blocks % splits);
  const int count = n_blocks / splits + (split < n_blocks % splits ? 1 : 0);

  // ---- copy assignment: x copy i of this thread is row x_row + i·kXRowStep, 16-byte chunk
  // tid % 8; every row step is even, so the swizzle (row parity) is the same for all i.
  constexpr int kXRowStep = S::kThreads / 8;
  const int x_row = tid / 8;
  const int x_chunk = tid % 8;
  const uint32_t x_dst = x_row * kXRowBytes + ((x_chunk ^ ((x_row & 1) << 2)) << 4);
  const __nv_bfloat16* x_src = p.x + (row0 + x_row) * p.x_stride + x_chunk * 8;
  const int rows_left = p.m - row0 - x_row;  // copy i is a real row when i·kXRowStep < this
  constexpr int kWRowStep = S::kThreads / 16;
  const int w_row = tid / 16;
  const int w_chunk = tid % 16;
  const uint32_t w_dst = S::kXStageBytes + w_row * kWRowBytes + ((w_chunk ^ (w_row & 1)) << 4);
  const uint32_t smem_base = shared_addr(smem);

  auto load_chunk = [&](int stage, int block) {
    const uint32_t base = smem_base + stage * S::kStageBytes;
    const int64_t k0 = static_cast<int64_t>(block) * kBlockK;
#pragma unroll
    for (int i = 0; i < S::kXCopies; ++i) {
      const bool real = i * kXRowStep < rows_left;
      // Rows past m copy nothing and zero-fill; their source stays a valid address.
      const __nv_bfloat16* src = real ? x_src + i * kXRowStep * p.x_stride + k0 : p.x;
      copy_x(base + x_dst + i * kXRowStep * kXRowBytes, src, real ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < S::kWCopies; ++i) {
      const int row = w_row + i * kWRowStep;  // staged rows 0-23: fn, 24-47: lo
      const float* src = row < kMixCols ? p.fn + static_cast<int64_t>(row) * p.k
                                        : p.lo + static_cast<int64_t>(row - kMixCols) * p.k;
      copy_w(base + w_dst + i * kWRowStep * kWRowBytes, src + k0 + w_chunk * 4);
    }
  };

  // ---- fragment addresses (bytes within a stage). A: row g (+8) of each m tile, logical
  // chunk 4q + t of the row. B: staged row g of each n tile, logical chunks 8q + 2t, +1.
  const int warp_row = warp_m * S::kMTiles * 16;
  const int warp_tile = warp_n * S::kNTiles;  // first of the warp's n8 tiles (of 6)
  uint32_t a_off[2], b_off[2][2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    a_off[q] = (warp_row + g) * kXRowBytes + (((4 * q + t) ^ ((g & 1) << 2)) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      b_off[q][h] = S::kXStageBytes + (warp_tile * 8 + g) * kWRowBytes +
                    (((8 * q + 2 * t + h) ^ (g & 1)) << 4);
    }
  }

  float acc[S::kMTiles][S::kNTiles][4] = {};
  float sq[S::kMTiles][2] = {};  // this lane's Σx² of rows g and g + 8 of each m tile

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < count) load_chunk(s, first + s);
    commit_copies();  // one group per slot, empty or not, so the wait count below holds
  }

  for (int step = 0; step < count; ++step) {
    wait_copies<S::kStages - 2>();  // this thread's copies of chunk `step` have landed
    __syncthreads();  // everyone's have, and everyone is done with chunk step - 1's slot
    const int ahead = step + S::kStages - 1;
    if (ahead < count) load_chunk(ahead % S::kStages, first + ahead);
    commit_copies();

    const unsigned char* stage = smem + (step % S::kStages) * S::kStageBytes;
    float chunk[S::kMTiles][S::kNTiles][4] = {};  // fresh chain for this chunk
    float chunk_sq[S::kMTiles][2] = {};  // and the chunk's squares, so sq's chains stay short
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      uint4 a[S::kMTiles][2];  // 8 bf16 of rows g, g + 8: physical k 32q + 8t .. + 7
#pragma unroll
      for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          a[mi][hr] =
              *reinterpret_cast<const uint4*>(stage + a_off[q] + (mi * 16 + hr * 8) * kXRowBytes);
        }
      }
      float4 b[S::kNTiles][2];  // 8 fp32 of staged row g: physical k 32q + 8t .. + 7
#pragma unroll
      for (int ni = 0; ni < S::kNTiles; ++ni) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          b[ni][h] = *reinterpret_cast<const float4*>(stage + b_off[q][h] + ni * 8 * kWRowBytes);
        }
      }
      // Squares of each x element once: with two column warps, half h takes group q == h.
      if (S::kWarpsN == 1 || q == warp_n) {
#pragma unroll
        for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const uint32_t words[4] = {a[mi][hr].x, a[mi][hr].y, a[mi][hr].z, a[mi][hr].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float even = __uint_as_float(words[j] << 16);
              const float odd = __uint_as_float(words[j] & 0xffff0000u);
              chunk_sq[mi][hr] = fmaf(even, even, chunk_sq[mi][hr]);
              chunk_sq[mi][hr] = fmaf(odd, odd, chunk_sq[mi][hr]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // MMA step j: physical k 32q + 8t + 2j (+1) as k = t (t+4)
        uint32_t b_bits[S::kNTiles][2];
#pragma unroll
        for (int ni = 0; ni < S::kNTiles; ++ni) {
          const float4& v = b[ni][j / 2];
          b_bits[ni][0] = __float_as_uint(j % 2 == 0 ? v.x : v.z);
          b_bits[ni][1] = __float_as_uint(j % 2 == 0 ? v.y : v.w);
        }
#pragma unroll
        for (int mi = 0; mi < S::kMTiles; ++mi) {
          const uint32_t top = (&a[mi][0].x)[j];     // row g: bf16 pair (2j, 2j + 1)
          const uint32_t bottom = (&a[mi][1].x)[j];  // row g + 8
          // bf16 -> fp32 is the 16 bits moved up: exact, and exact in TF32.
          const uint32_t frag[4] = {top << 16, bottom << 16, top & 0xffff0000u,
                                    bottom & 0xffff0000u};
#pragma unroll
          for (int ni = 0; ni < S::kNTiles; ++ni) {
            mma_tf32(chunk[mi][ni], frag, b_bits[ni][0], b_bits[ni][1]);
          }
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
      for (int ni = 0; ni < S::kNTiles; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] += chunk[mi][ni][e];  // IEEE fp32 add
      }
      sq[mi][0] += chunk_sq[mi][0];
      sq[mi][1] += chunk_sq[mi][1];
    }
  }

  // ---- sqsum: the quad's four lanes (a fixed tree), then half 0 + half 1.
#pragma unroll
  for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float v = sq[mi][hr];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      sq[mi][hr] = v;
    }
  }
  float* half_sq = reinterpret_cast<float*>(smem + S::kStages * S::kStageBytes);
  if constexpr (S::kWarpsN == 2) {
    if (warp_n == 1 && t == 0) {
#pragma unroll
      for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) half_sq[warp_row + mi * 16 + hr * 8 + g] = sq[mi][hr];
      }
    }
    __syncthreads();
  }
  const int64_t out_row0 = static_cast<int64_t>(split) * p.m + row0 + warp_row;
#pragma unroll
  for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int local = mi * 16 + hr * 8 + g;
      if (row0 + warp_row + local >= p.m) continue;
      const int64_t out = out_row0 + local;
      if (warp_n == 0 && t == 0) {
        p.sqsum[out] = S::kWarpsN == 2 ? sq[mi][hr] + half_sq[warp_row + local] : sq[mi][hr];
      }
      float* part_row = p.part + out * kPackedCols + 2 * t;
#pragma unroll
      for (int ni = 0; ni < S::kNTiles; ++ni) {
        *reinterpret_cast<float2*>(part_row + part_column(warp_tile + ni)) =
            make_float2(acc[mi][ni][2 * hr], acc[mi][ni][2 * hr + 1]);
      }
      // The zero columns after each half this warp owns (24-31, 56-63).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (S::kWarpsN == 1 || half == warp_n) {
          *reinterpret_cast<float2*>(part_row + half * kHalfCols + kMixCols) =
              make_float2(0.0f, 0.0f);
        }
      }
    }
  }
}

// Checks every argument and returns the kernel parameters (part.size(0) slices).
Params checked_params(const TensorView& x, const TensorView& fn, const TensorView& lo,
                      const TensorView& part, const TensorView& sqsum) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0);
  const int64_t k = x.size(1);
  if (k <= 0 || k % kBlockK != 0 || k > (int64_t{1} << 30)) {
    TVM_FFI_THROW(ValueError) << "x: K = " << k << " must be a positive multiple of " << kBlockK;
  }
  if (m > (int64_t{1} << 30)) TVM_FFI_THROW(ValueError) << "x: " << m << " rows is too many";
  const int device = x.device().device_id;
  check_tensor(fn, "fn", {kMixCols, k}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(lo, "lo", {kMixCols, k}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(part, "part", {kAnySize, m, kPackedCols}, {kFloat32}, device, Layout::kContiguous,
               8);
  const int64_t splits = part.size(0);
  if (splits < 1 || splits > 65535) {
    TVM_FFI_THROW(ValueError) << "part: S = " << splits << " must be in 1..65535";
  }
  check_tensor(sqsum, "sqsum", {splits, m}, {kFloat32}, device, Layout::kContiguous);
  Params p;
  p.x = data_as<const __nv_bfloat16>(x);
  p.fn = data_as<const float>(fn);
  p.lo = data_as<const float>(lo);
  p.part = data_as<float>(part);
  p.sqsum = data_as<float>(sqsum);
  p.x_stride = x.stride(0);
  p.m = static_cast<int>(m);
  p.k = static_cast<int>(k);
  return p;
}

template <class S>
void launch(const Params& p, int splits, int device) {
  if (p.m == 0) return;
  auto kernel = hc_mix_partials_kernel<S>;
  // The opt-in above 48 KB of shared memory.
  set_attribute_at_least<hc_mix_partials_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize>(
      S::kSmemBytes, device, "hc_mix_partials");
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((p.m + S::kRows - 1) / S::kRows, splits, 1);
  config.blockDim = dim3(S::kThreads, 1, 1);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = env_stream(device);
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, p);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << "hc_mix_partials launch failed: " << cudaGetErrorString(err);
  }
}

// The default launch shape: 128 rows, 4 warps of 32 rows x both halves, 4 stages, two CTAs
// an SM (the fastest of the H200 sweep at 4096 and 16384 rows).
using DefaultShape = Shape<128, 32, 48, 4>;

}  // namespace

// x: bf16 [m, K] (last-dim stride 1, 16-byte aligned rows, K % 64 == 0); fn and its TF32
// residual lo: fp32 [24, K] each; part: fp32 [S, m, 64]; sqsum: fp32 [S, m] (all four
// contiguous, fn and lo 16-byte aligned). Writes every row < m of every slice; the grid is
// (ceil(m / rows_per_cta), S).
void hc_mix_partials_tf32(TensorView x, TensorView fn, TensorView lo, TensorView part,
                          TensorView sqsum) {
  const Params p = checked_params(x, fn, lo, part, sqsum);
  const int device = x.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  launch<DefaultShape>(p, static_cast<int>(part.size(0)), device);
}

// Rows per CTA of the default shape: the caller picks S from ceil(m / rows) CTAs per slice.
int64_t hc_mix_partials_rows_per_cta() { return DefaultShape::kRows; }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_partials_tf32, hc_mix_partials_tf32);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_partials_rows_per_cta, hc_mix_partials_rows_per_cta);
