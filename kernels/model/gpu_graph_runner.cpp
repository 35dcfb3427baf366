#include "kernels/model/gpu_graph_runner.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "kernels/model/gpu_decode_graphs.h"

namespace pdserve {

Result<std::unique_ptr<DecodeGraphRunner>> DecodeGraphRunner::create(Backend& backend,
                                                                     Qwen3Model& model,
                                                                     KvCache& cache,
                                                                     ForwardContext& context,
                                                                     int scratch_block) {
  PDS_ASSIGN_OR_RETURN(cudaStream_t stream, cuda_stream_of(backend));
  if (scratch_block < 0 || scratch_block >= cache.layout().num_blocks) {
    return invalid_argument("decode graphs: scratch block " + std::to_string(scratch_block) +
                            " is outside the KV pool of " +
                            std::to_string(cache.layout().num_blocks) + " blocks");
  }
  std::unique_ptr<DecodeGraphRunner> runner(
      new DecodeGraphRunner(model, cache, context, stream, scratch_block));
  // A padded decode batch has one token per sequence: the context must hold both counts.
  runner->buckets_ = decode_graph_buckets(
      std::min(context.limits().max_num_seqs, context.limits().max_num_tokens));
  for (int bucket : runner->buckets_) PDS_RETURN_IF_ERROR(runner->capture(bucket));
  return runner;
}

Status DecodeGraphRunner::stage(std::span<const SequenceSlice> slices, int bucket,
                                AttentionBatch& batch) {
  PDS_RETURN_IF_ERROR(model_.prepare_batch(slices, cache_, context_));
  PDS_RETURN_IF_ERROR(pad_decode_batch(context_.host_batch(), bucket, scratch_block_,
                                       context_.block_size(), context_.limits().max_model_len));
  return model_.upload_batch(context_, batch);
}

Status DecodeGraphRunner::capture(int bucket) {
  // The warm-up step is one padding-like sequence (token 0 at position 0 in the scratch
  // block) padded to the bucket: it sizes every lazily grown buffer before capture.
  const std::vector<int32_t> token = {0};
  const std::vector<int32_t> table = {scratch_block_};
  const SequenceSlice warm_up{token, 0, table};
  AttentionBatch batch;
  PDS_RETURN_IF_ERROR(stage({&warm_up, 1}, bucket, batch));
  PDS_RETURN_IF_ERROR(model_.compute(batch, cache_.view(), context_));
  std::vector<float> logits(static_cast<size_t>(model_.config().vocab_size));
  PDS_RETURN_IF_ERROR(model_.fetch_logits(context_, 1, logits));
  PDS_ASSIGN_OR_RETURN(CudaGraph graph, CudaGraph::capture(stream_, [&] {
                         return model_.compute(batch, cache_.view(), context_);
                       }));
  graphs_.emplace(bucket, std::move(graph));
  return {};
}

Status DecodeGraphRunner::forward(std::span<const SequenceSlice> slices, std::span<float> logits) {
  const bool decode_only = std::all_of(slices.begin(), slices.end(),
                                       [](const SequenceSlice& s) { return s.tokens.size() == 1; });
  const std::optional<int> bucket =
      decode_only ? choose_decode_bucket(buckets_, static_cast<int>(slices.size())) : std::nullopt;
  if (!bucket.has_value()) return model_.forward(slices, cache_, context_, logits);
  if (logits.size() < slices.size() * static_cast<size_t>(model_.config().vocab_size)) {
    return invalid_argument("forward: logits buffer too small");
  }
  AttentionBatch batch;
  PDS_RETURN_IF_ERROR(stage(slices, *bucket, batch));
  PDS_RETURN_IF_ERROR(graphs_.at(*bucket).replay(stream_));
  return model_.fetch_logits(context_, static_cast<int>(slices.size()), logits);
}

}  // namespace pdserve
