// Per-head RMSNorm + rotary embedding of q and k, and the KV pool write, on CUDA: one block
// per token, one warp per head; one instance per activation type T (bfloat16 or float32) and
// KV element type K (those or FP8 E4M3, which stores x / the layer's scale, saturated).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kWarps = 8;

// Normalizes and rotates one head in place (HF rotate-half: j pairs with j + head_dim/2);
// when `cache` is set, also stores the result divided by cache_scale there. Angles are formed in double like the
// CPU reference: position * inv_freq reaches 1e5 radians and float would lose the phase.
template <typename T, typename K>
__device__ void norm_rope_head(T* head, Vector norm_weight, float eps, double rope_theta,
                               int head_dim, int position, K* cache, float cache_scale) {
  const int lane = threadIdx.x % 32;
  const int half = head_dim / 2;
  float sum_squares = 0.0f;
  for (int j = lane; j < half; j += 32) {
    const float x1 = to_float(head[j]);
    const float x2 = to_float(head[j + half]);
    sum_squares += x1 * x1 + x2 * x2;
  }
  const float inv_rms = rsqrtf(warp_sum(sum_squares) / static_cast<float>(head_dim) + eps);
  for (int j = lane; j < half; j += 32) {
    const float x1 =
        to_float(head[j]) * inv_rms * load_float(norm_weight.data, norm_weight.dtype, j);
    const float x2 = to_float(head[j + half]) * inv_rms *
                     load_float(norm_weight.data, norm_weight.dtype, j + half);
    const double inv_freq = pow(rope_theta, -2.0 * j / head_dim);
    double sin_angle = 0.0;
    double cos_angle = 0.0;
    sincos(position * inv_freq, &sin_angle, &cos_angle);
    const float c = static_cast<float>(cos_angle);
    const float s = static_cast<float>(sin_angle);
    const float y1 = x1 * c - x2 * s;
    const float y2 = x2 * c + x1 * s;
    head[j] = from_float<T>(y1);
    head[j + half] = from_float<T>(y2);
    if (cache != nullptr) {
      cache[j] = from_float<K>(y1 / cache_scale);
      cache[j + half] = from_float<K>(y2 / cache_scale);
    }
  }
}

template <typename T, typename K>
__global__ void qk_norm_rope_kv_kernel(Matrix q, Matrix k, Matrix v, RopeArgs p, Batch batch,
                                       KvPool cache, int layer, unsigned* error_word) {
  const int token = blockIdx.x;
  const int slot = batch.slot_mapping[token];
  const int position = batch.positions[token];
  const int64_t num_slots = static_cast<int64_t>(cache.layout.num_blocks) * cache.layout.block_size;
  if (slot < 0 || slot >= num_slots || position < 0) {
    if (threadIdx.x == 0) atomicOr(error_word, kKvSlotOutOfRange);
    return;
  }
  const int64_t kv_offset = kv_element(cache.layout, layer, slot);
  const int warp = threadIdx.x / 32;
  for (int h = warp; h < p.num_heads + p.num_kv_heads; h += kWarps) {
    if (h < p.num_heads) {
      T* head = static_cast<T*>(q.data) + token * q.row_stride + int64_t{h} * p.head_dim;
      norm_rope_head<T, K>(head, p.q_norm_weight, p.rms_norm_eps, p.rope_theta, p.head_dim,
                           position, nullptr, 1.0f);
    } else {
      const int64_t kv_head = h - p.num_heads;
      T* head = static_cast<T*>(k.data) + token * k.row_stride + kv_head * p.head_dim;
      K* cached = static_cast<K*>(cache.k) + kv_offset + kv_head * p.head_dim;
      norm_rope_head<T, K>(head, p.k_norm_weight, p.rms_norm_eps, p.rope_theta, p.head_dim,
                           position, cached, cache.k_scale);
    }
  }
  const T* v_row = static_cast<const T*>(v.data) + token * v.row_stride;
  K* v_cached = static_cast<K*>(cache.v) + kv_offset;
  for (int64_t j = threadIdx.x; j < v.cols; j += blockDim.x) {
    v_cached[j] = from_float<K>(to_float(v_row[j]) / cache.v_scale);
  }
}

}  // namespace

cudaError_t qk_norm_rope_kv_write(Matrix q, Matrix k, Matrix v, const RopeArgs& params,
                                  const Batch& batch, const KvPool& cache, int layer,
                                  unsigned* error_word, cudaStream_t stream) {
  if (batch.num_tokens == 0) return cudaSuccess;
  return with_element_type(q.dtype, [&](auto activation) {
    return with_kv_element_type(cache.layout.dtype, [&](auto cached) {
      using T = decltype(activation);
      using K = decltype(cached);
      qk_norm_rope_kv_kernel<T, K>
          <<<static_cast<unsigned>(batch.num_tokens), kWarps * 32, 0, stream>>>(
              q, k, v, params, batch, cache, layer, error_word);
      return cudaGetLastError();
    });
  });
}

}  // namespace pdserve::cuda
