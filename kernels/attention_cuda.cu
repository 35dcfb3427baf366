// Paged causal GQA attention on CUDA, FlashAttention-2 style: a block owns a tile of query
// rows (the group's query heads of consecutive tokens of one sequence, so the heads that read
// one KV head share its loads), walks the sequence's keys through shared memory in tiles,
// and keeps an online softmax per row. Decode (one token per sequence) is the same kernel
// with the keys split into ranges over more blocks and a merge pass (flash-decoding); the
// plan in cuda_attention_plan.h chooses. Arithmetic is float; one instance per activation
// type T (q, out: bfloat16 or float32) and KV element type K (those or FP8 E4M3, whose codes
// are widened in registers; the layer's k_scale scales q, its v_scale the output).
#include <cmath>

#include "kernels/cuda_attention_plan.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerTile = kAttentionRowsPerTile;
constexpr int kRowsPerWarp = kRowsPerTile / kWarps;
constexpr int kKeysPerTile = kAttentionKeysPerTile;  // one key per lane when scoring
constexpr int kMaxDimsPerLane = kAttentionMaxHeadDim / 32;
static_assert(kKeysPerTile == 32, "scores are computed one key per lane");
static_assert(kRowsPerTile % kWarps == 0, "rows are dealt evenly to the warps");

struct AttentionArgs {
  Matrix q;
  Matrix out;
  Batch batch;
  KvPool cache;
  int layer;
  int num_heads;
  int group;
  float scale;    // softmax scale times the layer's k_scale
  float v_scale;  // the layer's v_scale
  int num_splits;
  int keys_per_split;
  float* partial_acc;  // [split][token][head][head_dim], unnormalized
  float* partial_ml;   // [split][token][head][2]: running max and sum
  unsigned* error_word;
};

// Elements of K in one 16-byte load.
template <typename K>
constexpr int kPerLoad = 16 / static_cast<int>(sizeof(K));

// Loads 16 bytes at element `offset` of a K array into `out` (16 fp8, 8 bf16 or 4 float values).
__device__ __forceinline__ void load16(const __nv_bfloat16* base, int64_t offset, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(base + offset);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float2 pair = __bfloat1622float2(pairs[p]);
    out[2 * p] = pair.x;
    out[2 * p + 1] = pair.y;
  }
}
__device__ __forceinline__ void load16(const __nv_fp8_e4m3* base, int64_t offset, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(base + offset);
  const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    const float2 pair = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[p], __NV_E4M3)));
    out[2 * p] = pair.x;
    out[2 * p + 1] = pair.y;
  }
}
__device__ __forceinline__ void load16(const float* base, int64_t offset, float* out) {
  const float4 raw = *reinterpret_cast<const float4*>(base + offset);
  out[0] = raw.x;
  out[1] = raw.y;
  out[2] = raw.z;
  out[3] = raw.w;
}

template <typename T, typename K>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(AttentionArgs a) {
  extern __shared__ float shared[];
  const int head_dim = a.cache.layout.head_dim;
  const int dims_per_lane = head_dim / 32;
  float* q_tile = shared;                                  // [rows][head_dim]
  float* k_tile = q_tile + kRowsPerTile * head_dim;        // [keys][head_dim + 1]
  float* v_tile = k_tile + kKeysPerTile * (head_dim + 1);  // [keys][head_dim]

  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int row_tile = blockIdx.x / a.num_splits;
  const int split = blockIdx.x % a.num_splits;
  const int q_begin = a.batch.query_start[seq];
  const int num_rows = (a.batch.query_start[seq + 1] - q_begin) * a.group;
  const int first_row = row_tile * kRowsPerTile;
  if (first_row >= num_rows) return;  // the whole block: this tile holds no row

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kRowsPerTile * head_dim; i += kThreads) {
    const int row = first_row + i / head_dim;
    float value = 0.0f;
    if (row < num_rows) {
      const int64_t token = q_begin + row / a.group;
      const int64_t head = int64_t{kv_head} * a.group + row % a.group;
      value = to_float(static_cast<const T*>(
                  a.q.data)[token * a.q.row_stride + head * head_dim + i % head_dim]) *
              a.scale;
    }
    q_tile[i] = value;
  }

  // Row r of the tile belongs to warp r % kWarps: causal rows late in the tile see more
  // keys, and interleaving spreads them over the warps.
  int position[kRowsPerWarp];
  float running_max[kRowsPerWarp];
  float running_sum[kRowsPerWarp];
  float acc[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = first_row + warp + i * kWarps;
    position[i] = row < num_rows ? a.batch.positions[q_begin + row / a.group] : -1;
    running_max[i] = -INFINITY;
    running_sum[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < kMaxDimsPerLane; ++d) acc[i][d] = 0.0f;
  }

  const int last_row = min(first_row + kRowsPerTile, num_rows) - 1;
  const int last_position = a.batch.positions[q_begin + last_row / a.group];
  const int key_begin = split * a.keys_per_split;
  const int key_end =
      min(min(key_begin + a.keys_per_split, a.batch.context_lens[seq]), last_position + 1);
  const int32_t* block_table =
      a.batch.block_tables + static_cast<int64_t>(seq) * a.batch.max_blocks_per_seq;
  const KvLayout& layout = a.cache.layout;
  const int block_size = layout.block_size;

  for (int tile_start = key_begin; tile_start < key_end; tile_start += kKeysPerTile) {
    __syncthreads();  // the previous tile is consumed (first time: the Q tile is written)
    // 16-byte loads: 8 bf16 or 4 float elements of one key per thread and step. Offsets are
    // multiples of 8 elements (head_dim is a multiple of 32) and pools are cudaMalloc-aligned.
    constexpr int per_load = kPerLoad<K>;
    const int loads_per_key = head_dim / per_load;
    for (int i = threadIdx.x; i < kKeysPerTile * loads_per_key; i += kThreads) {
      const int j = i / loads_per_key;
      const int d = (i % loads_per_key) * per_load;
      const int key = tile_start + j;
      float k_values[per_load] = {};
      float v_values[per_load] = {};
      if (key < key_end) {
        const int block_index = key / block_size;
        const int block = block_index < a.batch.max_blocks_per_seq ? block_table[block_index] : -1;
        if (block < 0 || block >= a.cache.layout.num_blocks) {
          atomicOr(a.error_word, kBlockIdOutOfRange);
        } else {
          const int64_t offset =
              kv_element(layout, a.layer, kv_slot(layout, block, key % block_size), kv_head, d);
          load16(static_cast<const K*>(a.cache.k), offset, k_values);
          load16(static_cast<const K*>(a.cache.v), offset, v_values);
        }
      }
#pragma unroll
      for (int e = 0; e < per_load; ++e) {  // constant bounds keep the arrays in registers
        k_tile[j * (head_dim + 1) + d + e] = k_values[e];
        v_tile[j * head_dim + d + e] = v_values[e];
      }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (position[i] < 0) continue;  // uniform across the warp
      const float* q_row = q_tile + (warp + i * kWarps) * head_dim;
      const int key = tile_start + lane;
      float score = -INFINITY;
      if (key < key_end && key <= position[i]) {
        const float* k_row = k_tile + lane * (head_dim + 1);
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        score = dot;
      }
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // no visible key for this row in this tile
      const float new_max = fmaxf(running_max[i], tile_max);
      const float correction = expf(running_max[i] - new_max);  // 0 on the first tile
      const float weight = score == -INFINITY ? 0.0f : expf(score - new_max);
      running_sum[i] = running_sum[i] * correction + warp_sum(weight);
      running_max[i] = new_max;
#pragma unroll
      for (int d = 0; d < kMaxDimsPerLane; ++d) acc[i][d] *= correction;
      for (int j = 0; j < kKeysPerTile; ++j) {
        const float w = __shfl_sync(kFullWarpMask, weight, j);
        const float* v_row = v_tile + j * head_dim;
#pragma unroll
        for (int d = 0; d < kMaxDimsPerLane; ++d) {
          if (d < dims_per_lane) acc[i][d] += w * v_row[lane + 32 * d];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (position[i] < 0) continue;
    const int row = first_row + warp + i * kWarps;
    const int64_t token = q_begin + row / a.group;
    const int64_t head = int64_t{kv_head} * a.group + row % a.group;
    if (a.num_splits == 1) {
      const float inv_sum = running_sum[i] > 0.0f ? a.v_scale / running_sum[i] : 0.0f;
#pragma unroll
      for (int d = 0; d < kMaxDimsPerLane; ++d) {
        if (d < dims_per_lane) {
          static_cast<T*>(a.out.data)[token * a.out.row_stride + head * head_dim + lane + 32 * d] =
              from_float<T>(acc[i][d] * inv_sum);
        }
      }
    } else {
      // Written even when this split saw no key (max -inf, sum 0): the merge reads every split.
      const int64_t slot = (int64_t{split} * a.batch.num_tokens + token) * a.num_heads + head;
#pragma unroll
      for (int d = 0; d < kMaxDimsPerLane; ++d) {
        if (d < dims_per_lane) a.partial_acc[slot * head_dim + lane + 32 * d] = acc[i][d];
      }
      if (lane == 0) {
        a.partial_ml[slot * 2] = running_max[i];
        a.partial_ml[slot * 2 + 1] = running_sum[i];
      }
    }
  }
}

// One block per (token, head), one thread per dimension: rescales each split's partial sums
// to the common maximum and normalizes.
template <typename T>
__global__ void merge_splits_kernel(AttentionArgs a) {
  const int64_t token = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int head_dim = a.cache.layout.head_dim;
  const int64_t stride = int64_t{a.batch.num_tokens} * a.num_heads;
  const int64_t first = token * a.num_heads + head;
  float global_max = -INFINITY;
  for (int s = 0; s < a.num_splits; ++s) {
    const int64_t slot = first + s * stride;
    if (a.partial_ml[slot * 2 + 1] > 0.0f) global_max = fmaxf(global_max, a.partial_ml[slot * 2]);
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float numerator = 0.0f;
    float denominator = 0.0f;
    for (int s = 0; s < a.num_splits; ++s) {
      const int64_t slot = first + s * stride;
      const float sum = a.partial_ml[slot * 2 + 1];
      if (sum <= 0.0f) continue;
      const float factor = expf(a.partial_ml[slot * 2] - global_max);
      numerator += a.partial_acc[slot * head_dim + d] * factor;
      denominator += sum * factor;
    }
    static_cast<T*>(a.out.data)[token * a.out.row_stride + head * head_dim + d] =
        from_float<T>(denominator > 0.0f ? numerator / denominator * a.v_scale : 0.0f);
  }
}

}  // namespace

cudaError_t allow_attention_shared_memory(size_t bytes) {
  // Every instance: the activation and KV dtypes are only known per launch.
  for (DType activation : {DType::kBF16, DType::kF32}) {
    for (DType kv : {DType::kBF16, DType::kF32, DType::kF8E4M3}) {
      const cudaError_t error = with_element_type(activation, [&](auto t) {
        return with_kv_element_type(kv, [&](auto k) {
          return cudaFuncSetAttribute(paged_attention_kernel<decltype(t), decltype(k)>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes));
        });
      });
      if (error != cudaSuccess) return error;
    }
  }
  return cudaSuccess;
}

cudaError_t paged_attention(Matrix q, const Batch& batch, const KvPool& cache, int layer,
                            int num_heads, float scale, const AttentionLaunch& plan,
                            float* workspace, Matrix out, unsigned* error_word,
                            cudaStream_t stream) {
  if (batch.num_tokens == 0) return cudaSuccess;
  AttentionArgs args{};
  args.q = q;
  args.out = out;
  args.batch = batch;
  args.cache = cache;
  args.layer = layer;
  args.num_heads = num_heads;
  args.group = plan.group;
  args.scale = scale * cache.k_scale;
  args.v_scale = cache.v_scale;
  args.num_splits = plan.num_splits;
  args.keys_per_split = plan.keys_per_split;
  args.partial_acc = workspace;
  args.partial_ml = workspace + static_cast<size_t>(plan.num_splits) * batch.num_tokens *
                                    num_heads * cache.layout.head_dim;
  args.error_word = error_word;
  const dim3 grid(static_cast<unsigned>(plan.grid_x),
                  static_cast<unsigned>(cache.layout.num_kv_heads),
                  static_cast<unsigned>(batch.num_seqs));
  return with_element_type(q.dtype, [&](auto activation) {
    return with_kv_element_type(cache.layout.dtype, [&](auto cached) {
      using T = decltype(activation);
      using K = decltype(cached);
      paged_attention_kernel<T, K><<<grid, kThreads, plan.shared_bytes, stream>>>(args);
      if (plan.num_splits > 1) {
        const cudaError_t launched = cudaGetLastError();
        if (launched != cudaSuccess) return launched;
        const dim3 merge_grid(static_cast<unsigned>(batch.num_tokens),
                              static_cast<unsigned>(num_heads));
        merge_splits_kernel<T><<<merge_grid, cache.layout.head_dim, 0, stream>>>(args);
      }
      return cudaGetLastError();
    });
  });
}

}  // namespace pdserve::cuda
