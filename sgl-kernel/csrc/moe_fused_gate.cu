// DeepSeek-V4.1's vision router (sqrt-softplus scores, top-k by the biased score, image tokens
// taking the alternate bias), with the packed ids written by the same launch. Layouts of
// the same arithmetic (so the same bits): a CTA a token for a few tokens, 4 warps or a warp a
// token for more.
//
// Why: the Triton router (moe_fused_gate_triton.py) holds 16 values a lane of a 512-wide block
// for 384 experts in one warp, and takes each slot as three scans of all 16 plus three warp
// reductions; its scores and its slots each cost about as much as its loads and stores.
//
// A CTA a token (moe_fused_gate_kernel):
//   1. one thread an expert scores it and writes its key to shared memory;
//   2. the experts are dealt to 32 lists, list g holding experts g + 32 j (j < M = E / 32), and
//      each thread finds its rank in its list by comparing its key with the M - 1 others: the
//      lists come out sorted, best first, in shared memory, with no sorting pass;
//   3. warp 0 takes the slots, lane g holding the head of list g and the entry after it: a slot
//      is two warp reductions over the heads (the largest key, then the lowest expert holding
//      it), one shuffle for the weight, and the winning lane moving to its next entry by selects.
// Every shared-memory load is issued well before its first use: with the rank's loads and the
// next entries behind branches, each load waited for the last.
//
// The list kernel (moe_fused_gate_list_kernel) in two layouts, the list layout (W = 4 warps a
// token) and the warp layout (W = 1): once there are more tokens than SMs, the CTA layout's
// idle warps (all but one while the slots are taken) cost SM slots. Here the lanes of W warps
// score a token's members (lane g of warp w: members w + W i of list g, as independent chains;
// the score is written without branches so they overlap), then warp 0 holds every list in
// registers (lane g: list g, through shared memory when W > 1) and takes the slots: the same two
// reductions and shuffle over the lanes' best untaken entries, the winner marking its entry
// taken and finding its next best by a tree over its registers. The list layout (one token a
// CTA) from one token an SM, the warp layout (4 or 8 tokens a CTA) once a CTA of each token
// would crowd the SMs (the layout by tokens an SM: moe_fused_gate_cuda.py's cuda_layout).
//
// Contract (bitwise the Triton kernel's, and so dsv41_kernels.reference.vision_topk's):
//   score[e]  = sqrt.rn(x > 20 ? x : log1pf(expf(x)))  (the CUDA math library, as torch and
//               Triton's libdevice; no flush to zero), x = logits[t, e] (fp32);
//   biased[e] = score[e] + (input_ids[t] == image_token_id ? bias_alt : bias)[e]  (add.rn);
//   key[e]    = biased's bits made order-preserving (sign-magnitude to two's complement, so -0
//               meets +0), every NaN the largest; slot s < routed = top_k - shared takes the
//               largest key not yet taken, the lowest expert among equal keys;
//   weight    = the slot's unbiased score; routed_sum adds them left to right in slot order;
//   shared slots s >= routed: expert E + s - routed, weight div.rn(routed_sum, scaling);
//   renormalize: every weight div.rn(w, routed_sum + eps); scale_on_output: mul.rn(w, scaling);
//   rows t >= valid_rows: weight 0, id -1; packed = id << 16 | bf16_rn(weight) bits (every NaN
//   0x7FC0).
// E = 32 M experts, M <= 16. A list's order is the slots' order (key, then lower expert: within
// list g, j < j' means a lower expert), so the head of the lists with the largest key and the
// lowest expert is the next slot.
//
// Launch: grid (T) of E threads (a CTA a token), grid (T) of 128 threads (4 warps a token), or
// grid (ceil(T / n)) of 32 n threads (a warp a token, n tokens a CTA); a programmatic dependent
// launch (every global access after the wait; a grid that fits the GPU twice over lets the next
// launch start at once, early_start), on tvm-ffi's stream for the logits' device; no allocation, no
// host sync (CUDA-graph capturable).

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <climits>
#include <cstdint>

#include "cluster_launch.cuh"
#include "fp32_ops.cuh"
#include "tensor_view.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kLists = 32;       // one a lane of the selecting warp
constexpr int kMaxMembers = 16;  // experts a list: E <= 512
constexpr int kMaxExperts = kLists * kMaxMembers;
constexpr int kMaxTopK = 16;
constexpr int kMaxWarpTokens = 8;  // tokens a CTA of the warp layout
constexpr int kListWarps = 4;      // warps a token of the list layout
constexpr int64_t kMaxWarpLayoutTokens = (int64_t{1} << 32) / kLists - kLists * kMaxWarpTokens;
constexpr float kSoftplusThreshold = 20.0f;
constexpr int kTaken = INT_MIN;  // below every score's key: an exhausted list
constexpr unsigned kFull = 0xFFFFFFFFu;

struct Params {
  const float* logits;
  int64_t logits_stride;
  const float* bias;
  const float* bias_alt;  // null: every token takes bias
  const void* input_ids;  // int32 or int64; read only with bias_alt
  bool ids_64;
  int64_t ids_stride;
  int64_t image_token_id;
  const void* valid_rows_ptr;  // a one-element int32/int64 tensor, or null: valid_rows
  bool valid_64;
  int64_t valid_rows;
  float* weights;
  int64_t weights_stride[2];
  int32_t* ids;
  int64_t ids_out_stride[2];
  int32_t* packed;  // null: not written
  int64_t packed_stride[2];
  int tokens;
  int top_k;
  int routed;
  int experts;
  bool renormalize;
  bool scale_on_output;
  float eps;
  float scaling;
  bool early_start;  // let the next launch start at once (early_start below)
};

// The CUDA math library's log1pf(y) (nvcc 13.0) for y = expf(x): its main path's operations,
// and its special case (y's bits at or above +inf's) selected, not branched to.
__device__ __forceinline__ float log1p_of_exp(float y) {
  const int y_bits = __float_as_int(y);
  const int exponent = (__float_as_int(__fadd_rz(y, 1.0f)) - 0x3f400000) & 0xff800000;
  const float scale = __int_as_float(0x40800000 - exponent);
  const float m = __fadd_rn(__int_as_float(y_bits - exponent), __fmaf_rn(scale, 0.25f, -1.0f));
  float p = __fmaf_rn(m, -__int_as_float(0x3d39bf78), 0.10546888411045074463f);
  p = __fmaf_rn(m, p, -0.13229703903198242188f);
  p = __fmaf_rn(m, p, 0.14491446316242218018f);
  p = __fmaf_rn(m, p, -0.16641564667224884033f);
  p = __fmaf_rn(m, p, 0.19988867640495300293f);
  p = __fmaf_rn(m, p, -0.25000196695327758789f);
  p = __fmaf_rn(m, p, 0.33333510160446166992f);
  p = __fmaf_rn(m, p, -0.5f);
  const float e = __fmul_rn(__int2float_rn(exponent), 1.1920928955078125e-07f);
  const float main = __fmaf_rn(e, 0.69314718246459960938f, __fmaf_rn(m, __fmul_rn(m, p), m));
  const float inf = __int_as_float(0x7f800000);
  float special = y_bits >= -0x407fffff ? __fmaf_rn(y, inf, inf) : main;
  special = y != 0.0f ? special : -0.0f;
  return static_cast<unsigned>(y_bits) >= 0x7f800000u ? special : main;
}

// sqrt.rn(s) as the CUDA math library computes it: its fast path on s, or on s · 2^64 for s
// below 2^-101 (the result then · 2^-32, both exact), and its answers for ±0, +inf, negative
// numbers and NaN, all selected.
__device__ __forceinline__ float sqrt_rn_selected(float s) {
  const unsigned bits = __float_as_uint(s);
  const bool tiny = bits < 0x0d000000u;
  const float scaled = tiny ? __fmaf_rn(s, 18446744073709551616.0f, 0.0f) : s;
  const float r = rsqrt_approx(scaled);
  const float a = mul_ftz(r, scaled);
  const float root = __fmaf_rn(__fmaf_rn(-a, a, scaled), mul_ftz(r, 0.5f), a);
  float out = tiny ? mul_ftz(root, 2.3283064365386962891e-10f) : root;
  out = (bits & 0x7fffffffu) == 0 || bits == 0x7f800000u ? s : out;                    // ±0, +inf
  out = bits > 0x80000000u && bits <= 0xff800000u ? __int_as_float(0x7fffffff) : out;  // < 0
  return (bits & 0x7fffffffu) > 0x7f800000u ? add_ftz(s, 1.0f) : out;                  // NaN
}

// torch's softplus (identity above its threshold 20) through log1p, then an IEEE square root:
// sqrt.rn(x > 20 ? x : log1pf(expf(x))) of the CUDA math library, bit for bit for every fp32 x
// (all 2^32 compared on a GPU). The library's log1pf and sqrt branch to their special cases,
// and the branches kept a thread's values from interleaving (one dependent chain after
// another); written without branches, the warp layout's 12 values a lane overlap.
__device__ __forceinline__ float score_of(float x) {
  const float softplus = log1p_of_exp(expf(x));  // expf: the library's, branch-free
  return sqrt_rn_selected(x > kSoftplusThreshold ? x : softplus);
}

// The order-preserving integer of biased's bits (the reference's rank key without the id).
__device__ __forceinline__ int key_of(float biased) {
  const int bits = __float_as_int(biased);
  const int ordered = bits < 0 ? -(bits & 0x7FFFFFFF) : bits;
  return biased != biased ? 0x7FFFFFFF : ordered;
}

__device__ __forceinline__ int64_t load_int(const void* base, bool is64, int64_t at) {
  return is64 ? static_cast<const long long*>(base)[at]
              : static_cast<int64_t>(static_cast<const int*>(base)[at]);
}

// bf16 round to nearest even on the bits, every NaN 0x7FC0 (the reference's bf16_bits).
__device__ __forceinline__ uint32_t bf16_bits(float w) {
  const uint32_t bits = __float_as_uint(w);
  const uint32_t rounded = ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & 0xFFFFu;
  return w != w ? 0x7FC0u : rounded;
}

// A list entry: its key, unbiased score and expert.
struct Entry {
  int key;
  float score;
  int expert;
};

// Slot `lane` of the token's row from its routed expert and weight (lane < routed) and the
// routed weights' sum: the shared slots, renormalization, scaling, padding rows, the stores.
__device__ __forceinline__ void write_slot(const Params& p, int token, int lane, int64_t limit,
                                           int id, float weight, float routed_sum) {
  if (lane >= p.routed) {
    id = p.experts + lane - p.routed;
    weight = __fdiv_rn(routed_sum, p.scaling);
  }
  if (p.renormalize) weight = __fdiv_rn(weight, __fadd_rn(routed_sum, p.eps));
  if (p.scale_on_output) weight = __fmul_rn(weight, p.scaling);
  if (token >= limit) {
    weight = 0.0f;
    id = -1;
  }
  p.weights[token * p.weights_stride[0] + lane * p.weights_stride[1]] = weight;
  p.ids[token * p.ids_out_stride[0] + lane * p.ids_out_stride[1]] = id;
  if (p.packed != nullptr) {
    p.packed[token * p.packed_stride[0] + lane * p.packed_stride[1]] =
        static_cast<int32_t>(static_cast<uint32_t>(id) << 16 | bf16_bits(weight));
  }
}

// A slot's expert: of the lanes' heads, the largest key, then the lowest expert holding it.
__device__ __forceinline__ unsigned slot_winner(const Entry& head) {
  const int top = __reduce_max_sync(kFull, head.key);
  return __reduce_min_sync(kFull, head.key == top ? static_cast<unsigned>(head.expert) : ~0u);
}

__global__ void __launch_bounds__(kMaxExperts)
    moe_fused_gate_kernel(const __grid_constant__ Params p) {
  __shared__ int keys[kMaxExperts];
  __shared__ Entry lists[kMaxMembers][kLists];  // entry r of list g: lists[r][g]
  wait_for_previous_grid();                     // a dependent launch: no global access before
  if (p.early_start) allow_next_grid();
  const int token = blockIdx.x;
  const int expert = threadIdx.x;
  const int members = p.experts / kLists;

  // Every global load is issued before the first use of any.
  const float x = p.logits[static_cast<int64_t>(token) * p.logits_stride + expert];
  const float bias = p.bias[expert];
  float bias_alt = bias;
  bool image = false;
  if (p.bias_alt != nullptr) {
    bias_alt = p.bias_alt[expert];
    image = load_int(p.input_ids, p.ids_64, token * p.ids_stride) == p.image_token_id;
  }
  const int64_t limit =
      p.valid_rows_ptr != nullptr ? load_int(p.valid_rows_ptr, p.valid_64, 0) : p.valid_rows;
  const float score = score_of(x);
  const int key = key_of(__fadd_rn(score, image ? bias_alt : bias));
  keys[expert] = key;
  __syncthreads();

  const int list = expert % kLists, member = expert / kLists;
  // Every load before the first compare (a branch a member made each load wait for the one
  // before); absent members read as kTaken.
  int others[kMaxMembers];
#pragma unroll
  for (int j = 0; j < kMaxMembers; ++j) others[j] = j < members ? keys[list + kLists * j] : kTaken;
  int rank = 0;
#pragma unroll
  for (int j = 0; j < kMaxMembers; ++j) {
    rank += (others[j] > key) | ((others[j] == key) & (j < member));
  }
  lists[rank][list] = Entry{key, score, expert};
  __syncthreads();
  if (expert >= kLists) return;

  // Lane g holds list g's head and the entry after it, and has the entry after that in flight:
  // a win moves them up with selects and loads the next, first read one slot later, so no slot
  // waits on shared memory.
  const int lane = expert;
  const Entry taken{kTaken, 0.0f, 0};
  Entry head = lists[0][lane];
  Entry next = members > 1 ? lists[1][lane] : taken;
  int after = 2;  // the list entry in flight
  Entry fetched = lists[min(after, members - 1)][lane];
  int my_id = 0;
  float my_weight = 0.0f;
  float routed_sum = 0.0f;
  for (int slot = 0; slot < p.routed; ++slot) {
    const unsigned winner = slot_winner(head);
    const int owner = static_cast<int>(winner % kLists);
    const float weight = __shfl_sync(kFull, head.score, owner);
    const bool won = lane == owner;
    head = won ? next : head;
    next = won ? (after < members ? fetched : taken) : next;
    after += won;
    fetched = lists[min(after, members - 1)][lane];
    if (lane == slot) {
      my_id = static_cast<int>(winner);
      my_weight = weight;
    }
    routed_sum = __fadd_rn(routed_sum, weight);  // left to right in slot order
  }
  if (lane < p.top_k) write_slot(p, token, lane, limit, my_id, my_weight, routed_sum);
}

// The best of a lane's list members not yet taken: the largest key, the lowest member (so the
// lowest expert) among equal keys. A tree over fixed positions whose left half always holds the
// lower members, so a tie keeps the left.
template <int N>
__device__ __forceinline__ Entry best_of(const int (&key)[N], const float (&score)[N], int lane) {
  int k[N], j[N];
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) k[i] = key[i], j[i] = i, v[i] = score[i];
#pragma unroll
  for (int step = 1; step < N; step *= 2) {
#pragma unroll
    for (int i = 0; i + step < N; i += 2 * step) {
      const bool right = k[i + step] > k[i];
      k[i] = right ? k[i + step] : k[i];
      j[i] = right ? j[i + step] : j[i];
      v[i] = right ? v[i + step] : v[i];
    }
  }
  return Entry{k[0], v[0], lane + kLists * j[0]};
}

// Marks a lane's entry taken in its registers: `member` (-1: none).
template <int MEMBERS>
__device__ __forceinline__ void mark_taken(int (&key)[MEMBERS], int member) {
#pragma unroll
  for (int j = 0; j < MEMBERS; ++j) key[j] = j == member ? kTaken : key[j];
}

// Takes the slots from the lists in registers (lane g: list g's members, MEMBERS of them) and
// writes the token's row: a slot is the same two reductions and shuffle as in the CTA layout,
// over each lane's best untaken entry. Each lane finds its best and second best up front (both
// then marked taken), so a slot's winner moves to its second best by selects; only a lane that
// wins again runs its tree for the next best (a warp-uniform branch): a slot without the tree
// is about a third of the instructions of one with it.
template <int MEMBERS>
__device__ __forceinline__ void take_slots(const Params& p, int token, int lane, int64_t limit,
                                           int (&key)[MEMBERS], const float (&score)[MEMBERS]) {
  Entry head = best_of(key, score, lane);
  mark_taken(key, head.expert / kLists);
  Entry second = best_of(key, score, lane);
  mark_taken(key, second.expert / kLists);
  bool second_left = true;  // `second` not yet moved up to head
  int my_id = 0;
  float my_weight = 0.0f;
  float routed_sum = 0.0f;
  for (int slot = 0; slot < p.routed; ++slot) {
    const unsigned winner = slot_winner(head);
    const int owner = static_cast<int>(winner % kLists);
    const float weight = __shfl_sync(kFull, head.score, owner);
    if (slot + 1 < p.routed) {  // the winner's next best (none after the last slot)
      const bool won = lane == owner;
      if (__shfl_sync(kFull, second_left, owner)) {
        head = won ? second : head;
        second_left = second_left && !won;
      } else {  // the owner's third best or later: every entry it won is marked taken
        mark_taken(key, won ? head.expert / kLists : -1);
        const Entry best = best_of(key, score, lane);
        head = won ? best : head;
      }
    }
    if (lane == slot) {
      my_id = static_cast<int>(winner);
      my_weight = weight;
    }
    routed_sum = __fadd_rn(routed_sum, weight);  // left to right in slot order
  }
  if (lane < p.top_k) write_slot(p, token, lane, limit, my_id, my_weight, routed_sum);
}

// The list kernel: WARPS warps a token, thread (w, g) scoring members w + WARPS i of list g,
// then warp 0 holding every list in registers (through shared memory when WARPS > 1) takes the
// slots. WARPS == 1, the warp layout: blockDim.x / 32 tokens a CTA; else the list layout, one
// token a CTA.
template <int MEMBERS, int WARPS>
__global__ void __launch_bounds__(kLists* kMaxWarpTokens)
    moe_fused_gate_list_kernel(const __grid_constant__ Params p) {
  constexpr int kPerThread = (MEMBERS + WARPS - 1) / WARPS;
  constexpr int kShared = WARPS > 1 ? MEMBERS : 1;
  __shared__ int shared_keys[kShared][kLists];
  __shared__ float shared_scores[kShared][kLists];
  wait_for_previous_grid();  // a dependent launch: no global access before
  if (p.early_start) allow_next_grid();
  const int lane = threadIdx.x % 32;
  const int warp = WARPS > 1 ? static_cast<int>(threadIdx.x / 32) : 0;
  const int token = WARPS > 1 ? static_cast<int>(blockIdx.x)
                              : static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  if (token >= p.tokens) return;  // whole warps

  // Every global load is issued before the first use of any.
  const float* row = p.logits + static_cast<int64_t>(token) * p.logits_stride + lane;
  float x[kPerThread], bias[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int j = warp + WARPS * i;
    x[i] = j < MEMBERS ? row[kLists * j] : 0.0f;
    bias[i] = j < MEMBERS ? p.bias[lane + kLists * j] : 0.0f;
  }
  if (p.bias_alt != nullptr) {
    float bias_alt[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int j = warp + WARPS * i;
      bias_alt[i] = j < MEMBERS ? p.bias_alt[lane + kLists * j] : 0.0f;
    }
    if (load_int(p.input_ids, p.ids_64, token * p.ids_stride) == p.image_token_id) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) bias[i] = bias_alt[i];
    }
  }
  const int64_t limit =
      p.valid_rows_ptr != nullptr ? load_int(p.valid_rows_ptr, p.valid_64, 0) : p.valid_rows;
  int key[MEMBERS];
  float score[MEMBERS];
  if constexpr (WARPS == 1) {
#pragma unroll
    for (int j = 0; j < MEMBERS; ++j) {
      score[j] = score_of(x[j]);
      key[j] = key_of(__fadd_rn(score[j], bias[j]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int j = warp + WARPS * i;
      const float value = score_of(x[i]);
      if (j < MEMBERS) {
        shared_keys[j][lane] = key_of(__fadd_rn(value, bias[i]));
        shared_scores[j][lane] = value;
      }
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int j = 0; j < MEMBERS; ++j)
      key[j] = shared_keys[j][lane], score[j] = shared_scores[j][lane];
  }
  take_slots(p, token, lane, limit, key, score);
}

// Whether the next launch may start as this one does (griddepcontrol.launch_dependents first
// thing): when this grid and another of its shape are resident at once, so that a router
// following it (back to back in a CUDA graph) waits beside it. Past that the next grid's early
// CTAs take SM slots that its other CTAs then wait for, and back-to-back launches run slower.
template <typename Kernel>
bool early_start(Kernel kernel, int64_t ctas, int threads) {
  return one_wave(kernel, 2 * ctas, threads);
}

// The list kernel's launch (the warp layout with warps 1, else the list layout) for `members`
// experts a list (it is built for each count).
template <int MEMBERS = 1>
void launch_list_layout(Params p, int members, int warps, int tokens_per_cta, cudaStream_t stream) {
  if constexpr (MEMBERS < kMaxMembers) {
    if (members != MEMBERS) {
      return launch_list_layout<MEMBERS + 1>(p, members, warps, tokens_per_cta, stream);
    }
  }
  auto launch = [&](auto kernel, int ctas, int threads) {
    p.early_start = early_start(kernel, ctas, threads);
    launch_in_clusters("moe_fused_gate", kernel, dim3(static_cast<unsigned>(ctas)), dim3(threads),
                       /*cluster=*/0, /*dependent=*/true, stream, p);
  };
  if (warps == 1) {
    return launch(moe_fused_gate_list_kernel<MEMBERS, 1>,
                  (p.tokens + tokens_per_cta - 1) / tokens_per_cta, kLists * tokens_per_cta);
  }
  launch(moe_fused_gate_list_kernel<MEMBERS, kListWarps>, p.tokens, kLists * kListWarps);
}

void check_output(const TensorView& t, const char* name, int64_t tokens, int64_t top_k, DType dtype,
                  int device) {
  check_tensor(t, name, {tokens, top_k}, {dtype}, device);
}

}  // namespace

// logits fp32 [T, E] (last-dim stride 1), E = 32 M with M <= 16; bias and bias_alt fp32 [E]
// contiguous (bias_alt empty: none); input_ids int32/int64
// [T] (read with bias_alt); valid_rows: a one-element int32/int64 tensor, or empty to take
// valid_rows_value; weights fp32, ids int32 and packed int32 (empty: not written) [T, top_k],
// any strides, top_k <= 16; 0 <= shared < top_k, top_k - shared <= E. The layout: warps 0, a CTA
// a token (a thread an expert); 4, the list layout (4 warps a token); 1, a warp a token and
// tokens_per_cta (1..8) of them a CTA (else tokens_per_cta 1). Checked here too.
void moe_fused_gate_cuda(TensorView logits, TensorView bias, TensorView bias_alt,
                         TensorView input_ids, int64_t image_token_id, TensorView valid_rows,
                         int64_t valid_rows_value, TensorView weights, TensorView ids,
                         TensorView packed, int64_t shared, bool renormalize, double eps,
                         double scaling, bool scale_on_output, int64_t warps,
                         int64_t tokens_per_cta) {
  check_tensor(logits, "logits", {kAnySize, kAnySize}, {kFloat32}, kAnyDevice, Layout::kRows);
  const int device = logits.device().device_id;
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  if (experts % kLists != 0 || experts < kLists || experts > kMaxExperts || tokens > INT_MAX) {
    TVM_FFI_THROW(ValueError) << "logits must have 32 M experts with 1 <= M <= " << kMaxMembers
                              << " and at most 2^31 - 1 rows, got " << experts << " experts";
  }
  check_tensor(bias, "bias", {experts}, {kFloat32}, device, Layout::kContiguous);
  const bool has_alt = bias_alt.numel() > 0;
  if (has_alt) {
    check_tensor(bias_alt, "bias_alt", {experts}, {kFloat32}, device, Layout::kContiguous);
    check_tensor(input_ids, "input_ids", {tokens}, {kInt32, kInt64}, device);
  }
  const bool valid_from_tensor = valid_rows.numel() > 0;
  if (valid_from_tensor) check_tensor(valid_rows, "valid_rows", {1}, {kInt32, kInt64}, device);
  const int64_t top_k = weights.ndim() == 2 ? weights.size(1) : -1;
  if (top_k < 1 || top_k > kMaxTopK) {
    TVM_FFI_THROW(ValueError) << "weights must be [T, top_k] with 1 <= top_k <= " << kMaxTopK;
  }
  check_output(weights, "weights", tokens, top_k, kFloat32, device);
  check_output(ids, "ids", tokens, top_k, kInt32, device);
  const bool has_packed = packed.numel() > 0;
  if (has_packed) check_output(packed, "packed", tokens, top_k, kInt32, device);
  if (shared < 0 || shared >= top_k || top_k - shared > experts) {
    TVM_FFI_THROW(ValueError) << "shared must be in [0, top_k) with top_k - shared <= E, got "
                              << shared;
  }
  if (!(warps == 0 || warps == 1 || warps == kListWarps)) {
    TVM_FFI_THROW(ValueError) << "warps must be 0, 1 or " << kListWarps << ", got " << warps;
  }
  if (tokens_per_cta < 1 || tokens_per_cta > (warps == 1 ? kMaxWarpTokens : 1)) {
    TVM_FFI_THROW(ValueError) << "tokens_per_cta must be 1, or 1.." << kMaxWarpTokens
                              << " with warps 1, got " << tokens_per_cta;
  }
  if (warps == 1 && tokens > kMaxWarpLayoutTokens) {  // its thread index is 32-bit
    TVM_FFI_THROW(ValueError) << "logits: the warp layout (warps 1) takes at most "
                              << kMaxWarpLayoutTokens << " rows, got " << tokens;
  }
  if (tokens == 0) return;

  Params p{};
  p.logits = data_as<const float>(logits);
  p.logits_stride = logits.stride(0);
  p.bias = data_as<const float>(bias);
  p.bias_alt = has_alt ? data_as<const float>(bias_alt) : nullptr;
  p.input_ids = has_alt ? data_as<const void>(input_ids) : nullptr;
  p.ids_64 = has_alt && is_dtype(input_ids, kDLInt, 64);
  p.ids_stride = has_alt ? input_ids.stride(0) : 0;
  p.image_token_id = image_token_id;
  p.valid_rows_ptr = valid_from_tensor ? data_as<const void>(valid_rows) : nullptr;
  p.valid_64 = valid_from_tensor && is_dtype(valid_rows, kDLInt, 64);
  p.valid_rows = valid_rows_value;
  p.weights = data_as<float>(weights);
  p.weights_stride[0] = weights.stride(0), p.weights_stride[1] = weights.stride(1);
  p.ids = data_as<int32_t>(ids);
  p.ids_out_stride[0] = ids.stride(0), p.ids_out_stride[1] = ids.stride(1);
  p.packed = has_packed ? data_as<int32_t>(packed) : nullptr;
  p.packed_stride[0] = has_packed ? packed.stride(0) : 0;
  p.packed_stride[1] = has_packed ? packed.stride(1) : 0;
  p.tokens = static_cast<int>(tokens);
  p.top_k = static_cast<int>(top_k);
  p.routed = static_cast<int>(top_k - shared);
  p.experts = static_cast<int>(experts);
  p.renormalize = renormalize;
  p.scale_on_output = scale_on_output;
  p.eps = static_cast<float>(eps);
  p.scaling = static_cast<float>(scaling);

  tvm::ffi::CUDADeviceGuard guard(device);
  const cudaStream_t stream = env_stream(device);
  if (warps > 0) {
    return launch_list_layout(p, p.experts / kLists, static_cast<int>(warps),
                              static_cast<int>(tokens_per_cta), stream);
  }
  p.early_start = early_start(moe_fused_gate_kernel, p.tokens, p.experts);
  launch_in_clusters("moe_fused_gate", moe_fused_gate_kernel, dim3(static_cast<unsigned>(p.tokens)),
                     dim3(static_cast<unsigned>(p.experts)), /*cluster=*/0, /*dependent=*/true,
                     stream, p);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_fused_gate_cuda, moe_fused_gate_cuda);
