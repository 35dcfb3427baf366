// The Qwen3 dense transformer on any Backend: one explicit forward context (workspace and
// batch metadata in backend memory), weights placed on the backend once, and a forward step
// over a packed batch that mixes prefill chunks and decode tokens.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "common/model/qwen3_weights.h"
#include "kernels/backend.h"
#include "kernels/model/forward_batch.h"
#include "kernels/model/kv_cache.h"

namespace pdserve {

struct ForwardLimits {
  int max_num_tokens = 2048;  // tokens in one step, all sequences together
  int max_num_seqs = 64;
  int max_model_len = 4096;  // positions per sequence
};

// Bytes of one step's packed batch arrays at these limits (the ForwardContext's input buffer
// without extra inputs).
size_t packed_batch_capacity_bytes(const ForwardLimits& limits, int max_blocks_per_seq);

// One batch array's place in the context's packed step inputs (device memory).
struct PackedArray {
  void* data = nullptr;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Workspace for one forward step at the given limits. Allocated once; reused every step.
// A step's batch arrays go up in one copy: they are packed back to back into one host staging
// buffer (page-locked on CUDA, Backend::allocate_host) and copied to one device buffer; a caller
// may append `extra_input_bytes` of its own after them (the sampling inputs) to the same copy.
// The packing depends only on the batch's token count, sequence count and block-table width, so
// a CUDA graph captured for a padded decode batch reads its arrays where every later batch of
// that shape puts them.
class ForwardContext {
 public:
  static Result<ForwardContext> create(Backend& backend, const ModelConfig& config,
                                       const ForwardLimits& limits, int block_size,
                                       size_t extra_input_bytes = 0);
  const ForwardLimits& limits() const { return limits_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  int block_size() const { return block_size_; }
  // The host arrays of the step being prepared (see Qwen3Model::prepare_batch).
  HostBatch& host_batch() { return host_batch_; }

  // Packs host_batch() into the staging buffer and describes where its arrays will be on the
  // device in `batch`; nothing is copied yet. OutOfRange when the arrays exceed the limits.
  Status pack_batch(AttentionBatch& batch);
  // The staging space after the packed batch (extra_input_bytes, 16-byte aligned) and where
  // it lands on the device. Valid until the next pack_batch().
  std::span<std::byte> extra_inputs() const;
  void* device_extra_inputs() const;
  // Copies the packed batch and the first `extra_bytes` of extra_inputs() in one copy.
  Status upload_inputs(size_t extra_bytes);
  // The float32 logits on the device: [max_num_seqs, vocab_size], row i the i-th sequence's
  // (a device sampler overwrites them).
  float* device_logits() const { return logits_.as<float>(); }

 private:
  friend class Qwen3Model;
  ForwardContext() = default;

  Backend* backend_ = nullptr;
  ForwardLimits limits_;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
  HostBatch host_batch_;
  DeviceBuffer hidden_, residual_, qkv_, attention_out_, gate_up_, mlp_act_, last_hidden_, logits_;
  DeviceBuffer inputs_;  // packed batch arrays, then the extra inputs
  HostBuffer staging_;   // the same, on the host
  size_t batch_capacity_bytes_ = 0;
  size_t extra_capacity_bytes_ = 0;
  size_t packed_bytes_ = 0;              // of the current batch, extra inputs' offset
  PackedArray token_ids_, logits_rows_;  // of the current batch (compute() reads them)
};

// Reports each layer of a step to an observer (a prefill node's KV connector), in order, once
// that layer's KV is in the pool: compute() records a marker (Backend::record_marker; a CUDA
// event) right after each layer's KV write and reports the layers the device is already past;
// poll() reports more without blocking, drain() polls until every recorded layer is reported.
// A synchronous (CPU) backend is past each marker at once, so its layers are reported right
// after their writes. A step replayed from a CUDA graph records none: finish_after_wait(),
// after the step's wait, reports what is left. Without an observer it does nothing.
class LayerProgress {
 public:
  LayerProgress(Backend& backend, std::function<void(int layer)> observer, int num_layers);
  bool active() const { return static_cast<bool>(observer_); }
  Status written(int layer);
  Status poll();
  Status drain();
  void finish_after_wait();

 private:
  Backend& backend_;
  std::function<void(int layer)> observer_;
  int num_layers_;
  int recorded_ = 0;  // markers recorded: layers 0 .. recorded_ - 1
  int next_ = 0;      // the next layer to report
};

class Qwen3Model {
 public:
  // Places the weights on the backend: in place when the backend shares host memory,
  // copied otherwise (converted to the backend's activation dtype, with q/k/v and gate/up
  // each concatenated into one matrix so they run as one GEMM). The weights' keep-alive
  // handles are held for the model's lifetime.
  static Result<std::unique_ptr<Qwen3Model>> create(Backend& backend, Qwen3Weights weights);

  const ModelConfig& config() const { return weights_.config; }
  // The dtype the weights are held in where they are used (a device backend converts them
  // to its activation dtype when placing them).
  DType weight_dtype() const { return embed_tokens_.dtype; }

  // One step: computes the new tokens of every slice, writes their KV into `cache`, and
  // stores float32 logits of each slice's last new token into `logits` (row-major
  // [slices.size(), vocab_size], host memory).
  // `on_layer_written(l)`, when set, is called once per layer, in order, on the calling
  // thread, as soon as layer l's KV is in `cache`, so the caller can send it while the next
  // layers compute: right after the layer's KV write on a synchronous (CPU) backend; on an
  // asynchronous one (CUDA) a marker (an event) is recorded after each layer's KV write and
  // the layers are reported as the device passes them, polled without blocking while later
  // layers are queued and then until the last (see compute()).
  Status forward(std::span<const SequenceSlice> slices, KvCache& cache, ForwardContext& context,
                 std::span<float> logits,
                 const std::function<void(int layer)>& on_layer_written = {});

  // forward() in phases, for a caller that replays the device phase as a CUDA graph:
  // prepare_batch() validates the slices into context.host_batch() (which the caller may then
  // pad), upload_batch() packs and copies those arrays to the device in one copy
  // (ForwardContext::pack_batch + upload_inputs) and describes them, compute() queues the whole
  // step (embedding to logits) on the backend without host copies, allocations or waits, so it can
  // be captured, and fetch_logits() copies the first `rows` logits rows to host memory and reports
  // asynchronous failures.
  Status prepare_batch(std::span<const SequenceSlice> slices, const KvCache& cache,
                       ForwardContext& context) const;
  Status upload_batch(ForwardContext& context, AttentionBatch& batch);
  // With `on_layer_written` (see forward()) compute() returns only once every layer has been
  // reported, and records markers: such a step cannot be captured (nor is it: only decode
  // steps are, without an observer).
  Status compute(const AttentionBatch& batch, const KvCacheView& kv, ForwardContext& context,
                 const std::function<void(int layer)>& on_layer_written = {});
  // compute() that records the markers of `layers` (when not null) and reports the layers the
  // device is already past, without waiting for the others: its caller polls or drains them
  // (the CUDA step path, between queueing a step and its one wait).
  Status compute(const AttentionBatch& batch, const KvCacheView& kv, ForwardContext& context,
                 LayerProgress* layers);
  Status fetch_logits(ForwardContext& context, int rows, std::span<float> logits);
  // After a step's compute() (and after its sampled rows were fetched or sampled: this reuses
  // the logits buffer), the float32 logits of packed tokens [first_token, first_token + count)
  // of that step into `logits` (host memory, one vocab_size() row each): the lm_head over the
  // final hidden states the step left in the workspace. count <= limits.max_num_seqs. For
  // prompt logprobs; steps without such requests never pay for it.
  Status token_logits(ForwardContext& context, int first_token, int count, std::span<float> logits);

 private:
  struct LayerViews {
    VectorView input_norm, post_attention_norm, q_norm, k_norm;
    MatrixView q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    // Fused [q; k; v] and [gate; up] rows on copying backends; data == nullptr otherwise.
    MatrixView qkv_proj, gate_up_proj;
  };

  Qwen3Model(Backend& backend, Qwen3Weights weights)
      : backend_(backend), weights_(std::move(weights)) {}
  Result<MatrixView> place_matrix(const HostTensor& tensor);
  Result<VectorView> place_vector(const HostTensor& tensor);
  // One device matrix holding the rows of `parts` in order (copying backends only).
  Result<MatrixView> place_concatenated(std::initializer_list<const HostTensor*> parts);
  Result<MatrixView> place_fp8_concatenated(std::initializer_list<const HostTensor*> parts);

  Backend& backend_;
  Qwen3Weights weights_;
  std::vector<DeviceBuffer> device_weights_;  // empty when the backend shares host memory
  MatrixView embed_tokens_, lm_head_;
  VectorView final_norm_;
  std::vector<LayerViews> layers_;
};

}  // namespace pdserve
