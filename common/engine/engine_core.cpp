#include "common/engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <random>
#include <string>
#include <utility>

#include "common/core/log.h"

namespace pdserve {
namespace {

SteadyTime now() {
  return std::chrono::steady_clock::now();
}

}  // namespace

EngineCore::RequestState::RequestState(DeltaSink delta_sink, SeqId seq, SamplerRng request_rng,
                                       const Tokenizer& tokenizer, const InferenceRequest& request,
                                       std::optional<ConstraintMatcher> constraint)
    : sink(std::move(delta_sink)),
      seq_id(seq),
      rng(request_rng),
      kv_export(request.kv_export),
      report_sampler_state(request.report_sampler_state),
      grammar(std::move(constraint)),
      output(tokenizer, request) {}

Result<std::unique_ptr<EngineCore>> EngineCore::create(SchedulerConfig config,
                                                       ModelExecutor& executor, Tokenizer tokenizer,
                                                       EngineCoreParts parts) {
  if (executor.vocab_size() != config.vocab_size) {
    return invalid_argument(
        "engine: the model's vocabulary has " + std::to_string(executor.vocab_size()) +
        " tokens but the scheduler config says " + std::to_string(config.vocab_size));
  }
  PDS_ASSIGN_OR_RETURN(Scheduler scheduler, Scheduler::create(std::move(config)));
  return std::unique_ptr<EngineCore>(new EngineCore(
      std::move(scheduler), executor, std::move(tokenizer), std::move(parts)));
}

EngineCore::EngineCore(Scheduler scheduler, ModelExecutor& executor, Tokenizer tokenizer,
                       EngineCoreParts parts)
    : scheduler_(std::move(scheduler)),
      executor_(executor),
      tokenizer_(std::move(tokenizer)),
      sampler_(executor),
      prompt_logprobs_(executor),
      outputs_(tokenizer_, scheduler_.config().eos_token_ids, scheduler_.config().vocab_size),
      constraints_(std::make_unique<ConstraintCompiler>(tokenizer_, scheduler_.config().vocab_size,
                                                        scheduler_.config().eos_token_ids)),
      kv_transfers_(parts.connector, scheduler_),
      kv_tiers_(parts.tiers, scheduler_, parts.tier_policy),
      spec_(std::move(parts.spec_decoder)),
      seed_source_(std::random_device{}()) {}

Status EngineCore::validate(const InferenceRequest& request) const {
  const SchedulerConfig& config = scheduler_.config();
  const std::string where = "request '" + request.id + "'";
  if (request.id.empty()) return invalid_argument("the request id is empty");
  if ((request.kv_export || request.kv_import) && !kv_transfers_.has_connector()) {
    return invalid_argument(where + " moves KV between nodes, but this node has no KV connector");
  }
  if (request.kv_export && request.kv_import) {
    return invalid_argument(where + " both exports and imports its prompt's KV");
  }
  if (request.resume && request.kv_export) {
    return invalid_argument(where + " resumes a stream, which exports nothing");
  }
  if (request.resume && request.resume->output_tokens.empty()) {
    return invalid_argument(where + " resumes a stream without its output tokens");
  }
  if (request.resume &&
      static_cast<int64_t>(request.resume->output_tokens.size()) > request.sampling.max_tokens) {
    return invalid_argument(where + " resumes a stream that has more than max_tokens (" +
                            std::to_string(request.sampling.max_tokens) + ") tokens");
  }
  if (request.kv_import && request.kv_import->prefill_urls.empty()) {
    return invalid_argument(where + " imports its KV but names no prefill node");
  }
  if (request.prompt_tokens.empty()) return invalid_argument(where + ": the prompt is empty");
  for (size_t i = 0; i < request.prompt_tokens.size(); ++i) {
    const int32_t token = request.prompt_tokens[i];
    if (token < 0 || token >= config.vocab_size) {
      return invalid_argument(where + ": prompt token " + std::to_string(i) + " is " +
                              std::to_string(token) + ", outside [0, " +
                              std::to_string(config.vocab_size) + ")");
    }
  }
  if (request.sampling.prompt_logprobs && executor_.max_token_logits() < 1) {
    return invalid_argument(where +
                            " wants prompt logprobs, which this model executor does not "
                            "compute");
  }
  PDS_RETURN_IF_ERROR(StopChecker::create(request.sampling, config.eos_token_ids, config.vocab_size)
                          .status()
                          .with_context(where));
  for (size_t i = 0; i < request.stop.size(); ++i) {
    if (request.stop[i].empty()) {
      return invalid_argument(where + ": stop string " + std::to_string(i) + " is empty");
    }
  }
  const int64_t total =
      static_cast<int64_t>(request.prompt_tokens.size()) + request.sampling.max_tokens;
  if (config.max_model_len > 0 && total > config.max_model_len) {
    return out_of_range(where + ": prompt (" + std::to_string(request.prompt_tokens.size()) +
                        " tokens) + max_tokens (" + std::to_string(request.sampling.max_tokens) +
                        ") exceeds the context length " + std::to_string(config.max_model_len));
  }
  // The last sampled token never needs KV.
  const int64_t blocks = (total - 1 + config.block_size - 1) / config.block_size;
  if (blocks > config.num_blocks) {
    return out_of_range(where + ": prompt + max_tokens need " + std::to_string(blocks) +
                        " KV blocks; the pool has " + std::to_string(config.num_blocks));
  }
  return Status::ok_status();
}

Status EngineCore::add(InferenceRequest request, DeltaSink sink) {
  PDS_RETURN_IF_ERROR(validate(request));
  if (ids_.contains(request.id)) {
    return invalid_argument("request '" + request.id + "' is already in flight");
  }
  if (request.resume) {
    if (std::optional<SequenceDelta> ended = outputs_.resumed_output_end(request)) {
      deliver_delta(sink, std::move(*ended));
      return Status::ok_status();
    }
  }
  PDS_ASSIGN_OR_RETURN(std::optional<ConstraintMatcher> grammar, make_grammar(request));
  const SamplerRng rng = SamplerRng::for_request(request.sampling, seed_source_.next_u64());
  if (request.kv_import) return add_imported(request, rng, sink, grammar);
  if (request.resume) return add_resumed(request, rng, sink, grammar);
  PDS_ASSIGN_OR_RETURN(const SeqId seq_id,
                       scheduler_.add_request(request.prompt_tokens, request.sampling));
  requests_.emplace(
      seq_id, RequestState(std::move(sink), seq_id, rng, tokenizer_, request, std::move(grammar)));
  ids_.emplace(std::move(request.id), seq_id);
  return Status::ok_status();
}

Result<std::optional<ConstraintMatcher>> EngineCore::make_grammar(
    const InferenceRequest& request) const {
  if (!request.sampling.structured_output) return std::optional<ConstraintMatcher>();
  ConstraintHandle constraint = request.constraint;
  if (!constraint) {
    PDS_ASSIGN_OR_RETURN(constraint, constraints_->compile(*request.sampling.structured_output));
  }
  std::optional<ConstraintMatcher> grammar(std::in_place, std::move(constraint));
  if (request.resume) {
    const std::vector<int32_t>& tokens = request.resume->output_tokens;
    for (size_t i = 0; i < tokens.size(); ++i) {
      PDS_RETURN_IF_ERROR(grammar->accept(tokens[i]).with_context(
          "request '" + request.id + "' resumes a stream whose output token " + std::to_string(i) +
          " breaks its structured output"));
    }
  }
  return grammar;
}

Status EngineCore::catch_up_resumed(RequestState& state, const ResumedOutput& resume) {
  PDS_ASSIGN_OR_RETURN(state.rng, SamplerRng::from_state(resume.sampler_state));
  return outputs_.catch_up(state.output, resume.output_tokens);
}

Status EngineCore::add_resumed(InferenceRequest& request, const SamplerRng& rng, DeltaSink& sink,
                               std::optional<ConstraintMatcher>& grammar) {
  PDS_ASSIGN_OR_RETURN(const SeqId seq_id,
                       scheduler_.add_resumed_request(
                           request.prompt_tokens, request.resume->output_tokens, request.sampling));
  RequestState state(std::move(sink), seq_id, rng, tokenizer_, request, std::move(grammar));
  if (const Status caught = catch_up_resumed(state, *request.resume); !caught.ok()) {
    const Status aborted = scheduler_.abort(seq_id);
    PDS_CHECK(aborted.ok(), aborted.to_string());
    return caught;
  }
  requests_.emplace(seq_id, std::move(state));
  ids_.emplace(std::move(request.id), seq_id);
  return Status::ok_status();
}

Status EngineCore::add_imported(InferenceRequest& request, const SamplerRng& rng, DeltaSink& sink,
                                std::optional<ConstraintMatcher>& grammar) {
  const std::span<const int32_t> resumed_output =
      request.resume ? std::span<const int32_t>(request.resume->output_tokens)
                     : std::span<const int32_t>();
  PDS_ASSIGN_OR_RETURN(
      const SeqId seq_id,
      scheduler_.add_imported_request(request.prompt_tokens, request.sampling, resumed_output));
  const Sequence& seq = *scheduler_.find(seq_id);
  const auto abort_sequence = [&] {
    const Status aborted = scheduler_.abort(seq_id);
    PDS_CHECK(aborted.ok(), aborted.to_string());
  };
  if (request.resume && seq.num_computed_tokens() >= seq.num_tokens() - 1) {
    // Every token but the last is cached here: nothing to import.
    kv_transfers_.count_served_from_cache();
    abort_sequence();
    request.kv_import.reset();
    return add_resumed(request, rng, sink, grammar);
  }
  RequestState state(std::move(sink), seq_id, rng, tokenizer_, request, std::move(grammar));
  if (request.resume) {
    if (const Status caught = catch_up_resumed(state, *request.resume); !caught.ok()) {
      abort_sequence();
      return caught;
    }
  }
  if (!request.resume &&
      kv_tiers_.start_import_load(seq, scheduler_.block_manager().block_table(seq_id))) {
    state.pending_import = request;  // started once the tiers' part of the prefix landed
  } else if (const Status started = kv_transfers_.start_import(request, seq_id); !started.ok()) {
    abort_sequence();
    return started;
  }
  state.output.cached_prompt_tokens =
      std::min(seq.num_computed_tokens(), static_cast<int>(request.prompt_tokens.size()));
  requests_.emplace(seq_id, std::move(state));
  ids_.emplace(request.id, seq_id);
  return Status::ok_status();
}

std::optional<SeqId> EngineCore::live_sequence(const std::string& request_id) const {
  auto id = ids_.find(request_id);
  if (id == ids_.end()) return std::nullopt;
  return id->second;
}

void EngineCore::import_first_token(const std::string& request_id, const SeqId seq_id,
                                    RemotePrefillResult result) {
  RequestState& state = requests_.at(seq_id);
  if (state.output.resumed) {
    // The stream goes on from its delivered tokens: the prefill node's token is not used.
    result.stats.local_cached_tokens = state.output.cached_prompt_tokens;
    state.output.remote_prefill = result.stats;
    return;
  }
  Result<SamplerRng> rng = SamplerRng::from_state(result.rng_state);
  if (!rng.ok()) {
    abort(request_id, rng.status().with_context("the prefill node's sampler state"));
    return;
  }
  if (state.grammar) {
    // The prefill node sampled under the same constraint (it travels in the PrefillWork).
    const Status accepted = state.grammar->accept(result.first_token);
    if (!accepted.ok()) {
      abort(request_id, internal_error("the prefill node's first token: " + accepted.message()));
      return;
    }
  }
  Result<SequenceUpdate> update = scheduler_.accept_remote_first_token(seq_id, result.first_token);
  if (!update.ok()) {
    abort(request_id, update.status());
    return;
  }
  if (state.output.prompt_logprobs) {
    // Computed on the prefill node (whose prefix cache they bypassed), shipped with the token.
    if (!result.prompt_logprobs ||
        result.prompt_logprobs->size() != static_cast<size_t>(state.output.prompt_tokens - 1)) {
      abort(request_id, internal_error("the prefill node's first token came without the prompt "
                                       "logprobs of every prompt position"));
      return;
    }
    state.output.prompt_logprobs = std::move(result.prompt_logprobs);
  }
  state.rng = *rng;
  result.stats.local_cached_tokens = state.output.cached_prompt_tokens;
  state.output.cached_prompt_tokens =
      std::max(state.output.cached_prompt_tokens, result.stats.remote_cached_tokens);
  state.output.remote_prefill = result.stats;
  prompt_tokens_total_ += state.output.prompt_tokens;
  if (result.first_logprobs) state.output.step_logprobs = std::move(result.first_logprobs);
  emit(state, *update);
  // A stop string in the first token aborted the sequence: the KV is no longer wanted (its
  // blocks stay pinned until the connector says no put can still land). A first token that
  // ended it otherwise (EOS, max_tokens 1) leaves the import running: the landed prompt
  // enters the prefix cache (import_ready).
  if (!ids_.contains(request_id) && scheduler_.find(seq_id) == nullptr) {
    kv_transfers_.cancel_import(request_id);
  }
}

void EngineCore::import_ready(const std::string& request_id, const SeqId seq_id,
                              RemotePrefillStats stats) {
  RequestState& state = requests_.at(seq_id);
  const Status completed = scheduler_.complete_import(seq_id);
  if (!completed.ok()) {
    abort(request_id, completed.with_context("the KV of request '" + request_id + "' landed"));
    return;
  }
  state.output.timings.kv_ready = now();
  if (state.output.remote_prefill)
    stats.local_cached_tokens = state.output.remote_prefill->local_cached_tokens;
  state.output.remote_prefill = std::move(stats);
}

void EngineCore::start_pending_import(RequestState& state, bool given_up) {
  std::optional<InferenceRequest> request = std::exchange(state.pending_import, std::nullopt);
  if (!request || given_up) return;  // given up: requeued for a local prefill
  const Sequence& seq = *scheduler_.find(state.seq_id);
  state.output.cached_prompt_tokens =
      std::min(seq.num_computed_tokens(), static_cast<int>(request->prompt_tokens.size()));
  const Status started = kv_transfers_.start_import(*request, state.seq_id);
  if (started.ok()) return;
  PDS_LOG_WARN("request '" + request->id + "': " + started.message() + "; prefilling it here");
  Result<SeqId> holder = scheduler_.requeue_failed_import(state.seq_id);
  PDS_CHECK(holder.ok(), holder.status().to_string());
}

void EngineCore::start_exports(const ScheduledBatch& batch,
                               std::vector<std::pair<SeqId, Status>>& failures) {
  for (const ScheduledSequence& entry : batch.entries) {
    const Sequence& seq = *entry.sequence;
    if (!entry.samples || seq.num_output_tokens() > 0) continue;
    RequestState& state = requests_.at(seq.id());
    if (!state.kv_export) continue;
    const std::string& request_id = state.output.request_id;
    const Status status = kv_transfers_.start_export(request_id, *state.kv_export, seq.id(),
                                                     entry.block_table, seq.num_prompt_tokens());
    if (status.ok()) continue;
    failures.emplace_back(seq.id(),
                          status.with_context("sending the KV of request '" + request_id + "'"));
    const Status aborted = scheduler_.abort(seq.id());
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
}

void EngineCore::abort(const std::string& request_id, const Status& reason) {
  auto it = ids_.find(request_id);
  if (it == ids_.end()) return;
  const SeqId seq_id = it->second;
  if (kv_transfers_.importing(request_id)) kv_transfers_.cancel_import(request_id);
  const Status status = scheduler_.abort(seq_id);
  PDS_CHECK(status.ok(), status.to_string());
  end_with_error(seq_id, reason);
}

void EngineCore::abort_all(const Status& reason) {
  std::vector<std::string> ids;
  ids.reserve(ids_.size());
  for (const auto& [id, seq_id] : ids_) ids.push_back(id);
  for (const std::string& id : ids) abort(id, reason);
}

bool EngineCore::step() {
  kv_transfers_.apply_events(*this);
  for (const FinishedReload& reload : kv_tiers_.step_begin()) {
    auto it = requests_.find(reload.seq_id);
    if (it == requests_.end()) continue;
    it->second.output.timings.kv_reload = reload.timing;
    if (reload.for_import) start_pending_import(it->second, reload.given_up);
  }
  if (!scheduler_.has_schedulable()) return false;
  ScheduledBatch batch = scheduler_.schedule();
  preemptions_total_ += static_cast<int64_t>(batch.preempted.size());
  if (spec_) {
    for (const SeqId seq_id : batch.preempted) spec_->release(seq_id);
  }
  if (batch.empty()) {
    const auto updates = scheduler_.postprocess(batch, {});
    PDS_CHECK(updates.ok(), updates.status().to_string());
    return false;
  }
  note_scheduled(batch);

  // Exports start before the forward so that each layer's KV can leave as soon as it exists.
  std::vector<std::pair<SeqId, Status>> failures;
  if (kv_transfers_.has_connector()) start_exports(batch, failures);
  const LayerKvWritten on_layer_written = kv_transfers_.layer_listener();

  // A device sampler's step is queued first; its sampling inputs are prepared while the
  // device computes (BatchSampler::sample_on_device).
  const bool on_device = executor_.samples_on_device();
  const std::vector<SamplingSlot> slots = sampling_slots(batch);
  const std::span<float> logits = sampler_.logits(batch.num_samples);
  const SteadyTime forward_start = now();
  Status executed = capture_status([&] {
    if (!on_device) return executor_.execute(batch, logits, on_layer_written);
    return executor_.launch_step(batch, sampler_.device_rows(slots), on_layer_written);
  });
  std::vector<SlotSample> samples;
  if (executed.ok() && on_device) executed = sampler_.sample_on_device(slots, samples);
  if (!executed.ok()) {
    record_samples(slots, samples, failures);  // grammars that failed before the device step
    kv_transfers_.abort_step_exports();
    fail_batch(batch, executed);
    for (const auto& [seq_id, status] : failures) end_with_error(seq_id, status);
    return true;
  }
  note_prefill_chunks(batch, forward_start, now());

  if (!on_device) samples = sampler_.sample(slots);
  const std::vector<int32_t> tokens = record_samples(slots, samples, failures);
  SpecDecoder::Verification verification = verify_drafts(batch, failures);
  if (spec_) spec_->record_step(batch, now() - forward_start);
  collect_prompt_logprobs(batch, failures);
  kv_transfers_.finish_step_exports();
  // Sampled and verified tokens lie in the vocabulary and the batch is the pending one.
  Result<std::vector<SequenceUpdate>> updates =
      scheduler_.postprocess(batch, tokens, verification.runs);
  PDS_CHECK(updates.ok(), updates.status().to_string());
  for (const auto& [seq_id, status] : failures) end_with_error(seq_id, status);
  emit_updates(*updates, verification);
  if (spec_) propose_drafts(*updates);
  return true;
}

SpecDecoder::Verification EngineCore::verify_drafts(
    const ScheduledBatch& batch, std::vector<std::pair<SeqId, Status>>& failures) {
  if (!spec_ || batch.num_verify_rows == 0) return {};
  SpecDecoder::Verification verification = spec_->verify(
      batch, [this](SeqId seq_id) -> SamplerRng& { return requests_.at(seq_id).rng; });
  for (auto& [seq_id, status] : verification.failures) {
    failures.emplace_back(seq_id,
                          internal_error("request '" + requests_.at(seq_id).output.request_id +
                                         "': " + status.message()));
    const Status aborted = scheduler_.abort(seq_id);
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
  return verification;
}

void EngineCore::emit_updates(std::span<const SequenceUpdate> updates,
                              SpecDecoder::Verification& verification) {
  std::unordered_map<SeqId, size_t> next_token;  // of each verify row's run
  for (const SequenceUpdate& update : updates) {
    auto state = requests_.find(update.seq_id);
    if (state == requests_.end()) continue;  // a stop string ended it earlier in its run
    auto verified = verification.sequences.find(update.seq_id);
    if (verified != verification.sequences.end()) {
      size_t& index = next_token[update.seq_id];
      if (index == 0) {
        SpecDecodeCounts& counts = state->second.output.spec_decode;
        ++counts.num_drafts;
        counts.num_draft_tokens += verified->second.num_drafts;
        counts.num_accepted_tokens += verified->second.num_accepted;
      }
      SampleResult& token = verified->second.tokens.at(index++);
      if (verified->second.want_logprobs) {
        state->second.output.step_logprobs =
            SampledTokenLogprobs{token.token, token.logprob, std::move(token.top_logprobs)};
      }
    }
    emit(state->second, update);
  }
}

void EngineCore::propose_drafts(std::span<const SequenceUpdate> updates) {
  std::vector<SpecDecoder::Candidate> candidates;
  for (const SequenceUpdate& update : updates) {
    if (update.finish_reason != FinishReason::kNone) continue;
    auto state = requests_.find(update.seq_id);
    const Sequence* seq = scheduler_.find(update.seq_id);
    if (state == requests_.end() || seq == nullptr) continue;
    // A run's updates come together: one candidate per sequence.
    if (!candidates.empty() && candidates.back().sequence == seq) continue;
    candidates.push_back({seq, state->second.grammar.has_value()});
  }
  spec_->propose(scheduler_, candidates);
}

void EngineCore::note_scheduled(const ScheduledBatch& batch) {
  const SteadyTime time = now();
  for (const ScheduledSequence& entry : batch.entries) {
    RequestState& state = requests_.at(entry.sequence->id());
    if (state.output.timings.first_scheduled) continue;
    state.output.timings.first_scheduled = time;
    // An imported request's prompt was counted when its first token came.
    if (state.output.remote_prefill) continue;
    state.output.cached_prompt_tokens = entry.num_cached_before;
    prompt_tokens_total_ += state.output.prompt_tokens;
  }
}

void EngineCore::note_prefill_chunks(const ScheduledBatch& batch, SteadyTime start,
                                     SteadyTime end) {
  int batch_tokens = 0;
  for (const ScheduledSequence& entry : batch.entries) batch_tokens += entry.num_new_tokens;
  if (batch.num_decodes < static_cast<int>(batch.entries.size())) {
    kv_tiers_.note_prefill(batch_tokens, std::chrono::duration<double>(end - start).count());
  }
  for (const ScheduledSequence& entry : batch.entries) {
    const int prompt_left = entry.sequence->num_prompt_tokens() - entry.num_cached_before;
    if (prompt_left <= 0) continue;
    requests_.at(entry.sequence->id())
        .output.timings.prefill_chunks.push_back(
            {start, end, std::min(prompt_left, entry.num_new_tokens), batch_tokens});
  }
}

std::vector<SamplingSlot> EngineCore::sampling_slots(const ScheduledBatch& batch) {
  std::vector<SamplingSlot> slots;
  slots.reserve(static_cast<size_t>(batch.num_samples));
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    SamplingSlot& slot = slots.emplace_back();
    const Sequence& seq = *entry.sequence;
    if (seq.status() == SequenceStatus::kAborted) continue;  // its export could not start
    if (entry.verifies()) continue;                          // SpecDecoder::verify draws its tokens
    RequestState& state = requests_.at(seq.id());
    slot.sequence = &seq;
    slot.rng = &state.rng;
    if (state.grammar) slot.grammar = &*state.grammar;
  }
  return slots;
}

std::vector<int32_t> EngineCore::record_samples(std::span<const SamplingSlot> slots,
                                                std::vector<SlotSample>& samples,
                                                std::vector<std::pair<SeqId, Status>>& failures) {
  std::vector<int32_t> tokens(slots.size(), 0);
  for (size_t row = 0; row < samples.size(); ++row) {
    if (!samples[row]) continue;
    const Sequence& seq = *slots[row].sequence;
    record_sample(requests_.at(seq.id()), seq, std::move(*samples[row]), tokens[row], failures);
  }
  return tokens;
}

void EngineCore::record_sample(RequestState& state, const Sequence& seq,
                               Result<SampleResult> sampled, int32_t& token,
                               std::vector<std::pair<SeqId, Status>>& failures) {
  if (sampled.ok()) {
    token = sampled->token;
    if (seq.sampling_params().want_logprobs) {
      state.output.step_logprobs =
          SampledTokenLogprobs{sampled->token, sampled->logprob, std::move(sampled->top_logprobs)};
    }
    return;
  }
  // The request's parameters were validated on admission, so a failure here means the model
  // produced logits the sampler refuses (NaN, +inf) or a grammar failed: a server fault, not
  // the client's.
  failures.emplace_back(seq.id(), internal_error("sampling request '" + state.output.request_id +
                                                 "': " + sampled.status().message()));
  const Status aborted = scheduler_.abort(seq.id());
  PDS_CHECK(aborted.ok(), aborted.to_string());
}

void EngineCore::collect_prompt_logprobs(const ScheduledBatch& batch,
                                         std::vector<std::pair<SeqId, Status>>& failures) {
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const Sequence& seq = *batch.entries[i].sequence;
    if (!seq.sampling_params().prompt_logprobs || seq.status() == SequenceStatus::kAborted)
      continue;
    RequestOutput& output = requests_.at(seq.id()).output;
    if (!output.prompt_logprobs || output.prompt_logprobs_delivered) continue;
    const Status collected = prompt_logprobs_.collect(batch, i, *output.prompt_logprobs);
    if (collected.ok()) continue;
    failures.emplace_back(seq.id(), collected.with_context("request '" + output.request_id + "'"));
    const Status aborted = scheduler_.abort(seq.id());
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
}

void EngineCore::fail_batch(const ScheduledBatch& batch, const Status& status) {
  std::vector<SeqId> failed;
  for (const ScheduledSequence& entry : batch.entries) {
    if (entry.sequence->status() == SequenceStatus::kAborted) continue;  // already ended
    failed.push_back(entry.sequence->id());
    const Status aborted = scheduler_.abort(entry.sequence->id());
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
  // Every entry is aborted, so the tokens are ignored; postprocess frees the blocks.
  const std::vector<int32_t> ignored(static_cast<size_t>(batch.num_samples), 0);
  const auto updates = scheduler_.postprocess(batch, ignored);
  PDS_CHECK(updates.ok(), updates.status().to_string());
  const Status context = status.with_context("model step " + std::to_string(batch.step));
  for (SeqId seq_id : failed) end_with_error(seq_id, context);
}

void EngineCore::emit(RequestState& state, const SequenceUpdate& update) {
  ++generation_tokens_total_;
  SequenceDelta delta = outputs_.token_delta(state.output, update);
  if (state.kv_export || state.report_sampler_state) delta.sampler_state = state.rng.state();
  if (!delta.finished) {
    deliver_delta(state.sink, std::move(delta));
    return;
  }
  if (update.finish_reason == FinishReason::kNone) {  // a stop string ended it
    const Status aborted = scheduler_.abort(state.seq_id);
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
  finish(state.seq_id, std::move(delta));
}

void EngineCore::end_with_error(SeqId seq_id, const Status& status) {
  SequenceDelta delta = OutputProcessor::make_delta(requests_.at(seq_id).output);
  delta.finished = true;
  delta.error = status;
  finish(seq_id, std::move(delta));
}

void EngineCore::finish(SeqId seq_id, SequenceDelta delta) {
  auto it = requests_.find(seq_id);
  PDS_CHECK(it != requests_.end(), "finish() of an unknown sequence");
  delta.timings.finished = now();
  const DeltaSink sink = std::move(it->second.sink);
  if (spec_) spec_->release(seq_id);
  ids_.erase(it->second.output.request_id);
  requests_.erase(it);
  deliver_delta(sink, std::move(delta));
}

void deliver_delta(const DeltaSink& sink, SequenceDelta delta) {
  // A throwing sink is the front end's bug; it must not take the engine down with it.
  try {
    sink(std::move(delta));
  } catch (const std::exception& e) {
    PDS_LOG_ERROR(std::string("engine: a delta sink threw: ") + e.what());
  } catch (...) {
    PDS_LOG_ERROR("engine: a delta sink threw a non-standard exception");
  }
}

PrefixCacheChanges EngineCore::take_prefix_cache_changes() {
  return scheduler_.block_manager().take_prefix_cache_changes();
}

std::vector<uint64_t> EngineCore::prefix_cache_keys() const {
  return scheduler_.block_manager().registered_keys();
}

ServiceStats EngineCore::stats() const {
  const BlockManager& blocks = scheduler_.block_manager();
  ServiceStats stats;
  stats.num_waiting = scheduler_.num_waiting();
  stats.num_running = scheduler_.num_running();
  stats.kv_blocks_total = blocks.num_blocks();
  stats.kv_blocks_used = blocks.num_used_blocks();
  stats.kv_blocks_cached = blocks.num_cached_blocks();
  stats.prefix_cache_queried_tokens = blocks.prefix_cache_stats().queried_tokens;
  stats.prefix_cache_hit_tokens = blocks.prefix_cache_stats().hit_tokens;
  stats.prompt_tokens_total = prompt_tokens_total_;
  stats.generation_tokens_total = generation_tokens_total_;
  stats.preemptions_total = preemptions_total_;
  if (spec_) {
    stats.spec_decode_method = std::string(spec_->method());
    stats.spec_decode = spec_->counts();
  }
  kv_transfers_.fill_stats(stats);
  kv_tiers_.fill_stats(stats);
  return stats;
}

}  // namespace pdserve
