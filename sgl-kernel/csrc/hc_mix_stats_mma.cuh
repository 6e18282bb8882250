// The mHC projection's mma.sync kernel (sm_80+; hc_mix_stats.cu): cp.async copies into a ring
// of shared-memory stages, TF32 m16n8k8 MMAs.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (hc_mix_stats.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hc_mix_stats_common.cuh"

namespace {

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

}  // namespace
