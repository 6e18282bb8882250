// The mHC projection's wgmma kernel (sm_90a; hc_mix_stats.cu), fused with the statistics or not:
// TMA copies by a producer warpgroup, TF32 wgmma by the consumers.
//
// In the unnamed namespace, as every symbol of the one translation unit that includes it
// (hc_mix_stats.cu).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "hc_mix_stats_common.cuh"
#include "hc_mix_stats_finish.cuh"

namespace {

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
//   then multiplies in turn) read x well below what a copy with its access pattern reads; this
//   one comes much closer to it.
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
//   at 1-2 slices only (FUSED_MAX_SPLITS in hc_mix_stats_plan.py).

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

}  // namespace
