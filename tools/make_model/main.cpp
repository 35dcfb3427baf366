// pdserve-make-model: writes a Hugging Face Qwen3 folder with deterministic random weights.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/core/cli.h"
#include "common/model/synthetic_checkpoint.h"

namespace {

using pdserve::Result;

// "5000000000", "5GB" (decimal, like transformers) or "4GiB" (binary).
Result<uint64_t> parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t multiplier = 0;
  if (unit.empty() || unit == "B")
    multiplier = 1;
  else if (unit == "KB")
    multiplier = 1'000;
  else if (unit == "MB")
    multiplier = 1'000'000;
  else if (unit == "GB")
    multiplier = 1'000'000'000;
  else if (unit == "KIB")
    multiplier = uint64_t{1} << 10;
  else if (unit == "MIB")
    multiplier = uint64_t{1} << 20;
  else if (unit == "GIB")
    multiplier = uint64_t{1} << 30;
  uint64_t value = 0;
  bool valid = digits > 0 && digits <= 18 && multiplier != 0;
  if (valid) value = std::stoull(text.substr(0, digits));
  if (!valid || value == 0 || __builtin_mul_overflow(value, multiplier, &value)) {
    return pdserve::invalid_argument("--max-shard-size: '" + text +
                                     "' is not a positive size (e.g. 5GB, 500MB, 1GiB, 1048576)");
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Writes a complete Hugging Face Qwen3 model folder (config.json, generation_config.json, "
      "tokenizer files, safetensors) with deterministic random weights: the same seed gives "
      "the same bytes on any machine and thread count."};
  pdserve::SyntheticCheckpointOptions options;
  std::string dtype_name;
  std::string max_shard_size = "5GB";
  int layers = 0;
  bool tie = false;
  bool untie = false;
  options.tokenizer_dir = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer";

  app.add_option("--config", options.config_path, "Qwen3 config.json to take the shapes from")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", options.out_dir,
                 "Output folder (created if absent; earlier weight files in it are replaced)")
      ->required();
  app.add_option("--seed", options.seed, "Random seed (unsigned 64-bit)")->required();
  app.add_option("--layers", layers, "Override num_hidden_layers")->check(CLI::PositiveNumber);
  app.add_option("--dtype", dtype_name, "Weight dtype (default: the config's torch_dtype)")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32"}));
  auto* tie_flag = app.add_flag("--tie", tie, "Tie lm_head to the embeddings (no lm_head.weight)");
  app.add_flag("--untie", untie, "Untie: write a separate lm_head.weight")->excludes(tie_flag);
  app.add_flag("--fp8", options.fp8,
               "Write an FP8 checkpoint in Qwen's -FP8 layout: the decoder layers' projections "
               "as float8_e4m3fn quantized from the weights the same seed gives without --fp8, "
               "with bfloat16 weight_scale_inv per 128x128 block (amax/448) and a "
               "quantization_config (fp8, e4m3, dynamic activations) in config.json; "
               "embeddings, norms and lm_head stay in --dtype");
  app.add_option("--max-shard-size", max_shard_size,
                 "Largest shard, in bytes or with a unit (KB/MB/GB decimal, KiB/MiB/GiB); above "
                 "it the weights are split into model-0000i-of-0000N.safetensors plus "
                 "model.safetensors.index.json")
      ->capture_default_str();
  app.add_option("--tokenizer-dir", options.tokenizer_dir,
                 "Folder with tokenizer.json and tokenizer_config.json to copy")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);
  app.add_option("--threads", options.threads,
                 "Generator threads (0: all cores; the output does not depend on it)")
      ->capture_default_str();

  if (int exit_code = pdserve::parse_cli(app, argc, argv); exit_code >= 0) return exit_code;

  Result<uint64_t> shard_bytes = parse_byte_size(max_shard_size);
  if (!shard_bytes.ok()) return pdserve::report_cli_error(shard_bytes.status());
  options.max_shard_bytes = *shard_bytes;
  if (layers > 0) options.num_layers = layers;
  if (!dtype_name.empty()) options.dtype = pdserve::parse_dtype(dtype_name).value();
  if (tie || untie) options.tie_word_embeddings = tie;

  Result<pdserve::SyntheticCheckpoint> written = pdserve::write_synthetic_checkpoint(options);
  if (!written.ok()) return pdserve::report_cli_error(written.status());
  std::printf("wrote %s: %d layers, %s%s, %s embeddings, %zu weight file(s), %.3f GB of weights\n",
              options.out_dir.string().c_str(), written->config.num_hidden_layers,
              std::string(pdserve::dtype_name(written->config.torch_dtype)).c_str(),
              options.fp8 ? " with FP8 linear weights" : "",
              written->config.tie_word_embeddings ? "tied" : "untied", written->weight_files.size(),
              static_cast<double>(written->weight_bytes) / 1e9);
  return 0;
}
