#include "kernels/model/draft_model_proposer.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "kernels/model/draft_model_load.h"

namespace pdserve {
namespace {

Status check_config(const DraftModelProposerConfig& config) {
  if (config.num_speculative_tokens < 1 ||
      config.num_speculative_tokens > kMaxDraftSpeculativeTokens) {
    return invalid_argument("draft model: num_speculative_tokens must be 1 to " +
                            std::to_string(kMaxDraftSpeculativeTokens) + ", got " +
                            std::to_string(config.num_speculative_tokens));
  }
  const ForwardLimits& limits = config.limits;
  if (limits.max_num_tokens < 1 || limits.max_num_seqs < 1 || limits.max_model_len < 1) {
    return invalid_argument(
        "draft model: max_num_tokens, max_num_seqs and max_model_len must be "
        "at least 1");
  }
  if (config.target_vocab_size < 1) {
    return invalid_argument("draft model: the target's vocab_size is not set");
  }
  return Status::ok_status();
}

}  // namespace

size_t draft_kv_bytes_per_token(const ModelConfig& draft, DType kv_dtype) {
  return kv_layout_for(draft, 1, 1, kv_dtype).bytes_per_token();
}

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::create(
    const DraftModelProposerConfig& config, Backend& backend) {
  PDS_RETURN_IF_ERROR(check_config(config));
  PDS_ASSIGN_OR_RETURN(DraftSequenceTable sequences,
                       DraftSequenceTable::create(config.num_blocks, config.block_size));
  DraftModelSource source;
  source.model = config.model;
  source.dtype = config.dtype;
  source.target_vocab_size = config.target_vocab_size;
  source.target_model_dir = config.target_model_dir;
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, load_draft_model(source, backend));
  const ModelConfig& draft = model->config();
  const DType kv_dtype =
      config.kv_cache_dtype.value_or(backend.default_kv_dtype(model->weight_dtype()));
  PDS_ASSIGN_OR_RETURN(KvCache cache,
                       KvCache::create(backend, kv_layout_for(draft, config.num_blocks,
                                                              config.block_size, kv_dtype)));
  ForwardLimits limits = config.limits;
  limits.max_model_len = std::min(limits.max_model_len, draft.max_position_embeddings);
  PDS_ASSIGN_OR_RETURN(ForwardContext context,
                       ForwardContext::create(backend, draft, limits, config.block_size));
  return std::unique_ptr<DraftModelProposer>(
      new DraftModelProposer(std::move(model), std::move(cache), std::move(context),
                             std::move(sequences), config.num_speculative_tokens));
}

DraftModelProposer::DraftModelProposer(std::unique_ptr<Qwen3Model> model, KvCache cache,
                                       ForwardContext context, DraftSequenceTable sequences, int k)
    : model_(std::move(model)),
      cache_(std::move(cache)),
      context_(std::move(context)),
      sequences_(std::move(sequences)),
      k_(k),
      max_len_(context_.limits().max_model_len),
      logits_(static_cast<size_t>(context_.limits().max_num_seqs) *
              static_cast<size_t>(model_->config().vocab_size)) {}

int DraftModelProposer::proposals_wanted(const ProposalRequest& request) const {
  const int length = static_cast<int>(request.tokens.size());
  if (length == 0 || request.max_proposals < 1) return 0;
  const int vocab_size = model_->config().vocab_size;
  for (const int32_t token : request.tokens) {
    if (token < 0 || token >= vocab_size) return 0;
  }
  // The last proposal needs no KV: positions up to length + wanted - 1 must fit.
  return std::max(0, std::min({request.max_proposals, k_, max_len_ - length + 1}));
}

Status DraftModelProposer::propose(std::span<const ProposalRequest> requests,
                                   std::span<std::vector<int32_t>> proposals) {
  if (requests.size() != proposals.size()) {
    return invalid_argument("draft model: " + std::to_string(requests.size()) + " requests but " +
                            std::to_string(proposals.size()) + " proposal lists");
  }
  std::unordered_set<SeqId> seen;
  for (const ProposalRequest& request : requests) {
    if (!seen.insert(request.seq_id).second) {
      return invalid_argument("draft model: sequence " + std::to_string(request.seq_id) +
                              " appears twice in one propose()");
    }
  }
  for (std::vector<int32_t>& list : proposals) list.clear();

  // Sequences the pool already holds keep their room before new ones take any.
  std::vector<Active> active;
  for (const bool held_pass : {true, false}) {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ProposalRequest& request = requests[i];
      const bool held = sequences_.state(request.seq_id) == DraftSeqState::kHeld;
      if (held != held_pass) continue;
      const int wanted = proposals_wanted(request);
      if (wanted == 0) continue;
      const int positions = static_cast<int>(request.tokens.size()) + wanted - 1;
      const std::optional<int> computed =
          sequences_.reserve(request.seq_id, request.tokens, positions);
      if (!computed) continue;
      active.push_back({i, request.tokens, *computed, wanted, {}});
      proposals[i].reserve(static_cast<size_t>(wanted));
    }
  }
  // Reserving changes the tables; their spans are taken once every reservation is made.
  for (Active& sequence : active) {
    sequence.block_table = sequences_.block_table(requests[sequence.request].seq_id);
  }

  Status status = compute_missing(active, proposals);
  if (status.ok()) status = decode_steps(active, proposals);
  if (!status.ok()) {
    // Each sequence keeps the KV it had complete before this call (reserve() rolled it back).
    for (std::vector<int32_t>& list : proposals) list.clear();
    return status;
  }
  for (const Active& sequence : active) {
    // Every proposal but the last went through a draft step: its KV is in the pool.
    const std::span<const int32_t> proposed = proposals[sequence.request];
    sequences_.set_computed(requests[sequence.request].seq_id, sequence.tokens,
                            proposed.first(proposed.size() - 1));
  }
  return Status::ok_status();
}

Status DraftModelProposer::compute_missing(std::vector<Active>& active,
                                           std::span<std::vector<int32_t>> proposals) {
  const ForwardLimits& limits = context_.limits();
  std::vector<SequenceSlice> slices;
  std::vector<size_t> owners;
  while (true) {
    slices.clear();
    owners.clear();
    int budget = limits.max_num_tokens;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& sequence = active[j];
      const int missing = static_cast<int>(sequence.tokens.size()) - sequence.computed;
      if (missing == 0) continue;
      if (budget == 0 || static_cast<int>(slices.size()) == limits.max_num_seqs) break;
      const int chunk = std::min(missing, budget);
      slices.push_back({sequence.tokens.subspan(static_cast<size_t>(sequence.computed),
                                                static_cast<size_t>(chunk)),
                        sequence.computed, sequence.block_table});
      owners.push_back(j);
      budget -= chunk;
    }
    if (slices.empty()) return Status::ok_status();
    PDS_RETURN_IF_ERROR(forward(slices));
    for (size_t row = 0; row < owners.size(); ++row) {
      Active& sequence = active[owners[row]];
      sequence.computed += static_cast<int>(slices[row].tokens.size());
      // The slice ending at the last token gives the first proposal.
      if (sequence.computed == static_cast<int>(sequence.tokens.size())) {
        proposals[sequence.request].push_back(argmax_row(row));
      }
    }
  }
}

Status DraftModelProposer::decode_steps(std::vector<Active>& active,
                                        std::span<std::vector<int32_t>> proposals) {
  const size_t max_seqs = static_cast<size_t>(context_.limits().max_num_seqs);
  std::vector<SequenceSlice> slices;
  std::vector<size_t> owners;
  const auto flush = [&]() -> Status {
    if (slices.empty()) return Status::ok_status();
    PDS_RETURN_IF_ERROR(forward(slices));
    // After the forward: the slices point at the lists' last tokens.
    for (size_t row = 0; row < owners.size(); ++row) {
      proposals[active[owners[row]].request].push_back(argmax_row(row));
    }
    slices.clear();
    owners.clear();
    return Status::ok_status();
  };
  bool stepped = true;
  while (stepped) {
    stepped = false;
    for (size_t j = 0; j < active.size(); ++j) {
      const Active& sequence = active[j];
      const std::vector<int32_t>& proposed = proposals[sequence.request];
      if (static_cast<int>(proposed.size()) >= sequence.wanted) continue;
      const int position = static_cast<int>(sequence.tokens.size() + proposed.size()) - 1;
      slices.push_back(
          {std::span<const int32_t>(&proposed.back(), 1), position, sequence.block_table});
      owners.push_back(j);
      stepped = true;
      if (slices.size() == max_seqs) PDS_RETURN_IF_ERROR(flush());
    }
    PDS_RETURN_IF_ERROR(flush());
  }
  return Status::ok_status();
}

Status DraftModelProposer::forward(std::span<const SequenceSlice> slices) {
  const size_t rows = slices.size() * static_cast<size_t>(model_->config().vocab_size);
  return model_->forward(slices, cache_, context_, std::span<float>(logits_.data(), rows));
}

int32_t DraftModelProposer::argmax_row(size_t row) const {
  const size_t vocab_size = static_cast<size_t>(model_->config().vocab_size);
  const float* begin = logits_.data() + row * vocab_size;
  // The first of equal maxima: the lowest id, as the engine's greedy sampler breaks ties.
  return static_cast<int32_t>(std::max_element(begin, begin + vocab_size) - begin);
}

Result<std::unique_ptr<Proposer>> make_draft_model_proposer(const DraftModelProposerConfig& config,
                                                            Backend& backend) {
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelProposer> proposer,
                       DraftModelProposer::create(config, backend));
  return std::unique_ptr<Proposer>(std::move(proposer));
}

}  // namespace pdserve
