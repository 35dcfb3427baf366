#include "bench/spec_decode_engine/acceptance_profile.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/core/files.h"

namespace pdserve {

Result<std::vector<AcceptanceProfile>> read_acceptance_profiles(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(const std::string text, read_text_file(path));
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("workloads") || !json["workloads"].is_array()) {
    return invalid_argument(path.string() + ": no \"workloads\" array");
  }
  std::vector<AcceptanceProfile> profiles;
  for (const nlohmann::json& w : json["workloads"]) {
    AcceptanceProfile profile;
    try {
      profile.name = w.at("name").get<std::string>();
      profile.prompt_ids = w.at("prompt_ids").get<std::vector<int32_t>>();
      profile.proposed = w.at("proposed").get<std::vector<int>>();
      profile.accepted = w.at("accepted").get<std::vector<int>>();
      profile.offline_acceptance = w.at("path").at("acceptance").get<double>();
    } catch (const nlohmann::json::exception& error) {
      return invalid_argument(path.string() + ": a workload: " + error.what());
    }
    bool consistent =
        profile.proposed.size() == profile.accepted.size() && !profile.prompt_ids.empty();
    for (size_t i = 0; consistent && i < profile.proposed.size(); ++i) {
      consistent = 0 <= profile.accepted[i] && profile.accepted[i] <= profile.proposed[i];
    }
    if (!consistent) {
      return invalid_argument(
          path.string() + ": workload " + profile.name +
          ": needs a prompt and 0 <= accepted[i] <= proposed[i] at every position");
    }
    profiles.push_back(std::move(profile));
  }
  return profiles;
}

ProfileReplayProposer::ProfileReplayProposer(std::vector<std::vector<int32_t>> known,
                                             size_t prompt_length, const AcceptanceProfile& profile,
                                             int32_t vocab_size)
    : known_(std::move(known)),
      prompt_length_(prompt_length),
      profile_(profile),
      vocab_size_(vocab_size) {}

Status ProfileReplayProposer::propose(std::span<const ProposalRequest> requests,
                                      std::span<std::vector<int32_t>> proposals) {
  for (size_t r = 0; r < requests.size(); ++r) {
    proposals[r].clear();
    const std::span<const int32_t> tokens = requests[r].tokens;
    const auto row = std::find_if(known_.begin(), known_.end(), [&](const auto& candidate) {
      return candidate.size() >= tokens.size() &&
             std::equal(tokens.begin(), tokens.end(), candidate.begin());
    });
    if (row == known_.end() || tokens.size() <= prompt_length_) continue;
    // The request holds its last token without KV: output position i is the next token's.
    const size_t position = tokens.size() - prompt_length_;
    if (position >= profile_.proposed.size()) continue;
    const int count = std::min(profile_.proposed[position], requests[r].max_proposals);
    const int right = std::min(profile_.accepted[position], count);
    for (int t = 0; t < count && tokens.size() + static_cast<size_t>(t) < row->size(); ++t) {
      const int32_t greedy = (*row)[tokens.size() + static_cast<size_t>(t)];
      // Any other token is rejected by a greedy target.
      proposals[r].push_back(t < right ? greedy : (greedy + 1) % vocab_size_);
    }
  }
  return Status::ok_status();
}

}  // namespace pdserve
