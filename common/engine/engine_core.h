// The single-threaded heart of the serving engine. Each step() schedules a batch, runs the
// model, samples one token for every sequence whose context is complete, applies the tokens
// to the scheduler and streams the result to each request's sink as a SequenceDelta. The core
// keeps the step, the request table and admission; it delegates
//  * the draws to a BatchSampler (batch_sampler.h): host or device sampling (the stop tokens
//    banned until min_tokens), logprobs, the structured outputs' grammar masks;
//  * the deltas' text to an OutputProcessor (output_processor.h): detokenization, stop
//    strings (a match ends the sequence at once), a resumed stream's catch-up;
//  * prompt logprobs, for the requests that ask, to a PromptLogprobCollector;
//  * KV moving between nodes to a KvTransferCoordinator (kv_transfer_coordinator.h): imports
//    and exports on the connector, their blocks pinned until the connector releases them;
//  * speculative decoding, when configured, to a SpecDecoder (spec_decode/spec_decoder.h):
//    drafts proposed after a step, verified after the next forward; a step then emits several
//    tokens of a sequence, one delta each, in order (a stop ends the run there);
//  * the lower KV tiers, when the node has them, to a KvTierCoordinator
//    (kv_tier_coordinator.h): offloads of cached blocks, reloads of prefix hits.
// A request with a structured output has a ConstraintMatcher that follows its output tokens:
// the sampled token, the prefill node's first token or a resumed stream's tokens advance it.
// Preemption keeps the output, so the matcher stays in step with it.
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
#include "common/engine/batch_sampler.h"
#include "common/engine/inference_service.h"
#include "common/engine/kv_connector.h"
#include "common/engine/kv_tier_coordinator.h"
#include "common/engine/kv_transfer_coordinator.h"
#include "common/engine/model_executor.h"
#include "common/engine/output_processor.h"
#include "common/engine/prefix_cache_journal.h"
#include "common/engine/prompt_logprob_collector.h"
#include "common/engine/scheduler.h"
#include "common/engine/spec_decode/spec_decoder.h"
#include "common/grammar/constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

// Calls `sink`; an exception from it (a front-end bug) is logged, never propagated.
void deliver_delta(const DeltaSink& sink, SequenceDelta delta);

// The optional units of a core, each absent by default.
struct EngineCoreParts {
  KvConnector* connector = nullptr;  // a disaggregated node's KV transport
  KvTierStore* tiers = nullptr;      // the node's lower KV tiers
  KvTierPolicy tier_policy;
  std::unique_ptr<SpecDecoder> spec_decoder;  // speculative decoding
};

class EngineCore : private ImportListener {
 public:
  // InvalidArgument for a bad scheduler config or an executor whose vocabulary differs from
  // config.vocab_size. `executor` and the parts' pointers must outlive the core.
  static Result<std::unique_ptr<EngineCore>> create(SchedulerConfig config, ModelExecutor& executor,
                                                    Tokenizer tokenizer, EngineCoreParts parts = {});
  // Its units keep references into it.
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

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
  // Requests, KV transfers or tier copies (pinned or held blocks) still in flight.
  bool has_pending_work() const {
    return !requests_.empty() || kv_transfers_.has_pinned() || kv_tiers_.busy();
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
    RequestState(DeltaSink delta_sink, SeqId seq, SamplerRng request_rng,
                 const Tokenizer& tokenizer, const InferenceRequest& request,
                 std::optional<ConstraintMatcher> constraint);

    DeltaSink sink;
    SeqId seq_id;
    SamplerRng rng;
    std::optional<KvExportTarget> kv_export;
    bool report_sampler_state = false;
    std::optional<ConstraintMatcher> grammar;  // a structured output's state
    RequestOutput output;                      // its text and what its deltas report
    // An import waiting for a tier reload of its prefix (KvTierCoordinator::start_import_load).
    std::optional<InferenceRequest> pending_import;
  };
  EngineCore(Scheduler scheduler, ModelExecutor& executor, Tokenizer tokenizer,
             EngineCoreParts parts);

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
  // The matcher of a request with a structured output (its constraint compiled when the
  // request does not carry it), caught up on a resumed stream's tokens; nullopt without one.
  Result<std::optional<ConstraintMatcher>> make_grammar(const InferenceRequest& request) const;
  // ImportListener: the import events of the requests still running.
  std::optional<SeqId> live_sequence(const std::string& request_id) const override;
  // Streams the remotely sampled first token; the sequence keeps awaiting its KV.
  void import_first_token(const std::string& request_id, SeqId seq_id,
                          RemotePrefillResult result) override;
  // The KV has landed: the sequence joins the decode batch.
  void import_ready(const std::string& request_id, SeqId seq_id, RemotePrefillStats stats) override;
  // A tier reload before an import ended: the import starts for the tokens still missing (or,
  // when the reload was given up or the import cannot start, the request is prefilled here).
  void start_pending_import(RequestState& state, bool given_up);
  // Before the forward: starts the exports of the batch's requests whose prompt this step
  // completes and that export their KV; a request whose export cannot start is aborted and
  // recorded in `failures`.
  void start_exports(const ScheduledBatch& batch, std::vector<std::pair<SeqId, Status>>& failures);

  void note_scheduled(const ScheduledBatch& batch);
  // Records the forward step in the timings of every request whose prompt it computed.
  void note_prefill_chunks(const ScheduledBatch& batch, SteadyTime start, SteadyTime end);
  // One slot per sampling entry of the batch (none for an entry whose request failed).
  std::vector<SamplingSlot> sampling_slots(const ScheduledBatch& batch);
  // Stores each slot's result (its token and logprobs), or aborts its request in the scheduler
  // and records the failure in `failures`. Returns one token per slot (0 for the failed ones).
  std::vector<int32_t> record_samples(std::span<const SamplingSlot> slots,
                                      std::vector<SlotSample>& samples,
                                      std::vector<std::pair<SeqId, Status>>& failures);
  void record_sample(RequestState& state, const Sequence& seq, Result<SampleResult> sampled,
                     int32_t& token, std::vector<std::pair<SeqId, Status>>& failures);
  // After the forward: the prompt logprobs of the entries whose requests want them; a request
  // whose logprobs fail is aborted and recorded in `failures`.
  void collect_prompt_logprobs(const ScheduledBatch& batch,
                               std::vector<std::pair<SeqId, Status>>& failures);
  void fail_batch(const ScheduledBatch& batch, const Status& status);
  // Speculative decoding: the verify rows' runs (a failed row's request is aborted and recorded
  // in `failures`), and after the step the drafts of the sequences that go on.
  SpecDecoder::Verification verify_drafts(const ScheduledBatch& batch,
                                          std::vector<std::pair<SeqId, Status>>& failures);
  void propose_drafts(std::span<const SequenceUpdate> updates);
  // Delivers the step's tokens, a verify row's with their own logprobs and counts.
  void emit_updates(std::span<const SequenceUpdate> updates,
                    SpecDecoder::Verification& verification);
  void emit(RequestState& state, const SequenceUpdate& update);
  // Delivers the final delta of a request that ends without a normal finish, and forgets it.
  void end_with_error(SeqId seq_id, const Status& status);
  void finish(SeqId seq_id, SequenceDelta delta);

  Scheduler scheduler_;
  ModelExecutor& executor_;
  Tokenizer tokenizer_;
  BatchSampler sampler_;
  PromptLogprobCollector prompt_logprobs_;
  OutputProcessor outputs_;
  std::unique_ptr<ConstraintCompiler> constraints_;
  std::unordered_map<SeqId, RequestState> requests_;
  std::unordered_map<std::string, SeqId> ids_;
  KvTransferCoordinator kv_transfers_;
  KvTierCoordinator kv_tiers_;
  std::unique_ptr<SpecDecoder> spec_;  // null: no speculative decoding
  SamplerRng seed_source_;             // seeds the requests that set no seed
  int64_t prompt_tokens_total_ = 0;
  int64_t generation_tokens_total_ = 0;
  int64_t preemptions_total_ = 0;
};

}  // namespace pdserve
