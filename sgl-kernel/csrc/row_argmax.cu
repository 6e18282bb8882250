// Row argmax with one thread-block cluster per row (Hopper and Blackwell).
//
// torch.argmax gives each row one block; at [6, 129280] that leaves most SMs idle. Here a
// row is cut into up to 16 chunks, one CTA each, and the CTAs of a row form a cluster: each
// CTA reduces its chunk and stores its winner straight into the leader CTA's shared memory
// (distributed shared memory), one cluster barrier publishes them, and the leader writes the
// index. No global atomics, no workspace and no second launch, so the whole reduction is one
// kernel whose only global traffic is the logits read and one int64 store per row.
//
// Contract: bitwise identical to torch.argmax(logits, -1): the first NaN if the row has one,
// else the first maximum (-0.0 == +0.0, an all -Inf row gives 0). Each thread visits its
// columns in increasing order keeping its first winner; winners are merged by `precedes`.

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <cstdint>

#include "cluster_launch.cuh"

namespace {

namespace cg = cooperative_groups;
using tvm::ffi::TensorView;

constexpr int kThreads = 256;    // the default launch shape; the sweep export tries others
constexpr int kMaxCluster = 16;  // non-portable cluster size, available on sm_90 and sm_100

// True when (av, ai) comes before (bv, bi) in torch.argmax's order.
__device__ __forceinline__ bool precedes(float av, int ai, float bv, int bi) {
  const bool a_nan = av != av, b_nan = bv != bv;
  if (a_nan || b_nan) return a_nan && (!b_nan || ai < bi);
  return av > bv || (av == bv && ai < bi);
}

__device__ __forceinline__ void take_if_first(float& v, int& i, float ov, int oi) {
  if (precedes(ov, oi, v, i)) {
    v = ov;
    i = oi;
  }
}

// Every lane of the warp ends with the warp's first winner.
__device__ __forceinline__ void warp_first(float& v, int& i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    take_if_first(v, i, __shfl_xor_sync(0xffffffffu, v, offset),
                  __shfl_xor_sync(0xffffffffu, i, offset));
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

// 16-byte vectors of T.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// ITEMS vectors per thread, all loaded before any compare so the loads overlap.
template <typename T, int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS)
    row_argmax_cluster_kernel(const T* __restrict__ logits, int64_t row_stride, int vocab,
                              int64_t* __restrict__ out) {
  using V = Vec<T>;
  constexpr int kVec = V::kSize;
  constexpr int kWarps = THREADS / 32;
  constexpr int kChunk = THREADS * kVec * ITEMS;
  __shared__ float warp_v[kWarps];
  __shared__ int warp_i[kWarps];
  __shared__ float rank_v[kMaxCluster];
  __shared__ int rank_i[kMaxCluster];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.y;
  const T* x = logits + static_cast<int64_t>(row) * row_stride;
  const int tid = threadIdx.x;
  const int begin = rank * kChunk;

  // Column of item k for this thread: begin + (k * THREADS + tid) * kVec + lane-in-vector,
  // increasing in k, so a strict '>' keeps the thread's first maximum.
  V items[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int col = begin + (k * THREADS + tid) * kVec;
    if (col + kVec <= vocab) {
      items[k] = *reinterpret_cast<const V*>(x + col);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        items[k].v[j] = col + j < vocab ? x[col + j] : static_cast<T>(-INFINITY);
      }
    }
  }
  float best = -INFINITY;
  int best_i = min(begin + tid * kVec, vocab - 1);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v = to_float(items[k].v[j]);
      const int col = begin + (k * THREADS + tid) * kVec + j;
      if (col < vocab && (v > best || (v != v && best == best) || (k == 0 && j == 0))) {
        best = v;
        best_i = col;
      }
    }
  }
  warp_first(best, best_i);
  if (tid % 32 == 0) {
    warp_v[tid / 32] = best;
    warp_i[tid / 32] = best_i;
  }
  __syncthreads();
  if (tid < 32) {
    best = tid < kWarps ? warp_v[tid] : -INFINITY;
    best_i = tid < kWarps ? warp_i[tid] : vocab;
    warp_first(best, best_i);
    if (tid == 0) {
      *cluster.map_shared_rank(&rank_v[rank], 0) = best;
      *cluster.map_shared_rank(&rank_i[rank], 0) = best_i;
    }
  }
  cluster.sync();  // release the remote stores, acquire them in the leader
  if (rank != 0 || tid >= 32) return;
  const int ranks = static_cast<int>(cluster.num_blocks());
  best = tid < ranks ? rank_v[tid] : -INFINITY;
  best_i = tid < ranks ? rank_i[tid] : vocab;
  warp_first(best, best_i);
  if (tid == 0) out[row] = best_i;
}

template <typename T, int THREADS, int ITEMS>
void launch_items(const TensorView& logits, const TensorView& out, cudaStream_t stream) {
  constexpr int kChunk = THREADS * Vec<T>::kSize * ITEMS;
  const int rows = static_cast<int>(logits.size(0));
  const int vocab = static_cast<int>(logits.size(1));
  const unsigned cluster = static_cast<unsigned>((vocab + kChunk - 1) / kChunk);
  if (cluster > kMaxCluster) {
    TVM_FFI_THROW(ValueError) << "row_argmax: " << cluster << " CTAs per row > " << kMaxCluster;
  }
  auto kernel = row_argmax_cluster_kernel<T, THREADS, ITEMS>;
  static bool non_portable = false;  // once per process: the attribute is per function
  if (cluster > 8 && !non_portable) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) {
      TVM_FFI_THROW(RuntimeError) << "row_argmax: clusters of " << cluster
                                  << " CTAs unavailable: " << cudaGetErrorString(err);
    }
    non_portable = true;
  }
  const T* data = reinterpret_cast<const T*>(static_cast<const char*>(logits.data_ptr()) +
                                             logits.byte_offset());
  int64_t* dst = reinterpret_cast<int64_t*>(static_cast<char*>(out.data_ptr()) + out.byte_offset());
  launch_in_clusters("row_argmax", kernel, dim3(cluster, rows), dim3(THREADS), cluster, stream,
                     data, logits.stride(0), vocab, dst);
}

// The fewest items per thread that keep the cluster within kMaxCluster CTAs.
template <typename T>
void launch(const TensorView& logits, const TensorView& out, cudaStream_t stream) {
  const int64_t per_item = int64_t{kThreads} * Vec<T>::kSize * kMaxCluster;
  const int64_t vocab = logits.size(1);
  if (vocab <= 2 * per_item) return launch_items<T, kThreads, 2>(logits, out, stream);
  if (vocab <= 4 * per_item) return launch_items<T, kThreads, 4>(logits, out, stream);
  if (vocab <= 8 * per_item) return launch_items<T, kThreads, 8>(logits, out, stream);
  if (vocab <= 16 * per_item) return launch_items<T, kThreads, 16>(logits, out, stream);
  TVM_FFI_THROW(ValueError) << "row_argmax: vocab " << vocab << " > " << 16 * per_item;
}

cudaStream_t checked_stream(const TensorView& logits, const TensorView& out) {
  if (logits.ndim() != 2 || logits.stride(1) != 1) {
    TVM_FFI_THROW(ValueError) << "logits must be 2-D with last-dim stride 1";
  }
  if (out.ndim() != 1 || out.size(0) != logits.size(0) || out.dtype().code != kDLInt ||
      out.dtype().bits != 64) {
    TVM_FFI_THROW(ValueError) << "out must be int64 [rows]";
  }
  const DLDataType dt = logits.dtype();
  const int elem = dt.bits / 8;
  const auto base = reinterpret_cast<uintptr_t>(logits.data_ptr()) + logits.byte_offset();
  if (base % 16 != 0 || (logits.stride(0) * elem) % 16 != 0) {
    TVM_FFI_THROW(ValueError) << "logits rows must be 16-byte aligned";
  }
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, logits.device().device_id));
}

}  // namespace

// logits: [rows, vocab] fp32/bf16/fp16 CUDA, last-dim stride 1, 16-byte aligned rows;
// out: int64 [rows] contiguous on the same device. Checked here too: a wrong call throws.
void row_argmax_cluster(TensorView logits, TensorView out) {
  cudaStream_t stream = checked_stream(logits, out);
  const DLDataType dt = logits.dtype();
  if (dt.code == kDLFloat && dt.bits == 32) return launch<float>(logits, out, stream);
  if (dt.code == kDLBfloat && dt.bits == 16) return launch<__nv_bfloat16>(logits, out, stream);
  if (dt.code == kDLFloat && dt.bits == 16) return launch<__half>(logits, out, stream);
  TVM_FFI_THROW(ValueError) << "logits must be float32, bfloat16 or float16";
}

// fp32 only, with an explicit launch shape: what benchmark/kernels/bench_row_argmax.py --sweep
// times to choose kThreads and the items per thread.
void row_argmax_cluster_shape(TensorView logits, TensorView out, int threads, int items) {
  cudaStream_t stream = checked_stream(logits, out);
  if (logits.dtype().code != kDLFloat || logits.dtype().bits != 32) {
    TVM_FFI_THROW(ValueError) << "the sweep takes float32 logits";
  }
  if (threads == 128 && items == 16) return launch_items<float, 128, 16>(logits, out, stream);
  if (threads == 256 && items == 8) return launch_items<float, 256, 8>(logits, out, stream);
  if (threads == 256 && items == 16) return launch_items<float, 256, 16>(logits, out, stream);
  if (threads == 512 && items == 4) return launch_items<float, 512, 4>(logits, out, stream);
  if (threads == 512 && items == 8) return launch_items<float, 512, 8>(logits, out, stream);
  if (threads == 1024 && items == 2) return launch_items<float, 1024, 2>(logits, out, stream);
  TVM_FFI_THROW(ValueError) << "no launch shape " << threads << " threads x " << items << " items";
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_cluster, row_argmax_cluster);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_argmax_cluster_shape, row_argmax_cluster_shape);
