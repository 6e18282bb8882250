// Session 11 router probe: the production kernel's phases timed by clock64 (MODE 0), stripped
// copies (MODE 1..3) and a tie-break variant (MODE 4), same grid and dependent launch.
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <climits>
#include <cstdint>
#include "cluster_launch.cuh"

namespace {
using tvm::ffi::TensorView;
constexpr int kLists = 32, kMaxMembers = 16, kMaxExperts = 512;
constexpr int kTaken = INT_MIN;
constexpr unsigned kFull = 0xFFFFFFFFu;

struct P {
  const float* logits; const float* bias; const float* bias_alt; const long long* input_ids;
  float* weights; int32_t* ids; int32_t* packed; long long* stamps;
  int tokens, top_k, routed, experts; bool one_wave;
};
__device__ __forceinline__ float score_of(float x) { return __fsqrt_rn(x > 20.f ? x : log1pf(expf(x))); }
__device__ __forceinline__ int key_of(float b) {
  const int bits = __float_as_int(b); const int o = bits < 0 ? -(bits & 0x7FFFFFFF) : bits;
  return b != b ? 0x7FFFFFFF : o;
}
__device__ __forceinline__ uint32_t bf16_bits(float w) {
  const uint32_t bits = __float_as_uint(w);
  const uint32_t r = ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & 0xFFFFu;
  return w != w ? 0x7FC0u : r;
}
struct Entry { int key; float score; int expert; };

template <int MODE>
__global__ void __launch_bounds__(kMaxExperts) probe_kernel(const __grid_constant__ P p) {
  __shared__ int keys[kMaxExperts];
  __shared__ Entry lists[kMaxMembers][kLists];
  long long t[8];
  t[0] = clock64();
  wait_for_previous_grid();
  if (p.one_wave) allow_next_grid();
  t[1] = clock64();
  const int token = blockIdx.x, expert = threadIdx.x, members = p.experts / kLists;
  const float x = p.logits[(int64_t)token * p.experts + expert];
  const float bias = p.bias[expert];
  const float bias_alt = p.bias_alt[expert];
  const bool image = p.input_ids[token] == 129264;
  const float score = MODE == 1 ? x : score_of(x);
  const int key = key_of(__fadd_rn(score, image ? bias_alt : bias));
  keys[expert] = key;
  t[2] = clock64();
  __syncthreads();
  t[3] = clock64();
  if (MODE == 1 || MODE == 2) {
    if (expert < p.top_k) {
      p.weights[token * p.top_k + expert] = __int_as_float(keys[expert]);
      p.ids[token * p.top_k + expert] = expert;
      p.packed[token * p.top_k + expert] = expert << 16;
    }
    return;
  }
  const int list = expert % kLists, member = expert / kLists;
  int rank = 0;
  if (MODE == 5) {
    int others[kMaxMembers];
#pragma unroll
    for (int j = 0; j < kMaxMembers; ++j) others[j] = j < members ? keys[list + kLists * j] : kTaken;
#pragma unroll
    for (int j = 0; j < kMaxMembers; ++j) rank += (others[j] > key) | ((others[j] == key) & (j < member));
  } else {
#pragma unroll
  for (int j = 0; j < kMaxMembers; ++j) {
    if (j < members) {
      const int other = keys[list + kLists * j];
      rank += (other > key) | ((other == key) & (j < member));
    }
  }
  }
  lists[rank][list] = Entry{key, score, expert};
  t[4] = clock64();
  __syncthreads();
  t[5] = clock64();
  if (expert >= kLists) return;
  const int lane = expert;
  if (MODE == 3) {
    if (lane < p.top_k) {
      const Entry e = lists[0][lane];
      p.weights[token * p.top_k + lane] = e.score;
      p.ids[token * p.top_k + lane] = e.expert;
      p.packed[token * p.top_k + lane] = e.key;
    }
    return;
  }
  Entry head = lists[0][lane];
  Entry next = members > 1 ? lists[1][lane] : Entry{kTaken, 0.0f, 0};
  int after = 2, my_id = 0;
  float my_weight = 0.0f, routed_sum = 0.0f;
  if (MODE == 5) {
    const Entry taken{kTaken, 0.0f, 0};
    Entry fetched = lists[min(after, members - 1)][lane];
    for (int slot = 0; slot < p.routed; ++slot) {
      const int top = __reduce_max_sync(kFull, head.key);
      const unsigned winner = __reduce_min_sync(kFull, head.key == top ? (unsigned)head.expert : ~0u);
      const int owner = (int)(winner % kLists);
      const float weight = __shfl_sync(kFull, head.score, owner);
      const bool won = lane == owner;
      head = won ? next : head;
      next = won ? (after < members ? fetched : taken) : next;
      after += won;
      fetched = lists[min(after, members - 1)][lane];
      if (lane == slot) { my_id = (int)winner; my_weight = weight; }
      routed_sum = __fadd_rn(routed_sum, weight);
    }
  } else
  for (int slot = 0; slot < p.routed; ++slot) {
    const int top = __reduce_max_sync(kFull, head.key);
    unsigned winner;
    if (MODE == 4) {
      const unsigned tied = __ballot_sync(kFull, head.key == top);
      const int first = __ffs(tied) - 1;
      if ((tied & (tied - 1)) == 0) {
        winner = __shfl_sync(kFull, (unsigned)head.expert, first);
      } else {
        winner = __reduce_min_sync(kFull, head.key == top ? (unsigned)head.expert : ~0u);
      }
    } else {
      winner = __reduce_min_sync(kFull, head.key == top ? (unsigned)head.expert : ~0u);
    }
    const int owner = (int)(winner % kLists);
    const float weight = __shfl_sync(kFull, head.score, owner);
    if (lane == owner) {
      head = next;
      next = after < members ? lists[after][lane] : Entry{kTaken, 0.0f, 0};
      ++after;
    }
    if (lane == slot) { my_id = (int)winner; my_weight = weight; }
    routed_sum = __fadd_rn(routed_sum, weight);
  }
  t[6] = clock64();
  if (lane >= p.top_k) return;
  my_weight = __fdiv_rn(my_weight, __fadd_rn(routed_sum, 1e-20f));
  t[7] = clock64();
  p.weights[token * p.top_k + lane] = my_weight;
  p.ids[token * p.top_k + lane] = my_id;
  p.packed[token * p.top_k + lane] = (int32_t)((uint32_t)my_id << 16 | bf16_bits(my_weight));
  if (p.stamps != nullptr && token == 0 && lane == 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) p.stamps[i] = t[i] - t[0];
  }
}

__global__ void clock_kernel(long long* out, int spins) {
  long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  const long long c0 = clock64();
  while (clock64() - c0 < spins) {}
  const long long c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  out[0] = c1 - c0; out[1] = g1 - g0;
}

template <int MODE>
void run(const P& p, cudaStream_t s) {
  P q = p;
  q.one_wave = one_wave(probe_kernel<MODE>, p.tokens, p.experts);
  launch_in_clusters("probe", probe_kernel<MODE>, dim3(p.tokens), dim3(p.experts), 0, true, s, q);
}
}  // namespace

void router_probe(int64_t mode, TensorView logits, TensorView bias, TensorView bias_alt,
                  TensorView input_ids, TensorView weights, TensorView ids, TensorView packed,
                  TensorView stamps) {
  P p{};
  p.logits = static_cast<const float*>(logits.data_ptr());
  p.bias = static_cast<const float*>(bias.data_ptr());
  p.bias_alt = static_cast<const float*>(bias_alt.data_ptr());
  p.input_ids = static_cast<const long long*>(input_ids.data_ptr());
  p.weights = static_cast<float*>(weights.data_ptr());
  p.ids = static_cast<int32_t*>(ids.data_ptr());
  p.packed = static_cast<int32_t*>(packed.data_ptr());
  p.stamps = stamps.numel() > 0 ? static_cast<long long*>(stamps.data_ptr()) : nullptr;
  p.tokens = (int)logits.size(0); p.experts = (int)logits.size(1);
  p.top_k = (int)weights.size(1); p.routed = p.top_k;
  const cudaStream_t s = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, logits.device().device_id));
  switch (mode) {
    case 0: run<0>(p, s); break;
    case 1: run<1>(p, s); break;
    case 2: run<2>(p, s); break;
    case 3: run<3>(p, s); break;
    case 4: run<4>(p, s); break;
    case 5: run<5>(p, s); break;
  }
}

void clock_probe(TensorView out, int64_t spins) {
  const cudaStream_t s = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, out.device().device_id));
  clock_kernel<<<1, 1, 0, s>>>(static_cast<long long*>(out.data_ptr()), (int)spins);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(router_probe, router_probe);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(clock_probe, clock_probe);
