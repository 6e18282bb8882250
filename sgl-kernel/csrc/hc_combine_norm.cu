// mHC combine + RMSNorm (and optionally its MXFP8 quantization), one row per thread-block cluster.
//
// Why: at decode sizes (m = 1..128 rows, H = 5120) the Triton kernel, one CTA per row, is bound by
// instruction issue (about 1300 SASS instructions a thread for 20 values). Here a row is split
// over a cluster of C CTAs (C = 1, 2 or 4): CTA `rank` owns columns [rank·H/C, (rank+1)·H/C), so
// each CTA issues 1/C of the work, and the row's sum of squares is combined through distributed
// shared memory. A thread owns ITEMS 16-byte vectors (8 columns each): vector v = k·threads + tid
// of its CTA's columns for k < ITEMS (consecutive threads read consecutive 16 bytes of each of the
// 4 streams), so a 32-value MXFP8 block lies in 4 consecutive lanes. Every global load (x, pre,
// weight) is issued before the first reduction; the whole row lives in registers.
//
// Contract (bitwise; x [m, 4H] bf16, pre [m, 4] fp32, weight [H] bf16, H % (32·C) == 0):
//   x_in[h] = bf16_rn(((p0·x0[h] + p1·x1[h]) + p2·x2[h]) + p3·x3[h]), xs[h] = x[r, s·H + h], each
//             product and sum one fp32 rounding (mul.rn / add.rn in PTX: no FMA, no flush);
//   ss      = Σ x_in² in fp32 (each square exact), in the fixed order below;
//   inv     = div.rn(1, sqrt.rn(add.rn(div.rn(ss, H), eps)));
//   y[h]    = bf16_rn(mul.rn(mul.rn(x_in[h], inv), w[h]));
//   bf16_rn is round to nearest even (cvt.rn.bf16x2.f32) with every NaN stored as 0x7FC0.
// With quantize, per 32-value block of y (FlashInfer's cuda backend, as mxfp8_encode_blocks in
// mxfp8_quantize.py with HW_CVT): NaN-ignoring integer maxima of |y| over the even and the odd
// positions, vmax = max of the two, S = mul.rn(vmax, 0x3B124925); scale = S's exponent field E,
// 0 if E == 0, else min(E + (mantissa != 0), 254); 255 if every odd position is NaN; osc =
// 2^(127 - scale) (0 for scale 0 and 254, NaN for 255); code = cvt.rn.satfinite.e4m3x2.f32 of
// mul.rn.ftz(y, osc), NaN products replaced by +448. Scales go to the 128x4 swizzled buffer of
// rup(m, 128) x rup(H/32, 4) bytes; every byte is written (padding columns and rows 0).
//
// Reduction order of ss (fixed by H, C and the thread count; never by m or the row's position,
// so rows are batch-invariant, and the same with or without quantize):
//   1. a thread adds its squares to +0 in column order (item k = 0.., within it 8 columns);
//   2. a butterfly over the warp (shfl_xor 16, 8, 4, 2, 1): every lane ends with the same bits;
//   3. the warp sums of the cluster are slots n = rank·warps + warp (n < N = C·warps): each CTA
//      gets all N in its shared memory (lane j < C of each warp stores its warp's sum into CTA j
//      by st.async, completing on CTA j's mbarrier; with C = 1 a plain store and
//      __syncthreads); then every warp sums them: lane l takes slot l (+0 for l >= N), plus
//      slot l + 32 when N > 32, then a butterfly over the warp as in 2. Every CTA of the
//      cluster thus computes the identical ss. (The lanes >= N add +0, so this is the same
//      sum, bit for bit, as a butterfly over N rounded up to a power of two.)
// Adding +0 never changes a sum of squares, so idle vectors (past the CTA's columns) are
// computed on zeros and only their stores are skipped.
//
// Padding of the scale buffer: in the 128x4 layout each 4-byte word holds one row's 4
// consecutive scale columns, so extra CTAs after the row clusters zero the words of the last
// 128-row tile that belong to rows >= m; the last CTA of each row cluster writes the row's
// padding columns [H/32, rup(H/32, 4)).
//
// Launch: grid (m·C + padding CTAs), cluster (C, 1, 1), a programmatic dependent launch (as
// SGLang's own kernels on Hopper; every CTA waits for the previous kernel before its first global
// access, and a grid of one wave lets the next launch start at once), on tvm-ffi's stream for x's
// device; no allocation, no host sync (CUDA-graph capturable).

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_exchange.cuh"
#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "fp32_ops.cuh"
#include "hc_combine_norm_row.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kStreams = 4;
constexpr int kVec = 8;        // bf16 values per 16-byte vector
constexpr int kBlock = 32;     // values per MXFP8 scale
constexpr int kMaxItems = 5;   // vectors per thread and CTA
constexpr int kMaxSlots = 64;  // cluster CTAs x warps
constexpr int kPadWords = 8;   // scale-padding words per thread of a padding CTA
constexpr int kMaxRows = 1 << 24;
// The most row CTAs (rows x cluster, padding CTAs aside) whose grid lets the next launch start
// early (one wave by the calculator too): on the H200 the early start was faster up to 96 rows in
// clusters of 4 and slower at 128 (512 CTAs, which the occupancy test let through).
constexpr int kEarlyStartMaxRowCtas = 384;
constexpr uint32_t kRcp448 = 0x3B124925u;  // rcp.approx.ftz(448) = RN(1/448)

// The most threads a CTA may have for ITEMS vectors a thread (its register budget).
constexpr int max_threads(int items) { return items == 1 ? 1024 : items == 2 ? 512 : 256; }

struct Params {
  const uint16_t* x;  // bf16 bits
  const float* pre;
  const uint16_t* weight;
  uint16_t* y;
  uint8_t* data;
  uint8_t* scales;
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
};

// Zeroes the words of the last 128-row scale tile that belong to rows >= p.rows (which is not
// a multiple of 128): word i of a 512-byte column group holds tile row i/4 + 32·(i%4).
__device__ void zero_padding_rows(const Params& p, unsigned pad_cta) {
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

template <int C, int ITEMS, bool QUANTIZE>
__global__ void __launch_bounds__(max_threads(ITEMS))
    hc_combine_norm_kernel(const __grid_constant__ Params p) {
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

  // ---- every load first
  const uint16_t* x_row = p.x + row * p.x_row_stride + col0;
  const float* pre_row = p.pre + row * p.pre_row_stride;
  float gate[kStreams];
#pragma unroll
  for (int s = 0; s < kStreams; ++s) gate[s] = __ldg(pre_row + s * p.pre_col_stride);
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
      wv[k] = __ldg(reinterpret_cast<const uint4*>(p.weight + col0 + v * kVec));
    } else {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) xv[k][s] = make_uint4(0u, 0u, 0u, 0u);
      wv[k] = make_uint4(0u, 0u, 0u, 0u);
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
}

// ---- host side

struct Checked {
  Params params;
  int device;
};

// Checks every argument (ValueError naming it) and fills the kernel parameters.
Checked checked_params(const TensorView& x, const TensorView& pre, const TensorView& weight,
                       const TensorView& y, const TensorView& data, const TensorView& scales,
                       double eps, bool quantize, int cluster) {
  check_tensor(x, "x", {kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kRows, 16);
  const int64_t m = x.size(0), width = x.size(1);
  if (m > kMaxRows) TVM_FFI_THROW(ValueError) << "x: m = " << m << " rows > " << kMaxRows;
  if (width % kStreams != 0 || width / kStreams % kBlock != 0 || width == 0) {
    TVM_FFI_THROW(ValueError) << "x must be [m, 4*H] with H a positive multiple of 32, got width "
                              << width;
  }
  const int64_t h = width / kStreams;
  if (h > (int64_t{1} << 24)) TVM_FFI_THROW(ValueError) << "x: H = " << h << " > 2^24";
  if (h % (int64_t{kBlock} * cluster) != 0) {
    TVM_FFI_THROW(ValueError) << "x: H = " << h
                              << " must be a multiple of 32 * cluster = " << kBlock * cluster;
  }
  const int device = x.device().device_id;
  check_tensor(pre, "pre", {m, kStreams}, {kFloat32}, device);
  check_tensor(weight, "weight", {h}, {kBfloat16}, device, Layout::kRows, 16);
  check_tensor(y, "y", {m, h}, {kBfloat16}, device, Layout::kRows, 16);
  const int64_t cols = h / kBlock, padded_cols = (cols + 3) / 4 * 4;
  if (quantize) {
    check_tensor(data, "data", {m, h}, {kByte}, device, Layout::kRows, 8);
    const int64_t size = (m + 127) / 128 * 128 * padded_cols;
    check_tensor(scales, "scales", {size}, {kByte}, device, Layout::kContiguous, 4);
  }
  Params p{};
  p.x = data_as<const uint16_t>(x);
  p.pre = data_as<const float>(pre);
  p.weight = data_as<const uint16_t>(weight);
  p.y = data_as<uint16_t>(y);
  p.data = quantize ? data_as<uint8_t>(data) : nullptr;
  p.scales = quantize ? data_as<uint8_t>(scales) : nullptr;
  p.x_row_stride = x.stride(0);
  p.pre_row_stride = pre.stride(0);
  p.pre_col_stride = pre.stride(1);
  p.y_row_stride = y.stride(0);
  p.data_row_stride = quantize ? data.stride(0) : 0;
  p.rows = static_cast<int>(m);
  p.h = static_cast<int>(h);
  p.cta_vecs = static_cast<int>(h / cluster / kVec);
  p.cols = static_cast<int>(cols);
  p.padded_cols = static_cast<int>(padded_cols);
  p.h_float = static_cast<float>(h);
  p.eps = static_cast<float>(eps);
  return {p, device};
}

template <int C, int ITEMS, bool QUANTIZE>
void launch(Params p, int threads, cudaStream_t stream) {
  const int words = 32 * p.padded_cols;  // of one 128-row scale tile
  const int per_cta = threads * kPadWords;
  const int pad_ctas =
      QUANTIZE && p.rows % 128 != 0 ? ((words + per_cta - 1) / per_cta + C - 1) / C * C : 0;
  const int ctas = p.rows * C + pad_ctas;
  p.one_wave = p.rows * C <= kEarlyStartMaxRowCtas &&
               one_wave(hc_combine_norm_kernel<C, ITEMS, QUANTIZE>, ctas, threads, 0, C);
  launch_in_clusters("hc_combine_norm", hc_combine_norm_kernel<C, ITEMS, QUANTIZE>,
                     dim3(static_cast<unsigned>(ctas)), dim3(static_cast<unsigned>(threads)), C,
                     /*dependent=*/true, stream, p);
}

template <int C, bool QUANTIZE>
void launch_items(const Params& p, int threads, int items, cudaStream_t stream) {
  switch (items) {
    case 1:
      return launch<C, 1, QUANTIZE>(p, threads, stream);
    case 2:
      return launch<C, 2, QUANTIZE>(p, threads, stream);
    case 3:
      return launch<C, 3, QUANTIZE>(p, threads, stream);
    case 4:
      return launch<C, 4, QUANTIZE>(p, threads, stream);
    case 5:
      return launch<C, 5, QUANTIZE>(p, threads, stream);
    default:
      TVM_FFI_THROW(ValueError) << "hc_combine_norm: " << items << " vectors a thread > "
                                << kMaxItems;
  }
}

template <bool QUANTIZE>
void launch_cluster(const Params& p, int cluster, int threads, int items, cudaStream_t stream) {
  switch (cluster) {
    case 1:
      return launch_items<1, QUANTIZE>(p, threads, items, stream);
    case 2:
      return launch_items<2, QUANTIZE>(p, threads, items, stream);
    case 4:
      return launch_items<4, QUANTIZE>(p, threads, items, stream);
    default:
      TVM_FFI_THROW(ValueError) << "cluster = " << cluster << " must be 1, 2 or 4";
  }
}

void run(TensorView x, TensorView pre, TensorView weight, TensorView y, TensorView data,
         TensorView scales, double eps, bool quantize, int64_t cluster, int64_t threads) {
  if (cluster != 1 && cluster != 2 && cluster != 4) {
    TVM_FFI_THROW(ValueError) << "cluster = " << cluster << " must be 1, 2 or 4";
  }
  const Checked c =
      checked_params(x, pre, weight, y, data, scales, eps, quantize, static_cast<int>(cluster));
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    TVM_FFI_THROW(ValueError) << "threads = " << threads << " must be a multiple of 32 up to 1024";
  }
  const int items = static_cast<int>((c.params.cta_vecs + threads - 1) / threads);
  if (items > kMaxItems || threads > max_threads(items)) {
    TVM_FFI_THROW(ValueError) << "threads = " << threads << " with cluster = " << cluster
                              << " gives " << items << " vectors a thread (at most " << kMaxItems
                              << ", and at most " << max_threads(items) << " threads with " << items
                              << ")";
  }
  if (c.params.rows == 0) return;
  tvm::ffi::CUDADeviceGuard guard(c.device);
  const cudaStream_t stream = env_stream(c.device);
  if (quantize) {
    launch_cluster<true>(c.params, static_cast<int>(cluster), static_cast<int>(threads), items,
                         stream);
  } else {
    launch_cluster<false>(c.params, static_cast<int>(cluster), static_cast<int>(threads), items,
                          stream);
  }
}

}  // namespace

// x bf16 [m, 4H], pre fp32 [m, 4], weight bf16 [H] contiguous -> y bf16 [m, H]; with quantize
// also data (1-byte view of e4m3) [m, H] and scales (1-byte, rup(m,128)·rup(H/32,4), 128x4
// swizzled). data and scales are not read without quantize. The launch shape: cluster CTAs a row
// (1, 2 or 4; H % (32·cluster) == 0) of threads threads (a multiple of 32 up to 1024, at most 5
// vectors of 8 columns a thread), chosen by the caller (hc_combine_norm_plan.py); y's bits depend
// on it, never on m.
void hc_combine_norm_cuda(TensorView x, TensorView pre, TensorView weight, TensorView y,
                          TensorView data, TensorView scales, double eps, bool quantize,
                          int64_t cluster, int64_t threads) {
  run(x, pre, weight, y, data, scales, eps, quantize, cluster, threads);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hc_combine_norm_cuda, hc_combine_norm_cuda);
