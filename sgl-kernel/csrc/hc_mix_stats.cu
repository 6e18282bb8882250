// Split-K partials of the compensated mHC projection: part = x·hi^T + x·lo^T and Σx², per K
// slice, read from fn itself (its TF32 part hi is what the tensor core takes from fn's bits) and
// the stored residual lo = fn - hi: no copy of hi is kept. Two kernels give them: wgmma on
// Hopper (sm_90a), mma.sync elsewhere (sm_80+, the SM100 family).
//
// The Triton projection converts bf16 x to fp32 in registers before its TF32 MMA, so its x
// loads are not pipelined and the kernel waits on DRAM once per K step. Here x and w go
// straight from global to shared memory (cp.async 16-byte copies in the mma.sync kernel, TMA
// boxes in the wgmma one), STAGES chunks of 64 K columns in the ring, so the next chunks are
// in flight while one is multiplied, and every warp converts its x fragment in registers
// right before the MMA.
//
// One CTA = kRows rows x one K slice, grid (ceil(m / kRows), S). A stage holds x [kRows x 64]
// bf16 (128 bytes a row) and 48 rows of w: fn's 24 (read as hi) then lo's 24, 64 fp32 each
// (the wgmma kernel puts w first, as two 32-column atoms of the 48 rows; its section says how).
// Each thread holds the hi and the lo products of the same (row, column), so it adds them
// into the slice's one partial.
//
// Numerics contract (what the finisher in hc_mix_stats_kernels.py relies on):
// - part[s, r, n] = Σ_{k in slice s} x[r, k]·hi[n, k] + Σ_{k in slice s} x[r, k]·lo[n, k] for
//   n in 0-23 (the two sums kept apart to the end of the slice, then one IEEE fp32 add);
//   columns 24-31 are written as 0.0. sqsum[s, r] = Σ_{k in slice s} float(x[r, k])² in fp32.
// - Products run on tensor cores (TF32 MMAs): bf16 -> fp32 is exact and exact in TF32, and
//   fn/lo are passed as raw fp32 bits. The tensor core reads their top 19 bits, so fn's
//   product is hi's (split_tf32: hi = fn with the low 13 bits cleared, fn itself where not
//   finite), bit for bit; the GPU tier checks it against a staged hi, for both kernels.
// - The tensor core's internal accumulation is not round-to-nearest and drifts over long K,
//   so each 64-column chunk is one fresh 8-step chain from zero, added to the running sums
//   with an IEEE fp32 add. The two kernels' tensor cores round inside a chain differently,
//   and their lanes take different x elements into their sqsum chains: the two kernels'
//   partials and sums of squares differ in the last bits.
// - Slice s covers the 64-column blocks [first, first + count) with nb = K / 64, first =
//   s·(nb / S) + min(s, nb % S), count = nb / S + (s < nb % S), as the Triton kernel.
// - Deterministic: a fixed order everywhere (no atomics). sqsum: per lane, each chunk's squares
//   in one fma chain added to a running sum (chains of ~count, not 16·count, roundings), then
//   a fixed shuffle tree over the quad.
//
// Launch: one kernel on tvm-ffi's stream for x's device; no allocation, no host sync (it is
// captured in CUDA graphs). The wgmma kernel's tensor maps are encoded on the host each call
// and passed by value with the parameters. On Hopper the wgmma kernel can also finish the
// statistics itself (hc_mix_stats_fused; its section says how).

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <atomic>
#include <cstdint>

#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kBlockK = 64;         // K columns per chunk: one fresh MMA chain
constexpr int kPartCols = 32;       // part columns: [hi + lo 24 | 0 8]
constexpr int kMixCols = 24;        // rows of fn and of lo, useful columns of part
constexpr int kStagedWRows = 48;    // fn's rows then lo's, together in shared memory
constexpr int kXRowBytes = 128;     // 64 bf16
constexpr int kWRowBytes = 256;     // 64 fp32
constexpr int kSmemPerSm = 233472;  // 228 KB on sm_90 and sm_100
constexpr int kSmemPerCta = 1024;   // reserved by the system per resident CTA

// Two CTAs a SM when their shared memory fits (the register cap then follows).
constexpr int min_blocks(int smem_bytes) {
  return 2 * (smem_bytes + kSmemPerCta) <= kSmemPerSm ? 2 : 1;
}

struct Params {
  const __nv_bfloat16* x;  // [m, K], row stride x_stride elements
  const float* fn;         // [24, K] contiguous: read as hi
  const float* lo;         // [24, K] contiguous: fn - hi
  float* part;             // [S, m, 32] contiguous
  float* sqsum;            // [S, m] contiguous
  int64_t x_stride;
  int m;
  int k;
};

// The 64-column blocks of K slice `split` of `splits`: [first, first + count).
struct Slice {
  int first;
  int count;
};

__device__ __forceinline__ Slice slice_of(const Params& p, int split, int splits) {
  const int n_blocks = p.k / kBlockK;
  return {split * (n_blocks / splits) + min(split, n_blocks % splits),
          n_blocks / splits + (split < n_blocks % splits ? 1 : 0)};
}

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

// This thread's x copies of a chunk: copy i is the 16 bytes at src + i·ROW_STEP rows to dst +
// i·ROW_STEP rows; rows past m (i·ROW_STEP >= rows_left) copy nothing and zero-fill, their
// source kept a valid address.
template <int COPIES, int ROW_STEP>
__device__ __forceinline__ void copy_x_rows(const Params& p, uint32_t dst, const __nv_bfloat16* src,
                                            int rows_left) {
#pragma unroll
  for (int i = 0; i < COPIES; ++i) {
    const bool real = i * ROW_STEP < rows_left;
    copy_x(dst + i * ROW_STEP * kXRowBytes, real ? src + i * ROW_STEP * p.x_stride : p.x,
           real ? 16u : 0u);
  }
}

// Staged w row `row` (0-23: fn, 24-47: lo) at K column `column`.
__device__ __forceinline__ const float* w_source(const Params& p, int row, int64_t column) {
  return (row < kMixCols ? p.fn + static_cast<int64_t>(row) * p.k
                         : p.lo + static_cast<int64_t>(row - kMixCols) * p.k) +
         column;
}

// The quad's sum of its lanes' squares (a fixed tree): every lane gets it.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// One row of slice `split`'s partial from lane t of its quad: columns 8·tile + 2t (+1) of
// hi[tile] + lo[tile], the zeros 24 + 2t (+1), and (lane 0) the row's Σx².
__device__ __forceinline__ void store_partial_row(const Params& p, int split, int row, int t,
                                                  float sq, const float2 (&hi)[3],
                                                  const float2 (&lo)[3]) {
  if (row >= p.m) return;
  const int64_t out = static_cast<int64_t>(split) * p.m + row;
  if (t == 0) p.sqsum[out] = sq;
  float* part_row = p.part + out * kPartCols + 2 * t;
#pragma unroll
  for (int tile = 0; tile < 3; ++tile) {
    *reinterpret_cast<float2*>(part_row + 8 * tile) =
        make_float2(hi[tile].x + lo[tile].x, hi[tile].y + lo[tile].y);  // IEEE fp32 adds
  }
  *reinterpret_cast<float2*>(part_row + kMixCols) = make_float2(0.0f, 0.0f);
}

// ---- mma.sync (sm_80+): a warp owns WARP_ROWS rows x all 48 staged columns as m16n8k8 tiles;
// its B fragments serve all its row tiles, its A fragments all six column tiles.
// - k permutation: inside each 32-column group q of a chunk, lane t of a quad owns physical
//   columns 32q + 8t .. 32q + 8t + 7 and feeds columns 2j, 2j + 1 of them to MMA step j as
//   the logical k = t and k = t + 4 of both A and B. So one 16-byte shared load gives a lane
//   a row's x for four MMAs, two give it a column's w for four MMAs;
// - shared rows are XOR-swizzled at 16-byte granularity (x: chunk ^ 4·(row & 1), w: chunk ^
//   (row & 1)) so those loads, and the cp.async stores, are free of bank conflicts.
template <int ROWS, int WARP_ROWS, int STAGES>
struct Shape {
  static constexpr int kRows = ROWS;
  static constexpr int kStages = STAGES;
  static constexpr int kMTiles = WARP_ROWS / 16;    // m16 tiles per warp
  static constexpr int kNTiles = kStagedWRows / 8;  // n8 tiles: hi's 3, then lo's 3
  static constexpr int kThreads = 32 * (ROWS / WARP_ROWS);
  static constexpr int kXStageBytes = ROWS * kXRowBytes;
  static constexpr int kStageBytes = kXStageBytes + kStagedWRows * kWRowBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int kMinBlocks = min_blocks(kSmemBytes);
  static constexpr int kXCopies = ROWS * (kXRowBytes / 16) / kThreads;  // per thread per stage
  static constexpr int kWCopies = kStagedWRows * (kWRowBytes / 16) / kThreads;

  static_assert(WARP_ROWS % 16 == 0 && ROWS % WARP_ROWS == 0, "rows in m16 tiles");
  static_assert(kXCopies * kThreads == ROWS * 8 && kWCopies * kThreads == kStagedWRows * 16,
                "whole 16-byte copies per thread");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "threads");
  static_assert(STAGES >= 2, "a ring of at least two chunks");
};

// d += a·b on a tensor core, fp32 accumulate; a and b are fp32 bit patterns read as TF32.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    hc_mix_partials_kernel(const Params p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int g = lane / 4;  // MMA group: row (A, C) or column (B) within the tile
  const int t = lane % 4;  // thread in group: which 8 physical k of a 32-column group

  const int row0 = blockIdx.x * S::kRows;
  const Slice slice = slice_of(p, blockIdx.y, gridDim.y);

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
    copy_x_rows<S::kXCopies, kXRowStep>(p, base + x_dst, x_src + k0, rows_left);
#pragma unroll
    for (int i = 0; i < S::kWCopies; ++i) {
      copy_w(base + w_dst + i * kWRowStep * kWRowBytes,
             w_source(p, w_row + i * kWRowStep, k0 + w_chunk * 4));
    }
  };

  // ---- fragment addresses (bytes within a stage). A: row g (+8) of each m tile, logical
  // chunk 4q + t of the row. B: staged row g of each n tile, logical chunks 8q + 2t, +1.
  const int warp_row = warp * S::kMTiles * 16;
  uint32_t a_off[2], b_off[2][2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    a_off[q] = (warp_row + g) * kXRowBytes + (((4 * q + t) ^ ((g & 1) << 2)) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      b_off[q][h] = S::kXStageBytes + g * kWRowBytes + (((8 * q + 2 * t + h) ^ (g & 1)) << 4);
    }
  }

  float acc[S::kMTiles][S::kNTiles][4] = {};
  float sq[S::kMTiles][2] = {};  // this lane's Σx² of rows g and g + 8 of each m tile

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < slice.count) load_chunk(s, slice.first + s);
    commit_copies();  // one group per slot, empty or not, so the wait count below holds
  }

  for (int step = 0; step < slice.count; ++step) {
    wait_copies<S::kStages - 2>();  // this thread's copies of chunk `step` have landed
    __syncthreads();  // everyone's have, and everyone is done with chunk step - 1's slot
    const int ahead = step + S::kStages - 1;
    if (ahead < slice.count) load_chunk(ahead % S::kStages, slice.first + ahead);
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

#pragma unroll
  for (int mi = 0; mi < S::kMTiles; ++mi) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {  // tile ni's C registers 2hr, 2hr + 1: row g + 8hr
      float2 hi[3], lo[3];
#pragma unroll
      for (int tile = 0; tile < 3; ++tile) {
        hi[tile] = make_float2(acc[mi][tile][2 * hr], acc[mi][tile][2 * hr + 1]);
        lo[tile] = make_float2(acc[mi][tile + 3][2 * hr], acc[mi][tile + 3][2 * hr + 1]);
      }
      store_partial_row(p, blockIdx.y, row0 + warp_row + mi * 16 + hr * 8 + g, t,
                        quad_sum(sq[mi][hr]), hi, lo);
    }
  }
}

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

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)  // the fused kernel's only
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

// ---- wgmma (sm_90a): a warpgroup owns 64 rows and all 48 staged columns. Per k8 step one
// wgmma m64n48k8 takes A (x as TF32) from registers and B (w) from shared memory, so w is read
// once a warpgroup by the tensor core, not once a warp by the threads, and a chunk is 8
// instructions.
// - Copies: a producer warpgroup (one thread issues) fills the ring with the tensor memory
//   accelerator (TMA: x's [kRows x 64] box, then fn's and lo's [24 x 32] boxes twice), each
//   stage completing on its `full` mbarrier; every consumer warp arrives on the stage's `empty`
//   mbarrier once its wgmma has read it. No CTA-wide barrier in the loop: the warpgroups drift
//   apart and one's shared loads overlap another's tensor-core steps.
// - Inside a warpgroup the chunk goes in halves (k8 steps 0-3, 4-7), each one wgmma group with
//   its own A registers: the loads of a half run while the tensor core multiplies the half
//   before it. The extra A buffer needs more registers than an even share of the file, so the
//   producer gives its registers to the consumers (setmaxnreg).
// - Why: the cp.async kernel this replaced (all threads copying, a CTA barrier a chunk, loads
//   then multiplies in turn) read x at 3.1 TB/s where a copy with its access pattern reads 3.9;
//   this one reads it at 3.5 (docs/results/h200/session8).
// - B is staged as two 32-column atoms a chunk (48 rows x 128 bytes each, fn's 24 then lo's)
//   in the 128-byte swizzle that both TMA writes and the descriptor names: 16-byte unit u of
//   row n at (u ^ (n % 8)); k8 step j reads atom j / 4 from byte 32·(j % 4). w's k order is
//   then the physical one, so A follows it: lane (g, t) of a warp gives columns t and t + 4 of
//   each k8 step of its rows g and g + 8, two bf16 of one 16-byte unit of x, read as its words
//   t / 2 and 2 + t / 2. x's units are in the same swizzle, so the eight rows of a load hit
//   eight different bank groups.
// - Rows past m: the TMA writes zeros for them (and counts their bytes).
// - sqsum: each lane's chain takes its 16 elements of each of its two rows per chunk.
// - Fused (hc_mix_stats_fused: 256 rows a CTA, S <= 8 slices): a row tile's S CTAs are one
//   cluster. After the loop each consumer puts its slice's partial (store_partial_row's bits)
//   into its CTA's tile sums in shared memory; a cluster barrier; CTA s adds the S partials of
//   its ceil(256 / S) rows in slice order, read from the cluster's shared memory; a second
//   barrier (no CTA leaves while another reads its memory); then one thread a row makes the
//   statistics (finish_row). The producer warpgroup only joins the barriers. It saves the
//   partials' round trip through global memory and the finisher's launch, but every cluster
//   must be resident at once: the H200 holds 15 clusters of 8 and 30 of 4, so the op takes it
//   at 1-2 slices only (FUSED_MAX_SPLITS in hc_mix_stats_kernels.py; session 9).

// A register count setmaxnreg and the allocator take: a multiple of 8, at most 248.
constexpr int cap_registers(int registers) { return (registers < 248 ? registers : 248) & ~7; }

template <int WARPGROUPS, int STAGES>
struct WgmmaShape {
  static constexpr int kRows = 64 * WARPGROUPS;
  static constexpr int kConsumerWarps = 4 * WARPGROUPS;
  static constexpr int kThreads = 32 * kConsumerWarps + 128;  // and the producer warpgroup
  static constexpr int kStages = STAGES;
  static constexpr int kAtomBytes = kStagedWRows * 128;  // 32 fp32 columns of the 48 rows
  static constexpr int kWStageBytes = 2 * kAtomBytes;
  static constexpr int kStageBytes = kWStageBytes + kRows * kXRowBytes;     // one stage's TMA bytes
  static constexpr int kSmemBytes = STAGES * kStageBytes + 2 * 8 * STAGES;  // + full, empty
  static constexpr int kMinBlocks = min_blocks(kSmemBytes);
  // The fused kernel's too: the tile's sums [kRows x kSumCols] and the gate parameters.
  static constexpr int kFusedSmemBytes = kSmemBytes + 4 * (kRows * kSumCols + kGateParams);
  // Registers a thread. At launch each gets the __launch_bounds__ cap, an even share of the
  // register file (ptxas takes all of it for a kernel with setmaxnreg; launch_wgmma checks);
  // setmaxnreg then moves all but 32 of the producer's to the consumers, the CTA's total
  // unchanged (an increase beyond it would wait forever).
  static constexpr int kLaunchRegs = cap_registers(65536 / (kThreads * kMinBlocks));
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs =
      cap_registers((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * WARPGROUPS));

  static_assert(kAtomBytes % 1024 == 0 && kStageBytes % 1024 == 0, "swizzle atoms 1024-aligned");
  static_assert(kRows <= 256, "a TMA box spans at most 256 rows");
  static_assert(kConsumerRegs > kLaunchRegs, "the consumers gain registers");
  static_assert(STAGES * kStageBytes >= 4 * kRows * kSumCols, "a rank's totals fit the ring");
};

// What the wgmma kernel reads x, fn and lo through (built on the host for each call).
struct TmaParams {
  CUtensorMap x;   // bf16 [m, K], box [kRows x 64]
  CUtensorMap fn;  // fp32 [24, K], box [24 x 32]
  CUtensorMap lo;  // the same
  Params p;        // part and sqsum unused when fused
  FinishParams f;  // fused only
};

__device__ __forceinline__ void barrier_init(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}

// Blocks until phase `parity` of the barrier has completed.
__device__ __forceinline__ void barrier_wait(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// The producer's arrival, announcing the bytes the stage's copies will complete on it.
__device__ __forceinline__ void barrier_expect_bytes(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
}

// The box of `map` at (column, row) to shared memory at dst, completing on `barrier`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, int column, int row,
                                         uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(column), "r"(row), "r"(barrier)
      : "memory");
}

// The shared-memory matrix descriptor of one k8 step of B: K-major, 128-byte swizzle, 8-row
// groups 1024 bytes apart (the leading byte offset is unused in this layout).
__device__ __forceinline__ uint64_t b_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Keeps the compiler from moving accesses of wgmma's registers across its fences.
__device__ __forceinline__ void pin(float (&d)[24]) {
#pragma unroll
  for (int i = 0; i < 24; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= a·b over one k8 step, a from registers, b through its descriptor; `accumulate` 0
// starts a fresh chain.
__device__ __forceinline__ void wgmma_m64n48k8(float (&d)[24], const uint32_t (&a)[4], uint64_t b,
                                               int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

template <class S, bool FUSED>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    hc_mix_partials_wgmma_kernel(const __grid_constant__ TmaParams tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const Params& p = tp.p;
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int row0 = blockIdx.x * S::kRows;
  const Slice slice = slice_of(p, blockIdx.y, gridDim.y);
  const uint32_t smem_base = shared_addr(smem);
  if ((smem_base & 1023) != 0) __trap();  // the swizzle is of absolute address bits
  const uint32_t full = smem_base + S::kStages * S::kStageBytes;  // stage s: full + 8s
  const uint32_t empty = full + 8 * S::kStages;

  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      barrier_init(full + 8 * s, 1);
      barrier_init(empty + 8 * s, S::kConsumerWarps);
    }
    // Makes the initialised barriers visible to the TMA unit's completions (a CTA is its own
    // cluster here).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= S::kConsumerWarps) {  // the producer: stage step % kStages, use step / kStages
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegs));
    if (warp == S::kConsumerWarps && lane == 0) {
      for (int step = 0; step < slice.count; ++step) {
        const int s = step % S::kStages;
        if (step >= S::kStages) barrier_wait(empty + 8 * s, (step / S::kStages - 1) & 1);
        barrier_expect_bytes(full + 8 * s, S::kStageBytes);
        const uint32_t stage = smem_base + s * S::kStageBytes;
        const int k0 = (slice.first + step) * kBlockK;
        tma_load(stage + S::kWStageBytes, tp.x, k0, row0, full + 8 * s);
#pragma unroll
        for (int atom = 0; atom < 2; ++atom) {
          const uint32_t w = stage + atom * S::kAtomBytes;
          tma_load(w, tp.fn, k0 + 32 * atom, 0, full + 8 * s);
          tma_load(w + kMixCols * 128, tp.lo, k0 + 32 * atom, 0, full + 8 * s);
        }
      }
    }
    if constexpr (FUSED) {  // the epilogue's two cluster barriers, and nothing else
      __syncwarp();
      cluster_sync();
      cluster_sync();
    }
    return;  // no CTA-wide barrier follows
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegs));

  const int g = lane / 4;
  const int t = lane % 4;
  const int my_row = warp * 16 + g;  // this lane's rows of the CTA: my_row and my_row + 8
  // Bytes 2, 3 (t odd) or 0, 1 (t even) of a word to the top, zeros below: a bf16 as fp32.
  const uint32_t to_fp32 = (t & 1) ? 0x3244u : 0x1044u;

  // The A fragments of k8 steps 4h .. 4h + 3 of a stage's x, their squares added to sq2.
  auto load_half = [&](const unsigned char* x_stage, int h, uint32_t (&a)[4][4], float (&sq2)[2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * h + i;  // k8 step j: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        // bf16 t and t + 4 of the unit: half t % 2 of words t / 2 and 2 + t / 2, moved up to
        // fp32 by one byte permutation each.
        const uint32_t* unit = reinterpret_cast<const uint32_t*>(
            x_stage + (my_row + 8 * hr) * kXRowBytes + ((j ^ g) << 4));
        a[i][hr] = __byte_perm(unit[t / 2], 0, to_fp32);
        a[i][2 + hr] = __byte_perm(unit[2 + t / 2], 0, to_fp32);
        const float e0 = __uint_as_float(a[i][hr]);
        const float e1 = __uint_as_float(a[i][2 + hr]);
        sq2[hr] = fmaf(e0, e0, sq2[hr]);
        sq2[hr] = fmaf(e1, e1, sq2[hr]);
      }
    }
  };
  // k8 steps 4h .. 4h + 3 of the chunk's chain (h 0 starts it fresh) as one wgmma group.
  auto issue_half = [&](uint32_t stage, int h, const uint32_t (&a)[4][4], float (&d)[24]) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");  // orders the A registers' writes
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wgmma_m64n48k8(d, a[i], b_descriptor(stage + h * S::kAtomBytes + i * 32), h > 0 || i > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  auto x_stage_of = [&](int step) {
    return smem + (step % S::kStages) * S::kStageBytes + S::kWStageBytes;
  };

  float acc[24] = {};  // n8 block b (hi 0-2, lo 3-5): registers 4b + 2hr (+1), row g + 8hr
  float chunk[24] = {};
  float sq[2] = {};
  // Software pipeline, in halves of a chunk: a half's shared loads run while the tensor core
  // multiplies the half before it (two A buffers; each chunk's chain and its squares' chain
  // keep the order of a kernel without the overlap, so the bits are the same).
  uint32_t a0[4][4], a1[4][4];
  float chunk_sq[2] = {};
  if (slice.count > 0) {
    barrier_wait(full, 0);
    load_half(x_stage_of(0), 0, a0, chunk_sq);
  }
  for (int step = 0; step < slice.count; ++step) {
    const int s = step % S::kStages;
    const uint32_t stage = smem_base + s * S::kStageBytes;
    pin(chunk);
    issue_half(stage, 0, a0, chunk);
    load_half(x_stage_of(step), 1, a1, chunk_sq);
    issue_half(stage, 1, a1, chunk);
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // a0 is free again
    float next_sq[2] = {};
    if (step + 1 < slice.count) {
      barrier_wait(full + 8 * ((step + 1) % S::kStages), ((step + 1) / S::kStages) & 1);
      load_half(x_stage_of(step + 1), 0, a0, next_sq);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    pin(chunk);
    __syncwarp();
    if (lane == 0) barrier_arrive(empty + 8 * s);  // this warp's reads of the stage are done
#pragma unroll
    for (int i = 0; i < 24; ++i) acc[i] += chunk[i];  // IEEE fp32 add
    sq[0] += chunk_sq[0];
    sq[1] += chunk_sq[1];
    chunk_sq[0] = next_sq[0];
    chunk_sq[1] = next_sq[1];
  }

  if constexpr (!FUSED) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float2 hi[3], lo[3];
#pragma unroll
      for (int tile = 0; tile < 3; ++tile) {
        hi[tile] = make_float2(acc[4 * tile + 2 * hr], acc[4 * tile + 2 * hr + 1]);
        lo[tile] = make_float2(acc[4 * tile + 12 + 2 * hr], acc[4 * tile + 12 + 2 * hr + 1]);
      }
      store_partial_row(p, blockIdx.y, row0 + my_row + 8 * hr, t, quad_sum(sq[hr]), hi, lo);
    }
  } else {
    // The slice's partial (the same bits as store_partial_row's) into this CTA's tile sums.
    float* tile_sums = reinterpret_cast<float*>(smem + S::kSmemBytes);  // [kRows][kSumCols]
    float* gate_params = tile_sums + S::kRows * kSumCols;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float* sums = tile_sums + (my_row + 8 * hr) * kSumCols;
#pragma unroll
      for (int tile = 0; tile < 3; ++tile) {
        const int i = 4 * tile + 2 * hr;
        sums[8 * tile + 2 * t] = acc[i] + acc[i + 12];  // IEEE fp32 adds
        sums[8 * tile + 2 * t + 1] = acc[i + 1] + acc[i + 13];
      }
      const float row_sq = quad_sum(sq[hr]);
      if (t == 0) sums[kMixCols] = row_sq;
    }
    const FinishParams& f = tp.f;
    if (tid < kGateParams)
      gate_params[tid] = tid < kMixCols ? f.base[tid] : f.scale[tid - kMixCols];
    cluster_sync();
    // CTA `rank` of the tile's cluster (its slice) finishes rows [rank · per_rank, + per_rank)
    // of the tile: each of their sums adds the slices' values in slice order.
    const int splits = static_cast<int>(gridDim.y);
    const int rank = static_cast<int>(cluster_rank());
    const int per_rank = (S::kRows + splits - 1) / splits;
    const int first = rank * per_rank;
    const int count = max(0, min(per_rank, S::kRows - first));
    float* totals = reinterpret_cast<float*>(smem);  // the ring is free: every stage was read
    for (int i = tid; i < count * kSumCols; i += 32 * S::kConsumerWarps) {
      const uint32_t address = shared_addr(tile_sums + first * kSumCols + i);
      float total = load_from_rank(address, 0);
      for (int source = 1; source < splits; ++source) total += load_from_rank(address, source);
      totals[i] = total;
    }
    cluster_sync();  // the cluster's reads are done (a CTA may exit) and totals are visible
    if (tid < count && row0 + first + tid < p.m) {
      finish_row(f, row0 + first + tid, totals + tid * kSumCols, gate_params);
    }
  }
#else
  __trap();  // never runs: the host launches it on sm_90 only, from sm_90a modules
#endif
}

// Checks every argument and returns the kernel parameters (part.size(0) slices).
// Checks x, fn and lo; returns the kernel parameters without outputs.
Params checked_inputs(const TensorView& x, const TensorView& fn, const TensorView& lo) {
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
  Params p = {};
  p.x = data_as<const __nv_bfloat16>(x);
  p.fn = data_as<const float>(fn);
  p.lo = data_as<const float>(lo);
  p.x_stride = x.stride(0);
  p.m = static_cast<int>(m);
  p.k = static_cast<int>(k);
  return p;
}

// Checks every argument of the partials' entry and returns the kernel parameters (part.size(0)
// slices).
Params checked_params(const TensorView& x, const TensorView& fn, const TensorView& lo,
                      const TensorView& part, const TensorView& sqsum) {
  Params p = checked_inputs(x, fn, lo);
  const int device = x.device().device_id;
  check_tensor(part, "part", {kAnySize, p.m, kPartCols}, {kFloat32}, device, Layout::kContiguous,
               8);
  const int64_t splits = part.size(0);
  if (splits < 1 || splits > 65535) {
    TVM_FFI_THROW(ValueError) << "part: S = " << splits << " must be in 1..65535";
  }
  check_tensor(sqsum, "sqsum", {splits, p.m}, {kFloat32}, device, Layout::kContiguous);
  p.part = data_as<float>(part);
  p.sqsum = data_as<float>(sqsum);
  return p;
}

// Kernel on its parameters, grid (ceil(m / kRows), splits), on tvm-ffi's stream (m > 0); with
// `cluster`, each column of `splits` CTAs (a row tile's slices) is one cluster.
template <class S, auto Kernel, class P>
void launch(const P& params, int m, int splits, int device, const char* name, int smem_bytes,
            bool cluster = false) {
  // The opt-in above 48 KB of shared memory.
  set_attribute_at_least<Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(smem_bytes, device,
                                                                              name);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((m + S::kRows - 1) / S::kRows, splits, 1);
  config.blockDim = dim3(S::kThreads, 1, 1);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = env_stream(device);
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = static_cast<unsigned>(splits);
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, Kernel, params);
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << name << " launch failed: " << cudaGetErrorString(err);
  }
}

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry,
                                                             12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry)
               : nullptr;
  }();
  if (encode == nullptr) TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled is not available";
  return encode;
}

// A row-major [rows, columns] tensor (rows row_bytes apart) read in [box_rows x box_columns]
// boxes in the 128-byte swizzle, rows past the end read as zeros.
CUtensorMap tile_map(const void* base, CUtensorMapDataType type, uint64_t columns, uint64_t rows,
                     uint64_t row_bytes, uint32_t box_columns, uint32_t box_rows,
                     const char* name) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {columns, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_columns, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult err = tensor_map_encoder()(
      &map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (err != CUDA_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << name << ": cuTensorMapEncodeTiled failed (" << err << ")";
  }
  return map;
}

// The wgmma kernel; FUSED: the statistics too (f), each row tile's `splits` CTAs one cluster.
template <class S, bool FUSED>
void launch_wgmma(const Params& p, const FinishParams& f, int splits, int device) {
  // setmaxnreg's hand-over assumes the registers a thread the build gave the kernel (the
  // __launch_bounds__ cap, all of which ptxas takes for such a kernel); with fewer, the
  // consumers' increase would never be granted. Asked until the runtime answers.
  static std::atomic<int> launch_regs{0};
  if (launch_regs.load() == 0) {
    cudaFuncAttributes attributes = {};
    const cudaError_t err =
        cudaFuncGetAttributes(&attributes, hc_mix_partials_wgmma_kernel<S, FUSED>);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not left for a later launch's check
      TVM_FFI_THROW(RuntimeError) << "hc_mix_partials_wgmma: " << cudaGetErrorString(err);
    }
    launch_regs.store(attributes.numRegs);
  }
  if (launch_regs.load() != S::kLaunchRegs) {
    TVM_FFI_THROW(RuntimeError) << "hc_mix_partials_wgmma: built with " << launch_regs.load()
                                << " registers a thread, its register hand-over assumes "
                                << S::kLaunchRegs;
  }
  const uint64_t w_row_bytes = static_cast<uint64_t>(p.k) * 4;
  TmaParams tp;
  // One row's stride is never read: a whole-row box stands in for it.
  tp.x = tile_map(p.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.k, p.m,
                  2 * static_cast<uint64_t>(p.m > 1 ? p.x_stride : p.k), kBlockK, S::kRows, "x");
  tp.fn = tile_map(p.fn, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.k, kMixCols, w_row_bytes, 32, kMixCols,
                   "fn");
  tp.lo = tile_map(p.lo, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.k, kMixCols, w_row_bytes, 32, kMixCols,
                   "lo");
  tp.p = p;
  tp.f = f;
  launch<S, hc_mix_partials_wgmma_kernel<S, FUSED>>(
      tp, p.m, splits, device, FUSED ? "hc_mix_stats_fused" : "hc_mix_partials_wgmma",
      FUSED ? S::kFusedSmemBytes : S::kSmemBytes, FUSED);
}

// The launch shapes: 128 rows a CTA and two CTAs an SM (mma.sync: 4 warps of 32 rows, the
// fastest of the H200 sweep at 4096 and 16384 rows; wgmma: two consumer warpgroups), or for
// wgmma 256 rows and one CTA an SM (four: w's copies per row halve). 4 stages each. On the H200
// (session 8) the wgmma pair is within 4 % of the best of 2-4 warpgroups and 3-6 stages at
// every row count from 512 to 65536.
using SyncShape = Shape<128, 32, 4>;
using WgmmaShape128 = WgmmaShape<2, 4>;
using WgmmaShape256 = WgmmaShape<4, 4>;
constexpr int kMaxClusterSlices = 8;  // the portable cluster size
static_assert(WgmmaShape256::kFusedSmemBytes + kSmemPerCta <= kSmemPerSm, "fused: one CTA an SM");

// The wgmma kernel's conditions: sm_90, and x's rows apart (a tensor map cannot overlap them).
void check_wgmma(const Params& p, int device) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) TVM_FFI_THROW(ValueError) << "wgmma: the kernel runs on sm_90 only";
  if (p.m > 1 && p.x_stride < p.k) {
    TVM_FFI_THROW(ValueError) << "x: rows overlap (row stride " << p.x_stride << " < K = " << p.k
                              << "); the wgmma kernel reads x through a tensor map";
  }
}

}  // namespace

// x: bf16 [m, K] (last-dim stride 1, 16-byte aligned rows, K % 64 == 0); fn and its TF32
// residual lo: fp32 [24, K] each; part: fp32 [S, m, 32]; sqsum: fp32 [S, m] (all four
// contiguous, fn and lo 16-byte aligned). wgmma: the Hopper kernel (sm_90 only), else the
// mma.sync one. rows_per_cta: 128, or 256 with wgmma. Writes every row < m of every slice; the
// grid is (ceil(m / rows_per_cta), S).
void hc_mix_partials_tf32(TensorView x, TensorView fn, TensorView lo, TensorView part,
                          TensorView sqsum, bool wgmma, int64_t rows_per_cta) {
  const Params p = checked_params(x, fn, lo, part, sqsum);
  const int device = x.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const int splits = static_cast<int>(part.size(0));
  if (!(rows_per_cta == 128 || (wgmma && rows_per_cta == 256))) {
    TVM_FFI_THROW(ValueError) << "rows_per_cta: " << rows_per_cta
                              << " is not 128, or 256 with wgmma";
  }
  if (wgmma) check_wgmma(p, device);
  if (p.m == 0) return;  // nothing to write (and no tensor map has zero rows)
  if (!wgmma) {
    launch<SyncShape, hc_mix_partials_kernel<SyncShape>>(p, p.m, splits, device, "hc_mix_partials",
                                                         SyncShape::kSmemBytes);
  } else if (rows_per_cta == 128) {
    launch_wgmma<WgmmaShape128, false>(p, FinishParams{}, splits, device);
  } else {
    launch_wgmma<WgmmaShape256, false>(p, FinishParams{}, splits, device);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_partials_tf32, hc_mix_partials_tf32);

// The whole statistics in one launch on sm_90 (the wgmma kernel at 256 rows a CTA, fused): x,
// fn, lo as above; scale fp32 [3], base fp32 [24]; pre, post fp32 [m, 4], comb fp32 [m, 4, 4],
// mix fp32 [m, 24] (contiguous, 16-byte aligned). splits: S = 1..8 K slices, the CTAs of a
// cluster; rms_eps, eps, post_mult, iters (1..1000): V4's 1e-6, 1e-6, 2.0, 20. Each slice's
// partial is the partials entry's, bit for bit; the S CTAs of a row tile exchange them through
// distributed shared memory after a cluster barrier, each row's sums adding the slices in
// order, and CTA s finishes rows [s, s + 1) · ceil(256 / S) of the tile: no partials in global
// memory and no second launch.
void hc_mix_stats_fused(TensorView x, TensorView fn, TensorView lo, TensorView scale,
                        TensorView base, TensorView pre, TensorView post, TensorView comb,
                        TensorView mix, int64_t splits, double rms_eps, double eps,
                        double post_mult, int64_t iters) {
  const Params p = checked_inputs(x, fn, lo);
  const int device = x.device().device_id;
  const int64_t m = p.m;
  check_tensor(scale, "scale", {3}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(base, "base", {kMixCols}, {kFloat32}, device, Layout::kContiguous);
  check_tensor(pre, "pre", {m, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(post, "post", {m, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(comb, "comb", {m, 4, 4}, {kFloat32}, device, Layout::kContiguous, 16);
  check_tensor(mix, "mix", {m, kMixCols}, {kFloat32}, device, Layout::kContiguous, 16);
  if (splits < 1 || splits > kMaxClusterSlices) {
    TVM_FFI_THROW(ValueError) << "splits: " << splits << " is not in 1.." << kMaxClusterSlices;
  }
  if (iters < 1 || iters > 1000) {
    TVM_FFI_THROW(ValueError) << "iters: " << iters << " is not in 1..1000";
  }
  tvm::ffi::CUDADeviceGuard guard(device);
  check_wgmma(p, device);
  if (m == 0) return;
  FinishParams f;
  f.scale = data_as<const float>(scale);
  f.base = data_as<const float>(base);
  f.pre = data_as<float>(pre);
  f.post = data_as<float>(post);
  f.comb = data_as<float>(comb);
  f.mix = data_as<float>(mix);
  f.iters = static_cast<int>(iters);
  f.k = static_cast<float>(p.k);
  f.rms_eps = static_cast<float>(rms_eps);
  f.eps = static_cast<float>(eps);
  f.post_mult = static_cast<float>(post_mult);
  launch_wgmma<WgmmaShape256, true>(p, f, static_cast<int>(splits), device);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_mix_stats_fused, hc_mix_stats_fused);
