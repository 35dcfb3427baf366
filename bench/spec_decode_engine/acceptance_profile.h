// A prompt-copying workload's n-gram acceptance profile (bench/spec_decode_engine/copy_workload.py:
// real text, the real Qwen3 tokenizer, prompt lookup run offline against the reference output)
// and the proposer that replays it in the engine: at output position i it proposes p_i tokens,
// the first a_i of them the target's own greedy tokens (from a run without speculation), the
// rest wrong. The engine then verifies exactly the drafts n-gram would have verified on the
// copying text, at n-gram's acceptance, on whatever model it runs (random weights included).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/engine/spec_decode/proposer.h"

namespace pdserve {

struct AcceptanceProfile {
  std::string name;
  std::vector<int32_t> prompt_ids;
  std::vector<int> proposed;      // p_i: n-gram's proposals at output position i
  std::vector<int> accepted;      // a_i <= p_i: how many of them the reference accepts
  double offline_acceptance = 0;  // accepted / proposed along the reference's greedy path
};

// InvalidArgument naming the file and the field for anything malformed.
Result<std::vector<AcceptanceProfile>> read_acceptance_profiles(const std::filesystem::path& path);

class ProfileReplayProposer final : public Proposer {
 public:
  // `known`: each row's prompt followed by its greedy output without speculation; every prompt
  // is `prompt_length` tokens long.
  ProfileReplayProposer(std::vector<std::vector<int32_t>> known, size_t prompt_length,
                        const AcceptanceProfile& profile, int32_t vocab_size);
  std::string_view method() const override { return "profile"; }
  Status propose(std::span<const ProposalRequest> requests,
                 std::span<std::vector<int32_t>> proposals) override;

 private:
  std::vector<std::vector<int32_t>> known_;
  size_t prompt_length_;
  const AcceptanceProfile& profile_;
  int32_t vocab_size_;
};

}  // namespace pdserve
