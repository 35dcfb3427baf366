#include "common/engine/spec_decode/spec_decoder.h"

#include <algorithm>
#include <string>

#include "common/core/log.h"

namespace pdserve {

Result<std::unique_ptr<SpecDecoder>> SpecDecoder::create(const SpeculativeConfig& config,
                                                         std::unique_ptr<Proposer> proposer,
                                                         ModelExecutor& executor) {
  if (proposer == nullptr) return invalid_argument("speculative decoding: no proposer");
  const int k = config.num_speculative_tokens;
  if (k < 1 || k > kMaxSpeculativeTokens) {
    return invalid_argument("speculative decoding: num_speculative_tokens " + std::to_string(k) +
                            " is outside [1, " + std::to_string(kMaxSpeculativeTokens) + "]");
  }
  if (executor.max_token_logits() < k + 1) {
    return invalid_argument("speculative decoding: verifying " + std::to_string(k) +
                            " drafts needs " + std::to_string(k + 1) +
                            " logits rows per sequence; this model executor gives " +
                            std::to_string(executor.max_token_logits()) +
                            " (raise --max-num-seqs or lower num_speculative_tokens)");
  }
  return std::unique_ptr<SpecDecoder>(new SpecDecoder(config, std::move(proposer), executor));
}

SpecDecoder::SpecDecoder(const SpeculativeConfig& config, std::unique_ptr<Proposer> proposer,
                         ModelExecutor& executor)
    : num_speculative_tokens_(config.num_speculative_tokens),
      proposer_(std::move(proposer)),
      executor_(executor),
      policy_(config.num_speculative_tokens) {
  counts_.accepted_per_position.assign(static_cast<size_t>(num_speculative_tokens_), 0);
}

void SpecDecoder::propose(Scheduler& scheduler, std::span<const Candidate> candidates) {
  std::vector<ProposalRequest> requests;
  for (const Candidate& candidate : candidates) {
    const Sequence& seq = *candidate.sequence;
    const SamplingParams& params = seq.sampling_params();
    if (candidate.constrained || seq.status() != SequenceStatus::kRunning || seq.is_prefilling() ||
        static_cast<size_t>(seq.num_output_tokens()) < params.scripted_output.size()) {
      continue;
    }
    // The bonus token must still fit max_tokens.
    const int room = params.max_tokens - seq.num_output_tokens() - 1;
    const int max_proposals = std::min(num_speculative_tokens_, room);
    const bool reproducible = params.seed.has_value() && params.temperature >= kGreedyTemperature;
    if (max_proposals < 1 || !policy_.should_propose(seq.id(), reproducible)) continue;
    requests.push_back({seq.id(), seq.tokens(), max_proposals});
  }
  if (requests.empty()) return;
  std::vector<std::vector<int32_t>> proposals(requests.size());
  const Status proposed = capture_status([&] { return proposer_->propose(requests, proposals); });
  if (!proposed.ok()) {
    PDS_LOG_WARN("speculative decoding: the " + std::string(proposer_->method()) +
                 " proposer failed; decoding this step without drafts: " + proposed.to_string());
    return;
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t>& drafts = proposals[i];
    if (drafts.empty()) continue;
    if (drafts.size() > static_cast<size_t>(requests[i].max_proposals)) {
      drafts.resize(static_cast<size_t>(requests[i].max_proposals));
    }
    const Status set = scheduler.set_draft_tokens(requests[i].seq_id, std::move(drafts));
    if (!set.ok()) {
      PDS_LOG_WARN("speculative decoding: drafts of sequence " +
                   std::to_string(requests[i].seq_id) + " dropped: " + set.to_string());
    }
  }
}

SpecDecoder::Verification SpecDecoder::verify(const ScheduledBatch& batch,
                                              const std::function<SamplerRng&(SeqId)>& rng_of) {
  Verification result;
  result.runs.resize(static_cast<size_t>(batch.num_samples));
  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  size_t slot = 0;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const ScheduledSequence& entry = batch.entries[i];
    if (!entry.samples) continue;
    const size_t row = slot++;
    const Sequence& seq = *entry.sequence;
    if (!entry.verifies() || seq.status() == SequenceStatus::kAborted) continue;
    const std::span<const int32_t> drafts = entry.draft_tokens();
    logits_.resize(static_cast<size_t>(entry.num_new_tokens) * vocab);
    Result<VerifiedRun> run = [&]() -> Result<VerifiedRun> {
      PDS_RETURN_IF_ERROR(capture_status([&] {
        return executor_.token_logits(static_cast<int>(i), 0, entry.num_new_tokens, logits_);
      }));
      return rejection_sampler_.verify(seq, drafts, logits_, executor_.vocab_size(),
                                       rng_of(seq.id()));
    }();
    if (!run.ok()) {
      result.failures.emplace_back(seq.id(), run.status().with_context("verifying drafts"));
      continue;
    }
    VerifiedSequence& verified = result.sequences[seq.id()];
    verified.num_drafts = static_cast<int>(drafts.size());
    verified.num_accepted = run->num_accepted;
    verified.want_logprobs = seq.sampling_params().want_logprobs;
    for (const SampleResult& token : run->tokens) result.runs[row].push_back(token.token);
    verified.tokens = std::move(run->tokens);

    ++counts_.num_drafts;
    counts_.num_draft_tokens += verified.num_drafts;
    counts_.num_accepted_tokens += verified.num_accepted;
    for (int position = 0; position < verified.num_accepted; ++position) {
      ++counts_.accepted_per_position[static_cast<size_t>(position)];
    }
    policy_.record_verify(seq.id(), verified.num_accepted);
  }
  return result;
}

void SpecDecoder::record_step(const ScheduledBatch& batch, std::chrono::duration<double> elapsed) {
  const int rows = batch.num_decodes + batch.num_verify_rows;
  // Prefill chunks would dwarf what a verify row costs.
  if (rows != static_cast<int>(batch.entries.size())) return;
  policy_.record_step(rows, batch.num_verify_rows, elapsed);
}

void SpecDecoder::release(SeqId seq_id) {
  proposer_->release(seq_id);
  policy_.release(seq_id);
}

}  // namespace pdserve
