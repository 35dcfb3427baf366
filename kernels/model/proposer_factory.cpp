#include "kernels/model/proposer_factory.h"

#include "common/engine/spec_decode/ngram_proposer.h"

namespace pdserve {

Result<std::unique_ptr<Proposer>> make_proposer(const SpeculativeConfig& config,
                                                LoadedModel& target) {
  switch (config.method) {
    case SpeculativeMethod::kNgram:
      return std::unique_ptr<Proposer>(std::make_unique<NgramProposer>(config));
    case SpeculativeMethod::kDraftModel:
      // DRAFT-MODEL HOOK (issue #30): the spec-draft branch's factory goes here, i.e.
      //   return make_draft_model_proposer(config, target);
      // from kernels/model/draft_model_proposer.h, once both branches are merged.
      (void)target;
      return unimplemented(
          "--speculative-config: method \"draft_model\" is not built yet in "
          "this build; use \"ngram\"");
  }
  return invalid_argument("--speculative-config: unknown method");
}

}  // namespace pdserve
