#include "kernels/model/gpu_graph_runner.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"

namespace pdserve {

Result<std::unique_ptr<DecodeGraphRunner>> DecodeGraphRunner::create(
    Backend& backend, Qwen3Model& model, KvCache& cache, ForwardContext& context, int scratch_block,
    bool capture_graphs) {
  PDS_ASSIGN_OR_RETURN(cudaStream_t stream, cuda_stream_of(backend));
  if (!capture_graphs) {
    return std::unique_ptr<DecodeGraphRunner>(
        new DecodeGraphRunner(model, cache, context, stream, -1));
  }
  if (scratch_block < 0 || scratch_block >= cache.layout().num_blocks) {
    return invalid_argument("decode graphs: scratch block " + std::to_string(scratch_block) +
                            " is outside the KV pool of " +
                            std::to_string(cache.layout().num_blocks) + " blocks");
  }
  std::unique_ptr<DecodeGraphRunner> runner(
      new DecodeGraphRunner(model, cache, context, stream, scratch_block));
  // A padded decode batch has one token per sequence: the context must hold both counts.
  runner->batch_buckets_ = decode_graph_buckets(
      std::min(context.limits().max_num_seqs, context.limits().max_num_tokens));
  runner->context_buckets_ = decode_context_buckets(context.limits().max_model_len);
  for (int batch : runner->batch_buckets_) {
    for (int length : runner->context_buckets_) {
      PDS_RETURN_IF_ERROR(runner->capture({batch, length}));
    }
  }
  return runner;
}

Result<std::optional<DecodeGraphKey>> DecodeGraphRunner::prepare(
    std::span<const SequenceSlice> slices) {
  has_prepared_ = false;
  PDS_RETURN_IF_ERROR(model_.prepare_batch(slices, cache_, context_));
  HostBatch& host = context_.host_batch();
  prepared_ = std::nullopt;
  if (host.num_tokens == host.num_seqs) {  // decode-only: one new token per sequence
    prepared_ =
        choose_decode_graph(batch_buckets_, context_buckets_, host.num_seqs, host.max_context_len);
  }
  if (prepared_) {
    PDS_RETURN_IF_ERROR(pad_decode_batch(host, prepared_->batch, scratch_block_,
                                         context_.block_size(), prepared_->context));
  }
  batch_ = AttentionBatch{};
  PDS_RETURN_IF_ERROR(context_.pack_batch(batch_));
  has_prepared_ = true;
  return prepared_;
}

Status DecodeGraphRunner::launch(size_t extra_bytes) {
  if (!has_prepared_) return failed_precondition("decode graphs: launch() without prepare()");
  has_prepared_ = false;
  PDS_RETURN_IF_ERROR(context_.upload_inputs(extra_bytes));
  if (prepared_) return graphs_.at(*prepared_).replay(stream_);
  return model_.compute(batch_, cache_.view(), context_);
}

Status DecodeGraphRunner::capture(const DecodeGraphKey& key) {
  // The warm-up step is one padding-like sequence (token 0 at position 0 in the scratch
  // block) padded to the key's shape: it sizes every lazily grown buffer (the split-K
  // workspace) before capture, and leaves the packed arrays where the graph will read them.
  const std::vector<int32_t> token = {0};
  const std::vector<int32_t> table = {scratch_block_};
  const SequenceSlice warm_up{token, 0, table};
  PDS_RETURN_IF_ERROR(model_.prepare_batch({&warm_up, 1}, cache_, context_));
  PDS_RETURN_IF_ERROR(pad_decode_batch(context_.host_batch(), key.batch, scratch_block_,
                                       context_.block_size(), key.context));
  AttentionBatch batch;
  PDS_RETURN_IF_ERROR(context_.pack_batch(batch));
  PDS_RETURN_IF_ERROR(context_.upload_inputs(0));
  PDS_RETURN_IF_ERROR(model_.compute(batch, cache_.view(), context_));
  std::vector<float> logits(static_cast<size_t>(model_.config().vocab_size));
  PDS_RETURN_IF_ERROR(model_.fetch_logits(context_, 1, logits));
  PDS_ASSIGN_OR_RETURN(CudaGraph graph, CudaGraph::capture(stream_, [&] {
                         return model_.compute(batch, cache_.view(), context_);
                       }));
  graphs_.emplace(key, std::move(graph));
  return {};
}

Status DecodeGraphRunner::forward(std::span<const SequenceSlice> slices, std::span<float> logits) {
  if (logits.size() < slices.size() * static_cast<size_t>(model_.config().vocab_size)) {
    return invalid_argument("forward: logits buffer too small");
  }
  PDS_RETURN_IF_ERROR(prepare(slices).status());
  PDS_RETURN_IF_ERROR(launch(0));
  return model_.fetch_logits(context_, static_cast<int>(slices.size()), logits);
}

}  // namespace pdserve
