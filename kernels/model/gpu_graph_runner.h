// The steps of one forward context on the CUDA backend, decode steps through CUDA graphs
// (CUDA builds only). One graph per (batch bucket, context bucket) of gpu_decode_graphs.h,
// each captured after an eager warm-up step of the same padded shape. A step is prepared
// (validated, and padded to its graph when it is decode-only and a graph holds it, then packed
// into the context's staging buffer), the caller may add its own inputs behind the batch's
// (ForwardContext::extra_inputs), and launch() sends both up in one copy and queues the graph's
// replay or, for any other step, the eager compute(). Nothing waits: the caller synchronizes.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_graph.h"
#include "kernels/model/forward_batch.h"
#include "kernels/model/gpu_decode_graphs.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

class DecodeGraphRunner {
 public:
  // Captures every (batch, context) bucket up to the context's max_num_seqs (and
  // max_num_tokens) and max_model_len; none when `capture_graphs` is false (every step then
  // runs eagerly: for comparisons). `scratch_block` must be a KV block that no sequence is ever
  // given (hold it back from the block manager): padding sequences write their KV there; -1
  // without graphs. The backend must be the CUDA backend; model, cache and context must
  // outlive the runner and not be used by others while it runs.
  static Result<std::unique_ptr<DecodeGraphRunner>> create(Backend& backend, Qwen3Model& model,
                                                           KvCache& cache, ForwardContext& context,
                                                           int scratch_block,
                                                           bool capture_graphs = true);

  // Validates the slices into the context's host batch, pads it to its graph when one will
  // run, and packs it (ForwardContext::pack_batch). Returns the graph's key, nullopt for an
  // eager step.
  Result<std::optional<DecodeGraphKey>> prepare(std::span<const SequenceSlice> slices);
  // Sends the prepared batch and `extra_bytes` of the context's extra inputs up in one copy
  // and queues the step. The logits of the prepared step's i-th slice are row i of
  // ForwardContext::device_logits().
  Status launch(size_t extra_bytes);

  // prepare(), launch(), then the slices' logits rows to host memory (waits): the contract of
  // Qwen3Model::forward.
  Status forward(std::span<const SequenceSlice> slices, std::span<float> logits);

  int num_graphs() const { return static_cast<int>(graphs_.size()); }

 private:
  DecodeGraphRunner(Qwen3Model& model, KvCache& cache, ForwardContext& context, cudaStream_t stream,
                    int scratch_block)
      : model_(model),
        cache_(cache),
        context_(context),
        stream_(stream),
        scratch_block_(scratch_block) {}
  Status capture(const DecodeGraphKey& key);

  Qwen3Model& model_;
  KvCache& cache_;
  ForwardContext& context_;
  cudaStream_t stream_;
  int scratch_block_;
  std::vector<int> batch_buckets_;
  std::vector<int> context_buckets_;
  std::map<DecodeGraphKey, CudaGraph> graphs_;
  AttentionBatch batch_;                    // the prepared step's
  std::optional<DecodeGraphKey> prepared_;  // its graph
  bool has_prepared_ = false;
};

}  // namespace pdserve
