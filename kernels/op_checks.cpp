#include "kernels/op_checks.h"

#include <string>

namespace pdserve {
namespace {

std::string shape(MatrixView m) {
  return "[" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]";
}

Status check_view(MatrixView m, const char* op, const char* name) {
  if (m.rows < 0 || m.cols < 0 || m.row_stride < m.cols) {
    return invalid_argument(std::string(op) + ": bad view " + name + " " + shape(m));
  }
  if (m.data == nullptr && m.rows > 0 && m.cols > 0) {
    return invalid_argument(std::string(op) + ": null " + name);
  }
  return {};
}

}  // namespace

Status check_same_shape(MatrixView a, MatrixView b, const char* op) {
  PDS_RETURN_IF_ERROR(check_view(a, op, "a"));
  PDS_RETURN_IF_ERROR(check_view(b, op, "b"));
  if (a.rows != b.rows || a.cols != b.cols) {
    return invalid_argument(std::string(op) + ": shapes differ " + shape(a) + " vs " + shape(b));
  }
  return {};
}

Status check_embedding(MatrixView table, MatrixView out) {
  PDS_RETURN_IF_ERROR(check_view(table, "embedding", "table"));
  PDS_RETURN_IF_ERROR(check_view(out, "embedding", "out"));
  if (table.cols != out.cols) return invalid_argument("embedding: width mismatch");
  return {};
}

Status check_rms_norm(MatrixView in, VectorView weight, MatrixView out) {
  PDS_RETURN_IF_ERROR(check_same_shape(in, out, "rms_norm"));
  if (weight.size != in.cols || weight.data == nullptr) {
    return invalid_argument("rms_norm: weight size " + std::to_string(weight.size) + " != width " +
                            std::to_string(in.cols));
  }
  return {};
}

Status check_linear(MatrixView in, MatrixView weight, MatrixView out) {
  PDS_RETURN_IF_ERROR(check_view(in, "linear", "in"));
  PDS_RETURN_IF_ERROR(check_view(weight, "linear", "weight"));
  PDS_RETURN_IF_ERROR(check_view(out, "linear", "out"));
  if (in.cols != weight.cols || out.rows != in.rows || out.cols != weight.rows) {
    return invalid_argument("linear: in " + shape(in) + " weight " + shape(weight) + " out " +
                            shape(out));
  }
  const bool fp8 = weight.dtype == DType::kF8E4M3;
  if (fp8 && (weight.scale == nullptr || weight.scale_block_n <= 0 || weight.scale_block_k <= 0)) {
    return invalid_argument("linear: an FP8 weight " + shape(weight) +
                            " needs its scales and positive scale blocks");
  }
  if (!fp8 && weight.scale != nullptr) {
    return invalid_argument("linear: only FP8 weights have scales");
  }
  return {};
}

Status check_qk_norm_rope(MatrixView q, MatrixView k, MatrixView v, const QkNormRopeParams& p,
                          const AttentionBatch& batch, const KvCacheView& cache, int layer) {
  PDS_RETURN_IF_ERROR(check_view(q, "qk_norm_rope", "q"));
  PDS_RETURN_IF_ERROR(check_same_shape(k, v, "qk_norm_rope"));
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.num_heads <= 0 || p.num_kv_heads <= 0) {
    return invalid_argument("qk_norm_rope: bad head configuration");
  }
  if (q.rows != batch.num_tokens || k.rows != batch.num_tokens ||
      q.cols != static_cast<int64_t>(p.num_heads) * p.head_dim ||
      k.cols != static_cast<int64_t>(p.num_kv_heads) * p.head_dim) {
    return invalid_argument("qk_norm_rope: q " + shape(q) + " k " + shape(k) +
                            " do not match the batch and head configuration");
  }
  if (p.q_norm_weight.size != p.head_dim || p.k_norm_weight.size != p.head_dim) {
    return invalid_argument("qk_norm_rope: norm weights must have head_dim elements");
  }
  if (cache.layout.num_kv_heads != p.num_kv_heads || cache.layout.head_dim != p.head_dim || layer < 0 ||
      layer >= cache.layout.num_layers) {
    return invalid_argument("qk_norm_rope: KV cache does not match the layer");
  }
  return {};
}

Status check_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                       int layer, int num_heads, MatrixView out) {
  PDS_RETURN_IF_ERROR(check_same_shape(q, out, "paged_attention"));
  if (num_heads <= 0 || num_heads % cache.layout.num_kv_heads != 0 ||
      q.cols != static_cast<int64_t>(num_heads) * cache.layout.head_dim || q.rows != batch.num_tokens) {
    return invalid_argument("paged_attention: q " + shape(q) + " does not match " +
                            std::to_string(num_heads) + " heads of " +
                            std::to_string(cache.layout.head_dim));
  }
  if (layer < 0 || layer >= cache.layout.num_layers) return invalid_argument("paged_attention: bad layer");
  return {};
}

}  // namespace pdserve
