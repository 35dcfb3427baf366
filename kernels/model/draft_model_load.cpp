#include "kernels/model/draft_model_load.h"

#include <system_error>

#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/model_path.h"
#include "common/model/qwen3_weights.h"
#include "common/tokenizer/tokenizer_files.h"

namespace pdserve {
namespace {

// Token ids mean the same in both models when their tokenizer.json files are equal. A folder
// without one (weights only) cannot be compared: the vocab sizes then have to do.
Status check_same_tokenizer(const std::filesystem::path& draft_dir,
                            const std::filesystem::path& target_dir) {
  std::error_code ignored;
  if (target_dir.empty() || !std::filesystem::exists(draft_dir / "tokenizer.json", ignored) ||
      !std::filesystem::exists(target_dir / "tokenizer.json", ignored)) {
    return Status::ok_status();
  }
  PDS_ASSIGN_OR_RETURN(const TokenizerFiles draft, TokenizerFiles::read(draft_dir));
  PDS_ASSIGN_OR_RETURN(const TokenizerFiles target, TokenizerFiles::read(target_dir));
  if (sha256_hex(draft.tokenizer_json) != sha256_hex(target.tokenizer_json)) {
    return invalid_argument(
        "its tokenizer.json differs from the target model's: a draft model must share the "
        "target's tokenizer (the same token ids)");
  }
  return Status::ok_status();
}

Result<std::unique_ptr<Qwen3Model>> load_checked(const DraftModelSource& source, Backend& backend) {
  PDS_ASSIGN_OR_RETURN(const std::filesystem::path dir, resolve_model_path(source.model));
  PDS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(dir));
  const int vocab_size = checkpoint.config().vocab_size;
  if (vocab_size != source.target_vocab_size) {
    return invalid_argument("its vocab_size is " + std::to_string(vocab_size) +
                            ", the target model's " + std::to_string(source.target_vocab_size) +
                            ": a draft model must share the target's tokenizer");
  }
  PDS_RETURN_IF_ERROR(check_same_tokenizer(dir, source.target_model_dir));
  // As load_model places the target's weights: the host computes on a copy on huge pages, a
  // device on weights converted to its activation dtype.
  const bool host = backend.shares_host_memory();
  const DType dtype =
      host ? source.dtype.value_or(checkpoint.config().torch_dtype) : backend.activation_dtype();
  const WeightPlacement placement =
      host ? WeightPlacement::kHostHugePages : WeightPlacement::kMapWhereTheFileAllows;
  PDS_ASSIGN_OR_RETURN(Qwen3Weights weights, load_qwen3_weights(checkpoint, dtype, placement));
  return Qwen3Model::create(backend, std::move(weights));
}

}  // namespace

Result<std::unique_ptr<Qwen3Model>> load_draft_model(const DraftModelSource& source,
                                                     Backend& backend) {
  Result<std::unique_ptr<Qwen3Model>> model = load_checked(source, backend);
  if (!model.ok()) return model.status().with_context("draft model " + source.model);
  return model;
}

Result<ModelConfig> read_draft_model_config(const std::string& model) {
  Result<ModelConfig> config = [&]() -> Result<ModelConfig> {
    PDS_ASSIGN_OR_RETURN(const std::filesystem::path dir, resolve_model_path(model));
    return load_model_config(dir / "config.json");
  }();
  if (!config.ok()) return config.status().with_context("draft model " + model);
  return config;
}

}  // namespace pdserve
