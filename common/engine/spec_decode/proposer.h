// What speculative decoding asks of a proposer: up to k draft tokens continuing each sequence,
// which the engine then checks in one forward of the target model (vLLM's proposer/drafter).
// A proposer may keep per-sequence state (a draft model's KV) keyed by SeqId. `tokens` is the
// truth each time: tokens it proposed earlier and the target rejected are simply absent, so a
// draft model rolls its own KV back to the longest common prefix. Room for EAGLE-style heads:
// a later proposer may also take the target's hidden states through a new optional field.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/engine/sequence.h"

namespace pdserve {

struct ProposalRequest {
  SeqId seq_id = 0;
  // Prompt then output tokens; the last one has no KV in the target's cache yet.
  std::span<const int32_t> tokens;
  // Propose at most this many tokens (>= 1).
  int max_proposals = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;

  // "ngram" or "draft_model": for metrics labels and logs.
  virtual std::string_view method() const = 0;

  // Fills proposals[i] (cleared first) with 0..requests[i].max_proposals token ids, each in
  // the target's vocabulary, continuing requests[i].tokens. requests and proposals have the
  // same size. An error means no proposals this step (the engine decodes without speculation
  // and logs it); it never fails a request.
  virtual Status propose(std::span<const ProposalRequest> requests,
                         std::span<std::vector<int32_t>> proposals) = 0;

  // The sequence left the running set (finished, aborted, preempted, handed to another node):
  // forget whatever is kept for it. Unknown ids are ignored.
  virtual void release(SeqId seq_id) { (void)seq_id; }
};

}  // namespace pdserve
