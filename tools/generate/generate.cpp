// pdserve-generate: load a Qwen3 checkpoint, run one prompt through prefill and a decode loop
// with a paged KV cache, and stream the sampled text to stdout.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/core/cli.h"
#include "common/core/dtype.h"
#include "common/core/log.h"
#include "common/engine/scheduler.h"
#include "common/engine/sequence.h"
#include "common/engine/spec_decode/adaptive_speculation.h"
#include "common/engine/spec_decode/rejection_sampler.h"
#include "common/engine/spec_decode/speculative_config.h"
#include "common/sampling/sampler.h"
#include "common/sampling/stop_checker.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/model_loader.h"
#include "kernels/model/model_runner.h"
#include "kernels/model/proposer_factory.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultKvCacheMemoryGib = 4.0;

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
  std::optional<double> kv_cache_memory_gib;  // unset: 4 on the CPU; on CUDA, utilization decides
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  std::string kv_cache_dtype = "auto";
  int max_prefill_tokens = 2048;
  bool show_stats = false;
  bool print_ids = false;
  std::string logits_out;
  std::string speculative_config;  // vLLM's JSON; empty: no speculation
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

// Writes rows x cols float32 values as a NumPy .npy file (format 1.0, little-endian, C order),
// for comparing runs across devices and against other engines (scripts/gpu/).
Status write_npy(const std::string& path, const std::vector<float>& values, size_t rows,
                 size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes, then '\n'.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return invalid_argument("--logits-out: cannot write " + path);
  std::string preamble("\x93NUMPY\x01\x00", 8);
  preamble += static_cast<char>(header.size() & 0xff);
  preamble += static_cast<char>(header.size() >> 8);
  bool written = std::fwrite(preamble.data(), 1, preamble.size(), file) == preamble.size() &&
                 std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
                 std::fwrite(values.data(), sizeof(float), values.size(), file) == values.size();
  written = std::fclose(file) == 0 && written;
  if (!written) return data_loss("--logits-out: writing " + path + " failed");
  return {};
}

long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

// One step through the runner, as the engine runs it; the sampled token when the step samples.
Result<std::optional<int32_t>> run_step(Qwen3ModelRunner& runner, const ScheduledBatch& batch,
                                        Sampler& sampler, SamplerRng& rng,
                                        std::span<float> logits) {
  const ScheduledSequence& entry = batch.entries.front();
  const Sequence& seq = *entry.sequence;
  const SamplingParams& params = seq.sampling_params();
  const std::span<const int32_t> banned =
      seq.stop_checker().min_tokens_banned_ids(static_cast<size_t>(seq.num_output_tokens()));
  const auto host_sample = [&]() -> Result<std::optional<int32_t>> {
    PDS_ASSIGN_OR_RETURN(SampleResult sampled, sampler.sample(logits, params, seq.prompt_tokens(),
                                                              seq.output_tokens(), rng, banned));
    return std::optional<int32_t>(sampled.token);
  };
  if (!runner.samples_on_device()) {
    PDS_RETURN_IF_ERROR(runner.execute(batch, logits, {}));
    if (!entry.samples) return std::optional<int32_t>();
    return host_sample();
  }
  const SamplingRow row{&params, seq.prompt_tokens(), seq.output_tokens(), banned, &rng};
  const size_t rows = entry.samples ? 1 : 0;
  PDS_RETURN_IF_ERROR(runner.launch_step(batch, std::span<const SamplingRow>(&row, rows), {}));
  const std::span<const int32_t> no_mask;
  SampledRow result;
  PDS_RETURN_IF_ERROR(runner.sample_step(std::span<const std::span<const int32_t>>(&no_mask, rows),
                                         std::span<SampledRow>(&result, rows), logits));
  if (!entry.samples) return std::optional<int32_t>();
  switch (result.outcome) {
    case SampleOutcome::kSampled:
      return std::optional<int32_t>(result.token);
    case SampleOutcome::kLeftToHost:
      return host_sample();
    case SampleOutcome::kInvalidLogits:
      return internal_error("the model's logits hold a NaN or +inf");
    case SampleOutcome::kAllMasked:
      return internal_error("every token is masked: all logits are -inf");
    case SampleOutcome::kPenaltyOverflow:
      return invalid_argument("a penalty overflowed a logit to +inf");
  }
  return internal_error("unknown sampling outcome");
}

// Speculative decoding's figures for the stats line.
struct SpecDecodeTotals {
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  void add(int num_drafts, int num_accepted) {
    ++drafts;
    draft_tokens += num_drafts;
    accepted_tokens += num_accepted;
  }
  double acceptance() const {
    return draft_tokens == 0
               ? 0.0
               : static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens);
  }
};

// The drafts of the next step, as the engine's SpecDecoder asks for them: only in the decode
// phase, when the policy lets the sequence speculate, at most k and leaving room for the
// bonus token within max_tokens. A proposer error means no drafts this step.
std::vector<int32_t> propose_drafts(Proposer& proposer, AdaptiveSpeculation& policy,
                                    const Sequence& seq, int k) {
  if (seq.is_prefilling() || seq.num_output_tokens() == 0) return {};
  const int room = seq.sampling_params().max_tokens - seq.num_output_tokens() - 1;
  const int max_proposals = std::min(k, room);
  const SamplingParams& params = seq.sampling_params();
  const bool reproducible = params.seed.has_value() && params.temperature >= kGreedyTemperature;
  if (max_proposals < 1 || !policy.should_propose(seq.id(), reproducible)) return {};
  const ProposalRequest request{seq.id(), seq.tokens(), max_proposals};
  std::vector<int32_t> drafts;
  const Status proposed =
      proposer.propose(std::span<const ProposalRequest>(&request, 1), std::span(&drafts, 1));
  if (!proposed.ok()) {
    PDS_LOG_WARN("speculative decoding: no drafts this step: " + proposed.to_string());
    return {};
  }
  if (drafts.size() > static_cast<size_t>(max_proposals)) {
    drafts.resize(static_cast<size_t>(max_proposals));
  }
  return drafts;
}

// One verify step (the sequence's last token and its drafts through the model), then the
// rejection sampler over the 1 + k logits rows it leaves in `logits`.
Result<VerifiedRun> verify_step(Qwen3ModelRunner& runner, ScheduledSequence entry,
                                const std::vector<int32_t>& drafts, uint64_t step,
                                RejectionSampler& verifier, SamplerRng& rng,
                                std::vector<float>& logits) {
  const Sequence& seq = *entry.sequence;
  entry.verify_tokens.push_back(seq.tokens().back());
  entry.verify_tokens.insert(entry.verify_tokens.end(), drafts.begin(), drafts.end());
  entry.num_new_tokens = static_cast<int>(entry.verify_tokens.size());
  entry.samples = true;
  ScheduledBatch batch;
  batch.step = step;
  batch.entries = {entry};
  batch.num_verify_rows = 1;
  batch.num_batched_tokens = entry.num_new_tokens;
  batch.num_samples = 1;
  const size_t vocab = static_cast<size_t>(runner.vocab_size());
  logits.resize(static_cast<size_t>(entry.num_new_tokens) * vocab);
  if (runner.samples_on_device()) {
    // Nothing is drawn on the device for a verify row (params null): it is verified here.
    const SamplingRow row{};
    PDS_RETURN_IF_ERROR(runner.launch_step(batch, std::span<const SamplingRow>(&row, 1), {}));
    const std::span<const int32_t> no_mask;
    SampledRow ignored;
    PDS_RETURN_IF_ERROR(runner.sample_step(std::span<const std::span<const int32_t>>(&no_mask, 1),
                                           std::span<SampledRow>(&ignored, 1), logits));
  } else {
    PDS_RETURN_IF_ERROR(runner.execute(batch, logits, {}));
  }
  PDS_RETURN_IF_ERROR(runner.token_logits(0, 0, entry.num_new_tokens, logits));
  return verifier.verify(seq, drafts, logits, runner.vocab_size(), rng);
}

Status run(const Options& options) {
  PDS_ASSIGN_OR_RETURN(const ModelLoadOptions load_options,
                       model_load_options(options.device, options.threads, options.dtype));
  PDS_RETURN_IF_ERROR(check_gpu_memory_utilization(options.gpu_memory_utilization));
  if (options.kv_cache_memory_gib &&
      !(*options.kv_cache_memory_gib > 0 && std::isfinite(*options.kv_cache_memory_gib))) {
    return invalid_argument("--kv-cache-memory-gib must be a positive number");
  }
  if (options.block_size <= 0 || options.block_size > 256) {
    return invalid_argument("--block-size must be in [1, 256]");
  }
  if (options.max_new_tokens < 1) return invalid_argument("--max-new-tokens must be at least 1");
  if (options.prompt.empty() == options.prompt_ids.empty()) {
    return invalid_argument("give exactly one of --prompt and --prompt-ids (a non-empty prompt)");
  }
  if (options.chat && !options.prompt_ids.empty()) return invalid_argument("--chat needs --prompt");
  std::optional<SpeculativeConfig> speculative;
  if (!options.speculative_config.empty()) {
    PDS_ASSIGN_OR_RETURN(speculative, parse_speculative_config(options.speculative_config));
  }

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
  // A device-sampling runner copies a step's raw logits row back only for logprobs (or a row
  // left to the host); --logits-out needs every sampled row, so it asks for logprobs. The
  // tokens do not change: logprobs are computed beside the choice, from the raw row.
  params.want_logprobs = !options.logits_out.empty();
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
  const DType kv_dtype =
      kv_choice.value_or(loaded.backend->default_kv_dtype(loaded.model->weight_dtype()));
  const int blocks_needed =
      static_cast<int>((context_len + options.block_size - 1) / options.block_size);

  // The model runner the engine uses: on CUDA, decode steps through CUDA graphs (one block
  // of the pool is their scratch block) and sampling on the device.
  const bool on_device = !loaded.backend->shares_host_memory();
  ModelRunnerConfig runner_config;
  runner_config.block_size = options.block_size;
  runner_config.kv_dtype = kv_dtype;
  PDS_ASSIGN_OR_RETURN(runner_config.kv_scales,
                       kv_scales_for_model(loaded.model_dir, kv_dtype, config.num_hidden_layers));
  // A verify step computes 1 + k tokens and reads their k + 1 logits rows.
  const int verify_tokens = speculative ? speculative->num_speculative_tokens + 1 : 1;
  runner_config.limits.max_num_tokens = std::max(
      verify_tokens, std::min<int>(options.max_prefill_tokens, static_cast<int>(prompt.size())));
  runner_config.limits.max_num_seqs = verify_tokens;
  runner_config.limits.max_model_len = static_cast<int>(context_len);
  if (on_device && !options.kv_cache_memory_gib) {
    runner_config.gpu_memory_utilization = options.gpu_memory_utilization;
  } else {
    // The pool holds exactly this request: prompt plus every token it may generate.
    const double gib = options.kv_cache_memory_gib.value_or(kDefaultKvCacheMemoryGib);
    const int blocks_available = kv_blocks_for_memory(config, static_cast<size_t>(gib * (1 << 30)),
                                                      options.block_size, kv_dtype);
    const int blocks_wanted = blocks_needed + (on_device ? 1 : 0);
    if (blocks_wanted > blocks_available) {
      return resource_exhausted("prompt + --max-new-tokens need " + std::to_string(blocks_wanted) +
                                " KV blocks but " + "--kv-cache-memory-gib " + std::to_string(gib) +
                                " holds " + std::to_string(blocks_available));
    }
    runner_config.num_blocks = blocks_wanted;
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3ModelRunner> runner,
                       Qwen3ModelRunner::create(*loaded.backend, model, runner_config));
  if (runner->memory_report()) PDS_LOG_INFO(describe_gpu_memory(*runner->memory_report()));
  if (runner->schedulable_blocks() < blocks_needed) {
    return resource_exhausted("prompt + --max-new-tokens need " + std::to_string(blocks_needed) +
                              " KV blocks but --gpu-memory-utilization " +
                              std::to_string(options.gpu_memory_utilization) + " leaves " +
                              std::to_string(runner->schedulable_blocks()));
  }
  std::vector<int32_t> block_table(static_cast<size_t>(blocks_needed));
  for (int b = 0; b < blocks_needed; ++b) block_table[static_cast<size_t>(b)] = b;

  Sequence seq(0, prompt, params, stop_checker, 0, Clock::now());
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  Sampler sampler;
  SamplerRng rng = SamplerRng::for_request(params, std::random_device{}());
  IncrementalDetokenizer detokenizer(tokenizer);
  std::vector<float> sampled_logits;  // --logits-out: the row each output token came from
  std::unique_ptr<Proposer> proposer;
  if (speculative) {
    // A draft model gets a pool for this one request, with the target's steps and dtypes.
    DraftModelProposerConfig draft;
    draft.num_blocks = blocks_needed;
    draft.block_size = options.block_size;
    draft.dtype = loaded.model->weight_dtype();
    draft.kv_cache_dtype = kv_dtype;
    draft.limits = runner_config.limits;
    draft.target_vocab_size = config.vocab_size;
    draft.target_model_dir = loaded.model_dir;
    PDS_ASSIGN_OR_RETURN(proposer, make_proposer(*speculative, loaded, draft));
  }
  std::optional<AdaptiveSpeculation> policy;
  if (speculative) policy.emplace(speculative->num_speculative_tokens);
  RejectionSampler verifier;
  std::vector<float> verify_logits;
  SpecDecodeTotals spec_totals;

  const auto start = Clock::now();
  Clock::time_point first_token_time;
  // Appends a token and streams its text; true when it ends the sequence.
  const auto append = [&](int32_t token, std::span<const float> row) -> Result<bool> {
    if (!options.logits_out.empty())
      sampled_logits.insert(sampled_logits.end(), row.begin(), row.end());
    const FinishReason finish = seq.append_output_token(token);
    if (seq.num_output_tokens() == 1) first_token_time = Clock::now();
    if (!options.print_ids) {
      PDS_ASSIGN_OR_RETURN(std::string piece, detokenizer.push(token));
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return finish != FinishReason::kNone;
  };
  for (uint64_t step = 1;; ++step) {
    // One entry: the next prompt chunk (at most max_num_tokens), or the last sampled token.
    ScheduledSequence entry;
    entry.sequence = &seq;
    entry.num_cached_before = seq.num_computed_tokens();
    entry.num_new_tokens =
        std::min(seq.num_uncomputed_tokens(), runner_config.limits.max_num_tokens);
    entry.samples = entry.num_cached_before + entry.num_new_tokens == seq.num_tokens();
    entry.block_table = block_table;
    const std::vector<int32_t> drafts =
        proposer ? propose_drafts(*proposer, *policy, seq, speculative->num_speculative_tokens)
                 : std::vector<int32_t>();
    if (!drafts.empty()) {
      const auto verify_start = Clock::now();
      PDS_ASSIGN_OR_RETURN(const VerifiedRun run,
                           verify_step(*runner, entry, drafts, step, verifier, rng, verify_logits));
      policy->record_verify(seq.id(), run.num_accepted);
      spec_totals.add(static_cast<int>(drafts.size()), run.num_accepted);
      bool finished = false;
      int appended = 0;
      const size_t vocab = static_cast<size_t>(config.vocab_size);
      for (const SampleResult& token : run.tokens) {
        const std::span<const float> row(
            verify_logits.data() + static_cast<size_t>(appended) * vocab, vocab);
        ++appended;
        PDS_ASSIGN_OR_RETURN(finished, append(token.token, row));
        if (finished) break;
      }
      seq.set_num_computed_tokens(entry.num_cached_before + appended);
      policy->record_step(1, 1, Clock::now() - verify_start);
      if (finished) break;
      continue;
    }
    ScheduledBatch batch;
    batch.step = step;
    batch.entries = {entry};
    batch.num_decodes = seq.is_prefilling() ? 0 : 1;
    batch.num_batched_tokens = entry.num_new_tokens;
    batch.num_samples = entry.samples ? 1 : 0;
    const auto step_start = Clock::now();
    PDS_ASSIGN_OR_RETURN(const std::optional<int32_t> token,
                         run_step(*runner, batch, sampler, rng, logits));
    seq.set_num_computed_tokens(entry.num_cached_before + entry.num_new_tokens);
    if (!token) continue;
    if (policy && batch.num_decodes == 1) policy->record_step(1, 0, Clock::now() - step_start);
    PDS_ASSIGN_OR_RETURN(const bool finished, append(*token, logits));
    if (finished) break;
  }
  const std::vector<int32_t> output(seq.output_tokens().begin(), seq.output_tokens().end());
  const auto end = Clock::now();
  if (options.print_ids) {
    std::printf("%s\n", nlohmann::json(output).dump().c_str());
  } else {
    std::string rest = detokenizer.flush();
    std::printf("%s\n", rest.c_str());
  }
  std::fflush(stdout);  // the answer ends before the stats line on a shared terminal
  if (!options.logits_out.empty()) {
    PDS_RETURN_IF_ERROR(
        write_npy(options.logits_out, sampled_logits, output.size(), logits.size()));
  }

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
    if (speculative) {
      std::fprintf(stderr,
                   "spec_decode_method=%s num_drafts=%lld num_draft_tokens=%lld "
                   "num_accepted_tokens=%lld acceptance_rate=%.3f\n",
                   std::string(speculative_method_name(speculative->method)).c_str(),
                   static_cast<long long>(spec_totals.drafts),
                   static_cast<long long>(spec_totals.draft_tokens),
                   static_cast<long long>(spec_totals.accepted_tokens), spec_totals.acceptance());
    }
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
  app.add_option("--dtype", options.dtype,
                 "cpu: the weights' dtype, bfloat16, float16 or float32 (default: the "
                 "checkpoint's torch_dtype; it computes in float32). cuda: what it computes in, "
                 "bfloat16 (default) or float32 (strict: float32 weights, activations and KV, "
                 "no TF32)");
  app.add_option("--threads", options.threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--block-size", options.block_size, "Tokens per KV-cache block")
      ->capture_default_str();
  app.add_option("--kv-cache-memory-gib", options.kv_cache_memory_gib,
                 "Most memory for the KV cache (default: 4 on cpu; on cuda the cache is sized "
                 "by --gpu-memory-utilization unless this is given)");
  app.add_option("--gpu-memory-utilization", options.gpu_memory_utilization,
                 "cuda: fraction of the device's total memory to use (weights, activations, "
                 "CUDA graphs and the KV cache), in (0, 1]")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", options.kv_cache_dtype,
                 "KV cache element type: auto (the backend's default: bfloat16 on the CPU at the "
                 "avx512_bf16 level and on CUDA, else float32), bfloat16, float32, or fp8 / "
                 "fp8_e4m3 (FP8 E4M3 with per-layer scales: half the bytes of bfloat16)")
      ->capture_default_str();
  app.add_option("--max-prefill-tokens", options.max_prefill_tokens, "Prefill chunk size in tokens")
      ->capture_default_str();
  app.add_flag("--show-stats", options.show_stats,
               "Print prompt_tokens, generated_tokens, ttft_ms, tpot_ms, tokens_per_second "
               "(decode), device, dtype, load_ms and peak_rss_mib to stderr");
  app.add_flag("--print-ids", options.print_ids,
               "Print the generated token ids as one JSON array instead of the text");
  app.add_option("--speculative-config", options.speculative_config,
                 "Speculative decoding, as vLLM's JSON, e.g. {\"method\": \"ngram\", "
                 "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3} "
                 "(docs/SPECULATIVE.md); greedy output is unchanged");
  app.add_option("--logits-out", options.logits_out,
                 "Write the float32 logits each generated token was sampled from to this "
                 ".npy file (one row per token)");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
