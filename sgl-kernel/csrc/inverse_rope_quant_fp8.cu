// Inverse RoPE and FP8 group quantization of the attention output, a warp per 1, 2 or 4
// 128-value groups.
//
// Why CUDA: SGLang's two kernels on this path are programmatic dependent launches on Hopper,
// which in a chain of launches hides most of the gap between kernels; a CUDA launch can do the
// same (the Triton kernel of python/dsv41_kernels/ops/attention/inverse_rope_quant_fp8_triton.py
// is launched plainly). As an ordinary launch this kernel was no faster than the Triton one; the
// dependent launch, the early start of the next launch and the table read before the wait are
// what make it faster (docs/performance.md). Only the lanes of rope pairs load the position and
// the table; the other three quarters of the groups are a load, a warp maximum and a store.
//
// Contract (bitwise, the one of the Python op: python/dsv41_kernels/reference/
// inverse_rope_quant_fp8.py), o bf16 [T, H, head_dim] with head_dim % 128 == 0, rope_dim % 4 == 0:
//   rope pair j of a head (values head_dim - rope_dim + 2j, +1) = (x_r, x_i), (c, s) =
//   freqs[position, j] (NaN both when position is outside [0, rows), row 0 read instead):
//     x_r' = bf16_rn(fma.rn(c, x_r, mul.rn(s, x_i))), x_i' = bf16_rn(fma.rn(c, x_i, -mul.rn(s,
//     x_r)))
//   (the negation a sign-bit flip; bf16_rn to nearest even, every NaN as 0x7FFF, no flush);
//   per 128-value group y (rotated where rope): amax = max(int max of |y| bits, NaN as 0, and
//   fp32(1e-10)); scale = mul.rn(amax, 0x3B124925); m = div.approx.ftz.f32(448, amax);
//   codes = cvt.rn.satfinite.e4m3x2.f32(mul.rn(y_odd, m), mul.rn(y_even, m)) per pair.
// Outputs: codes [T, H * head_dim] bytes (a group's 128 at group * 128), scales fp32
// [T, H * head_dim / 128], both contiguous; with rotate_o the rotated rope words back into o.
//
// Layout: warp w of CTA (t, b) owns groups g = (b * WARPS + w) * GROUPS + j, j < GROUPS, of
// token t; lane l owns values 4l..4l+3 of each: two (even, odd) pairs, one 8-byte load of o, one
// 16-byte load of (c, s) for its two rope pairs, one 4-byte store of codes. Lanes of a group
// agree on amax through one integer warp maximum (order-free: the maximum is exact).
//
// Launch: grid (T, ceil(groups_per_token / (WARPS * GROUPS))), WARPS * 32 threads, a
// programmatic dependent launch (as SGLang's two kernels are on Hopper: nothing is read or
// written before the previous kernel's end but, with tables_ready, the position and the table,
// which SGLang's RoPE kernel reads early too; a grid of one wave lets the next launch start at
// once) on tvm-ffi's stream for o's device (the token from the grid and 32-bit
// index arithmetic: no 64-bit division ahead of the first load); no allocation, no host sync
// (CUDA-graph capturable).

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"
#include "float_bits.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kGroup = 128;                     // values per scale (SGLang's group_size)
constexpr int kLaneValues = kGroup / 32;        // 4: two pairs
constexpr uint32_t kAmaxFloor = 0x2EDBE6FFu;    // fp32(1e-10)
constexpr uint32_t kRcp448 = 0x3B124925u;       // RN(1/448)
constexpr uint32_t kBf16NanBits = 0x7FFF0000u;  // rounds to 0x7FFF
constexpr int kDefaultWarps = 4;  // warps a CTA when the caller passes 0; the Python plan's too

struct Params {
  uint32_t* o;            // bf16 pairs as words
  const float4* freqs;    // (c, s) of two consecutive rope pairs per float4
  const void* positions;  // int32 or int64 [T]
  uint32_t* codes;        // 4 e4m3 codes per word
  float* scales;
  int64_t o_token_stride;  // in words
  int64_t o_head_stride;
  int64_t freqs_row_stride;  // in float4 (two complex values)
  int64_t position_stride;
  int64_t table_rows;
  int64_t tokens;
  unsigned groups_per_token;
  unsigned groups_per_head;
  int rope_first_pair;  // (head_dim - rope_dim) / 2: the head's first rope pair
  bool one_wave;        // the grid is resident at once: let the next launch start early
  bool tables_ready;    // positions and freqs are not written by the previous kernel
};

// fp32 -> bf16 bits to nearest even, NaN -> 0x7FFF, in integers (as the Triton kernel's).
__device__ __forceinline__ uint32_t bf16_bits(float v) {
  const uint32_t bits = v != v ? kBf16NanBits : __float_as_uint(v);
  return ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & 0xFFFFu;
}

// |v|'s bits, NaN as 0: non-negative fp32 bits order as their values.
__device__ __forceinline__ uint32_t magnitude(float v) {
  const uint32_t bits = __float_as_uint(v) & 0x7FFFFFFFu;
  return bits > 0x7F800000u ? 0u : bits;
}

__device__ __forceinline__ float div_approx_ftz(float a, float b) {
  float q;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}

// One rope pair's rotation, as bf16 bits (real in the low half, imaginary in the high).
__device__ __forceinline__ uint32_t rotate(uint32_t word, float c, float s) {
  const float x_r = bf16_lo(word), x_i = bf16_hi(word);
  const float minus_s_x_r = __uint_as_float(__float_as_uint(__fmul_rn(s, x_r)) ^ 0x80000000u);
  const uint32_t r = bf16_bits(__fmaf_rn(c, x_r, __fmul_rn(s, x_i)));
  const uint32_t i = bf16_bits(__fmaf_rn(c, x_i, minus_s_x_r));
  return (i << 16) | r;
}

// A warp's GROUPS groups, all loads issued before any is used: at one group a warp the kernel
// is one chain of latencies (the position, then the table); at several the chains overlap.
template <typename Position, int WARPS, int GROUPS, bool ROTATE_O>
__global__ void __launch_bounds__(WARPS * 32) inverse_rope_quant_fp8_kernel(const Params p) {
  const int lane = threadIdx.x % 32;
  const unsigned first = (blockIdx.y * WARPS + threadIdx.x / 32) * GROUPS;
  if (first >= p.groups_per_token) return;
  const int64_t token = blockIdx.x;
  uint32_t* o[GROUPS];
  int first_pair[GROUPS];  // the lane's first pair in its head
  bool real[GROUPS], rope[GROUPS];
  bool any_rope = false;
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) {
    const unsigned group = first + j;
    real[j] = group < p.groups_per_token;
    first_pair[j] = (group % p.groups_per_head) * (kGroup / 2) + 2 * lane;
    o[j] = p.o + token * p.o_token_stride + (group / p.groups_per_head) * p.o_head_stride +
           first_pair[j];
    // rope_first_pair is even and so is first_pair: a lane's two pairs are rope or not together.
    rope[j] = real[j] && first_pair[j] >= p.rope_first_pair;
    any_rope |= rope[j];
  }
  float4 cs[GROUPS];
  bool inside = false;
  const auto load_table = [&] {  // the position, then the lane's rows of the table
    const int64_t position =
        static_cast<int64_t>(static_cast<const Position*>(p.positions)[token * p.position_stride]);
    inside = position >= 0 && position < p.table_rows;
    const float4* row = p.freqs + (inside ? position : 0) * p.freqs_row_stride;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
      if (rope[j]) cs[j] = row[(first_pair[j] - p.rope_first_pair) / 2];
    }
  };
  // With tables_ready the two dependent loads overlap the previous kernel's tail, as in
  // SGLang's own RoPE kernel, which reads them before its wait.
  if (any_rope && p.tables_ready) load_table();
  wait_for_previous_grid();
  if (p.one_wave) allow_next_grid();
  uint2 words[GROUPS];
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) {
    if (real[j]) words[j] = *reinterpret_cast<const uint2*>(o[j]);
  }
  if (any_rope) {
    if (!p.tables_ready) load_table();
    const float nan = __uint_as_float(0x7FC00000u);
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
      if (!rope[j]) continue;
      words[j].x = rotate(words[j].x, inside ? cs[j].x : nan, inside ? cs[j].y : nan);
      words[j].y = rotate(words[j].y, inside ? cs[j].z : nan, inside ? cs[j].w : nan);
      if (ROTATE_O) *reinterpret_cast<uint2*>(o[j]) = words[j];
    }
  }
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) {
    if (!real[j]) continue;
    const float y[kLaneValues] = {bf16_lo(words[j].x), bf16_hi(words[j].x), bf16_lo(words[j].y),
                                  bf16_hi(words[j].y)};
    uint32_t amax_bits = 0;
#pragma unroll
    for (int k = 0; k < kLaneValues; ++k) amax_bits = max(amax_bits, magnitude(y[k]));
    // Whole warps reach here (real[j] is the same in every lane): one redux.sync maximum.
    amax_bits = __reduce_max_sync(0xFFFFFFFFu, amax_bits);
    const float amax = fmaxf(__uint_as_float(amax_bits), __uint_as_float(kAmaxFloor));
    const float multiplier = div_approx_ftz(448.0f, amax);
    const float y1 = __fmul_rn(y[1], multiplier), y0 = __fmul_rn(y[0], multiplier);
    const uint32_t low = e4m3x2_rn(y0, y1);
    const float y3 = __fmul_rn(y[3], multiplier), y2 = __fmul_rn(y[2], multiplier);
    const uint32_t high = e4m3x2_rn(y2, y3);
    const int64_t n = token * p.groups_per_token + first + j;  // the group's codes and scale
    p.codes[n * (kGroup / 4) + lane] = (high << 16) | low;
    if (lane == 0) p.scales[n] = __fmul_rn(amax, __uint_as_float(kRcp448));
  }
}

template <typename Position, int WARPS, int GROUPS>
void launch(Params p, bool rotate_o, cudaStream_t stream) {
  constexpr unsigned kPerCta = WARPS * GROUPS;
  const dim3 grid(static_cast<unsigned>(p.tokens), (p.groups_per_token + kPerCta - 1) / kPerCta);
  const auto kernel = rotate_o ? inverse_rope_quant_fp8_kernel<Position, WARPS, GROUPS, true>
                               : inverse_rope_quant_fp8_kernel<Position, WARPS, GROUPS, false>;
  p.one_wave = one_wave(kernel, int64_t{grid.x} * grid.y, WARPS * 32);
  launch_in_clusters("inverse_rope_quant_fp8", kernel, grid, dim3(WARPS * 32), /*cluster=*/0,
                     /*dependent=*/true, stream, p);
}

template <typename Position, int WARPS>
void launch_groups(const Params& p, int groups, bool rotate_o, cudaStream_t stream) {
  switch (groups) {
    case 1:
      return launch<Position, WARPS, 1>(p, rotate_o, stream);
    case 2:
      return launch<Position, WARPS, 2>(p, rotate_o, stream);
    case 4:
      return launch<Position, WARPS, 4>(p, rotate_o, stream);
    default:
      TVM_FFI_THROW(ValueError) << "groups = " << groups << " must be 1, 2 or 4";
  }
}

template <typename Position>
void launch_warps(const Params& p, int warps, int groups, bool rotate_o, cudaStream_t stream) {
  switch (warps) {
    case 1:
      return launch_groups<Position, 1>(p, groups, rotate_o, stream);
    case 2:
      return launch_groups<Position, 2>(p, groups, rotate_o, stream);
    case 4:
      return launch_groups<Position, 4>(p, groups, rotate_o, stream);
    case 8:
      return launch_groups<Position, 8>(p, groups, rotate_o, stream);
    default:
      TVM_FFI_THROW(ValueError) << "warps = " << warps << " must be 1, 2, 4 or 8";
  }
}

}  // namespace

// o bf16 [T, H, head_dim] (head_dim % 128 == 0, last stride 1, token and head strides multiples
// of 4 values, 8-byte aligned); freqs fp32 [rows, rope_dim] (the complex64 table viewed as
// fp32, rope_dim % 4 == 0, rows 16-byte aligned, last stride 1); positions int32/int64 [T];
// codes 1-byte [T, H * head_dim] and scales fp32 [T, H * head_dim / 128], both contiguous.
// tables_ready: the caller's promise that the kernel launched before this one on the stream does
// not write positions or freqs (they are then read before the dependency wait). warps: per CTA,
// 1, 2, 4 or 8 (0: the default 4); groups: per warp, 1, 2 or 4; the bits depend on neither.
void inverse_rope_quant_fp8_cuda(TensorView o, TensorView freqs, TensorView positions,
                                 TensorView codes, TensorView scales, bool rotate_o,
                                 bool tables_ready, int64_t warps, int64_t groups) {
  check_tensor(o, "o", {kAnySize, kAnySize, kAnySize}, {kBfloat16}, kAnyDevice, Layout::kAny, 8);
  const int64_t tokens = o.size(0), heads = o.size(1), head_dim = o.size(2);
  const int device = o.device().device_id;
  if (head_dim % kGroup != 0 || head_dim == 0 || o.stride(2) != 1 || o.stride(0) % 4 != 0 ||
      o.stride(1) % 4 != 0) {
    TVM_FFI_THROW(ValueError) << "o must have a head_dim that is a positive multiple of " << kGroup
                              << ", last stride 1 and token and head strides multiples of 4";
  }
  check_tensor(freqs, "freqs", {kAnySize, kAnySize}, {kFloat32}, device, Layout::kRows, 16);
  const int64_t rope_dim = freqs.size(1);
  if (freqs.size(0) == 0 || rope_dim % 4 != 0 || rope_dim == 0 || rope_dim > head_dim) {
    TVM_FFI_THROW(ValueError) << "freqs must have rows and a rope width that is a positive "
                              << "multiple of 4 up to head_dim, got [" << freqs.size(0) << ", "
                              << rope_dim << "]";
  }
  check_tensor(positions, "positions", {tokens}, {kInt32, kInt64}, device);
  const int64_t width = heads * head_dim;
  if (tokens >= (int64_t{1} << 31) || width / kGroup > 65535) {  // the grid's x and y limits
    TVM_FFI_THROW(ValueError) << "o: " << tokens << " tokens (at most 2^31 - 1) of "
                              << width / kGroup << " groups (at most 65535)";
  }
  check_tensor(codes, "codes", {tokens, width}, {kByte}, device, Layout::kContiguous, 4);
  check_tensor(scales, "scales", {tokens, width / kGroup}, {kFloat32}, device, Layout::kContiguous);
  if (warps == 0) warps = kDefaultWarps;
  Params p{};
  p.o = data_as<uint32_t>(o);
  p.freqs = data_as<const float4>(freqs);
  p.positions = data_as<const void>(positions);
  p.codes = data_as<uint32_t>(codes);
  p.scales = data_as<float>(scales);
  p.o_token_stride = o.stride(0) / 2;
  p.o_head_stride = o.stride(1) / 2;
  p.freqs_row_stride = freqs.stride(0) / 4;
  p.position_stride = positions.stride(0);
  p.groups_per_token = static_cast<unsigned>(width / kGroup);
  p.tokens = tokens;
  p.table_rows = freqs.size(0);
  p.groups_per_head = static_cast<unsigned>(head_dim / kGroup);
  p.rope_first_pair = static_cast<int>((head_dim - rope_dim) / 2);
  p.tables_ready = tables_ready;
  if (tokens == 0 || width == 0) return;
  tvm::ffi::CUDADeviceGuard guard(device);
  const cudaStream_t stream = env_stream(device);
  if (is_dtype(positions, kDLInt, 32)) {
    launch_warps<int32_t>(p, static_cast<int>(warps), static_cast<int>(groups), rotate_o, stream);
  } else {
    launch_warps<int64_t>(p, static_cast<int>(warps), static_cast<int>(groups), rotate_o, stream);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(inverse_rope_quant_fp8_cuda, inverse_rope_quant_fp8_cuda);
