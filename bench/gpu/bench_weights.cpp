#include "bench/gpu/bench_weights.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/float8.h"

namespace pdserve {
namespace {

const uint16_t kProjectionBits = float_to_bf16(0.01f);
constexpr uint8_t kFp8One = 0x38;  // E4M3: exponent 7 (the bias), mantissa 0
static_assert(fp8_e4m3_to_float(kFp8One) == 1.0f);

HostTensor shared_tensor(DType dtype, std::vector<int64_t> shape,
                         std::shared_ptr<const void> data) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = static_cast<const std::byte*>(data.get());
  t.keep_alive = std::move(data);
  return t;
}

template <typename T>
std::shared_ptr<const void> filled(int64_t count, T value) {
  auto data = std::make_shared<std::vector<T>>(static_cast<size_t>(count), value);
  return {data, data->data()};
}

int64_t scale_blocks(int64_t rows, int64_t cols) {
  return (rows + kFp8WeightBlock - 1) / kFp8WeightBlock *
         ((cols + kFp8WeightBlock - 1) / kFp8WeightBlock);
}

// A layer's projections (rows x cols each), all views of one buffer of codes and one of scales
// sized for the largest.
class ProjectionSource {
 public:
  ProjectionSource(BenchWeights weights, std::span<const std::pair<int64_t, int64_t>> shapes)
      : weights_(weights) {
    int64_t elements = 0;
    int64_t blocks = 0;
    for (const auto& [rows, cols] : shapes) {
      elements = std::max(elements, rows * cols);
      blocks = std::max(blocks, scale_blocks(rows, cols));
    }
    if (weights == BenchWeights::kBF16) {
      values_ = filled<uint16_t>(elements, kProjectionBits);
    } else {
      values_ = filled<uint8_t>(elements, kFp8One);
      scales_ = filled<float>(blocks, bf16_to_float(kProjectionBits));
    }
  }

  HostTensor make(int64_t rows, int64_t cols) const {
    if (weights_ == BenchWeights::kBF16) return shared_tensor(DType::kBF16, {rows, cols}, values_);
    HostTensor t = shared_tensor(DType::kF8E4M3, {rows, cols}, values_);
    t.scale = static_cast<const float*>(scales_.get());
    t.scale_block_n = kFp8WeightBlock;
    t.scale_block_k = kFp8WeightBlock;
    t.scale_keep_alive = scales_;
    return t;
  }

 private:
  BenchWeights weights_;
  std::shared_ptr<const void> values_;
  std::shared_ptr<const void> scales_;
};

}  // namespace

const char* bench_weights_name(BenchWeights weights) {
  return weights == BenchWeights::kBF16 ? "bf16" : "fp8";
}

ModelConfig bench_config(ModelConfig config, BenchWeights weights) {
  config.quantization.reset();
  if (weights == BenchWeights::kFp8) {
    config.quantization = Fp8WeightQuantization{kFp8WeightBlock, kFp8WeightBlock};
  }
  return config;
}

Qwen3Weights constant_qwen3_weights(const ModelConfig& config, BenchWeights weights) {
  const int64_t hidden = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  const int64_t q_width = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_width = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t embedding = int64_t{config.vocab_size} * hidden;
  const std::pair<int64_t, int64_t> shapes[] = {
      {q_width, hidden}, {kv_width, hidden}, {hidden, q_width}, {inter, hidden}, {hidden, inter}};
  const ProjectionSource projections(weights, shapes);
  const std::shared_ptr<const void> ones =
      filled<uint16_t>(std::max<int64_t>(hidden, config.head_dim), float_to_bf16(1.0f));

  Qwen3Weights w;
  w.config = bench_config(config, weights);
  w.embed_tokens =
      shared_tensor(DType::kBF16, {config.vocab_size, hidden}, filled(embedding, kProjectionBits));
  w.final_norm = shared_tensor(DType::kBF16, {hidden}, ones);
  w.lm_head = config.tie_word_embeddings ? w.embed_tokens
                                         : shared_tensor(DType::kBF16, {config.vocab_size, hidden},
                                                         filled(embedding, kProjectionBits));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    Qwen3LayerWeights layer;
    layer.input_layernorm = shared_tensor(DType::kBF16, {hidden}, ones);
    layer.post_attention_layernorm = shared_tensor(DType::kBF16, {hidden}, ones);
    layer.q_norm = shared_tensor(DType::kBF16, {config.head_dim}, ones);
    layer.k_norm = shared_tensor(DType::kBF16, {config.head_dim}, ones);
    layer.q_proj = projections.make(q_width, hidden);
    layer.k_proj = projections.make(kv_width, hidden);
    layer.v_proj = projections.make(kv_width, hidden);
    layer.o_proj = projections.make(hidden, q_width);
    layer.gate_proj = projections.make(inter, hidden);
    layer.up_proj = projections.make(inter, hidden);
    layer.down_proj = projections.make(hidden, inter);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

HostTensor constant_projection(BenchWeights weights, int64_t rows, int64_t cols) {
  const std::pair<int64_t, int64_t> shape[] = {{rows, cols}};
  return ProjectionSource(weights, shape).make(rows, cols);
}

}  // namespace pdserve
