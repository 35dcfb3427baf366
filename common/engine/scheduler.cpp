#include "common/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

namespace pdserve {
namespace {

std::string seq_name(SeqId seq_id) {
  return "sequence " + std::to_string(seq_id);
}

Status require_positive(int value, const char* field) {
  if (value >= 1) return Status::ok_status();
  return invalid_argument(std::string("scheduler config: ") + field + " must be >= 1, got " +
                          std::to_string(value));
}

}  // namespace

Status SchedulerConfig::validate() const {
  PDS_RETURN_IF_ERROR(require_positive(num_blocks, "num_blocks"));
  PDS_RETURN_IF_ERROR(require_positive(block_size, "block_size"));
  PDS_RETURN_IF_ERROR(require_positive(max_num_batched_tokens, "max_num_batched_tokens"));
  PDS_RETURN_IF_ERROR(require_positive(max_num_seqs, "max_num_seqs"));
  PDS_RETURN_IF_ERROR(require_positive(max_num_waiting, "max_num_waiting"));
  PDS_RETURN_IF_ERROR(require_positive(vocab_size, "vocab_size"));
  if (max_model_len < 0) {
    return invalid_argument("scheduler config: max_model_len must be >= 0, got " +
                            std::to_string(max_model_len));
  }
  return Status::ok_status();
}

Result<Scheduler> Scheduler::create(SchedulerConfig config, BlockHashFn hash) {
  PDS_RETURN_IF_ERROR(config.validate());
  PDS_ASSIGN_OR_RETURN(BlockManager block_manager,
                       BlockManager::create(config.num_blocks, config.block_size, hash));
  // Fail here rather than on every request.
  PDS_RETURN_IF_ERROR(
      StopChecker::create(SamplingParams{}, config.eos_token_ids, config.vocab_size).status());
  return Scheduler(std::move(config), std::move(block_manager));
}

Scheduler::Scheduler(SchedulerConfig config, BlockManager block_manager)
    : config_(std::move(config)), block_manager_(std::move(block_manager)) {}

Result<std::unique_ptr<Sequence>> Scheduler::make_sequence(std::vector<int32_t> prompt_tokens,
                                                           SamplingParams params,
                                                           std::span<const int32_t> output_tokens) {
  if (prompt_tokens.empty()) return invalid_argument("the prompt is empty");
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    if (prompt_tokens[i] < 0 || prompt_tokens[i] >= config_.vocab_size) {
      return invalid_argument("prompt token " + std::to_string(i) + " is " +
                              std::to_string(prompt_tokens[i]) + ", outside [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
  }
  PDS_ASSIGN_OR_RETURN(StopChecker stop_checker,
                       StopChecker::create(params, config_.eos_token_ids, config_.vocab_size));
  const int64_t num_prompt = static_cast<int64_t>(prompt_tokens.size());
  const int64_t total = num_prompt + params.max_tokens;
  if (config_.max_model_len > 0 && total > config_.max_model_len) {
    return out_of_range("prompt (" + std::to_string(num_prompt) + " tokens) + max_tokens (" +
                        std::to_string(params.max_tokens) + ") exceeds the context length " +
                        std::to_string(config_.max_model_len));
  }
  // The last sampled token never needs KV.
  const int64_t needed_blocks = (total - 1 + config_.block_size - 1) / config_.block_size;
  if (needed_blocks > config_.num_blocks) {
    return out_of_range("prompt (" + std::to_string(num_prompt) + " tokens) + max_tokens (" +
                        std::to_string(params.max_tokens) + ") needs " +
                        std::to_string(needed_blocks) + " KV blocks; the pool has " +
                        std::to_string(config_.num_blocks));
  }
  const SeqId seq_id = next_seq_id_;
  auto seq = std::make_unique<Sequence>(seq_id, std::move(prompt_tokens), std::move(params),
                                        std::move(stop_checker), static_cast<uint64_t>(seq_id),
                                        std::chrono::steady_clock::now());
  for (size_t i = 0; i < output_tokens.size(); ++i) {
    const int32_t token = output_tokens[i];
    if (token < 0 || token >= config_.vocab_size) {
      return invalid_argument("resumed output token " + std::to_string(i) + " is " +
                              std::to_string(token) + ", outside [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
    if (seq->append_output_token(token) != FinishReason::kNone) {
      return invalid_argument("resumed output token " + std::to_string(i) +
                              " ends the sequence: there is nothing left to generate");
    }
  }
  return seq;
}

Result<SeqId> Scheduler::add_request(std::vector<int32_t> prompt_tokens, SamplingParams params) {
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                       make_sequence(std::move(prompt_tokens), std::move(params)));
  return enqueue(std::move(seq));
}

Result<SeqId> Scheduler::add_resumed_request(std::vector<int32_t> prompt_tokens,
                                             std::span<const int32_t> output_tokens,
                                             SamplingParams params) {
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                       make_sequence(std::move(prompt_tokens), std::move(params), output_tokens));
  return enqueue(std::move(seq));
}

Result<SeqId> Scheduler::enqueue(std::unique_ptr<Sequence> seq) {
  if (static_cast<int>(waiting_.size()) >= config_.max_num_waiting) {
    return resource_exhausted("the waiting queue is full (" +
                              std::to_string(config_.max_num_waiting) + " requests)");
  }
  const SeqId seq_id = next_seq_id_++;
  waiting_.push_back(seq.get());
  sequences_.emplace(seq_id, std::move(seq));
  return seq_id;
}

Result<SeqId> Scheduler::add_imported_request(std::vector<int32_t> prompt_tokens,
                                              SamplingParams params,
                                              std::span<const int32_t> output_tokens) {
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                       make_sequence(std::move(prompt_tokens), std::move(params), output_tokens));
  if (static_cast<int>(running_.size()) + num_awaiting_kv_ >= config_.max_num_seqs) {
    return resource_exhausted("the node already holds " + std::to_string(config_.max_num_seqs) +
                              " sequences (max_num_seqs)");
  }
  if (!block_manager_.can_allocate(*seq)) {
    return resource_exhausted("the KV pool is full: " +
                              std::to_string(block_manager_.blocks_for_tokens(seq->num_tokens())) +
                              " blocks needed, " +
                              std::to_string(block_manager_.num_available_blocks()) + " available");
  }
  const SeqId seq_id = next_seq_id_++;
  const Status allocated = block_manager_.allocate(*seq);
  PDS_CHECK(allocated.ok(), allocated.to_string());
  seq->set_status(SequenceStatus::kAwaitingKv);
  ++num_awaiting_kv_;
  sequences_.emplace(seq_id, std::move(seq));
  return seq_id;
}

Result<SequenceUpdate> Scheduler::accept_remote_first_token(SeqId seq_id, int32_t first_token) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kAwaitingKv ||
      it->second->num_output_tokens() != 0) {
    return failed_precondition(seq_name(seq_id) + " is not awaiting its first token");
  }
  if (first_token < 0 || first_token >= config_.vocab_size) {
    return invalid_argument("the remotely sampled token " + std::to_string(first_token) +
                            " is outside [0, " + std::to_string(config_.vocab_size) + ")");
  }
  Sequence& seq = *it->second;
  const FinishReason reason = seq.append_output_token(first_token);
  // Even when that token ends the sequence, it waits for its KV, so that the landed prompt
  // enters the prefix cache.
  seq.set_status(SequenceStatus::kAwaitingKv);
  return SequenceUpdate{seq_id, first_token, reason};
}

Status Scheduler::complete_import(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kAwaitingKv ||
      it->second->num_output_tokens() < 1) {
    return failed_precondition(seq_name(seq_id) + " is not awaiting KV after its first token");
  }
  Sequence& seq = *it->second;
  --num_awaiting_kv_;
  // The last token's KV is written by its decode step.
  seq.set_num_computed_tokens(seq.num_tokens() - 1);
  block_manager_.cache_computed_blocks(seq);
  if (seq.finish_reason() != FinishReason::kNone) {
    seq.set_status(SequenceStatus::kFinished);
    retire(seq_id);
  } else {
    seq.set_status(SequenceStatus::kRunning);
    insert_running(seq);
  }
  return Status::ok_status();
}

Result<SeqId> Scheduler::requeue_failed_import(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kAwaitingKv) {
    return failed_precondition(seq_name(seq_id) + " is not awaiting KV");
  }
  --num_awaiting_kv_;
  return requeue_with_fresh_blocks(*it->second);
}

SeqId Scheduler::requeue_with_fresh_blocks(Sequence& seq) {
  // Holder ids come from the sequence ids, so they never name a sequence.
  const SeqId holder = next_seq_id_++;
  const Status handed = block_manager_.hand_over(seq.id(), holder);
  PDS_CHECK(handed.ok(), handed.to_string());
  block_manager_.free(holder);
  seq.set_num_computed_tokens(0);
  seq.set_status(SequenceStatus::kWaiting);
  waiting_.push_front(&seq);
  return holder;
}

Status Scheduler::count_loaded_tokens(Sequence& seq, int loaded_tokens) {
  const int computed = seq.num_computed_tokens() + loaded_tokens;
  if (loaded_tokens < 0 || loaded_tokens % config_.block_size != 0 ||
      computed >= seq.num_tokens()) {
    return invalid_argument(seq_name(seq.id()) + ": " + std::to_string(loaded_tokens) +
                            " loaded tokens are not whole blocks before its last token");
  }
  seq.set_num_computed_tokens(computed);
  block_manager_.cache_computed_blocks(seq);
  return Status::ok_status();
}

Status Scheduler::complete_load(SeqId seq_id, int loaded_tokens) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kLoadingKv) {
    return failed_precondition(seq_name(seq_id) + " is not loading KV");
  }
  Sequence& seq = *it->second;
  PDS_RETURN_IF_ERROR(count_loaded_tokens(seq, loaded_tokens));
  --num_loading_;
  seq.set_status(SequenceStatus::kRunning);
  insert_running(seq);
  return Status::ok_status();
}

Status Scheduler::add_loaded_tokens(SeqId seq_id, int loaded_tokens) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kAwaitingKv ||
      it->second->num_output_tokens() != 0) {
    return failed_precondition(seq_name(seq_id) + " is not awaiting its import");
  }
  return count_loaded_tokens(*it->second, loaded_tokens);
}

Result<SeqId> Scheduler::abandon_load(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() != SequenceStatus::kLoadingKv) {
    return failed_precondition(seq_name(seq_id) + " is not loading KV");
  }
  --num_loading_;
  return requeue_with_fresh_blocks(*it->second);
}

ScheduledBatch Scheduler::schedule() {
  PDS_CHECK(!step_in_flight_, "schedule() called before postprocess() of the previous step");
  ScheduledBatch batch;
  batch.step = next_step_++;
  int budget = config_.max_num_batched_tokens;
  schedule_decodes(batch, budget);
  schedule_prefills(batch, budget);
  // Tables only change above, so the spans taken now stay valid until postprocess().
  for (ScheduledSequence& entry : batch.entries) {
    entry.block_table = block_manager_.block_table(entry.sequence->id());
  }
  step_in_flight_ = true;
  return batch;
}

void Scheduler::schedule_decodes(ScheduledBatch& batch, int& budget) {
  std::vector<ScheduledSequence> verify_rows;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& seq = *running_[i];
    if (seq.is_prefilling()) continue;
    if (add_verify_row(batch, verify_rows, seq, budget)) continue;
    bool preempted_itself = false;
    while (!block_manager_.can_append_slot(seq)) {
      // Victims come from the back, so they were not scheduled yet (or are `seq` itself).
      preempted_itself = running_.back() == &seq;
      preempt_latest(batch);
      if (preempted_itself) break;
    }
    if (preempted_itself) break;
    const Status status = block_manager_.append_slot(seq);
    PDS_CHECK(status.ok(), status.to_string());
    add_chunk(batch, seq, budget);
    ++batch.num_decodes;
  }
  // After the one-token decodes, which an executor may run on a decode-only path.
  batch.num_verify_rows = static_cast<int>(verify_rows.size());
  for (ScheduledSequence& row : verify_rows) batch.entries.push_back(std::move(row));
}

bool Scheduler::add_verify_row(ScheduledBatch& batch, std::vector<ScheduledSequence>& rows,
                               Sequence& seq, int& budget) {
  const std::span<const int32_t> drafts = seq.draft_tokens();
  // The budget pays for the last token too; drafts that do not fit are cut, not queued.
  const int k = std::min(static_cast<int>(drafts.size()), budget - 1);
  if (k < 1 || !block_manager_.can_append_slot(seq, k)) {
    // No room to verify: a plain decode (which may preempt to get its one slot).
    seq.clear_draft_tokens();
    return false;
  }
  const Status status = block_manager_.append_slot(seq, k);
  PDS_CHECK(status.ok(), status.to_string());
  ScheduledSequence& row = rows.emplace_back();
  row.sequence = &seq;
  row.num_cached_before = seq.num_computed_tokens();
  row.num_new_tokens = 1 + k;
  row.samples = true;
  row.verify_tokens.reserve(static_cast<size_t>(1 + k));
  row.verify_tokens.push_back(seq.tokens().back());
  row.verify_tokens.insert(row.verify_tokens.end(), drafts.begin(), drafts.begin() + k);
  seq.clear_draft_tokens();
  budget -= row.num_new_tokens;
  batch.num_batched_tokens += row.num_new_tokens;
  ++batch.num_samples;
  return true;
}

Status Scheduler::set_draft_tokens(SeqId seq_id, std::vector<int32_t> draft_tokens) {
  auto it = sequences_.find(seq_id);
  if (step_in_flight_ || it == sequences_.end() ||
      it->second->status() != SequenceStatus::kRunning || it->second->is_prefilling()) {
    return failed_precondition(seq_name(seq_id) + " is not decoding between steps");
  }
  for (const int32_t token : draft_tokens) {
    if (token < 0 || token >= config_.vocab_size) {
      return invalid_argument("draft token " + std::to_string(token) + " is outside [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
  }
  it->second->set_draft_tokens(std::move(draft_tokens));
  return Status::ok_status();
}

void Scheduler::schedule_prefills(ScheduledBatch& batch, int& budget) {
  for (Sequence* seq : running_) {
    if (budget == 0) return;
    if (seq->is_prefilling()) add_chunk(batch, *seq, budget);
  }
  // Admitting now could hand the blocks just taken back to the sequences that lost them.
  if (!batch.preempted.empty()) return;
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) + num_loading_ < config_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    if (!block_manager_.can_allocate(seq)) return;
    const Status status = block_manager_.allocate(seq);
    PDS_CHECK(status.ok(), status.to_string());
    waiting_.pop_front();
    if (loader_ != nullptr && loader_->start_load(seq, block_manager_.block_table(seq.id()))) {
      seq.set_status(SequenceStatus::kLoadingKv);
      ++num_loading_;
      continue;
    }
    seq.set_status(SequenceStatus::kRunning);
    insert_running(seq);
    add_chunk(batch, seq, budget);
  }
}

void Scheduler::insert_running(Sequence& seq) {
  auto position = std::ranges::upper_bound(running_, seq.arrival_order(), {},
                                           [](const Sequence* s) { return s->arrival_order(); });
  running_.insert(position, &seq);
}

void Scheduler::add_chunk(ScheduledBatch& batch, Sequence& seq, int& budget) {
  ScheduledSequence entry;
  entry.sequence = &seq;
  entry.num_cached_before = seq.num_computed_tokens();
  entry.num_new_tokens = std::min(seq.num_uncomputed_tokens(), budget);
  entry.samples = entry.num_cached_before + entry.num_new_tokens == seq.num_tokens();
  budget -= entry.num_new_tokens;
  batch.num_batched_tokens += entry.num_new_tokens;
  if (entry.samples) ++batch.num_samples;
  batch.entries.push_back(entry);
}

void Scheduler::preempt_latest(ScheduledBatch& batch) {
  Sequence& victim = *running_.back();
  running_.pop_back();
  block_manager_.free(victim.id());
  victim.clear_draft_tokens();
  victim.set_num_computed_tokens(0);
  victim.set_status(SequenceStatus::kPreempted);
  // Victims leave latest first, so the front of the queue stays in arrival order.
  waiting_.push_front(&victim);
  batch.preempted.push_back(victim.id());
}

Status Scheduler::check_results(const ScheduledBatch& batch,
                                std::span<const int32_t> sampled_tokens,
                                std::span<const std::vector<int32_t>> verified_tokens) const {
  if (!step_in_flight_ || batch.step + 1 != next_step_) {
    return failed_precondition("postprocess() of step " + std::to_string(batch.step) +
                               ", which is not the pending step");
  }
  const size_t num_samples = static_cast<size_t>(batch.num_samples);
  if (sampled_tokens.size() != num_samples) {
    return invalid_argument("step " + std::to_string(batch.step) + " samples " +
                            std::to_string(batch.num_samples) + " tokens, got " +
                            std::to_string(sampled_tokens.size()));
  }
  if (!verified_tokens.empty() && verified_tokens.size() != num_samples) {
    return invalid_argument("step " + std::to_string(batch.step) + " has " +
                            std::to_string(batch.num_samples) + " sampling entries, got " +
                            std::to_string(verified_tokens.size()) + " verified runs");
  }
  const auto check_token = [&](int32_t token, const std::string& what) {
    if (token >= 0 && token < config_.vocab_size) return Status::ok_status();
    return invalid_argument(what + " is " + std::to_string(token) + ", outside [0, " +
                            std::to_string(config_.vocab_size) + ")");
  };
  for (size_t i = 0; i < sampled_tokens.size(); ++i) {
    PDS_RETURN_IF_ERROR(check_token(sampled_tokens[i], "sampled token " + std::to_string(i)));
  }
  size_t slot = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    if (!entry.samples) continue;
    const size_t i = slot++;
    const size_t run = verified_tokens.empty() ? 0 : verified_tokens[i].size();
    const std::string where = "sampling entry " + std::to_string(i);
    if (!entry.verifies() && run > 0) return invalid_argument(where + " verifies no drafts");
    if (entry.verifies() && entry.sequence->status() != SequenceStatus::kAborted &&
        (run < 1 || run > static_cast<size_t>(entry.num_new_tokens))) {
      return invalid_argument(where + " verified " + std::to_string(entry.num_draft_tokens()) +
                              " drafts, so emits 1 to " + std::to_string(entry.num_new_tokens) +
                              " tokens, got " + std::to_string(run));
    }
    for (size_t t = 0; t < run; ++t) {
      PDS_RETURN_IF_ERROR(
          check_token(verified_tokens[i][t], where + "'s verified token " + std::to_string(t)));
    }
  }
  return Status::ok_status();
}

Result<std::vector<SequenceUpdate>> Scheduler::postprocess(
    const ScheduledBatch& batch, std::span<const int32_t> sampled_tokens,
    std::span<const std::vector<int32_t>> verified_tokens) {
  PDS_RETURN_IF_ERROR(check_results(batch, sampled_tokens, verified_tokens));
  step_in_flight_ = false;

  std::vector<SequenceUpdate> updates;
  updates.reserve(sampled_tokens.size());
  size_t next_sample = 0;
  for (const ScheduledSequence& entry : batch.entries) {
    Sequence& seq = *entry.sequence;
    const size_t slot = entry.samples ? next_sample++ : 0;
    if (seq.status() == SequenceStatus::kAborted) continue;
    FinishReason reason = FinishReason::kNone;
    if (entry.verifies()) {
      // The KV of the last token and of each accepted draft is right; the rest is overwritten
      // by later steps, so only the tokens appended count as computed (one fewer than appended
      // plus the last token, whose KV this row wrote).
      int appended = 0;
      for (const int32_t token : verified_tokens[slot]) {
        reason = seq.append_output_token(token);
        ++appended;
        updates.push_back({seq.id(), token, reason});
        if (reason != FinishReason::kNone) break;
      }
      seq.set_num_computed_tokens(entry.num_cached_before + appended);
      block_manager_.cache_computed_blocks(seq);
      if (reason == FinishReason::kNone) block_manager_.release_surplus_blocks(seq);
    } else {
      seq.set_num_computed_tokens(entry.num_cached_before + entry.num_new_tokens);
      block_manager_.cache_computed_blocks(seq);
      if (!entry.samples) continue;
      const int32_t token = sampled_tokens[slot];
      reason = seq.append_output_token(token);
      updates.push_back({seq.id(), token, reason});
    }
    if (reason != FinishReason::kNone) {
      running_.erase(std::ranges::find(running_, &seq));
      retire(seq.id());
    }
  }
  for (SeqId seq_id : aborted_in_flight_) retire(seq_id);
  aborted_in_flight_.clear();
  return updates;
}

Status Scheduler::abort(SeqId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->status() == SequenceStatus::kAborted) {
    return not_found(seq_name(seq_id) + " is not queued or running");
  }
  Sequence* seq = it->second.get();
  if (seq->status() == SequenceStatus::kAwaitingKv || seq->status() == SequenceStatus::kLoadingKv) {
    // Not part of any step: its blocks go now (deferred while a transfer holds a pin).
    --(seq->status() == SequenceStatus::kAwaitingKv ? num_awaiting_kv_ : num_loading_);
    seq->set_status(SequenceStatus::kAborted);
    retire(seq_id);
    return Status::ok_status();
  }
  if (auto waiting = std::ranges::find(waiting_, seq); waiting != waiting_.end()) {
    waiting_.erase(waiting);
  } else {
    running_.erase(std::ranges::find(running_, seq));
  }
  seq->set_status(SequenceStatus::kAborted);
  if (step_in_flight_) {
    aborted_in_flight_.push_back(seq_id);
  } else {
    retire(seq_id);
  }
  return Status::ok_status();
}

void Scheduler::retire(SeqId seq_id) {
  block_manager_.free(seq_id);
  sequences_.erase(seq_id);
}

const Sequence* Scheduler::find(SeqId seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

}  // namespace pdserve
