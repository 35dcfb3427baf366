#include "common/model/synthetic_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "common/core/files.h"
#include "common/model/checkpoint.h"
#include "common/model/counter_rng.h"
#include "common/model/fp8_quantizer.h"
#include "common/model/parallel_for.h"
#include "common/model/qwen3_layout.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_writer.h"
#include "common/model/tensor_shape.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json"};
// Elements generated per write: 4 Mi elements (8-16 MiB) keeps memory flat for any model size.
constexpr size_t kElementsPerWrite = size_t{1} << 22;
constexpr size_t kGenerationGrain = size_t{1} << 16;

// Qwen3-8B-FP8 and its dense siblings store weight_scale_inv in bf16 (vLLM forks had to stop
// assuming float32 for them); the block is weight_block_size [128, 128].
constexpr DType kFp8ScaleDtype = DType::kBF16;

enum class TensorRole { kWeight, kNorm, kFp8Weight, kFp8Scale };

struct Shard {
  std::vector<SafetensorsEntry> tensors;
  std::vector<TensorRole> roles;
};

using UniqueFile = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

Status write_bytes(std::FILE* file, const void* data, size_t size, const fs::path& path) {
  if (size > 0 && std::fwrite(data, 1, size, file) != size) {
    return data_loss("cannot write '" + path.string() + "': " + std::strerror(errno));
  }
  return {};
}

Result<nlohmann::json> configured_json(const SyntheticCheckpointOptions& options) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(options.config_path));
  if (!json.is_object()) {
    return invalid_argument(options.config_path.string() + ": expected a JSON object");
  }
  if (options.num_layers) {
    if (*options.num_layers <= 0) return invalid_argument("--layers must be positive");
    json["num_hidden_layers"] = *options.num_layers;
  }
  if (options.tie_word_embeddings) json["tie_word_embeddings"] = *options.tie_word_embeddings;
  if (options.dtype) {
    json["torch_dtype"] = dtype_name(*options.dtype);
    if (json.contains("dtype")) json["dtype"] = dtype_name(*options.dtype);
  }
  json.erase("quantization_config");
  if (options.fp8) {
    // As Qwen3-8B-FP8's config.json has it.
    json["quantization_config"] = {{"activation_scheme", "dynamic"},
                                   {"fmt", "e4m3"},
                                   {"quant_method", "fp8"},
                                   {"weight_block_size", {kFp8WeightBlock, kFp8WeightBlock}}};
  }
  return json;
}

// Groups tensors in order, starting a new shard when the next one would exceed the limit (as
// transformers does); a tensor larger than the limit gets a shard of its own.
// An FP8 weight and its scales go to the same shard.
std::vector<Shard> plan_shards(const std::vector<TensorSpec>& specs, DType dtype,
                               uint64_t max_shard_bytes, bool fp8) {
  std::vector<Shard> shards(1);
  uint64_t shard_bytes = 0;
  for (const TensorSpec& spec : specs) {
    std::vector<std::pair<SafetensorsEntry, TensorRole>> entries;
    const bool quantized = fp8 && spec.is_linear;
    const TensorRole role = quantized      ? TensorRole::kFp8Weight
                            : spec.is_norm ? TensorRole::kNorm
                                           : TensorRole::kWeight;
    entries.push_back({{spec.name, quantized ? DType::kF8E4M3 : dtype, spec.shape}, role});
    if (quantized) {
      const std::vector<int64_t> blocks = {
          (spec.shape[0] + kFp8WeightBlock - 1) / kFp8WeightBlock,
          (spec.shape[1] + kFp8WeightBlock - 1) / kFp8WeightBlock};
      entries.push_back({{spec.name + "_scale_inv", kFp8ScaleDtype, blocks}, TensorRole::kFp8Scale});
    }
    uint64_t bytes = 0;
    for (const auto& [entry, entry_role] : entries) {
      bytes += static_cast<uint64_t>(*checked_numel(entry.shape)) * dtype_size(entry.dtype);
    }
    if (!shards.back().tensors.empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    for (auto& [entry, entry_role] : entries) {
      shards.back().tensors.push_back(std::move(entry));
      shards.back().roles.push_back(entry_role);
    }
    shard_bytes += bytes;
  }
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return kSingleFileWeightsName;
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// Elements [first, first + count) of tensor `name` in `dtype`.
void generate(const std::string& name, DType dtype, bool is_norm, uint64_t seed, size_t first,
              size_t count, std::byte* out, unsigned threads) {
  CounterNormal normal(seed, hash_name(name));
  const size_t element_bytes = dtype_size(dtype);
  const double mean = is_norm ? 1.0 : 0.0;
  parallel_for(
      count, kGenerationGrain,
      [&](size_t begin, size_t end) {
        std::vector<float> values(end - begin);
        normal.fill(first + begin, values.size(), mean, kSyntheticWeightStddev, values.data());
        convert_elements(values.data(), DType::kF32, out + begin * element_bytes, dtype,
                         values.size());
      },
      threads);
}

// Writes an FP8 weight stripe by stripe of kFp8WeightBlock rows, quantized from the values a
// `source_dtype` checkpoint holds; returns its scales (row-major blocks) for its scale entry.
Result<std::vector<float>> write_fp8_weight(std::FILE* file, const fs::path& path,
                                            const SafetensorsEntry& entry, DType source_dtype,
                                            const SyntheticCheckpointOptions& options) {
  const int64_t n = entry.shape[0];
  const int64_t k = entry.shape[1];
  const int64_t scale_cols = (k + kFp8WeightBlock - 1) / kFp8WeightBlock;
  std::vector<float> scales(
      static_cast<size_t>((n + kFp8WeightBlock - 1) / kFp8WeightBlock * scale_cols));
  std::vector<std::byte> source;
  std::vector<float> values;
  std::vector<uint8_t> codes;
  for (int64_t row = 0; row < n; row += kFp8WeightBlock) {
    const int64_t rows = std::min(kFp8WeightBlock, n - row);
    const size_t count = static_cast<size_t>(rows * k);
    source.resize(count * dtype_size(source_dtype));
    generate(entry.name, source_dtype, false, options.seed, static_cast<size_t>(row * k), count,
             source.data(), options.threads);
    values.resize(count);
    convert_elements(source.data(), source_dtype, values.data(), DType::kF32, count);
    codes.resize(count);
    quantize_fp8_stripe(values.data(), rows, k, kFp8WeightBlock, kFp8ScaleDtype, codes.data(),
                        scales.data() + row / kFp8WeightBlock * scale_cols);
    PDS_RETURN_IF_ERROR(write_bytes(file, codes.data(), codes.size(), path));
  }
  return scales;
}

// The safetensors library lays the data out by dtype, then by name; every tensor of a synthetic
// checkpoint has one dtype, so by name. With that order the file is byte-identical to what
// transformers' save_pretrained writes for the same weights.
void sort_by_name(Shard& shard) {
  std::vector<size_t> order(shard.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return shard.tensors[a].name < shard.tensors[b].name; });
  Shard sorted;
  for (size_t i : order) {
    sorted.tensors.push_back(std::move(shard.tensors[i]));
    sorted.roles.push_back(shard.roles[i]);
  }
  shard = std::move(sorted);
}

Status write_shard(Shard& shard, const fs::path& path, const SyntheticCheckpointOptions& options,
                   DType weight_dtype) {
  sort_by_name(shard);  // an FP8 weight comes right before its scale tensor
  std::string header = encode_safetensors_header(shard.tensors, {{"format", "pt"}});
  fs::path temporary = path;
  temporary += ".tmp";
  UniqueFile file(std::fopen(temporary.c_str(), "wb"), &std::fclose);
  if (!file)
    return invalid_argument("cannot create '" + temporary.string() + "': " + std::strerror(errno));
  PDS_RETURN_IF_ERROR(write_bytes(file.get(), header.data(), header.size(), temporary));
  std::vector<std::byte> buffer;
  std::vector<float> last_scales;  // of the FP8 weight just written
  for (size_t t = 0; t < shard.tensors.size(); ++t) {
    const SafetensorsEntry& entry = shard.tensors[t];
    const size_t element_bytes = dtype_size(entry.dtype);
    const size_t count = (entry.end - entry.begin) / element_bytes;
    if (shard.roles[t] == TensorRole::kFp8Weight) {
      PDS_ASSIGN_OR_RETURN(last_scales,
                           write_fp8_weight(file.get(), temporary, entry, weight_dtype, options));
      continue;
    }
    if (shard.roles[t] == TensorRole::kFp8Scale) {
      PDS_CHECK(last_scales.size() == count, "FP8 scales written apart from their weight");
      buffer.resize(count * element_bytes);
      convert_elements(last_scales.data(), DType::kF32, buffer.data(), entry.dtype, count);
      PDS_RETURN_IF_ERROR(write_bytes(file.get(), buffer.data(), buffer.size(), temporary));
      continue;
    }
    for (size_t first = 0; first < count; first += kElementsPerWrite) {
      size_t chunk = std::min(kElementsPerWrite, count - first);
      buffer.resize(chunk * element_bytes);
      generate(entry.name, entry.dtype, shard.roles[t] == TensorRole::kNorm, options.seed, first,
               chunk, buffer.data(), options.threads);
      PDS_RETURN_IF_ERROR(write_bytes(file.get(), buffer.data(), buffer.size(), temporary));
    }
  }
  if (std::fclose(file.release()) != 0) {
    return data_loss("cannot write '" + temporary.string() + "': " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) return invalid_argument("cannot rename '" + temporary.string() + "': " + ec.message());
  return {};
}

// Weight files of an earlier run would confuse a loader (an old index beside a new single file).
Status remove_stale_weights(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    bool weights = name == kSingleFileWeightsName || name == kShardIndexFileName ||
                   (name.starts_with("model-") && name.ends_with(".safetensors"));
    if (weights && !fs::remove(entry.path(), ec)) {
      return invalid_argument("cannot remove stale '" + entry.path().string() +
                              "': " + ec.message());
    }
  }
  if (ec) return invalid_argument("cannot list '" + dir.string() + "': " + ec.message());
  return {};
}

Status copy_side_files(const SyntheticCheckpointOptions& options, const ModelConfig& config) {
  fs::path generation_source = options.config_path.parent_path() / "generation_config.json";
  std::error_code ec;
  if (fs::exists(generation_source, ec)) {
    PDS_ASSIGN_OR_RETURN(std::string text, read_text_file(generation_source));
    PDS_RETURN_IF_ERROR(write_file(options.out_dir / "generation_config.json", text));
  } else {
    nlohmann::json minimal = nlohmann::json::object();
    if (config.bos_token_id) minimal["bos_token_id"] = *config.bos_token_id;
    if (!config.eos_token_ids.empty()) minimal["eos_token_id"] = config.eos_token_ids;
    PDS_RETURN_IF_ERROR(
        write_file(options.out_dir / "generation_config.json", minimal.dump(2) + "\n"));
  }
  for (const char* name : kTokenizerFiles) {
    PDS_ASSIGN_OR_RETURN(std::string text, read_text_file(options.tokenizer_dir / name));
    PDS_RETURN_IF_ERROR(write_file(options.out_dir / name, text));
  }
  return {};
}

Result<SyntheticCheckpoint> write_checkpoint(const SyntheticCheckpointOptions& options) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json config_json, configured_json(options));
  PDS_ASSIGN_OR_RETURN(ModelConfig config,
                       parse_model_config(config_json, options.config_path.string()));
  for (const char* name : kTokenizerFiles) {
    std::error_code ec;
    if (!fs::is_regular_file(options.tokenizer_dir / name, ec)) {
      return not_found("tokenizer file '" + (options.tokenizer_dir / name).string() +
                       "' not found");
    }
  }
  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec || !fs::is_directory(options.out_dir)) {
    return invalid_argument("cannot create output folder '" + options.out_dir.string() + "'" +
                            (ec ? ": " + ec.message() : ""));
  }
  PDS_RETURN_IF_ERROR(remove_stale_weights(options.out_dir));

  SyntheticCheckpoint result;
  result.config = config;
  std::vector<TensorSpec> specs = qwen3_tensor_specs(config, !config.tie_word_embeddings);
  std::vector<Shard> shards =
      plan_shards(specs, config.torch_dtype, options.max_shard_bytes, options.fp8);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = shard_file_name(s, shards.size());
    fs::path path = options.out_dir / name;
    PDS_RETURN_IF_ERROR(write_shard(shards[s], path, options, config.torch_dtype));
    result.weight_files.push_back(path);
    result.weight_bytes += safetensors_data_bytes(shards[s].tensors);
    for (const SafetensorsEntry& entry : shards[s].tensors) weight_map[entry.name] = name;
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", result.weight_bytes}}},
                            {"weight_map", weight_map}};
    PDS_RETURN_IF_ERROR(write_file(options.out_dir / kShardIndexFileName, index.dump(2) + "\n"));
  }
  PDS_RETURN_IF_ERROR(copy_side_files(options, config));
  PDS_RETURN_IF_ERROR(write_file(options.out_dir / "config.json", config_json.dump(2) + "\n"));
  return result;
}

}  // namespace

Result<SyntheticCheckpoint> write_synthetic_checkpoint(const SyntheticCheckpointOptions& options) {
  return capture_status([&] { return write_checkpoint(options); });
}

}  // namespace pdserve
