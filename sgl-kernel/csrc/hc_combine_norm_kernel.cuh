// The mHC combine + RMSNorm kernel (optionally with SGLang's post before it, and a quantization
// of the normed row after it) and its launch, shared by hc_combine_norm.cu and
// hc_post_combine_norm.cu: one template, so that a row normed by either module has the same
// bits for the same launch shape. hc_combine_norm.cu's header states the contract, the
// reduction order and the MXFP8 epilogue; hc_post_combine_norm.cu's what the post and the FP8
// groups add.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>

#include <cstdint>

#include "cluster_exchange.cuh"
#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "group_quant_ue8m0.cuh"
#include "hc_combine_norm_row.cuh"
#include "hc_post_row.cuh"
#include "tensor_view.cuh"

namespace combine_norm {

constexpr int kStreams = 4;
constexpr int kVec = 8;        // bf16 values per 16-byte vector
constexpr int kBlock = 32;     // values per scale: an MXFP8 block, an FP8 group
constexpr int kMaxItems = 5;   // vectors per thread and CTA
constexpr int kMaxSlots = 64;  // cluster CTAs x warps
constexpr int kPadWords = 8;   // scale-padding words per thread of a padding CTA
constexpr int kMaxRows = 1 << 24;
// The most row CTAs (rows x cluster, padding CTAs aside) whose grid lets the next launch start
// early (one wave by the calculator too): on the H200 the early start was faster up to 96 rows in
// clusters of 4 and slower at 128 (512 CTAs, which the occupancy test let through).
constexpr int kEarlyStartMaxRowCtas = 384;
constexpr uint32_t kRcp448 = 0x3B124925u;  // rcp.approx.ftz(448) = RN(1/448)

// What the kernel writes after the normed row y: nothing; its MXFP8 quantization (e4m3 data
// and 128x4-swizzled UE8M0 scales, FlashInfer's); or its e4m3 groups of 32 with power-of-two
// fp32 scales, row-major (SGLang's per-token-group quantizer with scale_ue8m0:
// group_quant_ue8m0.cuh). Both quantize the stored bf16 y.
enum class Epilogue { kNone, kMxfp8, kGroups };

// The most threads a CTA may have for ITEMS vectors a thread (its register budget; the post's
// inputs and coefficients take about 40 more registers at one vector a thread).
constexpr int max_threads(int items, bool post) {
  return items == 1 ? (post ? 640 : 1024) : items == 2 ? 512 : 256;
}

struct Params {
  const uint16_t* x;  // bf16 bits (not read with POST: the post's result takes its place)
  const float* pre;
  const uint16_t* weight;
  uint16_t* y;
  uint8_t* data;         // the e4m3 codes of either quantization
  uint8_t* scales;       // kMxfp8: the swizzled UE8M0 scales
  float* group_scales;   // kGroups: [rows, H / 32] fp32, contiguous
  int64_t x_row_stride;  // elements
  int64_t pre_row_stride;
  int64_t pre_col_stride;
  int64_t y_row_stride;
  int64_t data_row_stride;
  int rows;
  int h;
  int cta_vecs;     // 16-byte vectors of a row per CTA: H / C / 8
  int cols;         // scale columns H / 32
  int padded_cols;  // rup(cols, 4)
  float h_float;
  float eps;
  bool one_wave;  // the grid is resident at once: let the next launch start early
  // With POST (hc_post_combine_norm.cu): the post's inputs, and its result written out.
  const uint16_t* sublayer;  // [m, H] bf16, rows sublayer_row_stride apart
  const uint16_t* residual;  // [m, 4, H] bf16, contiguous
  const float* post_mix;     // [m, 4], contiguous
  const float* comb;         // [m, 4, 4], contiguous
  uint16_t* updated;         // [m, 4, H] bf16, contiguous
  int64_t sublayer_row_stride;
};

// Zeroes the words of the last 128-row scale tile that belong to rows >= p.rows (which is not
// a multiple of 128): word i of a 512-byte column group holds tile row i/4 + 32·(i%4).
__device__ inline void zero_padding_rows(const Params& p, unsigned pad_cta) {
  const unsigned tile_rows = static_cast<unsigned>(p.rows) % 128u;
  uint32_t* tile = reinterpret_cast<uint32_t*>(p.scales + static_cast<int64_t>(p.rows / 128) * 128 *
                                                              p.padded_cols);
  const unsigned words = 32u * static_cast<unsigned>(p.padded_cols);
  const unsigned first = pad_cta * blockDim.x * kPadWords + threadIdx.x;
#pragma unroll
  for (unsigned j = 0; j < kPadWords; ++j) {
    const unsigned word = first + j * blockDim.x;
    const unsigned in_group = word % 128u;
    if (word < words && in_group / 4u + 32u * (in_group % 4u) >= tile_rows) tile[word] = 0u;
  }
}

template <int C, int ITEMS, Epilogue E, bool POST>
__global__ void __launch_bounds__(max_threads(ITEMS, POST))
    hc_combine_norm_kernel(const __grid_constant__ Params p) {
  constexpr bool QUANTIZE = E == Epilogue::kMxfp8;
  static_assert(!(QUANTIZE && POST), "the post's form has no MXFP8 epilogue");
  __shared__ float slots[kMaxSlots];
  __shared__ alignas(8) uint64_t arrived;  // the exchange's mbarrier (C > 1)
  const int cluster = static_cast<int>(blockIdx.x) / C;
  wait_for_previous_grid();  // a dependent launch: no global access before
  if (p.one_wave) allow_next_grid();
  if (cluster >= p.rows) {  // a padding CTA (only launched with QUANTIZE)
    if constexpr (QUANTIZE) zero_padding_rows(p, blockIdx.x - static_cast<unsigned>(p.rows * C));
    return;
  }
  // The cluster barrier, arrived at now and waited on before the first remote store, so that no
  // CTA writes into the shared memory of one that has not started (or not set up `arrived`).
  if constexpr (C > 1) {
    if (threadIdx.x == 0) init_exchange(&arrived);
    cluster_arrive_relaxed();
  }

  const int rank = static_cast<int>(blockIdx.x) % C;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = tid % 32, warp = tid / 32;
  const int64_t row = cluster;
  const int col0 = rank * (p.h / C);

  // ---- every load first (with POST, x's rows are the residual's: the post's input streams)
  const uint16_t* x_row =
      POST ? p.residual + row * kStreams * p.h + col0 : p.x + row * p.x_row_stride + col0;
  const float* pre_row = p.pre + row * p.pre_row_stride;
  float gate[kStreams];
#pragma unroll
  for (int s = 0; s < kStreams; ++s) gate[s] = __ldg(pre_row + s * p.pre_col_stride);
  float post_c[kStreams] = {}, comb[kStreams * kStreams] = {};
  uint4 yv[ITEMS] = {};
  if constexpr (POST) {
#pragma unroll
    for (int c = 0; c < kStreams; ++c) post_c[c] = __ldg(p.post_mix + row * kStreams + c);
#pragma unroll
    for (int j = 0; j < kStreams * kStreams; ++j) {
      comb[j] = __ldg(p.comb + row * kStreams * kStreams + j);
    }
  }
  uint4 xv[ITEMS][kStreams];
  uint4 wv[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int v = k * threads + tid;
    if (v < p.cta_vecs) {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        xv[k][s] = __ldg(reinterpret_cast<const uint4*>(x_row + s * p.h + v * kVec));
      }
      if constexpr (POST) {
        yv[k] = __ldg(reinterpret_cast<const uint4*>(p.sublayer + row * p.sublayer_row_stride +
                                                     col0 + v * kVec));
      }
      wv[k] = __ldg(reinterpret_cast<const uint4*>(p.weight + col0 + v * kVec));
    } else {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) xv[k][s] = make_uint4(0u, 0u, 0u, 0u);
      wv[k] = make_uint4(0u, 0u, 0u, 0u);
    }
  }

  // ---- the post: the updated streams, stored, replace the input streams (idle vectors keep
  // their zeros: a post of zeros with infinite coefficients would be NaN)
  if constexpr (POST) {
    uint16_t* updated_row = p.updated + row * kStreams * p.h + col0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int v = k * threads + tid;
      if (v < p.cta_vecs) {
        uint4 out[kStreams];
#pragma unroll
        for (int c = 0; c < kStreams; ++c) out[c] = post_vector(yv[k], xv[k], post_c[c], comb, c);
#pragma unroll
        for (int c = 0; c < kStreams; ++c) {
          xv[k][c] = out[c];
          *reinterpret_cast<uint4*>(updated_row + c * p.h + v * kVec) = out[c];
        }
      }
    }
  }

  // ---- combine, round to bf16, the thread's squares in column order
  uint32_t xin[ITEMS][4];  // bf16x2 words of x_in
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) combine_vector(xv[k], gate, xin[k], ss);

  // ---- the row's sum of squares (see the reduction order above)
  ss = warp_sum(ss);
  const int warps = threads / 32;
  if constexpr (C == 1) {
    if (lane == 0) slots[warp] = ss;
    __syncthreads();
  } else {
    cluster_wait();
    if (tid == 0) expect_bytes(&arrived, static_cast<uint32_t>(C * warps * sizeof(float)));
    if (lane < C) send_to_rank(&slots[rank * warps + warp], &arrived, lane, __float_as_uint(ss));
    wait_exchange(&arrived);
  }
  const float total = sum_slots(slots, C * warps, lane);
  const float inv = div_rn(1.0f, sqrt_rn(add_rn(div_rn(total, p.h_float), p.eps)));

  // ---- y = bf16((x_in · inv) · w)
  uint32_t yw[ITEMS][4];
  uint32_t keys[ITEMS][4];
  uint32_t top = 0u;  // per half, the largest key of the thread (unsigned: NaN keys are largest)
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) normalize_vector(xin[k], inv, wv[k], yw[k], keys[k], top);
  const bool nonfinite = any_nonfinite(top);
  if (nonfinite) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) canonical_nans(yw[k], keys[k]);
  }
  uint16_t* y_row = p.y + row * p.y_row_stride + col0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int v = k * threads + tid;
    if (v < p.cta_vecs) {
      *reinterpret_cast<uint4*>(y_row + v * kVec) =
          make_uint4(yw[k][0], yw[k][1], yw[k][2], yw[k][3]);
    }
  }

  if constexpr (QUANTIZE) {
    uint8_t* data_row = p.data + row * p.data_row_stride + col0;
    const int64_t scale_row =
        (row / 128) * 128 * p.padded_cols + (row % 32) * 16 + (row % 128) / 32 * 4;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      // Per half (low: even positions, high: odd), the block's largest signed key: shuffles stay
      // inside the block's 4 lanes, run by every lane (idle vectors hold zeros).
      uint32_t block =
          max_s16x2(max_s16x2(keys[k][0], keys[k][1]), max_s16x2(keys[k][2], keys[k][3]));
      block = max_s16x2(block, __shfl_xor_sync(0xffffffffu, block, 1));
      block = max_s16x2(block, __shfl_xor_sync(0xffffffffu, block, 2));
      const int even_key = static_cast<int16_t>(block & 0xFFFFu);
      const int odd_key = static_cast<int>(block) >> 16;
      const float vmax =
          __uint_as_float(static_cast<uint32_t>(max(even_key, odd_key) - 0x7F) << 16);
      const uint32_t s = __float_as_uint(mul_rn(vmax, __uint_as_float(kRcp448)));
      const int s_exp = static_cast<int>((s >> 23) & 0xFFu);
      int scale = s_exp == 0 ? 0 : min(s_exp + ((s & 0x7FFFFFu) != 0u ? 1 : 0), 254);
      if (odd_key < 0) scale = 255;  // every odd position NaN
      uint32_t osc_bits =
          scale == 0 || scale >= 254 ? 0u : static_cast<uint32_t>(254 - scale) << 23;
      if (scale == 255) osc_bits = 0x7FC00000u;
      const float osc = __uint_as_float(osc_bits);

      uint32_t codes[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t pair[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t w = yw[k][2 * half + j];
          float lo = mul_ftz(bf16_lo(w), osc);
          float hi = mul_ftz(bf16_hi(w), osc);
          if (nonfinite) {
            lo = lo != lo ? 448.0f : lo;
            hi = hi != hi ? 448.0f : hi;
          }
          pair[j] = e4m3x2_rn(lo, hi);
        }
        codes[half] = pair[0] | (pair[1] << 16);
      }
      const int v = k * threads + tid;
      if (v < p.cta_vecs) {
        *reinterpret_cast<uint2*>(data_row + v * kVec) = make_uint2(codes[0], codes[1]);
        if (lane % 4 == 0) {
          const int col = col0 / kBlock + v / 4;
          p.scales[scale_row + (col / 4) * 512 + col % 4] = static_cast<uint8_t>(scale);
        }
      }
    }
    if (rank == C - 1 && tid < p.padded_cols - p.cols) {
      const int col = p.cols + tid;
      p.scales[scale_row + (col / 4) * 512 + col % 4] = 0;
    }
  }

  if constexpr (E == Epilogue::kGroups) {
    // A group is 4 vectors v ≡ 0..3 (mod 4) of 4 adjacent lanes (threads and H / C are
    // multiples of 32, so v % 4 == lane % 4); idle vectors fill whole groups, never stored.
    uint8_t* data_row = p.data + row * p.data_row_stride + col0;
    float* scale_row = p.group_scales + row * p.cols + col0 / kBlock;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float scale;
      const uint2 codes = e4m3_codes_of_words<kBlock>(yw[k], scale);
      const int v = k * threads + tid;
      if (v < p.cta_vecs) {
        *reinterpret_cast<uint2*>(data_row + v * kVec) = codes;
        if (lane % (kBlock / kVec) == 0) scale_row[v / (kBlock / kVec)] = scale;
      }
    }
  }
}

template <int C, int ITEMS, Epilogue E, bool POST>
void launch(Params p, int threads, cudaStream_t stream) {
  const int words = 32 * p.padded_cols;  // of one 128-row scale tile
  const int per_cta = threads * kPadWords;
  const int pad_ctas = E == Epilogue::kMxfp8 && p.rows % 128 != 0
                           ? ((words + per_cta - 1) / per_cta + C - 1) / C * C
                           : 0;
  const int ctas = p.rows * C + pad_ctas;
  p.one_wave = p.rows * C <= kEarlyStartMaxRowCtas &&
               one_wave(hc_combine_norm_kernel<C, ITEMS, E, POST>, ctas, threads, 0, C);
  launch_in_clusters(POST ? "hc_post_combine_norm" : "hc_combine_norm",
                     hc_combine_norm_kernel<C, ITEMS, E, POST>, dim3(static_cast<unsigned>(ctas)),
                     dim3(static_cast<unsigned>(threads)), C,
                     /*dependent=*/true, stream, p);
}

template <int C, Epilogue E, bool POST>
void launch_items(const Params& p, int threads, int items, cudaStream_t stream) {
  switch (items) {
    case 1:
      return launch<C, 1, E, POST>(p, threads, stream);
    case 2:
      return launch<C, 2, E, POST>(p, threads, stream);
    case 3:
      return launch<C, 3, E, POST>(p, threads, stream);
    case 4:
      return launch<C, 4, E, POST>(p, threads, stream);
    case 5:
      return launch<C, 5, E, POST>(p, threads, stream);
    default:
      TVM_FFI_THROW(ValueError) << "combine + norm: " << items << " vectors a thread > "
                                << kMaxItems;
  }
}

template <Epilogue E, bool POST>
void launch_cluster(const Params& p, int cluster, int threads, int items, cudaStream_t stream) {
  switch (cluster) {
    case 1:
      return launch_items<1, E, POST>(p, threads, items, stream);
    case 2:
      return launch_items<2, E, POST>(p, threads, items, stream);
    case 4:
      return launch_items<4, E, POST>(p, threads, items, stream);
    default:
      TVM_FFI_THROW(ValueError) << "cluster = " << cluster << " must be 1, 2 or 4";
  }
}

// ---- host side

// Checks the arguments every form shares (ValueError naming the first that is off): the shape
// (m rows of width H in 4 streams; `what` names the tensor that gave them), pre, weight and the
// normed output y (named `y_name`), and the cluster; fills their fields of the kernel parameters.
inline Params common_params(const char* what, int64_t m, int64_t h, int device,
                            const tvm::ffi::TensorView& pre, const tvm::ffi::TensorView& weight,
                            const tvm::ffi::TensorView& y, const char* y_name, double eps,
                            int64_t cluster) {
  if (cluster != 1 && cluster != 2 && cluster != 4) {
    TVM_FFI_THROW(ValueError) << "cluster = " << cluster << " must be 1, 2 or 4";
  }
  if (m > kMaxRows) TVM_FFI_THROW(ValueError) << what << ": m = " << m << " rows > " << kMaxRows;
  if (h > (int64_t{1} << 24)) TVM_FFI_THROW(ValueError) << what << ": H = " << h << " > 2^24";
  if (h <= 0 || h % (int64_t{kBlock} * cluster) != 0) {
    TVM_FFI_THROW(ValueError) << what << ": H = " << h
                              << " must be a positive multiple of 32 * cluster = "
                              << kBlock * cluster;
  }
  check_tensor(pre, "pre", {m, kStreams}, {kFloat32}, device);
  check_tensor(weight, "weight", {h}, {kBfloat16}, device, Layout::kRows, 16);
  check_tensor(y, y_name, {m, h}, {kBfloat16}, device, Layout::kRows, 16);
  Params p{};
  p.pre = data_as<const float>(pre);
  p.weight = data_as<const uint16_t>(weight);
  p.y = data_as<uint16_t>(y);
  p.pre_row_stride = pre.stride(0);
  p.pre_col_stride = pre.stride(1);
  p.y_row_stride = y.stride(0);
  p.rows = static_cast<int>(m);
  p.h = static_cast<int>(h);
  p.cta_vecs = static_cast<int>(h / cluster / kVec);
  p.cols = static_cast<int>(h / kBlock);
  p.padded_cols = (p.cols + 3) / 4 * 4;
  p.h_float = static_cast<float>(h);
  p.eps = static_cast<float>(eps);
  return p;
}

// The FP8 groups' outputs (Epilogue::kGroups) into p, whose rows and H are set: q [rows, H]
// (1-byte, contiguous, 16-byte aligned) and q_scales fp32 [rows, H / 32] (contiguous), or both
// with no rows: no groups (returns false). ValueError naming the one that is off.
inline bool groups_params(Params& p, const tvm::ffi::TensorView& q,
                          const tvm::ffi::TensorView& q_scales, int device) {
  const bool groups = fp8_groups_given<kBlock>(q, q_scales, p.rows, p.h, device);
  if (groups) {
    p.data = data_as<uint8_t>(q);
    p.data_row_stride = p.h;
    p.group_scales = data_as<float>(q_scales);
  }
  return groups;
}

// Checks the launch shape against the row (ValueError) and launches on tvm-ffi's stream for
// `device`.
template <Epilogue E, bool POST>
void run_checked(const Params& p, int device, int64_t cluster, int64_t threads) {
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    TVM_FFI_THROW(ValueError) << "threads = " << threads << " must be a multiple of 32 up to 1024";
  }
  const int items = static_cast<int>((p.cta_vecs + threads - 1) / threads);
  if (items > kMaxItems || threads > max_threads(items, POST)) {
    TVM_FFI_THROW(ValueError) << "threads = " << threads << " with cluster = " << cluster
                              << " gives " << items << " vectors a thread (at most " << kMaxItems
                              << ", and at most " << max_threads(items, POST) << " threads with "
                              << items << ")";
  }
  if (p.rows == 0) return;
  tvm::ffi::CUDADeviceGuard guard(device);
  launch_cluster<E, POST>(p, static_cast<int>(cluster), static_cast<int>(threads), items,
                          env_stream(device));
}

}  // namespace combine_norm
