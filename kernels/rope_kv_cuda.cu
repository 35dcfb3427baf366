// Per-head RMSNorm + rotary embedding of q and k, and the KV pool write, on CUDA: one block
// per token, one warp per head.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kWarps = 8;

// Normalizes and rotates one head in place (HF rotate-half: j pairs with j + head_dim/2);
// when `cache` is set, also stores the result there. Angles are formed in double like the
// CPU reference: position * inv_freq reaches 1e5 radians and float would lose the phase.
__device__ void norm_rope_head(void* row, DType dtype, int64_t offset, Vector norm_weight,
                               float eps, double rope_theta, int head_dim, int position,
                               void* cache, DType cache_dtype, int64_t cache_offset) {
  const int lane = threadIdx.x % 32;
  const int half = head_dim / 2;
  float sum_squares = 0.0f;
  for (int j = lane; j < half; j += 32) {
    const float x1 = load_float(row, dtype, offset + j);
    const float x2 = load_float(row, dtype, offset + j + half);
    sum_squares += x1 * x1 + x2 * x2;
  }
  const float inv_rms = rsqrtf(warp_sum(sum_squares) / static_cast<float>(head_dim) + eps);
  for (int j = lane; j < half; j += 32) {
    const float x1 = load_float(row, dtype, offset + j) * inv_rms *
                     load_float(norm_weight.data, norm_weight.dtype, j);
    const float x2 = load_float(row, dtype, offset + j + half) * inv_rms *
                     load_float(norm_weight.data, norm_weight.dtype, j + half);
    const double inv_freq = pow(rope_theta, -2.0 * j / head_dim);
    double sin_angle = 0.0;
    double cos_angle = 0.0;
    sincos(position * inv_freq, &sin_angle, &cos_angle);
    const float c = static_cast<float>(cos_angle);
    const float s = static_cast<float>(sin_angle);
    const float y1 = x1 * c - x2 * s;
    const float y2 = x2 * c + x1 * s;
    store_float(row, dtype, offset + j, y1);
    store_float(row, dtype, offset + j + half, y2);
    if (cache != nullptr) {
      store_float(cache, cache_dtype, cache_offset + j, y1);
      store_float(cache, cache_dtype, cache_offset + j + half, y2);
    }
  }
}

__global__ void qk_norm_rope_kv_kernel(Matrix q, Matrix k, Matrix v, RopeArgs p, Batch batch,
                                       KvPool cache, int64_t layer_offset, unsigned* error_word) {
  const int token = blockIdx.x;
  const int slot = batch.slot_mapping[token];
  const int position = batch.positions[token];
  const int64_t num_slots = static_cast<int64_t>(cache.layout.num_blocks) * cache.layout.block_size;
  if (slot < 0 || slot >= num_slots || position < 0) {
    if (threadIdx.x == 0) atomicOr(error_word, kKvSlotOutOfRange);
    return;
  }
  const int64_t kv_offset = layer_offset + slot * cache.layout.token_elements();
  const int warp = threadIdx.x / 32;
  for (int h = warp; h < p.num_heads + p.num_kv_heads; h += kWarps) {
    if (h < p.num_heads) {
      norm_rope_head(q.data, q.dtype, token * q.row_stride + int64_t{h} * p.head_dim,
                     p.q_norm_weight, p.rms_norm_eps, p.rope_theta, p.head_dim, position, nullptr,
                     cache.layout.dtype, 0);
    } else {
      const int kv_head = h - p.num_heads;
      norm_rope_head(k.data, k.dtype, token * k.row_stride + int64_t{kv_head} * p.head_dim,
                     p.k_norm_weight, p.rms_norm_eps, p.rope_theta, p.head_dim, position, cache.k,
                     cache.layout.dtype, kv_offset + int64_t{kv_head} * p.head_dim);
    }
  }
  for (int64_t j = threadIdx.x; j < v.cols; j += blockDim.x) {
    store_float(cache.v, cache.layout.dtype, kv_offset + j,
                load_float(v.data, v.dtype, token * v.row_stride + j));
  }
}

}  // namespace

cudaError_t qk_norm_rope_kv_write(Matrix q, Matrix k, Matrix v, const RopeArgs& params,
                                  const Batch& batch, const KvPool& cache, int layer,
                                  unsigned* error_word, cudaStream_t stream) {
  if (batch.num_tokens == 0) return cudaSuccess;
  const int64_t layer_offset = static_cast<int64_t>(layer) * cache.layout.layer_elements();
  qk_norm_rope_kv_kernel<<<static_cast<unsigned>(batch.num_tokens), kWarps * 32, 0, stream>>>(
      q, k, v, params, batch, cache, layer_offset, error_word);
  return cudaGetLastError();
}

}  // namespace pdserve::cuda
