// Loads a speculative-decoding draft model onto the target's backend, after checking that it
// can propose for the target: a Qwen3 checkpoint whose token ids mean the same (the same
// vocab_size and, when both folders have one, the same tokenizer.json).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "kernels/backend.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

struct DraftModelSource {
  std::string model;  // a folder or a hub id in the local Hugging Face cache
  // The weights' dtype on a backend that shares host memory; unset: the checkpoint's. A device
  // backend holds them in its activation dtype, as the target's.
  std::optional<DType> dtype;
  int target_vocab_size = 0;
  // The target's model folder, whose tokenizer.json the draft's must equal; empty: only the
  // vocab sizes are compared.
  std::filesystem::path target_model_dir;
};

// InvalidArgument naming both sides when the vocab sizes or tokenizers differ; the loader's
// errors (NotFound for a missing folder, InvalidArgument for a non-Qwen3 config) with
// "draft model <name>: " in front.
Result<std::unique_ptr<Qwen3Model>> load_draft_model(const DraftModelSource& source,
                                                     Backend& backend);

// The draft's config.json only (nothing loaded), for sizing memory before it is loaded; the
// same errors as load_draft_model's for a missing folder or a non-Qwen3 config.
Result<ModelConfig> read_draft_model_config(const std::string& model);

}  // namespace pdserve
