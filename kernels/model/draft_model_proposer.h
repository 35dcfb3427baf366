// Speculative decoding's draft-model proposer (issue #30; vLLM's method "draft_model"): a
// smaller Qwen3 sharing the target's tokenizer proposes k tokens per sequence by greedy decoding
// on its own paged KV pool, in the target's process and on the target's Backend.
//
// Per sequence it remembers the tokens whose KV its pool holds (DraftSequenceTable). Each
// propose() rolls a sequence back to the longest common prefix with the request's tokens
// (tokens the target rejected are absent there), computes the missing tokens (the whole prompt,
// in chunks, the first time: on a disaggregated decode node the draft's prompt KV is computed
// locally, never shipped), then runs up to k greedy steps, all sequences of the call batched in
// each forward. Proposals are greedy, i.e. a deterministic draft distribution (a point mass):
// the engine's rejection sampling then stays exact under sampling (it accepts a draft token t
// with probability p_target(t)), and with greedy targets a draft equal to the target is always
// accepted. A sequence the pool cannot hold gets no proposals (never an error). See
// docs/SPECULATIVE_DRAFT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/engine/spec_decode/proposer.h"
#include "kernels/backend.h"
#include "kernels/model/draft_sequence_table.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

inline constexpr int kMaxDraftSpeculativeTokens = 32;

struct DraftModelProposerConfig {
  std::string model;               // a folder or a hub id in the local Hugging Face cache
  int num_speculative_tokens = 0;  // k: 1 .. kMaxDraftSpeculativeTokens
  // The draft's own KV pool. Its memory: num_blocks x block_size x draft_kv_bytes_per_token().
  int num_blocks = 0;
  int block_size = 16;
  // Weights on a backend that shares host memory (unset: the checkpoint's dtype); a device
  // backend holds them in its activation dtype.
  std::optional<DType> dtype;
  // The pool's element type; unset: Backend::default_kv_dtype(the draft's weight dtype).
  std::optional<DType> kv_cache_dtype;
  // One draft forward: max_num_tokens is the prompt chunk, max_num_seqs the sequences batched
  // per step (more are split into several forwards), max_model_len the longest sequence it
  // proposes for (capped at the draft's max_position_embeddings).
  ForwardLimits limits;
  // What the draft must agree with (see draft_model_load.h).
  int target_vocab_size = 0;
  std::filesystem::path target_model_dir;  // empty: tokenizers not compared
};

// KV bytes one token takes in a draft pool of this model and dtype.
size_t draft_kv_bytes_per_token(const ModelConfig& draft, DType kv_dtype);

class DraftModelProposer final : public Proposer {
 public:
  // Loads the draft onto `backend` (which must outlive the proposer), allocates its pool and
  // forward workspace. InvalidArgument for a bad config or an incompatible draft (vocab size or
  // tokenizer differing from the target's), NotFound for a missing model, ResourceExhausted when
  // the pool cannot be allocated.
  static Result<std::unique_ptr<DraftModelProposer>> create(const DraftModelProposerConfig& config,
                                                            Backend& backend);

  std::string_view method() const override { return "draft_model"; }
  // InvalidArgument (no proposals at all) when requests and proposals differ in size or a
  // sequence appears twice; an error of the draft's forward also ends the call (the sequences'
  // KV is then rolled back to what was complete before it). A request with no tokens, ids
  // outside the vocabulary, or too long for limits.max_model_len gets no proposals.
  Status propose(std::span<const ProposalRequest> requests,
                 std::span<std::vector<int32_t>> proposals) override;
  void release(SeqId seq_id) override { sequences_.release(seq_id); }

  const DraftSequenceTable& sequences() const { return sequences_; }
  const ModelConfig& draft_config() const { return model_->config(); }
  DType weight_dtype() const { return model_->weight_dtype(); }
  size_t pool_bytes() const { return cache_.size_bytes(); }

 private:
  // A sequence of this call that the pool holds: its tokens, what has KV, and its proposals.
  struct Active {
    size_t request = 0;
    std::span<const int32_t> tokens;
    int computed = 0;  // leading tokens with KV in the draft pool
    int wanted = 0;    // proposals to make
    std::span<const int32_t> block_table;
  };

  DraftModelProposer(std::unique_ptr<Qwen3Model> model, KvCache cache, ForwardContext context,
                     DraftSequenceTable sequences, int k);
  // The proposals a request may get (0: none).
  int proposals_wanted(const ProposalRequest& request) const;
  // Computes every active sequence's missing tokens, in forwards of at most the chunk budget;
  // each sequence's first proposal comes from its last token's logits.
  Status compute_missing(std::vector<Active>& active, std::span<std::vector<int32_t>> proposals);
  // Draft steps 2..k: one token per sequence still wanting proposals, batched.
  Status decode_steps(std::vector<Active>& active, std::span<std::vector<int32_t>> proposals);
  Status forward(std::span<const SequenceSlice> slices);
  int32_t argmax_row(size_t row) const;

  std::unique_ptr<Qwen3Model> model_;
  KvCache cache_;
  ForwardContext context_;
  DraftSequenceTable sequences_;
  int k_;
  int max_len_;                // positions a sequence may reach in the draft
  std::vector<float> logits_;  // [limits.max_num_seqs, vocab_size]
};

// make_draft_model_proposer's interface form, for the engine.
Result<std::unique_ptr<Proposer>> make_draft_model_proposer(const DraftModelProposerConfig& config,
                                                            Backend& backend);

}  // namespace pdserve
