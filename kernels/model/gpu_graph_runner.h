// Decode steps through CUDA graphs (CUDA builds only). One graph per bucket of
// decode_graph_buckets(), captured after an eager warm-up step of the same padded shape. A
// decode-only step of n sequences is padded to its bucket (pad_decode_batch), its arrays are
// uploaded, the bucket's graph is replayed and the n real logits rows are fetched; any other
// step (prefill, more sequences than the largest bucket) runs Qwen3Model::forward.
#pragma once

#include <map>
#include <memory>
#include <span>

#include "kernels/backend.h"
#include "kernels/cuda_graph.h"
#include "kernels/model/forward_batch.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

class DecodeGraphRunner {
 public:
  // Captures every bucket up to the context's max_num_seqs (and max_num_tokens). `scratch_block`
  // must be a KV block that no sequence is ever given (hold it back from the block manager):
  // padding sequences write their KV there. The backend must be the CUDA backend; model, cache and
  // context must outlive the runner and not be used by others while it runs.
  static Result<std::unique_ptr<DecodeGraphRunner>> create(Backend& backend, Qwen3Model& model,
                                                           KvCache& cache, ForwardContext& context,
                                                           int scratch_block);

  // Same contract as Qwen3Model::forward.
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
  // Builds, pads and uploads a decode batch for `bucket`.
  Status stage(std::span<const SequenceSlice> slices, int bucket, AttentionBatch& batch);
  Status capture(int bucket);

  Qwen3Model& model_;
  KvCache& cache_;
  ForwardContext& context_;
  cudaStream_t stream_;
  int scratch_block_;
  std::vector<int> buckets_;
  std::map<int, CudaGraph> graphs_;
};

}  // namespace pdserve
