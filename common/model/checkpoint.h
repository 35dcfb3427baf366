// A Hugging Face model folder: config.json, an optional generation_config.json, and weights in
// a single model.safetensors or shards listed by model.safetensors.index.json.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/model/generation_config.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace pdserve {

inline constexpr const char* kSingleFileWeightsName = "model.safetensors";
inline constexpr const char* kShardIndexFileName = "model.safetensors.index.json";

class Checkpoint {
 public:
  // Validates the configs and every shard header; tensor data is mapped, not read.
  static Result<Checkpoint> open(const std::filesystem::path& model_dir);

  const ModelConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return generation_config_; }
  const std::filesystem::path& dir() const { return dir_; }

  bool has_tensor(std::string_view name) const;
  // NOT_FOUND naming the tensor and the folder when absent.
  Result<TensorView> tensor(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

 private:
  // Indices, not pointers, so that copies and moves stay valid.
  struct Location {
    size_t shard = 0;
    size_t entry = 0;  // index into shards_[shard].tensors()
  };

  Status add_single_file();
  Status add_sharded(const std::filesystem::path& index_path);

  std::filesystem::path dir_;
  ModelConfig config_;
  GenerationConfig generation_config_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, Location, std::less<>> tensors_;
};

}  // namespace pdserve
