// The single-threaded heart of the serving engine. Each step() schedules a batch, runs the
// model, samples one token for every sequence whose context is complete, applies the tokens
// to the scheduler and streams the result to each request's sink as a SequenceDelta:
//  * text comes from an IncrementalDetokenizer (complete UTF-8 only) passed through a
//    StopStringMatcher, so no partial stop string is ever streamed; a stop-string match ends
//    the sequence at once (FinishReason kStop, matched_stop set);
//  * the text of a token that ends the sequence as EOS or a stop token id is left out unless
//    include_stop_str_in_output (vLLM's rule); ids the tokenizer does not know (a model's
//    padded vocabulary rows) produce no text;
//  * until min_tokens, the stop tokens are banned from sampling; logprobs come from the raw
//    logits when requested;
//  * a request with a structured output has a ConstraintMatcher that follows its output
//    tokens: before each of its samples the logits the grammar forbids are set to -inf (so the
//    logprobs are those of the masked logits, as in vLLM), and the sampled token, the prefill
//    node's first token or a resumed stream's tokens advance it. Preemption keeps the output,
//    so the matcher stays in step with it.
// Every request added receives exactly one final delta: finished, aborted (kCancelled or the
// given reason), or failed (the model or the sampler failed on it). Sinks are called on the
// caller's thread; see inference_service.h for what a sink may do.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/engine/inference_service.h"
#include "common/engine/kv_connector.h"
#include "common/engine/model_executor.h"
#include "common/engine/prefix_cache_journal.h"
#include "common/engine/scheduler.h"
#include "common/engine/stop_strings.h"
#include "common/grammar/constraint.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

// Calls `sink`; an exception from it (a front-end bug) is logged, never propagated.
void deliver_delta(const DeltaSink& sink, SequenceDelta delta);

class EngineCore {
 public:
  // InvalidArgument for a bad scheduler config or an executor whose vocabulary differs from
  // config.vocab_size. `executor` (and `connector`, when given: a disaggregated node) must
  // outlive the core.
  static Result<std::unique_ptr<EngineCore>> create(SchedulerConfig config, ModelExecutor& executor,
                                                    Tokenizer tokenizer,
                                                    KvConnector* connector = nullptr);

  // The checks add() makes that do not depend on the engine's state (prompt, sampling
  // parameters, stop strings, context and KV pool limits). Thread-safe.
  Status validate(const InferenceRequest& request) const;

  // Queues a request. On error (validate(), a duplicate id, a full waiting queue) the sink is
  // never called.
  Status add(InferenceRequest request, DeltaSink sink);
  // Ends a request now with a final delta carrying `reason` (kCancelled for a client abort)
  // and frees its blocks. Unknown or finished ids are ignored.
  void abort(const std::string& request_id, const Status& reason);
  // abort() of every unfinished request, e.g. at shutdown.
  void abort_all(const Status& reason);

  // Applies the connector's events, then runs one step; false when there was nothing to run.
  bool step();

  bool has_unfinished() const { return !requests_.empty(); }
  // Requests or KV transfers (pinned blocks) still in flight.
  bool has_pending_work() const {
    return !requests_.empty() || !exports_.empty() || !imports_.empty();
  }
  ServiceStats stats() const;
  // The block manager's prefix-cache journal and keys (BlockManager::take_prefix_cache_changes,
  // registered_keys).
  PrefixCacheChanges take_prefix_cache_changes();
  std::vector<uint64_t> prefix_cache_keys() const;
  const Scheduler& scheduler() const { return scheduler_; }
  // Compiles structured outputs for this engine's vocabulary. Thread-safe.
  const ConstraintCompiler& constraint_compiler() const { return *constraints_; }

 private:
  struct RequestState {
    RequestState(std::string request_id, DeltaSink delta_sink, SeqId seq, SamplerRng request_rng,
                 const Tokenizer& tokenizer, const InferenceRequest& request,
                 std::optional<ConstraintMatcher> constraint);

    std::string id;
    DeltaSink sink;
    SeqId seq_id;
    bool include_stop_str_in_output;
    SamplerRng rng;
    IncrementalDetokenizer detokenizer;
    StopStringMatcher stop_matcher;
    RequestTimings timings;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_prompt_tokens = 0;
    std::optional<SampledTokenLogprobs> step_logprobs;  // of the token sampled this step
    std::optional<KvExportTarget> kv_export;
    std::optional<RemotePrefillStats> remote_prefill;
    bool report_sampler_state = false;
    std::optional<std::string> resumed_text;  // until the first delta carries it
    bool resumed = false;                     // a stream resumed from another node
    std::optional<ConstraintMatcher> grammar;  // a structured output's state
  };
  EngineCore(Scheduler scheduler, ModelExecutor& executor, Tokenizer tokenizer,
             KvConnector* connector);

  // A remote prefill; for a resumed stream, of its prompt and delivered tokens (a prefix
  // cached here in full leaves nothing to import: it is added as add_resumed does).
  Status add_imported(InferenceRequest& request, const SamplerRng& rng, DeltaSink& sink,
                      std::optional<ConstraintMatcher>& grammar);
  // A stream resumed from another node, prefilled here: queued with its earlier output.
  Status add_resumed(InferenceRequest& request, const SamplerRng& rng, DeltaSink& sink,
                     std::optional<ConstraintMatcher>& grammar);
  // A resumed stream's state: the sampler where it stopped, the text state caught up
  // (InferenceRequest::resume). InvalidArgument when its output already holds a stop string.
  Status catch_up_resumed(RequestState& state, const ResumedOutput& resume);
  // When a resumed stream's delivered output already ends it (max_tokens, a stop token or a
  // stop string: the first node was cut between its last token's event and its finish
  // chunk), the final delta that ends it at once, without tokens (ended_before_resume);
  // nullopt when there is more to generate.
  std::optional<SequenceDelta> resumed_output_end(const InferenceRequest& request) const;
  // The matcher of a request with a structured output (its constraint compiled when the
  // request does not carry it), caught up on a resumed stream's tokens; nullopt without one.
  Result<std::optional<ConstraintMatcher>> make_grammar(const InferenceRequest& request) const;
  void apply_connector_events();
  // Streams the remotely sampled first token; the sequence keeps awaiting its KV.
  void import_first_token(const std::string& request_id, RemotePrefillResult result);
  // The KV has landed: the sequence joins the decode batch.
  void import_ready(const std::string& request_id, RemotePrefillStats stats);
  // The remote prefill failed: a request still wanted is prefilled here instead.
  // `stats`: the import's figures when it has some (its checksum mismatches and re-fetches).
  void import_failed(const std::string& request_id, const Status& status,
                     const std::optional<RemotePrefillStats>& stats);
  // The sequence of a request that its first token finished while its KV is still coming.
  std::optional<SeqId> awaiting_after_finish(const std::string& request_id) const;
  // Before the forward: pins the blocks of the batch's requests whose prompt this step
  // completes and that export their KV, and starts their exports; a request whose export
  // cannot start is aborted and recorded in `failures`. Returns the exports started.
  std::vector<std::pair<std::string, SeqId>> start_exports(
      const ScheduledBatch& batch, std::vector<std::pair<SeqId, Status>>& failures);
  // After sampling: the exports of requests still alive finish, the others are aborted.
  void finish_exports(const std::vector<std::pair<std::string, SeqId>>& started);
  void unpin(const SeqId seq_id);

  void note_scheduled(const ScheduledBatch& batch);
  // Records the forward step in the timings of every request whose prompt it computed.
  void note_prefill_chunks(const ScheduledBatch& batch, SteadyTime start, SteadyTime end);
  // Samples every sampling entry; a request whose sampling fails is aborted in the scheduler
  // and recorded in `failures`. Returns one token per sampling entry (0 for the failed ones).
  std::vector<int32_t> sample_batch(const ScheduledBatch& batch,
                                    std::vector<std::pair<SeqId, Status>>& failures);
  // Stores a sampling entry's result (its token and logprobs), or aborts its request and
  // records the failure.
  void record_sample(RequestState& state, const Sequence& seq, Result<SampleResult> sampled,
                     int32_t& token, std::vector<std::pair<SeqId, Status>>& failures);
  // The device path (executor_.samples_on_device()). device_rows(): launch_step()'s rows, one
  // per sampling entry (params null for an aborted entry). sample_on_device(), after
  // launch_step(): the grammars' masks, sample_step(), then each entry's token, logprobs and
  // grammar. Returns sample_step()'s error (the batch fails); a row's own failure aborts its
  // request and is recorded in `failures`.
  std::span<const SamplingRow> device_rows(const ScheduledBatch& batch);
  Status sample_on_device(const ScheduledBatch& batch,
                          std::vector<std::pair<SeqId, Status>>& failures,
                          std::vector<int32_t>& tokens);
  // One device row's result as the host sampler would give it: logprobs from its logits row
  // (masked by `allowed`, its grammar's mask), a row left to the host sampled here, outcomes
  // turned into errors.
  Result<SampleResult> device_sample_result(const SamplingRow& row,
                                            std::span<const int32_t> allowed,
                                            const SampledRow& result, std::span<float> logits);
  // Applies the grammars of the batch's constrained sampling rows to their logits, all at once
  // (ConstraintBatchMasker); one status per sampling row, ok for the unconstrained ones.
  std::vector<Status> mask_constrained_rows(const ScheduledBatch& batch);
  // One sampling entry, its logits already masked: the draw, the grammar advanced over it.
  Result<SampleResult> sample_entry(RequestState& state, const Sequence& seq,
                                    std::span<const float> logits);
  void fail_batch(const ScheduledBatch& batch, const Status& status);
  void emit(RequestState& state, const SequenceUpdate& update);
  // Delivers the final delta of a request that ends without a normal finish, and forgets it.
  void end_with_error(SeqId seq_id, const Status& status);
  void finish(SeqId seq_id, SequenceDelta delta);
  static SequenceDelta make_delta(const RequestState& state);

  Scheduler scheduler_;
  ModelExecutor& executor_;
  Tokenizer tokenizer_;
  Sampler sampler_;
  std::unique_ptr<ConstraintCompiler> constraints_;
  ConstraintBatchMasker grammar_masker_;
  std::unordered_map<SeqId, RequestState> requests_;
  std::unordered_map<std::string, SeqId> ids_;
  KvConnector* connector_;
  // Blocks pinned for a transfer, by request id; they outlive the request itself.
  std::unordered_map<std::string, SeqId> exports_;
  std::unordered_map<std::string, SeqId> imports_;
  std::vector<float> logits_;
  // The device path's rows and grammar masks (one mask row per constrained entry).
  std::vector<SamplingRow> device_rows_;
  std::vector<int32_t> bitmasks_;
  SamplerRng seed_source_;  // seeds the requests that set no seed
  int64_t prompt_tokens_total_ = 0;
  int64_t generation_tokens_total_ = 0;
  int64_t preemptions_total_ = 0;
  int64_t kv_checksum_mismatches_total_ = 0;
  int64_t remote_prefill_fallbacks_total_ = 0;
  int64_t remote_prefills_served_from_cache_total_ = 0;
  int64_t kv_refetches_total_ = 0;
  int64_t kv_import_hold_expired_total_ = 0;
};

}  // namespace pdserve
