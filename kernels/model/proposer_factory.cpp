#include "kernels/model/proposer_factory.h"

#include "common/engine/spec_decode/ngram_proposer.h"

namespace pdserve {

Result<std::unique_ptr<Proposer>> make_proposer(const SpeculativeConfig& config,
                                                LoadedModel& target,
                                                const DraftModelProposerConfig& draft) {
  switch (config.method) {
    case SpeculativeMethod::kNgram:
      return std::unique_ptr<Proposer>(std::make_unique<NgramProposer>(config));
    case SpeculativeMethod::kDraftModel: {
      DraftModelProposerConfig draft_config = draft;
      draft_config.model = config.model;
      draft_config.num_speculative_tokens = config.num_speculative_tokens;
      return make_draft_model_proposer(draft_config, *target.backend);
    }
  }
  return invalid_argument("--speculative-config: unknown method");
}

}  // namespace pdserve
