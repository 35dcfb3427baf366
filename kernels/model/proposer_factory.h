// The proposer a --speculative-config names, for the binaries that speculate (pdserve-decode
// through serving/engine_assembly, pdserve-generate): "ngram" is prompt lookup
// (common/engine/spec_decode/ngram_proposer.h); "draft_model" runs a smaller Qwen3 next to the
// target (kernels/model/draft_model_proposer.h). The one place a method meets its proposer.
#pragma once

#include <memory>

#include "common/core/status.h"
#include "common/engine/spec_decode/proposer.h"
#include "common/engine/spec_decode/speculative_config.h"
#include "kernels/model/draft_model_proposer.h"
#include "kernels/model/model_loader.h"

namespace pdserve {

// `target` is the served model (the draft shares its tokenizer and backend) and must outlive
// the proposer. `draft` is the draft model's pool, step limits and dtypes as the caller's
// engine settles them (serving/draft_proposer_factory.h for a node); read for "draft_model"
// only, whose model and k come from `config`. Errors are the config's or the draft model's (the
// binaries exit 2 on them).
Result<std::unique_ptr<Proposer>> make_proposer(const SpeculativeConfig& config,
                                                LoadedModel& target,
                                                const DraftModelProposerConfig& draft = {});

}  // namespace pdserve
