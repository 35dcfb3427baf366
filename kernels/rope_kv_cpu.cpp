#include <cmath>
#include <cstring>
#include <string>

#include "common/core/dtype.h"
#include "common/core/float8.h"
#include "kernels/cpu_kernels.h"
#include "kernels/row_ops_avx512.h"

namespace pdserve::cpu {
namespace {

constexpr int kMaxHeadDim = 512;

void norm_and_rotate_head(float* head, const VectorView& norm_weight, float eps, int head_dim,
                          const double* cos_table, const double* sin_table) {
  double sum_squares = 0.0;
  for (int j = 0; j < head_dim; ++j) sum_squares += static_cast<double>(head[j]) * head[j];
  const float inv_rms =
      static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(head_dim) + eps));
  float normed[kMaxHeadDim];
  for (int j = 0; j < head_dim; ++j) {
    normed[j] = head[j] * inv_rms * load_as_float(norm_weight.data, norm_weight.dtype, j);
  }
  // HF rotate-half layout: element j pairs with j + head_dim/2.
  const int half = head_dim / 2;
  for (int j = 0; j < half; ++j) {
    const double x1 = normed[j];
    const double x2 = normed[j + half];
    head[j] = static_cast<float>(x1 * cos_table[j] - x2 * sin_table[j]);
    head[j + half] = static_cast<float>(x2 * cos_table[j] + x1 * sin_table[j]);
  }
}

// An FP8 pool stores src / scale, saturated to +-448 as vLLM's quantizer does (an outlier
// beyond the scale's range clips rather than becoming NaN).
void store_kv(const float* src, void* dst_base, DType dtype, float scale, int64_t offset, int64_t n,
              bool vector) {
  if (dtype == DType::kF8E4M3) {
    auto* dst = static_cast<uint8_t*>(dst_base) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp8_e4m3_saturated(src[i] / scale);
  } else if (dtype == DType::kF32) {
    std::memcpy(static_cast<float*>(dst_base) + offset, src, static_cast<size_t>(n) * 4);
  } else if (dtype == DType::kBF16 && vector) {
    avx512::store_bf16(src, static_cast<uint16_t*>(dst_base) + offset, n);
  } else {
    convert_elements(src, DType::kF32, static_cast<std::byte*>(dst_base) + offset * 2, dtype,
                     static_cast<size_t>(n));
  }
}

}  // namespace

Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v, const QkNormRopeParams& p,
                             const AttentionBatch& batch, const KvCacheView& cache, int layer,
                             CpuThreadPool& pool, CpuIsa isa) {
  const bool vector = uses_avx512(isa);
  if (p.head_dim > kMaxHeadDim) return unimplemented("head_dim above 512");
  const int64_t num_slots = static_cast<int64_t>(cache.layout.num_blocks) * cache.layout.block_size;
  for (int t = 0; t < batch.num_tokens; ++t) {
    if (batch.slot_mapping[t] < 0 || batch.slot_mapping[t] >= num_slots || batch.positions[t] < 0) {
      return invalid_argument("kv write: slot " + std::to_string(batch.slot_mapping[t]) +
                              " or position " + std::to_string(batch.positions[t]) +
                              " out of range");
    }
  }
  const int half = p.head_dim / 2;
  double inv_freq[kMaxHeadDim / 2];
  for (int j = 0; j < half; ++j) inv_freq[j] = std::pow(p.rope_theta, -2.0 * j / p.head_dim);
  pool.run(batch.num_tokens, [&](int64_t t) {
    double cos_table[kMaxHeadDim / 2];
    double sin_table[kMaxHeadDim / 2];
    for (int j = 0; j < half; ++j) {
      const double angle = batch.positions[t] * inv_freq[j];
      cos_table[j] = std::cos(angle);
      sin_table[j] = std::sin(angle);
    }
    const auto rotate = [&](float* head, const VectorView& weight) {
      if (vector) {
        avx512::norm_rope_head(head, weight.data, weight.dtype, p.rms_norm_eps, p.head_dim,
                               cos_table, sin_table);
      } else {
        norm_and_rotate_head(head, weight, p.rms_norm_eps, p.head_dim, cos_table, sin_table);
      }
    };
    float* q_row = q.row<float>(t);
    for (int h = 0; h < p.num_heads; ++h) rotate(q_row + h * p.head_dim, p.q_norm_weight);
    float* k_row = k.row<float>(t);
    for (int h = 0; h < p.num_kv_heads; ++h) rotate(k_row + h * p.head_dim, p.k_norm_weight);
    const int64_t offset = kv_element(cache.layout, layer, batch.slot_mapping[t]);
    const int64_t n = cache.layout.token_elements();
    store_kv(k_row, cache.k, cache.layout.dtype, cache.k_scale(layer), offset, n, vector);
    store_kv(v.row<float>(t), cache.v, cache.layout.dtype, cache.v_scale(layer), offset, n, vector);
  });
  return {};
}

}  // namespace pdserve::cpu
