// pdserve-generate: load a Qwen3 checkpoint, run one prompt through prefill and a decode loop
// with a paged KV cache, and stream the sampled text to stdout.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/core/cli.h"
#include "common/core/dtype.h"
#include "common/sampling/sampler.h"
#include "common/sampling/stop_checker.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/model_loader.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  bool chat = false;
  std::string system;
  bool enable_thinking = false;
  int max_new_tokens = 128;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  std::string device = "cpu";
  std::string dtype;
  int threads = 0;
  int block_size = 16;
  double kv_cache_memory_gib = 4.0;
  std::string kv_cache_dtype = "auto";
  int max_prefill_tokens = 2048;
  bool show_stats = false;
  bool print_ids = false;
};

double elapsed_ms(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX) {
      return invalid_argument("--prompt-ids: '" + item + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(value));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

Result<std::vector<int32_t>> prompt_tokens(const Options& options, const Tokenizer& tokenizer,
                                           const std::filesystem::path& model_dir) {
  if (!options.prompt_ids.empty()) return parse_id_list(options.prompt_ids);
  std::string text = options.prompt;
  if (options.chat) {
    PDS_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                         ChatTemplate::from_tokenizer_config(model_dir / "tokenizer_config.json"));
    nlohmann::json messages = nlohmann::json::array();
    if (!options.system.empty())
      messages.push_back({{"role", "system"}, {"content", options.system}});
    messages.push_back({{"role", "user"}, {"content", options.prompt}});
    nlohmann::json context = {{"messages", messages},
                              {"add_generation_prompt", true},
                              {"enable_thinking", options.enable_thinking}};
    PDS_ASSIGN_OR_RETURN(text, chat_template.render(context));
  }
  return tokenizer.encode(text);
}

Result<SamplingParams> sampling_params(const Options& options,
                                       const SamplingDefaults& model_defaults) {
  SamplingParams base;
  base.max_tokens = options.max_new_tokens;
  base.repetition_penalty = options.repetition_penalty;
  base.presence_penalty = options.presence_penalty;
  base.frequency_penalty = options.frequency_penalty;
  base.seed = options.seed;
  base.ignore_eos = options.ignore_eos;
  SamplingDefaults request{options.temperature, options.top_p, options.top_k, options.min_p,
                           std::nullopt};
  return resolve_sampling_defaults(base, request, model_defaults);
}

long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

Status run(const Options& options) {
  PDS_ASSIGN_OR_RETURN(const ModelLoadOptions load_options,
                       model_load_options(options.device, options.threads, options.dtype));
  if (options.block_size <= 0 || options.block_size > 256) {
    return invalid_argument("--block-size must be in [1, 256]");
  }
  if (options.max_new_tokens < 1) return invalid_argument("--max-new-tokens must be at least 1");
  if (options.prompt.empty() == options.prompt_ids.empty()) {
    return invalid_argument("give exactly one of --prompt and --prompt-ids (a non-empty prompt)");
  }
  if (options.chat && !options.prompt_ids.empty()) return invalid_argument("--chat needs --prompt");

  const auto load_start = Clock::now();
  PDS_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(options.model, load_options));
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(loaded.model_dir));
  const double load_ms = elapsed_ms(load_start, Clock::now());
  Qwen3Model& model = *loaded.model;
  const ModelConfig& config = model.config();

  PDS_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                       prompt_tokens(options, tokenizer, loaded.model_dir));
  if (prompt.empty()) return invalid_argument("the prompt encodes to no tokens");
  for (int32_t id : prompt) {
    if (id >= config.vocab_size) {
      return invalid_argument("prompt token id " + std::to_string(id) +
                              " is outside the vocabulary of " + std::to_string(config.vocab_size));
    }
  }
  PDS_ASSIGN_OR_RETURN(SamplingParams params, sampling_params(options, loaded.sampling_defaults()));
  PDS_RETURN_IF_ERROR(params.validate(config.vocab_size));
  PDS_ASSIGN_OR_RETURN(StopChecker stop_checker,
                       StopChecker::create(params, loaded.eos_token_ids(), config.vocab_size));

  // The KV pool holds exactly this request: prompt plus every token it may generate.
  const int64_t context_len = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (static_cast<int64_t>(prompt.size()) > config.max_position_embeddings) {
    return out_of_range("the prompt has " + std::to_string(prompt.size()) +
                        " tokens, more than max_position_embeddings (" +
                        std::to_string(config.max_position_embeddings) + ")");
  }
  if (context_len > config.max_position_embeddings) {
    return out_of_range("prompt (" + std::to_string(prompt.size()) +
                        " tokens) + --max-new-tokens (" + std::to_string(options.max_new_tokens) +
                        ") exceeds max_position_embeddings (" +
                        std::to_string(config.max_position_embeddings) + ")");
  }
  PDS_ASSIGN_OR_RETURN(std::optional<DType> kv_choice,
                       parse_kv_cache_dtype(options.kv_cache_dtype));
  const DType kv_dtype = kv_choice.value_or(loaded.backend->default_kv_dtype(loaded.model->weight_dtype()));
  const int blocks_needed =
      static_cast<int>((context_len + options.block_size - 1) / options.block_size);
  const int blocks_available =
      kv_blocks_for_memory(config, static_cast<size_t>(options.kv_cache_memory_gib * (1 << 30)),
                           options.block_size, kv_dtype);
  if (blocks_needed > blocks_available) {
    return resource_exhausted("prompt + --max-new-tokens need " + std::to_string(blocks_needed) +
                              " KV blocks but --kv-cache-memory-gib " +
                              std::to_string(options.kv_cache_memory_gib) + " holds " +
                              std::to_string(blocks_available));
  }
  PDS_ASSIGN_OR_RETURN(
      KvCache cache,
      KvCache::create(*loaded.backend,
                      kv_layout_for(config, blocks_needed, options.block_size, kv_dtype)));
  ForwardLimits limits;
  limits.max_num_tokens =
      std::max(1, std::min<int>(options.max_prefill_tokens, static_cast<int>(prompt.size())));
  limits.max_num_seqs = 1;
  limits.max_model_len = static_cast<int>(context_len);
  PDS_ASSIGN_OR_RETURN(ForwardContext context,
                       ForwardContext::create(*loaded.backend, config, limits, options.block_size));
  std::vector<int32_t> block_table(static_cast<size_t>(blocks_needed));
  for (int b = 0; b < blocks_needed; ++b) block_table[static_cast<size_t>(b)] = b;

  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  Sampler sampler;
  SamplerRng rng = SamplerRng::for_request(params, std::random_device{}());
  IncrementalDetokenizer detokenizer(tokenizer);
  std::vector<int32_t> output;

  const auto start = Clock::now();
  // Prefill, in chunks of at most max_num_tokens.
  for (size_t done = 0; done < prompt.size();) {
    const size_t count = std::min(prompt.size() - done, static_cast<size_t>(limits.max_num_tokens));
    SequenceSlice slice{std::span<const int32_t>(prompt).subspan(done, count),
                        static_cast<int>(done), block_table};
    PDS_RETURN_IF_ERROR(model.forward({&slice, 1}, cache, context, logits));
    done += count;
  }
  Clock::time_point first_token_time;
  while (true) {
    PDS_ASSIGN_OR_RETURN(SampleResult sample,
                         sampler.sample(logits, params, prompt, output, rng,
                                        stop_checker.min_tokens_banned_ids(output.size())));
    output.push_back(sample.token);
    if (output.size() == 1) first_token_time = Clock::now();
    if (!options.print_ids) {
      PDS_ASSIGN_OR_RETURN(std::string piece, detokenizer.push(sample.token));
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (stop_checker.check(output) != FinishReason::kNone) break;
    SequenceSlice slice{std::span<const int32_t>(&output.back(), 1),
                        static_cast<int>(prompt.size() + output.size() - 1), block_table};
    PDS_RETURN_IF_ERROR(model.forward({&slice, 1}, cache, context, logits));
  }
  const auto end = Clock::now();
  if (options.print_ids) {
    std::printf("%s\n", nlohmann::json(output).dump().c_str());
  } else {
    std::string rest = detokenizer.flush();
    std::printf("%s\n", rest.c_str());
  }
  std::fflush(stdout);  // the answer ends before the stats line on a shared terminal

  if (options.show_stats) {
    const double ttft_ms = elapsed_ms(start, first_token_time);
    const double decode_ms = elapsed_ms(first_token_time, end);
    const double tpot_ms =
        output.size() > 1 ? decode_ms / static_cast<double>(output.size() - 1) : 0.0;
    const double tokens_per_second = tpot_ms > 0 ? 1000.0 / tpot_ms : 0.0;
    std::fprintf(stderr,
                 "prompt_tokens=%zu generated_tokens=%zu ttft_ms=%.1f tpot_ms=%.2f "
                 "tokens_per_second=%.2f device=%s dtype=%s load_ms=%.0f peak_rss_mib=%ld\n",
                 prompt.size(), output.size(), ttft_ms, tpot_ms, tokens_per_second,
                 std::string(device_kind_name(loaded.backend->kind())).c_str(),
                 std::string(dtype_name(model.weight_dtype())).c_str(), load_ms, peak_rss_mib());
  }
  return {};
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  using pdserve::Options;
  Options options;
  CLI::App app{"pdserve-generate: run one prompt through a Qwen3 model and stream the answer"};
  app.add_option("--model", options.model,
                 "Model folder, or a hub id (Qwen/Qwen3-0.6B) in the local HF cache")
      ->required();
  app.add_option("--prompt", options.prompt, "Prompt text");
  app.add_option("--prompt-ids", options.prompt_ids,
                 "Prompt as comma-separated token ids (instead of --prompt)");
  app.add_flag("--chat", options.chat,
               "Wrap the prompt in the model's chat template as a user message");
  app.add_option("--system", options.system, "System message (with --chat)");
  app.add_flag("--enable-thinking", options.enable_thinking,
               "Let the model think first (with --chat; Qwen3 enable_thinking)");
  app.add_option("--max-new-tokens", options.max_new_tokens, "Most tokens to generate")
      ->capture_default_str();
  app.add_option("--temperature", options.temperature,
                 "Sampling temperature; 0 is greedy (default: generation_config.json, else 1)");
  app.add_option("--top-p", options.top_p,
                 "Nucleus sampling mass in (0, 1] (default: generation_config.json, else 1)");
  app.add_option(
      "--top-k", options.top_k,
      "Keep the k most likely tokens; 0 or -1 disables (default: generation_config.json)");
  app.add_option("--min-p", options.min_p, "Drop tokens below min_p times the top probability");
  app.add_option("--repetition-penalty", options.repetition_penalty,
                 "Penalty > 0 on tokens already seen")
      ->capture_default_str();
  app.add_option("--presence-penalty", options.presence_penalty, "In [-2, 2], on generated tokens")
      ->capture_default_str();
  app.add_option("--frequency-penalty", options.frequency_penalty,
                 "In [-2, 2], per occurrence in generated tokens")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Sampling seed (same seed, same output)");
  app.add_flag("--ignore-eos", options.ignore_eos, "Do not stop at EOS tokens");
  app.add_option("--device", options.device, "cpu or cuda")->capture_default_str();
  app.add_option(
      "--dtype", options.dtype,
      "Weight dtype: bfloat16, float16 or float32 (default: the checkpoint's torch_dtype)");
  app.add_option("--threads", options.threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--block-size", options.block_size, "Tokens per KV-cache block")
      ->capture_default_str();
  app.add_option("--kv-cache-memory-gib", options.kv_cache_memory_gib,
                 "Most memory for the KV cache")
      ->capture_default_str();
  app.add_option(
         "--kv-cache-dtype", options.kv_cache_dtype,
         "KV cache element type: auto (the backend's default: bfloat16 on the CPU at the "
         "avx512_bf16 level and on CUDA, else float32), bfloat16 or float32")
      ->capture_default_str();
  app.add_option("--max-prefill-tokens", options.max_prefill_tokens, "Prefill chunk size in tokens")
      ->capture_default_str();
  app.add_flag("--show-stats", options.show_stats,
               "Print prompt_tokens, generated_tokens, ttft_ms, tpot_ms, tokens_per_second "
               "(decode), device, dtype, load_ms and peak_rss_mib to stderr");
  app.add_flag("--print-ids", options.print_ids,
               "Print the generated token ids as one JSON array instead of the text");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
