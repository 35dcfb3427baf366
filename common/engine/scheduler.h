// Continuous batching over a BlockManager, nano-vllm / vLLM-v1 style. Each step:
//  1. running sequences in the decode phase, oldest first, one token each; when one cannot get
//     a KV block, the most recently arrived running sequence (possibly itself) is preempted by
//     recompute: its blocks are freed and it goes back to the front of the waiting queue;
//  2. chunks of sequences still prefilling (oldest first), then waiting sequences admitted in
//     FCFS order (the queue head blocks those behind it) while the token budget, the sequence
//     cap and the KV pool allow; no admission in a step that preempted.
// A long prompt is prefilled over several steps; it keeps its blocks in between.
// Speculative decoding: a decode-phase sequence with draft tokens (Sequence::draft_tokens, set
// by the engine's SpecDecoder after the previous step) is scheduled as a verify row of 1 + k
// tokens (its last token, then the drafts; k cut to the token budget and the KV pool), after
// the one-token decodes; postprocess() then takes the run of tokens the verifier accepted.
// Pins (BlockManager::pin) are for sequences that will not be preempted (e.g. a finished
// prefill whose KV is being sent): a preempted sequence cannot be readmitted while its old
// table is still pinned.
//
// Lower KV tiers: a PrefixLoader, when set, sees each sequence admitted from the waiting queue
// (its pool prefix hit already counted as computed) and may start reloading more of its prefix
// into the blocks after that hit; the sequence then waits outside the queues, status
// kLoadingKv, until complete_load() (landed or failed: it prefills the rest) or abandon_load()
// (overdue: it starts again with fresh blocks).
//
// The runner turns each ScheduledSequence into a SequenceSlice {new_tokens(),
// num_cached_before, block_table}, runs the model, samples one token for each entry with
// `samples` set (in entry order) and hands them to postprocess().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/core/status.h"
#include "common/engine/block_manager.h"
#include "common/engine/sequence.h"

namespace pdserve {

struct SchedulerConfig {
  int num_blocks = 0;
  int block_size = 16;
  int max_num_batched_tokens = 2048;  // tokens computed per step
  int max_num_seqs = 256;             // sequences holding blocks (and so per step)
  int max_num_waiting = 1024;         // add_request answers "queue full" beyond this
  int max_model_len = 0;              // prompt + max_tokens limit; 0: only the pool limits it
  int vocab_size = 0;
  std::vector<int32_t> eos_token_ids;

  // InvalidArgument naming the first field out of range.
  Status validate() const;
};

struct ScheduledSequence {
  Sequence* sequence = nullptr;
  int num_new_tokens = 0;
  int num_cached_before = 0;  // tokens already in the KV cache, before the new ones
  bool samples = false;       // this step completes the sequence's context: sample a token
  std::span<const int32_t> block_table;
  // A verify row (speculative decoding): the sequence's last token, then the draft tokens;
  // num_new_tokens is its size. Empty for every other entry.
  std::vector<int32_t> verify_tokens;

  bool verifies() const { return !verify_tokens.empty(); }
  int num_draft_tokens() const { return verifies() ? num_new_tokens - 1 : 0; }
  std::span<const int32_t> draft_tokens() const {
    return verifies() ? std::span<const int32_t>(verify_tokens).subspan(1)
                      : std::span<const int32_t>();
  }
  std::span<const int32_t> new_tokens() const {
    if (verifies()) return verify_tokens;
    return sequence->tokens().subspan(static_cast<size_t>(num_cached_before),
                                      static_cast<size_t>(num_new_tokens));
  }
};

// Valid until the postprocess() of the same step.
struct ScheduledBatch {
  uint64_t step = 0;
  // The num_decodes one-token decodes first, then the verify rows, then the prefill chunks.
  std::vector<ScheduledSequence> entries;
  int num_decodes = 0;
  int num_verify_rows = 0;
  int num_batched_tokens = 0;
  int num_samples = 0;
  std::vector<SeqId> preempted;  // this step, in preemption order

  bool empty() const { return entries.empty(); }
};

// One sampled token of one sequence; finish_reason is kNone while it continues.
struct SequenceUpdate {
  SeqId seq_id = 0;
  int32_t token = 0;
  FinishReason finish_reason = FinishReason::kNone;
};

class PrefixLoader {
 public:
  virtual ~PrefixLoader() = default;
  // `seq` was just given `block_table`. True when a reload into its blocks after
  // seq.num_computed_tokens() started (the sequence then loads); false to compute them.
  virtual bool start_load(const Sequence& seq, std::span<const int32_t> block_table) = 0;
};

class Scheduler {
 public:
  // InvalidArgument for a bad config; `hash` is passed to the BlockManager.
  static Result<Scheduler> create(SchedulerConfig config, BlockHashFn hash = &hash_block_tokens);

  // Queues a request and returns its id (ids increase with arrival). InvalidArgument for an
  // empty prompt, a token outside the vocabulary or bad sampling parameters; OutOfRange when
  // prompt + max_tokens exceeds max_model_len or could never fit the KV pool;
  // ResourceExhausted when the waiting queue is full (retry later).
  Result<SeqId> add_request(std::vector<int32_t> prompt_tokens, SamplingParams params);

  // Disaggregation, decode side: a request whose prompt is prefilled on another node. It gets
  // its blocks at once (prefix-cache hits are reused and counted as computed) and waits
  // outside the queues, status kAwaitingKv, until complete_import() or abort().
  // `output_tokens`: a resumed stream's delivered tokens (see add_resumed_request), whose KV,
  // but for the last token's, is imported with the prompt's.
  // ResourceExhausted when the pool or the sequence cap cannot take it now (the caller can
  // route the request elsewhere); otherwise add_request()'s and add_resumed_request()'s errors.
  Result<SeqId> add_imported_request(std::vector<int32_t> prompt_tokens, SamplingParams params,
                                     std::span<const int32_t> output_tokens = {});
  // Queues a sequence that already has `output_tokens` (a stream resumed from another node):
  // like a preempted one, it is prefilled over all its tokens and then samples the next.
  // InvalidArgument when an output token is out of the vocabulary or would have ended the
  // sequence; otherwise add_request()'s errors.
  Result<SeqId> add_resumed_request(std::vector<int32_t> prompt_tokens,
                                    std::span<const int32_t> output_tokens, SamplingParams params);
  // The prefill node sampled `first_token`; its KV may still be on the way. The token is
  // appended and the sequence keeps awaiting KV, even when the token finishes it (max_tokens
  // 1, EOS: the update says so), so that the prompt's KV still enters the prefix cache.
  // FailedPrecondition unless the sequence awaits KV without a first token; InvalidArgument
  // for a token outside the vocabulary. Nothing changes on error.
  Result<SequenceUpdate> accept_remote_first_token(SeqId seq_id, int32_t first_token);
  // The KV of every token but the last has arrived: its full blocks enter the prefix cache and
  // the sequence joins the running batch, or, finished by its first token, is retired (blocks
  // freed, deferred while pinned). FailedPrecondition unless it awaits KV and has an output
  // token (its first, or a resumed stream's).
  Status complete_import(SeqId seq_id);

  // The remote prefill failed (every prefill node failed, or the KV failed its checksum) and
  // the request is still wanted: it is prefilled here instead. Its table, which the transfer
  // may still write into, moves to the returned holder id with its free already requested
  // (its blocks go back once the caller's last unpin of that id says no put can land); the
  // sequence, with a remotely sampled first token kept as output, goes to the front of the
  // waiting queue (it has waited already) to be computed with fresh blocks, like a preempted
  // sequence. FailedPrecondition unless it awaits KV.
  Result<SeqId> requeue_failed_import(SeqId seq_id);

  // Lower KV tiers (null: none). The loader must outlive the scheduler's use of it.
  void set_prefix_loader(PrefixLoader* loader) { loader_ = loader; }
  // The reload of `seq_id` ended: `loaded_tokens` more of its tokens have their KV (0 when it
  // failed); their full blocks enter the prefix cache and the sequence joins the running batch
  // to compute the rest. FailedPrecondition unless it is loading, InvalidArgument when the
  // tokens are not whole blocks before its last token.
  Status complete_load(SeqId seq_id, int loaded_tokens);
  // Decode side: a tier reload into an imported sequence's blocks landed before its import
  // starts: `loaded_tokens` more tokens count as computed (and enter the prefix cache), so
  // only the rest is imported. FailedPrecondition unless it awaits KV without output tokens;
  // InvalidArgument as complete_load.
  Status add_loaded_tokens(SeqId seq_id, int loaded_tokens);
  // The reload of `seq_id` is given up while its copy may still write its blocks: its table
  // moves to the returned holder id with its free already requested (the blocks go back at the
  // caller's last unpin of that id) and the sequence goes to the front of the waiting queue.
  // FailedPrecondition unless it is loading.
  Result<SeqId> abandon_load(SeqId seq_id);

  // Plans the next step. Must be followed by postprocess() before the next schedule().
  ScheduledBatch schedule();

  // Applies a step's results: advances computed tokens, registers newly computed full blocks
  // in the prefix cache, appends the sampled tokens (one per entry with `samples`, in entry
  // order), stops finished sequences and frees their blocks (deferred while pinned).
  // `verified_tokens`, empty or one per sampling entry: a verify row's accepted drafts and its
  // bonus token (1 to 1 + k tokens), which replace its sampled token; empty for the others.
  // They are appended in order until one finishes the sequence (the rest are dropped); only
  // the accepted ones count as computed, and the blocks held for rejected drafts are freed.
  // One update per appended token, in order. FailedPrecondition for a batch that is not the
  // pending step; InvalidArgument when the number of tokens differs from batch.num_samples, a
  // run is empty or too long or given to another entry, or a token is outside the vocabulary
  // (nothing is applied then).
  Result<std::vector<SequenceUpdate>> postprocess(
      const ScheduledBatch& batch, std::span<const int32_t> sampled_tokens,
      std::span<const std::vector<int32_t>> verified_tokens = {});

  // Speculative decoding: the drafts the next schedule() verifies for a running sequence in
  // its decode phase. FailedPrecondition otherwise (or during a step); InvalidArgument for a
  // token outside the vocabulary.
  Status set_draft_tokens(SeqId seq_id, std::vector<int32_t> draft_tokens);

  // Cancels a request wherever it is and frees its blocks; during a step (between schedule()
  // and postprocess()) the blocks are freed by postprocess(), after the runner is done with
  // them. NotFound for an unknown or already finished id.
  Status abort(SeqId seq_id);

  const Sequence* find(SeqId seq_id) const;
  bool has_unfinished() const {
    return !waiting_.empty() || !running_.empty() || num_awaiting_kv_ > 0 || num_loading_ > 0;
  }
  // Whether schedule() has anything to run (sequences awaiting or loading KV do not count).
  bool has_schedulable() const { return !waiting_.empty() || !running_.empty(); }
  int num_awaiting_kv() const { return num_awaiting_kv_; }
  int num_loading() const { return num_loading_; }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const SchedulerConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return block_manager_; }
  BlockManager& block_manager() { return block_manager_; }

 private:
  Scheduler(SchedulerConfig config, BlockManager block_manager);

  void schedule_decodes(ScheduledBatch& batch, int& budget);
  void schedule_prefills(ScheduledBatch& batch, int& budget);
  void preempt_latest(ScheduledBatch& batch);
  void add_chunk(ScheduledBatch& batch, Sequence& seq, int& budget);
  // A decode with drafts that fit the budget and the pool: its verify row; false otherwise.
  bool add_verify_row(ScheduledBatch& batch, std::vector<ScheduledSequence>& rows, Sequence& seq,
                      int& budget);
  Status check_results(const ScheduledBatch& batch, std::span<const int32_t> sampled_tokens,
                       std::span<const std::vector<int32_t>> verified_tokens) const;
  void retire(SeqId seq_id);
  // Puts a new sequence at the back of the waiting queue, unless the queue is full.
  Result<SeqId> enqueue(std::unique_ptr<Sequence> seq);
  // The checks and the Sequence common to every add_*, with a resumed stream's output tokens.
  Result<std::unique_ptr<Sequence>> make_sequence(std::vector<int32_t> prompt_tokens,
                                                  SamplingParams params,
                                                  std::span<const int32_t> output_tokens = {});
  void insert_running(Sequence& seq);
  // Counts `loaded_tokens` more of seq's tokens as computed (KV loaded from a tier) and caches
  // their blocks; InvalidArgument unless they are whole blocks before its last token.
  Status count_loaded_tokens(Sequence& seq, int loaded_tokens);
  // Moves seq's table, which a copy may still write into, to a new holder id whose free is
  // requested, and queues seq first to be computed with fresh blocks. Returns the holder.
  SeqId requeue_with_fresh_blocks(Sequence& seq);

  SchedulerConfig config_;
  BlockManager block_manager_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> sequences_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // by arrival order; preemption victims from the back
  std::vector<SeqId> aborted_in_flight_;
  int num_awaiting_kv_ = 0;
  int num_loading_ = 0;
  PrefixLoader* loader_ = nullptr;
  SeqId next_seq_id_ = 0;
  uint64_t next_step_ = 1;
  bool step_in_flight_ = false;
};

}  // namespace pdserve
