#include "kernels/model/qwen3_model.h"

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/model/fp8_scale_concat.h"

namespace pdserve {
namespace {

Result<DeviceBuffer> allocate_matrix(Backend& backend, int64_t rows, int64_t cols, DType dtype) {
  return backend.allocate(static_cast<size_t>(rows * cols) * dtype_size(dtype));
}

// The tensor's bytes in `dtype`: the tensor itself, or a converted copy in `scratch`.
const std::byte* bytes_in(const HostTensor& tensor, DType dtype, std::vector<std::byte>& scratch) {
  if (tensor.dtype == dtype) return tensor.data;
  scratch.resize(static_cast<size_t>(tensor.numel()) * dtype_size(dtype));
  convert_elements(tensor.data, tensor.dtype, scratch.data(), dtype,
                   static_cast<size_t>(tensor.numel()));
  return scratch.data();
}

// The batch arrays in packing order, each starting on a kPackAlignment boundary.
constexpr size_t kPackAlignment = 16;

size_t aligned(size_t bytes) {
  return (bytes + kPackAlignment - 1) / kPackAlignment * kPackAlignment;
}

}  // namespace

size_t packed_batch_capacity_bytes(const ForwardLimits& limits, int max_blocks_per_seq) {
  const size_t tokens = static_cast<size_t>(limits.max_num_tokens);
  const size_t seqs = static_cast<size_t>(limits.max_num_seqs);
  const size_t ints = sizeof(int32_t);
  // token ids, positions, slots; query starts, context lengths, logits rows; block tables
  return 3 * aligned(tokens * ints) + aligned((seqs + 1) * ints) + 2 * aligned(seqs * ints) +
         aligned(seqs * static_cast<size_t>(max_blocks_per_seq) * ints);
}

Result<ForwardContext> ForwardContext::create(Backend& backend, const ModelConfig& config,
                                              const ForwardLimits& limits, int block_size,
                                              size_t extra_input_bytes) {
  if (limits.max_num_tokens <= 0 || limits.max_num_seqs <= 0 || limits.max_model_len <= 0 ||
      block_size <= 0) {
    return invalid_argument("forward limits must be positive");
  }
  ForwardContext context;
  context.limits_ = limits;
  context.block_size_ = block_size;
  context.max_blocks_per_seq_ = (limits.max_model_len + block_size - 1) / block_size;
  const int64_t tokens = limits.max_num_tokens;
  const int64_t seqs = limits.max_num_seqs;
  const int64_t q_width = static_cast<int64_t>(config.num_attention_heads) * config.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config.num_key_value_heads) * config.head_dim;
  const DType act = backend.activation_dtype();
  PDS_ASSIGN_OR_RETURN(context.hidden_, allocate_matrix(backend, tokens, config.hidden_size, act));
  PDS_ASSIGN_OR_RETURN(context.residual_,
                       allocate_matrix(backend, tokens, config.hidden_size, act));
  PDS_ASSIGN_OR_RETURN(context.qkv_, allocate_matrix(backend, tokens, q_width + 2 * kv_width, act));
  PDS_ASSIGN_OR_RETURN(context.attention_out_, allocate_matrix(backend, tokens, q_width, act));
  PDS_ASSIGN_OR_RETURN(
      context.gate_up_,
      allocate_matrix(backend, tokens, 2 * int64_t{config.intermediate_size}, act));
  PDS_ASSIGN_OR_RETURN(context.mlp_act_,
                       allocate_matrix(backend, tokens, config.intermediate_size, act));
  PDS_ASSIGN_OR_RETURN(context.last_hidden_,
                       allocate_matrix(backend, seqs, config.hidden_size, act));
  PDS_ASSIGN_OR_RETURN(context.logits_,
                       allocate_matrix(backend, seqs, config.vocab_size, DType::kF32));
  context.batch_capacity_bytes_ = packed_batch_capacity_bytes(limits, context.max_blocks_per_seq_);
  context.extra_capacity_bytes_ = aligned(extra_input_bytes);
  const size_t input_bytes = context.batch_capacity_bytes_ + context.extra_capacity_bytes_;
  PDS_ASSIGN_OR_RETURN(context.inputs_, backend.allocate(input_bytes));
  PDS_ASSIGN_OR_RETURN(context.staging_, backend.allocate_host(input_bytes));
  context.backend_ = &backend;
  return context;
}

Result<MatrixView> Qwen3Model::place_matrix(const HostTensor& tensor) {
  if (tensor.shape.size() != 2) return invalid_argument("expected a matrix");
  if (backend_.shares_host_memory()) {
    MatrixView view = MatrixView::dense(const_cast<std::byte*>(tensor.data), tensor.dtype,
                                        tensor.shape[0], tensor.shape[1]);
    view.scale = tensor.scale;
    view.scale_block_n = tensor.scale_block_n;
    view.scale_block_k = tensor.scale_block_k;
    return view;
  }
  return place_concatenated({&tensor});
}

Result<MatrixView> Qwen3Model::place_concatenated(std::initializer_list<const HostTensor*> parts) {
  const DType dtype = backend_.activation_dtype();
  const int64_t cols = (*parts.begin())->shape[1];
  int64_t rows = 0;
  if ((*parts.begin())->dtype == DType::kF8E4M3) return place_fp8_concatenated(parts);
  for (const HostTensor* part : parts) {
    if (part->dtype == DType::kF8E4M3) {
      return invalid_argument("cannot concatenate FP8 and other weight matrices");
    }
    if (part->shape.size() != 2 || part->shape[1] != cols) {
      return invalid_argument("cannot concatenate weight matrices of different widths");
    }
    rows += part->shape[0];
  }
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dtype);
  PDS_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                       backend_.allocate(static_cast<size_t>(rows) * row_bytes));
  std::vector<std::byte> scratch;
  size_t offset = 0;
  for (const HostTensor* part : parts) {
    const size_t bytes = static_cast<size_t>(part->shape[0]) * row_bytes;
    PDS_RETURN_IF_ERROR(backend_.copy_to_device(buffer.as<std::byte>() + offset,
                                                bytes_in(*part, dtype, scratch), bytes));
    // The copy may still read `scratch` until the stream reaches it.
    PDS_RETURN_IF_ERROR(backend_.synchronize());
    offset += bytes;
  }
  const MatrixView view = MatrixView::dense(buffer.data(), dtype, rows, cols);
  device_weights_.push_back(std::move(buffer));
  return view;
}

// FP8 weights stay one byte a weight on the device: the codes are copied as they are and the
// parts' scale grids joined into one (fp8_scale_concat.h), uploaded beside them.
Result<MatrixView> Qwen3Model::place_fp8_concatenated(
    std::initializer_list<const HostTensor*> parts) {
  const int64_t cols = (*parts.begin())->shape[1];
  std::vector<Fp8ScalePart> scale_parts;
  int64_t rows = 0;
  for (const HostTensor* part : parts) {
    if (part->dtype != DType::kF8E4M3) {
      return invalid_argument("cannot concatenate FP8 and other weight matrices");
    }
    if (part->shape.size() != 2 || part->shape[1] != cols) {
      return invalid_argument("cannot concatenate weight matrices of different widths");
    }
    scale_parts.push_back(
        {part->shape[0], cols, part->scale, part->scale_block_n, part->scale_block_k});
    rows += part->shape[0];
  }
  PDS_ASSIGN_OR_RETURN(Fp8ScaleGrid grid, concatenate_fp8_scales(scale_parts));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer codes, backend_.allocate(static_cast<size_t>(rows * cols)));
  const size_t scale_bytes = grid.scales.size() * sizeof(float);
  PDS_ASSIGN_OR_RETURN(DeviceBuffer scales, backend_.allocate(scale_bytes));
  size_t offset = 0;
  for (const HostTensor* part : parts) {
    const size_t bytes = static_cast<size_t>(part->shape[0] * cols);
    PDS_RETURN_IF_ERROR(backend_.copy_to_device(codes.as<std::byte>() + offset, part->data, bytes));
    offset += bytes;
  }
  PDS_RETURN_IF_ERROR(backend_.copy_to_device(scales.data(), grid.scales.data(), scale_bytes));
  PDS_RETURN_IF_ERROR(backend_.synchronize());  // the copies may read `grid` until then
  MatrixView view = MatrixView::dense(codes.data(), DType::kF8E4M3, rows, cols);
  view.scale = scales.as<float>();
  view.scale_block_n = grid.block_n;
  view.scale_block_k = grid.block_k;
  device_weights_.push_back(std::move(codes));
  device_weights_.push_back(std::move(scales));
  return view;
}

Result<VectorView> Qwen3Model::place_vector(const HostTensor& tensor) {
  HostTensor as_matrix = tensor;
  as_matrix.shape = {1, tensor.numel()};
  PDS_ASSIGN_OR_RETURN(MatrixView placed, place_matrix(as_matrix));
  return VectorView{placed.data, placed.dtype, placed.cols};
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::create(Backend& backend, Qwen3Weights weights) {
  std::unique_ptr<Qwen3Model> model(new Qwen3Model(backend, std::move(weights)));
  const Qwen3Weights& w = model->weights_;
  PDS_ASSIGN_OR_RETURN(model->embed_tokens_, model->place_matrix(w.embed_tokens));
  if (w.lm_head.data == w.embed_tokens.data) {
    model->lm_head_ = model->embed_tokens_;  // tied: one copy on the device too
  } else {
    PDS_ASSIGN_OR_RETURN(model->lm_head_, model->place_matrix(w.lm_head));
  }
  PDS_ASSIGN_OR_RETURN(model->final_norm_, model->place_vector(w.final_norm));
  for (const Qwen3LayerWeights& layer : w.layers) {
    LayerViews views;
    PDS_ASSIGN_OR_RETURN(views.input_norm, model->place_vector(layer.input_layernorm));
    PDS_ASSIGN_OR_RETURN(views.post_attention_norm,
                         model->place_vector(layer.post_attention_layernorm));
    PDS_ASSIGN_OR_RETURN(views.q_norm, model->place_vector(layer.q_norm));
    PDS_ASSIGN_OR_RETURN(views.k_norm, model->place_vector(layer.k_norm));
    if (backend.shares_host_memory()) {
      PDS_ASSIGN_OR_RETURN(views.q_proj, model->place_matrix(layer.q_proj));
      PDS_ASSIGN_OR_RETURN(views.k_proj, model->place_matrix(layer.k_proj));
      PDS_ASSIGN_OR_RETURN(views.v_proj, model->place_matrix(layer.v_proj));
      PDS_ASSIGN_OR_RETURN(views.gate_proj, model->place_matrix(layer.gate_proj));
      PDS_ASSIGN_OR_RETURN(views.up_proj, model->place_matrix(layer.up_proj));
    } else {
      PDS_ASSIGN_OR_RETURN(
          views.qkv_proj, model->place_concatenated({&layer.q_proj, &layer.k_proj, &layer.v_proj}));
      PDS_ASSIGN_OR_RETURN(views.gate_up_proj,
                           model->place_concatenated({&layer.gate_proj, &layer.up_proj}));
    }
    PDS_ASSIGN_OR_RETURN(views.o_proj, model->place_matrix(layer.o_proj));
    PDS_ASSIGN_OR_RETURN(views.down_proj, model->place_matrix(layer.down_proj));
    model->layers_.push_back(views);
  }
  return model;
}

Status ForwardContext::pack_batch(AttentionBatch& batch) {
  const HostBatch& host = host_batch_;
  std::byte* const staging = staging_.as<std::byte>();
  std::byte* const device = inputs_.as<std::byte>();
  size_t offset = 0;
  Status status;
  // Appends one array; returns where it will be on the device.
  const auto pack = [&](const std::vector<int32_t>& array) -> int32_t* {
    const size_t bytes = array.size() * sizeof(int32_t);
    if (offset + bytes > batch_capacity_bytes_) {
      status = out_of_range("forward: a batch array of " + std::to_string(array.size()) +
                            " entries exceeds the forward context's limits");
      return nullptr;
    }
    if (bytes > 0) std::memcpy(staging + offset, array.data(), bytes);
    int32_t* placed = reinterpret_cast<int32_t*>(device + offset);
    offset += aligned(bytes);
    return placed;
  };
  // Arrays sized by tokens, then by sequences, the block tables last: a graph's padded batch
  // (tokens == sequences == its bucket) finds every array where it was captured.
  token_ids_.data = pack(host.token_ids);
  batch.positions = pack(host.positions);
  batch.slot_mapping = pack(host.slot_mapping);
  batch.query_start = pack(host.query_start);
  batch.context_lens = pack(host.context_lens);
  logits_rows_.data = pack(host.logits_rows);
  batch.block_tables = pack(host.block_tables);
  PDS_RETURN_IF_ERROR(status);
  packed_bytes_ = offset;
  batch.num_seqs = host.num_seqs;
  batch.num_tokens = host.num_tokens;
  batch.max_blocks_per_seq = host.max_blocks_per_seq;
  batch.max_query_len = host.max_query_len;
  batch.max_context_len = host.max_context_len;
  return {};
}

std::span<std::byte> ForwardContext::extra_inputs() const {
  return {staging_.as<std::byte>() + packed_bytes_, extra_capacity_bytes_};
}

void* ForwardContext::device_extra_inputs() const {
  return inputs_.as<std::byte>() + packed_bytes_;
}

Status ForwardContext::upload_inputs(size_t extra_bytes) {
  if (extra_bytes > extra_capacity_bytes_) {
    return out_of_range("forward: " + std::to_string(extra_bytes) +
                        " bytes of extra step inputs exceed the " +
                        std::to_string(extra_capacity_bytes_) + " reserved");
  }
  return backend_->copy_to_device(inputs_.data(), staging_.data(), packed_bytes_ + extra_bytes);
}

Status Qwen3Model::upload_batch(ForwardContext& context, AttentionBatch& batch) {
  PDS_RETURN_IF_ERROR(context.pack_batch(batch));
  return context.upload_inputs(0);
}

Status Qwen3Model::prepare_batch(std::span<const SequenceSlice> slices, const KvCache& cache,
                                 ForwardContext& context) const {
  const ModelConfig& config = weights_.config;
  const KvCacheView kv = cache.view();
  if (kv.layout.num_layers != config.num_hidden_layers || kv.layout.num_kv_heads != config.num_key_value_heads ||
      kv.layout.head_dim != config.head_dim || kv.layout.block_size != context.block_size_) {
    return invalid_argument("forward: the KV cache does not match the model or the context");
  }
  BatchLimits limits;
  limits.max_num_tokens = context.limits_.max_num_tokens;
  limits.max_num_seqs = context.limits_.max_num_seqs;
  limits.max_blocks_per_seq = context.max_blocks_per_seq_;
  limits.block_size = kv.layout.block_size;
  limits.num_blocks = kv.layout.num_blocks;
  limits.vocab_size = config.vocab_size;
  limits.max_position_embeddings =
      std::min(config.max_position_embeddings, context.limits_.max_model_len);
  return build_host_batch(slices, limits, context.host_batch_);
}

LayerProgress::LayerProgress(Backend& backend, std::function<void(int layer)> observer,
                             int num_layers)
    : backend_(backend), observer_(std::move(observer)), num_layers_(num_layers) {}

Status LayerProgress::written(int layer) {
  if (!observer_) return Status::ok_status();
  if (layer >= Backend::kMaxMarkers) {
    return invalid_argument("forward: more layers than the backend has markers");
  }
  PDS_RETURN_IF_ERROR(backend_.record_marker(layer));
  recorded_ = layer + 1;
  return poll();
}

Status LayerProgress::poll() {
  while (observer_ && next_ < recorded_) {
    PDS_ASSIGN_OR_RETURN(const bool reached, backend_.marker_reached(next_));
    if (!reached) break;
    observer_(next_++);
  }
  return Status::ok_status();
}

Status LayerProgress::drain() {
  while (observer_ && next_ < recorded_) {
    PDS_RETURN_IF_ERROR(poll());
    if (next_ < recorded_) std::this_thread::yield();
  }
  return Status::ok_status();
}

void LayerProgress::finish_after_wait() {
  while (observer_ && next_ < num_layers_) observer_(next_++);
}

Status Qwen3Model::forward(std::span<const SequenceSlice> slices, KvCache& cache,
                           ForwardContext& context, std::span<float> logits,
                           const std::function<void(int layer)>& on_layer_written) {
  const size_t vocab = static_cast<size_t>(weights_.config.vocab_size);
  PDS_RETURN_IF_ERROR(prepare_batch(slices, cache, context));
  if (logits.size() < slices.size() * vocab)
    return invalid_argument("forward: logits buffer too small");
  AttentionBatch batch;
  PDS_RETURN_IF_ERROR(upload_batch(context, batch));
  PDS_RETURN_IF_ERROR(compute(batch, cache.view(), context, on_layer_written));
  return fetch_logits(context, batch.num_seqs, logits);
}

Status Qwen3Model::compute(const AttentionBatch& batch, const KvCacheView& kv,
                           ForwardContext& context,
                           const std::function<void(int layer)>& on_layer_written) {
  LayerProgress layers(backend_, on_layer_written, config().num_hidden_layers);
  PDS_RETURN_IF_ERROR(compute(batch, kv, context, &layers));
  return layers.drain();
}

Status Qwen3Model::compute(const AttentionBatch& batch, const KvCacheView& kv,
                           ForwardContext& context, LayerProgress* layers) {
  const ModelConfig& config = weights_.config;
  const int64_t tokens = batch.num_tokens;
  const DType act = backend_.activation_dtype();
  const int64_t hidden_size = config.hidden_size;
  const int64_t q_width = static_cast<int64_t>(config.num_attention_heads) * config.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config.num_key_value_heads) * config.head_dim;
  const int64_t inter = config.intermediate_size;

  const MatrixView hidden = MatrixView::dense(context.hidden_.data(), act, tokens, hidden_size);
  const MatrixView residual = MatrixView::dense(context.residual_.data(), act, tokens, hidden_size);
  const MatrixView qkv =
      MatrixView::dense(context.qkv_.data(), act, tokens, q_width + 2 * kv_width);
  const MatrixView q = qkv.column_slice(0, q_width);
  const MatrixView k = qkv.column_slice(q_width, kv_width);
  const MatrixView v = qkv.column_slice(q_width + kv_width, kv_width);
  const MatrixView attention_out =
      MatrixView::dense(context.attention_out_.data(), act, tokens, q_width);
  const MatrixView gate_up = MatrixView::dense(context.gate_up_.data(), act, tokens, 2 * inter);
  const MatrixView gate = gate_up.column_slice(0, inter);
  const MatrixView up = gate_up.column_slice(inter, inter);
  const MatrixView mlp_act = MatrixView::dense(context.mlp_act_.data(), act, tokens, inter);

  QkNormRopeParams rope;
  rope.rms_norm_eps = config.rms_norm_eps;
  rope.rope_theta = config.rope_theta;
  rope.num_heads = config.num_attention_heads;
  rope.num_kv_heads = config.num_key_value_heads;
  rope.head_dim = config.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));

  // The residual stream starts as the embeddings; each layer's first norm adds into it.
  PDS_RETURN_IF_ERROR(
      backend_.embedding(embed_tokens_, context.token_ids_.as<int32_t>(), residual));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerViews& layer = layers_[l];
    if (l == 0) {
      PDS_RETURN_IF_ERROR(
          backend_.rms_norm(residual, layer.input_norm, config.rms_norm_eps, hidden));
    } else {
      PDS_RETURN_IF_ERROR(
          backend_.add_rms_norm(hidden, residual, layer.input_norm, config.rms_norm_eps));
    }
    if (layer.qkv_proj.data != nullptr) {
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.qkv_proj, qkv));
    } else {
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.q_proj, q));
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.k_proj, k));
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.v_proj, v));
    }
    rope.q_norm_weight = layer.q_norm;
    rope.k_norm_weight = layer.k_norm;
    PDS_RETURN_IF_ERROR(
        backend_.qk_norm_rope_kv_write(q, k, v, rope, batch, kv, static_cast<int>(l)));
    if (layers != nullptr) PDS_RETURN_IF_ERROR(layers->written(static_cast<int>(l)));
    PDS_RETURN_IF_ERROR(backend_.paged_attention(q, batch, kv, static_cast<int>(l),
                                                 config.num_attention_heads, scale, attention_out));
    PDS_RETURN_IF_ERROR(backend_.linear(attention_out, layer.o_proj, hidden));
    PDS_RETURN_IF_ERROR(
        backend_.add_rms_norm(hidden, residual, layer.post_attention_norm, config.rms_norm_eps));
    if (layer.gate_up_proj.data != nullptr) {
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.gate_up_proj, gate_up));
    } else {
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.gate_proj, gate));
      PDS_RETURN_IF_ERROR(backend_.linear(hidden, layer.up_proj, up));
    }
    PDS_RETURN_IF_ERROR(backend_.silu_mul(gate, up, mlp_act));
    PDS_RETURN_IF_ERROR(backend_.linear(mlp_act, layer.down_proj, hidden));
  }
  PDS_RETURN_IF_ERROR(backend_.add_rms_norm(hidden, residual, final_norm_, config.rms_norm_eps));
  const int64_t seqs = batch.num_seqs;
  const MatrixView last = MatrixView::dense(context.last_hidden_.data(), act, seqs, hidden_size);
  PDS_RETURN_IF_ERROR(backend_.gather_rows(hidden, context.logits_rows_.as<int32_t>(), last));
  const MatrixView logits_device =
      MatrixView::dense(context.logits_.data(), DType::kF32, seqs, config.vocab_size);
  return backend_.linear(last, lm_head_, logits_device);
}

Status Qwen3Model::fetch_logits(ForwardContext& context, int rows, std::span<float> logits) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(weights_.config.vocab_size);
  if (rows < 0 || rows > context.limits_.max_num_seqs || logits.size() < count) {
    return invalid_argument("fetch_logits: " + std::to_string(rows) +
                            " rows do not fit the context or the logits buffer");
  }
  PDS_RETURN_IF_ERROR(
      backend_.copy_to_host(logits.data(), context.logits_.data(), count * sizeof(float)));
  return backend_.synchronize();
}

Status Qwen3Model::token_logits(ForwardContext& context, int first_token, int count,
                                std::span<float> logits) {
  const ModelConfig& config = weights_.config;
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const int step_tokens = context.host_batch_.num_tokens;
  if (count < 1 || count > context.limits_.max_num_seqs || first_token < 0 ||
      first_token + count > step_tokens || logits.size() < static_cast<size_t>(count) * vocab) {
    return invalid_argument("token_logits: tokens [" + std::to_string(first_token) + ", " +
                            std::to_string(first_token + count) + ") of a step of " +
                            std::to_string(step_tokens) +
                            " do not fit the step, the context or the logits buffer");
  }
  const DType act = backend_.activation_dtype();
  const size_t row_bytes = static_cast<size_t>(config.hidden_size) * dtype_size(act);
  // The final norm ran in place: the workspace's hidden rows are the lm_head's inputs.
  std::byte* first_row = static_cast<std::byte*>(context.hidden_.data()) +
                         static_cast<size_t>(first_token) * row_bytes;
  const MatrixView rows = MatrixView::dense(first_row, act, count, config.hidden_size);
  const MatrixView logits_device =
      MatrixView::dense(context.logits_.data(), DType::kF32, count, config.vocab_size);
  PDS_RETURN_IF_ERROR(backend_.linear(rows, lm_head_, logits_device));
  return fetch_logits(context, count, logits);
}

}  // namespace pdserve
