#include "common/model/checkpoint.h"

#include "common/core/files.h"

namespace pdserve {
namespace {

// Shard names come from a file we do not control: keep them inside the model folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return not_found("model folder '" + model_dir.string() + "' does not exist");
  }
  Checkpoint checkpoint;
  checkpoint.dir_ = model_dir;
  PDS_ASSIGN_OR_RETURN(checkpoint.config_, load_model_config(model_dir / "config.json"));
  PDS_ASSIGN_OR_RETURN(checkpoint.generation_config_,
                       load_generation_config(model_dir / "generation_config.json"));
  std::filesystem::path index_path = model_dir / kShardIndexFileName;
  if (std::filesystem::exists(index_path, ec)) {
    PDS_RETURN_IF_ERROR(checkpoint.add_sharded(index_path));
  } else {
    PDS_RETURN_IF_ERROR(checkpoint.add_single_file());
  }
  return checkpoint;
}

Status Checkpoint::add_single_file() {
  std::filesystem::path path = dir_ / kSingleFileWeightsName;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return not_found("model folder '" + dir_.string() + "' has neither " + kSingleFileWeightsName +
                     " nor " + kShardIndexFileName);
  }
  PDS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  shards_.push_back(std::move(file));
  const std::vector<SafetensorsEntry>& entries = shards_.back().tensors();
  for (size_t i = 0; i < entries.size(); ++i) tensors_[entries[i].name] = Location{0, i};
  return {};
}

Status Checkpoint::add_sharded(const std::filesystem::path& index_path) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file(index_path));
  const std::string source = index_path.string();
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return invalid_argument(source + ": key 'weight_map' must be a JSON object");
  }
  std::map<std::string, size_t> shard_by_name;
  for (const auto& [tensor_name, shard_json] : index["weight_map"].items()) {
    if (!shard_json.is_string() || !is_plain_file_name(shard_json.get<std::string>())) {
      return invalid_argument(source + ": weight_map entry for '" + tensor_name +
                              "' must be a file name in the model folder, got " +
                              shard_json.dump());
    }
    const std::string shard_name = shard_json.get<std::string>();
    auto [it, inserted] = shard_by_name.try_emplace(shard_name, shards_.size());
    if (inserted) {
      Result<SafetensorsFile> shard = SafetensorsFile::open(dir_ / shard_name);
      if (!shard.ok()) {
        return shard.status().with_context(source + " references shard '" + shard_name + "'");
      }
      shards_.push_back(std::move(shard).value());
    }
  }
  for (const auto& [tensor_name, shard_json] : index["weight_map"].items()) {
    size_t shard = shard_by_name.at(shard_json.get<std::string>());
    const SafetensorsEntry* entry = shards_[shard].find(tensor_name);
    if (entry == nullptr) {
      return not_found(source + ": tensor '" + tensor_name + "' is listed in shard '" +
                       shards_[shard].path().string() + "' but that shard does not hold it");
    }
    tensors_[tensor_name] =
        Location{shard, static_cast<size_t>(entry - shards_[shard].tensors().data())};
  }
  return {};
}

bool Checkpoint::has_tensor(std::string_view name) const {
  return tensors_.contains(name);
}

Result<TensorView> Checkpoint::tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return not_found("tensor '" + std::string(name) + "' is not in the checkpoint '" +
                     dir_.string() + "'");
  }
  const SafetensorsFile& shard = shards_[it->second.shard];
  return shard.view(shard.tensors()[it->second.entry]);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

}  // namespace pdserve
