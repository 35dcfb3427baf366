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

// What a resumed stream asks a prefill node for: the KV of its prompt and of its delivered
// tokens but the last (whose KV its next decode step writes). The engine keeps its own sampler
// and does not use the prefill node's token, so that token is sampled greedily.
InferenceRequest resumed_import(const InferenceRequest& request) {
  InferenceRequest work;
  work.id = request.id;
  work.prompt_tokens = request.prompt_tokens;
  const std::vector<int32_t>& delivered = request.resume->output_tokens;
  work.prompt_tokens.insert(work.prompt_tokens.end(), delivered.begin(), delivered.end() - 1);
  work.sampling.temperature = 0.0f;
  work.sampling.max_tokens = 1;
  work.kv_import = request.kv_import;
  return work;
}

SteadyTime now() {
  return std::chrono::steady_clock::now();
}

// Pushes tokens the client already has through a detokenizer and stop matcher; returns the
// text they streamed.
std::string replay_text(const Tokenizer& tokenizer, IncrementalDetokenizer& detokenizer,
                        StopStringMatcher& matcher, std::span<const int32_t> tokens) {
  std::string text;
  for (const int32_t token : tokens) {
    if (!tokenizer.token_bytes(token).has_value()) continue;
    Result<std::string> piece = detokenizer.push(token);
    PDS_CHECK(piece.ok(), piece.status().to_string());
    text += matcher.push(*piece);
  }
  return text;
}

}  // namespace

EngineCore::RequestState::RequestState(std::string request_id, DeltaSink delta_sink, SeqId seq,
                                       SamplerRng request_rng, const Tokenizer& tokenizer,
                                       const InferenceRequest& request,
                                       std::optional<ConstraintMatcher> constraint)
    : id(std::move(request_id)),
      sink(std::move(delta_sink)),
      seq_id(seq),
      include_stop_str_in_output(request.include_stop_str_in_output),
      rng(request_rng),
      detokenizer(tokenizer, request.skip_special_tokens),
      stop_matcher(request.stop, request.include_stop_str_in_output),
      prompt_tokens(static_cast<int>(request.prompt_tokens.size())),
      kv_export(request.kv_export),
      report_sampler_state(request.report_sampler_state),
      grammar(std::move(constraint)) {
  timings.arrival = request.arrival;
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(SchedulerConfig config,
                                                       ModelExecutor& executor, Tokenizer tokenizer,
                                                       KvConnector* connector) {
  if (executor.vocab_size() != config.vocab_size) {
    return invalid_argument(
        "engine: the model's vocabulary has " + std::to_string(executor.vocab_size()) +
        " tokens but the scheduler config says " + std::to_string(config.vocab_size));
  }
  PDS_ASSIGN_OR_RETURN(Scheduler scheduler, Scheduler::create(std::move(config)));
  return std::unique_ptr<EngineCore>(
      new EngineCore(std::move(scheduler), executor, std::move(tokenizer), connector));
}

EngineCore::EngineCore(Scheduler scheduler, ModelExecutor& executor, Tokenizer tokenizer,
                       KvConnector* connector)
    : scheduler_(std::move(scheduler)),
      executor_(executor),
      tokenizer_(std::move(tokenizer)),
      constraints_(std::make_unique<ConstraintCompiler>(
          tokenizer_, scheduler_.config().vocab_size, scheduler_.config().eos_token_ids)),
      connector_(connector),
      seed_source_(std::random_device{}()) {}

Status EngineCore::validate(const InferenceRequest& request) const {
  const SchedulerConfig& config = scheduler_.config();
  const std::string where = "request '" + request.id + "'";
  if (request.id.empty()) return invalid_argument("the request id is empty");
  if ((request.kv_export || request.kv_import) && connector_ == nullptr) {
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
    if (std::optional<SequenceDelta> ended = resumed_output_end(request)) {
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
  requests_.emplace(seq_id, RequestState(request.id, std::move(sink), seq_id, rng, tokenizer_,
                                         request, std::move(grammar)));
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
          "request '" + request.id + "' resumes a stream whose output token " +
          std::to_string(i) + " breaks its structured output"));
    }
  }
  return grammar;
}

std::optional<SequenceDelta> EngineCore::resumed_output_end(
    const InferenceRequest& request) const {
  const std::vector<int32_t>& output = request.resume->output_tokens;
  // validate() created the same checker.
  Result<StopChecker> checker = StopChecker::create(
      request.sampling, scheduler_.config().eos_token_ids, scheduler_.config().vocab_size);
  PDS_CHECK(checker.ok(), checker.status().to_string());
  FinishReason reason = checker->check(output);
  if (reason == FinishReason::kNone && request.stop.empty()) return std::nullopt;
  IncrementalDetokenizer detokenizer(tokenizer_, request.skip_special_tokens);
  StopStringMatcher matcher(request.stop, request.include_stop_str_in_output);
  std::string text = replay_text(tokenizer_, detokenizer, matcher, output);
  if (reason == FinishReason::kNone) {
    if (!matcher.match()) return std::nullopt;
    reason = FinishReason::kStop;
  }
  // All the text the client has, held-back bytes included (the first node's final delta
  // flushed them), for the front end's parsers to catch up on.
  if (!matcher.match()) {
    text += matcher.push(detokenizer.flush());
    text += matcher.finish();
  }
  SequenceDelta delta;
  delta.request_id = request.id;
  delta.finished = true;
  delta.finish_reason = reason;
  delta.ended_before_resume = true;
  delta.prompt_tokens = static_cast<int>(request.prompt_tokens.size());
  delta.completion_tokens = static_cast<int>(output.size());
  delta.timings.arrival = request.arrival;
  delta.timings.finished = now();
  delta.resumed_text = std::move(text);
  return delta;
}

Status EngineCore::catch_up_resumed(RequestState& state, const ResumedOutput& resume) {
  PDS_ASSIGN_OR_RETURN(state.rng, SamplerRng::from_state(resume.sampler_state));
  // The detokenizer and the stop-string matcher catch up on what was streamed before, so the
  // next delta starts where the client's text ends (held-back bytes included).
  std::string text =
      replay_text(tokenizer_, state.detokenizer, state.stop_matcher, resume.output_tokens);
  if (state.stop_matcher.match()) {
    return invalid_argument("request '" + state.id +
                            "' resumes a stream whose output already contains a stop string");
  }
  state.resumed = true;
  state.completion_tokens = static_cast<int>(resume.output_tokens.size());
  state.resumed_text = std::move(text);
  return Status::ok_status();
}

Status EngineCore::add_resumed(InferenceRequest& request, const SamplerRng& rng, DeltaSink& sink,
                               std::optional<ConstraintMatcher>& grammar) {
  PDS_ASSIGN_OR_RETURN(const SeqId seq_id,
                       scheduler_.add_resumed_request(request.prompt_tokens,
                                                      request.resume->output_tokens,
                                                      request.sampling));
  RequestState state(request.id, std::move(sink), seq_id, rng, tokenizer_, request,
                     std::move(grammar));
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
  PDS_ASSIGN_OR_RETURN(const SeqId seq_id,
                       scheduler_.add_imported_request(request.prompt_tokens, request.sampling,
                                                       resumed_output));
  const Sequence& seq = *scheduler_.find(seq_id);
  const auto abort_sequence = [&] {
    const Status aborted = scheduler_.abort(seq_id);
    PDS_CHECK(aborted.ok(), aborted.to_string());
  };
  if (request.resume && seq.num_computed_tokens() >= seq.num_tokens() - 1) {
    // Every token but the last is cached here: nothing to import.
    ++remote_prefills_served_from_cache_total_;
    abort_sequence();
    request.kv_import.reset();
    return add_resumed(request, rng, sink, grammar);
  }
  RequestState state(request.id, std::move(sink), seq_id, rng, tokenizer_, request,
                     std::move(grammar));
  if (request.resume) {
    if (const Status caught = catch_up_resumed(state, *request.resume); !caught.ok()) {
      abort_sequence();
      return caught;
    }
  }
  Status pinned = scheduler_.block_manager().pin(seq_id);
  PDS_CHECK(pinned.ok(), pinned.to_string());
  const std::vector<int32_t> table(scheduler_.block_manager().block_table(seq_id).begin(),
                                   scheduler_.block_manager().block_table(seq_id).end());
  const Status started = capture_status([&] {
    return connector_->start_import(request.resume ? resumed_import(request) : request, table,
                                    seq.num_computed_tokens());
  });
  if (!started.ok()) {
    abort_sequence();
    unpin(seq_id);
    return started;
  }
  imports_.emplace(request.id, seq_id);
  state.cached_prompt_tokens =
      std::min(seq.num_computed_tokens(), static_cast<int>(request.prompt_tokens.size()));
  requests_.emplace(seq_id, std::move(state));
  ids_.emplace(request.id, seq_id);
  return Status::ok_status();
}

void EngineCore::unpin(const SeqId seq_id) {
  const Status unpinned = scheduler_.block_manager().unpin(seq_id);
  PDS_CHECK(unpinned.ok(), unpinned.to_string());
}

void EngineCore::apply_connector_events() {
  if (connector_ == nullptr) return;
  for (KvEvent& event : connector_->poll()) {
    switch (event.kind) {
      case KvEventKind::kExportReleased:
        if (auto it = exports_.find(event.request_id); it != exports_.end()) {
          unpin(it->second);
          exports_.erase(it);
        }
        break;
      case KvEventKind::kImportReleased:
        // Not OK: freed at the hold deadline, without a confirmation (the connector logged why).
        if (!event.status.ok()) ++kv_import_hold_expired_total_;
        if (auto it = imports_.find(event.request_id); it != imports_.end()) {
          unpin(it->second);
          imports_.erase(it);
        }
        break;
      case KvEventKind::kFirstToken:
        PDS_CHECK(event.result.has_value(), "a remote first token without its result");
        import_first_token(event.request_id, std::move(*event.result));
        break;
      case KvEventKind::kImportReady:
        PDS_CHECK(event.stats.has_value(), "an import is ready without its figures");
        import_ready(event.request_id, std::move(*event.stats));
        break;
      case KvEventKind::kImportFailed:
        import_failed(event.request_id, event.status, event.stats);
        break;
    }
  }
}

void EngineCore::import_first_token(const std::string& request_id, RemotePrefillResult result) {
  auto id = ids_.find(request_id);
  if (id == ids_.end()) return;  // aborted meanwhile
  const SeqId seq_id = id->second;
  RequestState& state = requests_.at(seq_id);
  if (state.resumed) {
    // The stream goes on from its delivered tokens: the prefill node's token is not used.
    result.stats.local_cached_tokens = state.cached_prompt_tokens;
    state.remote_prefill = result.stats;
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
  state.rng = *rng;
  result.stats.local_cached_tokens = state.cached_prompt_tokens;
  state.cached_prompt_tokens =
      std::max(state.cached_prompt_tokens, result.stats.remote_cached_tokens);
  state.remote_prefill = result.stats;
  prompt_tokens_total_ += state.prompt_tokens;
  if (result.first_logprobs) state.step_logprobs = std::move(result.first_logprobs);
  emit(state, *update);
  // A stop string in the first token aborted the sequence: the KV is no longer wanted (its
  // blocks stay pinned until the connector says no put can still land). A first token that
  // ended it otherwise (EOS, max_tokens 1) leaves the import running: the landed prompt
  // enters the prefix cache (import_ready).
  if (!ids_.contains(request_id) && scheduler_.find(seq_id) == nullptr) {
    connector_->cancel_import(request_id);
  }
}

void EngineCore::import_ready(const std::string& request_id, RemotePrefillStats stats) {
  kv_checksum_mismatches_total_ += stats.checksum_mismatches;
  kv_refetches_total_ += stats.refetches;
  auto id = ids_.find(request_id);
  if (id == ids_.end()) {
    // Finished by its first token: its prompt still enters the prefix cache.
    if (const std::optional<SeqId> seq_id = awaiting_after_finish(request_id)) {
      const Status completed = scheduler_.complete_import(*seq_id);
      PDS_CHECK(completed.ok(), completed.to_string());
    }
    return;
  }
  const SeqId seq_id = id->second;
  RequestState& state = requests_.at(seq_id);
  const Status completed = scheduler_.complete_import(seq_id);
  if (!completed.ok()) {
    abort(request_id, completed.with_context("the KV of request '" + request_id + "' landed"));
    return;
  }
  state.timings.kv_ready = now();
  if (state.remote_prefill) stats.local_cached_tokens = state.remote_prefill->local_cached_tokens;
  state.remote_prefill = std::move(stats);
}

std::optional<SeqId> EngineCore::awaiting_after_finish(const std::string& request_id) const {
  auto it = imports_.find(request_id);
  if (it == imports_.end() || ids_.contains(request_id)) return std::nullopt;
  const Sequence* seq = scheduler_.find(it->second);
  if (seq == nullptr || seq->status() != SequenceStatus::kAwaitingKv) return std::nullopt;
  return it->second;
}

void EngineCore::import_failed(const std::string& request_id, const Status& status,
                               const std::optional<RemotePrefillStats>& stats) {
  if (stats) {
    kv_checksum_mismatches_total_ += stats->checksum_mismatches;
    kv_refetches_total_ += stats->refetches;
  } else if (status.code() == StatusCode::kDataLoss) {
    ++kv_checksum_mismatches_total_;
  }
  auto id = ids_.find(request_id);
  if (id == ids_.end()) {
    if (const std::optional<SeqId> seq_id = awaiting_after_finish(request_id)) {
      const Status aborted = scheduler_.abort(*seq_id);
      PDS_CHECK(aborted.ok(), aborted.to_string());
    }
    return;
  }
  const SeqId seq_id = id->second;
  // The held blocks stay with the import (its kImportReleased unpins the holder); the sequence
  // queues for a local prefill with new blocks.
  Result<SeqId> holder = scheduler_.requeue_failed_import(seq_id);
  PDS_CHECK(holder.ok(), holder.status().to_string());
  if (auto it = imports_.find(request_id); it != imports_.end()) it->second = *holder;
  ++remote_prefill_fallbacks_total_;
  PDS_LOG_WARN("request '" + request_id + "': " + status.message() + "; prefilling it here");
}

std::vector<std::pair<std::string, SeqId>> EngineCore::start_exports(
    const ScheduledBatch& batch, std::vector<std::pair<SeqId, Status>>& failures) {
  std::vector<std::pair<std::string, SeqId>> started;
  for (const ScheduledSequence& entry : batch.entries) {
    const Sequence& seq = *entry.sequence;
    if (!entry.samples || seq.num_output_tokens() > 0) continue;
    RequestState& state = requests_.at(seq.id());
    if (!state.kv_export) continue;
    Status pinned = scheduler_.block_manager().pin(seq.id());
    PDS_CHECK(pinned.ok(), pinned.to_string());
    const std::vector<int32_t> table(entry.block_table.begin(), entry.block_table.end());
    const Status status = capture_status([&] {
      return connector_->start_export(state.id, *state.kv_export, table, seq.num_prompt_tokens());
    });
    if (status.ok()) {
      exports_.emplace(state.id, seq.id());
      started.emplace_back(state.id, seq.id());
      continue;
    }
    unpin(seq.id());
    failures.emplace_back(seq.id(),
                          status.with_context("sending the KV of request '" + state.id + "'"));
    const Status aborted = scheduler_.abort(seq.id());
    PDS_CHECK(aborted.ok(), aborted.to_string());
  }
  return started;
}

void EngineCore::finish_exports(const std::vector<std::pair<std::string, SeqId>>& started) {
  for (const auto& [request_id, seq_id] : started) {
    const Sequence* seq = scheduler_.find(seq_id);
    if (seq != nullptr && seq->status() != SequenceStatus::kAborted) {
      connector_->finish_export(request_id);
    } else {
      connector_->abort_export(request_id);
    }
  }
}

void EngineCore::abort(const std::string& request_id, const Status& reason) {
  auto it = ids_.find(request_id);
  if (it == ids_.end()) return;
  const SeqId seq_id = it->second;
  if (imports_.contains(request_id)) connector_->cancel_import(request_id);
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
  apply_connector_events();
  if (!scheduler_.has_schedulable()) return false;
  ScheduledBatch batch = scheduler_.schedule();
  preemptions_total_ += static_cast<int64_t>(batch.preempted.size());
  if (batch.empty()) {
    const auto updates = scheduler_.postprocess(batch, {});
    PDS_CHECK(updates.ok(), updates.status().to_string());
    return false;
  }
  note_scheduled(batch);

  // Exports start before the forward so that each layer's KV can leave as soon as it exists.
  std::vector<std::pair<SeqId, Status>> failures;
  std::vector<std::pair<std::string, SeqId>> exporting;
  if (connector_ != nullptr) exporting = start_exports(batch, failures);
  LayerKvWritten on_layer_written;
  if (!exporting.empty())
    on_layer_written = [this](int layer) { connector_->layer_written(layer); };

  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  logits_.resize(static_cast<size_t>(batch.num_samples) * vocab);
  // A device sampler's step is queued first; its sampling inputs are prepared while the
  // device computes (sample_on_device).
  const bool on_device = executor_.samples_on_device();
  const SteadyTime forward_start = now();
  Status executed = capture_status([&] {
    if (!on_device) return executor_.execute(batch, logits_, on_layer_written);
    return executor_.launch_step(batch, device_rows(batch), on_layer_written);
  });
  std::vector<int32_t> tokens;
  if (executed.ok() && on_device) executed = sample_on_device(batch, failures, tokens);
  if (!executed.ok()) {
    for (const auto& [request_id, seq_id] : exporting) connector_->abort_export(request_id);
    fail_batch(batch, executed);
    for (const auto& [seq_id, status] : failures) end_with_error(seq_id, status);
    return true;
  }
  note_prefill_chunks(batch, forward_start, now());

  if (!on_device) tokens = sample_batch(batch, failures);
  finish_exports(exporting);
  // Sampled tokens lie in the vocabulary and the batch is the pending one.
  Result<std::vector<SequenceUpdate>> updates = scheduler_.postprocess(batch, tokens);
  PDS_CHECK(updates.ok(), updates.status().to_string());
  for (const auto& [seq_id, status] : failures) end_with_error(seq_id, status);
  for (const SequenceUpdate& update : *updates) emit(requests_.at(update.seq_id), update);
  return true;
}

void EngineCore::note_scheduled(const ScheduledBatch& batch) {
  const SteadyTime time = now();
  for (const ScheduledSequence& entry : batch.entries) {
    RequestState& state = requests_.at(entry.sequence->id());
    if (state.timings.first_scheduled) continue;
    state.timings.first_scheduled = time;
    // An imported request's prompt was counted when its first token came.
    if (state.remote_prefill) continue;
    state.cached_prompt_tokens = entry.num_cached_before;
    prompt_tokens_total_ += state.prompt_tokens;
  }
}

void EngineCore::note_prefill_chunks(const ScheduledBatch& batch, SteadyTime start,
                                     SteadyTime end) {
  int batch_tokens = 0;
  for (const ScheduledSequence& entry : batch.entries) batch_tokens += entry.num_new_tokens;
  for (const ScheduledSequence& entry : batch.entries) {
    const int prompt_left = entry.sequence->num_prompt_tokens() - entry.num_cached_before;
    if (prompt_left <= 0) continue;
    requests_.at(entry.sequence->id())
        .timings.prefill_chunks.push_back(
            {start, end, std::min(prompt_left, entry.num_new_tokens), batch_tokens});
  }
}

std::vector<int32_t> EngineCore::sample_batch(const ScheduledBatch& batch,
                                              std::vector<std::pair<SeqId, Status>>& failures) {
  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  std::vector<int32_t> tokens(static_cast<size_t>(batch.num_samples), 0);
  const std::vector<Status> masked = mask_constrained_rows(batch);
  size_t row = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    const Sequence& seq = *entry.sequence;
    if (seq.status() == SequenceStatus::kAborted) {  // its export could not start
      ++row;
      continue;
    }
    RequestState& state = requests_.at(seq.id());
    Result<SampleResult> sampled =
        masked[row].ok()
            ? sample_entry(state, seq, std::span<const float>(logits_.data() + row * vocab, vocab))
            : Result<SampleResult>(masked[row]);
    record_sample(state, seq, std::move(sampled), tokens[row], failures);
    ++row;
  }
  return tokens;
}

void EngineCore::record_sample(RequestState& state, const Sequence& seq,
                               Result<SampleResult> sampled, int32_t& token,
                               std::vector<std::pair<SeqId, Status>>& failures) {
  if (sampled.ok()) {
    token = sampled->token;
    if (seq.sampling_params().want_logprobs) {
      state.step_logprobs =
          SampledTokenLogprobs{sampled->token, sampled->logprob, std::move(sampled->top_logprobs)};
    }
    return;
  }
  // The request's parameters were validated on admission, so a failure here means the model
  // produced logits the sampler refuses (NaN, +inf) or a grammar failed: a server fault, not
  // the client's.
  failures.emplace_back(seq.id(), internal_error("sampling request '" + state.id +
                                                 "': " + sampled.status().message()));
  const Status aborted = scheduler_.abort(seq.id());
  PDS_CHECK(aborted.ok(), aborted.to_string());
}

std::span<const SamplingRow> EngineCore::device_rows(const ScheduledBatch& batch) {
  device_rows_.assign(static_cast<size_t>(batch.num_samples), SamplingRow{});
  size_t row = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    const Sequence& seq = *entry.sequence;
    if (seq.status() != SequenceStatus::kAborted) {  // else its export could not start
      SamplingRow& out = device_rows_[row];
      out.params = &seq.sampling_params();
      out.prompt_tokens = seq.prompt_tokens();
      out.output_tokens = seq.output_tokens();
      out.banned_token_ids =
          seq.stop_checker().min_tokens_banned_ids(static_cast<size_t>(seq.num_output_tokens()));
      out.rng = &requests_.at(seq.id()).rng;
    }
    ++row;
  }
  return device_rows_;
}

Status EngineCore::sample_on_device(const ScheduledBatch& batch,
                                    std::vector<std::pair<SeqId, Status>>& failures,
                                    std::vector<int32_t>& tokens) {
  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  const size_t num_samples = static_cast<size_t>(batch.num_samples);
  const size_t words = token_bitmask_words(executor_.vocab_size());
  tokens.assign(num_samples, 0);
  std::vector<const Sequence*> sequences(num_samples, nullptr);  // null: no token wanted
  size_t row = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    if (device_rows_[row].params != nullptr) sequences[row] = entry.sequence;
    ++row;
  }

  // The grammars' masks, all rows at once (ConstraintBatchMasker), while the device computes.
  std::vector<ConstraintMatcher*> matchers;
  std::vector<size_t> constrained_rows;
  for (size_t r = 0; r < num_samples; ++r) {
    if (sequences[r] == nullptr) continue;
    RequestState& state = requests_.at(sequences[r]->id());
    if (state.grammar) {
      matchers.push_back(&*state.grammar);
      constrained_rows.push_back(r);
    }
  }
  bitmasks_.assign(constrained_rows.size() * words, 0);
  std::vector<std::span<int32_t>> masks;
  std::vector<std::span<const int32_t>> allowed(num_samples);
  for (size_t i = 0; i < constrained_rows.size(); ++i) {
    masks.emplace_back(bitmasks_.data() + i * words, words);
  }
  if (!matchers.empty()) {
    const std::vector<Status> filled = grammar_masker_.allowed(matchers, masks);
    for (size_t i = 0; i < constrained_rows.size(); ++i) {
      const size_t r = constrained_rows[i];
      if (filled[i].ok()) {
        allowed[r] = masks[i];
        continue;
      }
      // The grammar failed: its request fails; the device's token for it is ignored.
      RequestState& state = requests_.at(sequences[r]->id());
      record_sample(state, *sequences[r], filled[i], tokens[r], failures);
      sequences[r] = nullptr;
    }
  }

  std::vector<SampledRow> results(num_samples);
  PDS_RETURN_IF_ERROR(
      capture_status([&] { return executor_.sample_step(allowed, results, logits_); }));

  for (size_t r = 0; r < num_samples; ++r) {
    if (sequences[r] == nullptr) continue;
    const Sequence& seq = *sequences[r];
    RequestState& state = requests_.at(seq.id());
    const std::span<float> logits(logits_.data() + r * vocab, vocab);
    Result<SampleResult> sampled =
        device_sample_result(device_rows_[r], allowed[r], results[r], logits);
    if (sampled.ok() && state.grammar) {
      const Status accepted = state.grammar->accept(sampled->token);
      if (!accepted.ok()) sampled = accepted;
    }
    record_sample(state, seq, std::move(sampled), tokens[r], failures);
  }
  return Status::ok_status();
}

Result<SampleResult> EngineCore::device_sample_result(const SamplingRow& row,
                                                      std::span<const int32_t> allowed,
                                                      const SampledRow& result,
                                                      std::span<float> logits) {
  const SamplingParams& params = *row.params;
  switch (result.outcome) {
    case SampleOutcome::kSampled:
      break;
    case SampleOutcome::kLeftToHost:
      // Nothing was drawn: the host sampler draws as it always does.
      apply_token_bitmask(allowed, logits);
      return sampler_.sample(logits, params, row.prompt_tokens, row.output_tokens, *row.rng,
                             row.banned_token_ids);
    case SampleOutcome::kInvalidLogits:
      return invalid_argument("the logits hold a NaN or +inf");
    case SampleOutcome::kAllMasked:
      return invalid_argument("every token is masked: all logits are -inf");
    case SampleOutcome::kPenaltyOverflow:
      return invalid_argument("a penalty overflowed a logit to +inf");
  }
  if (result.token < 0 || result.token >= executor_.vocab_size()) {
    return internal_error("the device sampler returned token " + std::to_string(result.token));
  }
  if (!params.want_logprobs) return SampleResult{result.token, 0.0f, {}};
  // Logprobs come from the raw logits as the host path sees them: after the grammar's mask.
  apply_token_bitmask(allowed, logits);
  return sampler_.logprobs(logits, result.token, params.logprobs);
}

std::vector<Status> EngineCore::mask_constrained_rows(const ScheduledBatch& batch) {
  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  std::vector<Status> statuses(static_cast<size_t>(batch.num_samples), Status::ok_status());
  std::vector<ConstraintMatcher*> matchers;
  std::vector<std::span<float>> rows;
  std::vector<size_t> row_indices;
  size_t row = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    const Sequence& seq = *entry.sequence;
    if (seq.status() != SequenceStatus::kAborted) {
      RequestState& state = requests_.at(seq.id());
      if (state.grammar) {
        matchers.push_back(&*state.grammar);
        rows.emplace_back(logits_.data() + row * vocab, vocab);
        row_indices.push_back(row);
      }
    }
    ++row;
  }
  if (matchers.empty()) return statuses;
  std::vector<Status> masked = grammar_masker_.mask(matchers, rows);
  for (size_t i = 0; i < row_indices.size(); ++i) statuses[row_indices[i]] = std::move(masked[i]);
  return statuses;
}

Result<SampleResult> EngineCore::sample_entry(RequestState& state, const Sequence& seq,
                                              std::span<const float> logits) {
  PDS_ASSIGN_OR_RETURN(
      SampleResult sampled,
      sampler_.sample(logits, seq.sampling_params(), seq.prompt_tokens(), seq.output_tokens(),
                      state.rng,
                      seq.stop_checker().min_tokens_banned_ids(
                          static_cast<size_t>(seq.num_output_tokens()))));
  if (state.grammar) PDS_RETURN_IF_ERROR(state.grammar->accept(sampled.token));
  return sampled;
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
  ++state.completion_tokens;
  ++generation_tokens_total_;
  if (!state.timings.first_token) state.timings.first_token = now();
  SequenceDelta delta = make_delta(state);
  delta.token_ids.push_back(update.token);
  if (state.kv_export || state.report_sampler_state) delta.sampler_state = state.rng.state();
  if (state.resumed_text) {
    delta.resumed_text = std::move(state.resumed_text);
    state.resumed_text.reset();
  }
  if (state.step_logprobs) {
    delta.logprobs.push_back(std::move(*state.step_logprobs));
    state.step_logprobs.reset();
  }

  // An EOS or stop token ends the text without showing up in it (vLLM's rule).
  const bool ended_by_stop_token = update.finish_reason == FinishReason::kStop;
  const bool has_text = (!ended_by_stop_token || state.include_stop_str_in_output) &&
                        tokenizer_.token_bytes(update.token).has_value();
  std::string text;
  if (has_text) {
    // Only unknown ids fail, and those were filtered out above.
    Result<std::string> piece = state.detokenizer.push(update.token);
    PDS_CHECK(piece.ok(), piece.status().to_string());
    text = state.stop_matcher.push(*piece);
  }
  FinishReason reason = update.finish_reason;
  if (!state.stop_matcher.match() && reason != FinishReason::kNone) {
    text += state.stop_matcher.push(state.detokenizer.flush());
  }
  if (const std::optional<StopMatch>& match = state.stop_matcher.match()) {
    if (update.finish_reason == FinishReason::kNone) {
      const Status aborted = scheduler_.abort(state.seq_id);
      PDS_CHECK(aborted.ok(), aborted.to_string());
    }
    reason = FinishReason::kStop;
    delta.matched_stop = match->stop;
  } else if (reason != FinishReason::kNone) {
    text += state.stop_matcher.finish();
  }
  delta.text = std::move(text);
  if (reason == FinishReason::kNone) {
    deliver_delta(state.sink, std::move(delta));
    return;
  }
  delta.finished = true;
  delta.finish_reason = reason;
  finish(state.seq_id, std::move(delta));
}

void EngineCore::end_with_error(SeqId seq_id, const Status& status) {
  SequenceDelta delta = make_delta(requests_.at(seq_id));
  delta.finished = true;
  delta.error = status;
  finish(seq_id, std::move(delta));
}

void EngineCore::finish(SeqId seq_id, SequenceDelta delta) {
  auto it = requests_.find(seq_id);
  PDS_CHECK(it != requests_.end(), "finish() of an unknown sequence");
  delta.timings.finished = now();
  const DeltaSink sink = std::move(it->second.sink);
  ids_.erase(it->second.id);
  requests_.erase(it);
  deliver_delta(sink, std::move(delta));
}

SequenceDelta EngineCore::make_delta(const RequestState& state) {
  SequenceDelta delta;
  delta.request_id = state.id;
  delta.prompt_tokens = state.prompt_tokens;
  delta.completion_tokens = state.completion_tokens;
  delta.cached_prompt_tokens = state.cached_prompt_tokens;
  delta.timings = state.timings;
  delta.remote_prefill = state.remote_prefill;
  return delta;
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
  stats.kv_checksum_mismatches_total = kv_checksum_mismatches_total_;
  stats.remote_prefill_fallbacks_total = remote_prefill_fallbacks_total_;
  stats.remote_prefills_served_from_cache_total = remote_prefills_served_from_cache_total_;
  stats.kv_refetches_total = kv_refetches_total_;
  stats.kv_import_hold_expired_total = kv_import_hold_expired_total_;
  return stats;
}

}  // namespace pdserve
