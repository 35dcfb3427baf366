// pdserve-bench-spec-decode: speculative decoding on one node's engine (EngineCore on the
// model runner, no HTTP), batch sizes x workloads x proposers, the modes alternated (A B A B)
// so that a noisy machine hurts them alike. Greedy, ignore_eos, every request of a batch
// submitted at once with the same prompt length and max_tokens. Workloads:
//   repeat: a random 16-token phrase repeated 4 times (64 tokens): prompt lookup finds it;
//   random: 64 random tokens: prompt lookup finds only what the output itself repeats.
// Modes: off; ngram ({"method": "ngram", k, prompt_lookup 1..3}); oracle (a test proposer that
// replays the output of the "off" run: acceptance 1.0, the upper bound of any proposer);
// wrong (random tokens: acceptance about 0, what the adaptive auto-off must make cheap);
// profile (with --profile FILE from copy_workload.py: the workloads are that file's prompt-
// copying texts in real Qwen3 tokens, and the proposer replays n-gram's acceptance on them,
// position by position: acceptance_profile.h; docs/SPECULATIVE.md "Measuring on copying text").
// Each run's engine first serves the same prompts with --warmup-tokens tokens (as a node that
// has been serving: the adaptive rule has timed verify steps and learnt the acceptance), then
// the measured batch. Prints one line per run: tokens/s (generated tokens / wall time of the
// measured batch), mean TPOT (per request, (last token - first token) / (tokens - 1)), and the
// measured batch's drafts and acceptance.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/spec_decode_engine/acceptance_profile.h"
#include "common/core/cli.h"
#include "common/engine/engine_core.h"
#include "common/engine/spec_decode/ngram_proposer.h"
#include "kernels/model/model_loader.h"
#include "kernels/model/model_runner.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::vector<int> batches = {1, 4, 16};
  std::vector<std::string> workloads = {"repeat", "random"};
  std::string profile;  // copy_workload.py's file: its workloads replace the synthetic ones
  std::vector<std::string> modes = {"off", "ngram", "oracle", "wrong"};
  int max_tokens = 32;
  int warmup_tokens = 8;
  int k = 4;
  int rounds = 2;
  int threads = 0;
};

// Replays known continuations, or proposes random tokens when it knows none.
class ReplayProposer final : public Proposer {
 public:
  explicit ReplayProposer(std::vector<std::vector<int32_t>> known) : known_(std::move(known)) {}
  std::string_view method() const override { return "replay"; }
  Status propose(std::span<const ProposalRequest> requests,
                 std::span<std::vector<int32_t>> proposals) override {
    std::uniform_int_distribution<int32_t> token(0, 150000);
    for (size_t i = 0; i < requests.size(); ++i) {
      proposals[i].clear();
      const std::vector<int32_t>* full = nullptr;
      for (const auto& candidate : known_) {
        if (candidate.size() >= requests[i].tokens.size() &&
            std::equal(requests[i].tokens.begin(), requests[i].tokens.end(), candidate.begin())) {
          full = &candidate;
        }
      }
      for (int t = 0; t < requests[i].max_proposals; ++t) {
        const size_t position = requests[i].tokens.size() + static_cast<size_t>(t);
        if (full != nullptr && position >= full->size()) break;
        proposals[i].push_back(full != nullptr ? (*full)[position] : token(random_));
      }
    }
    return Status::ok_status();
  }

 private:
  std::vector<std::vector<int32_t>> known_;
  std::mt19937 random_{7};
};

struct RunFigures {
  double tokens_per_second = 0;
  double tpot_ms = 0;
  SpecDecodeCounts counts;
  std::vector<std::vector<int32_t>> outputs;
};

// The profile's prompt once per row, each row's made distinct by a first token of its own (so
// that rows do not share prefix-cache blocks).
std::vector<std::vector<int32_t>> profile_prompts(const AcceptanceProfile& profile, int batch) {
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < batch; ++b) {
    prompts.push_back({1000 + b});
    prompts.back().insert(prompts.back().end(), profile.prompt_ids.begin(),
                          profile.prompt_ids.end());
  }
  return prompts;
}

std::vector<std::vector<int32_t>> make_prompts(const std::string& workload, int batch) {
  std::mt19937 random(static_cast<uint32_t>(batch * 131 + (workload == "repeat" ? 1 : 2)));
  std::uniform_int_distribution<int32_t> token(0, 150000);
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt;
    if (workload == "repeat") {
      std::vector<int32_t> phrase(16);
      for (int32_t& t : phrase) t = token(random);
      for (int r = 0; r < 4; ++r) prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    } else {
      for (int t = 0; t < 64; ++t) prompt.push_back(token(random));
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

Result<RunFigures> run_once(LoadedModel& model, const Options& options, int max_tokens,
                            const std::vector<std::vector<int32_t>>& prompts,
                            std::unique_ptr<Proposer> proposer) {
  const int batch = static_cast<int>(prompts.size());
  const int prompt_length = static_cast<int>(prompts.front().size());
  ModelRunnerConfig runner_config;
  runner_config.block_size = 16;
  runner_config.num_blocks = batch * ((prompt_length + max_tokens + options.k) / 16 + 2);
  runner_config.kv_dtype = model.backend->default_kv_dtype(model.model->weight_dtype());
  runner_config.limits.max_num_tokens = std::max(prompt_length * batch, 256);
  runner_config.limits.max_num_seqs = std::max(batch, options.k + 1);
  runner_config.limits.max_model_len = prompt_length + max_tokens + options.k + 1;
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3ModelRunner> runner,
                       Qwen3ModelRunner::create(*model.backend, *model.model, runner_config));
  SchedulerConfig config;
  config.num_blocks = runner->schedulable_blocks();
  config.block_size = 16;
  config.max_num_batched_tokens = runner_config.limits.max_num_tokens;
  config.max_num_seqs = runner_config.limits.max_num_seqs;
  config.max_model_len = runner_config.limits.max_model_len;
  config.vocab_size = runner->vocab_size();
  config.eos_token_ids = model.eos_token_ids();
  std::unique_ptr<SpecDecoder> spec;
  if (proposer) {
    SpeculativeConfig spec_config;
    spec_config.num_speculative_tokens = options.k;
    PDS_ASSIGN_OR_RETURN(spec, SpecDecoder::create(spec_config, std::move(proposer), *runner));
  }
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(model.model_dir));
  EngineCoreParts parts;
  parts.spec_decoder = std::move(spec);
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core,
                       EngineCore::create(config, *runner, std::move(tokenizer), std::move(parts)));
  // Warm-up, as on a node that has been serving: the same prompts, fewer tokens, so that the
  // adaptive rule has measured the verify cost and the engine's acceptance.
  for (size_t i = 0; i < prompts.size() && options.warmup_tokens > 0; ++i) {
    InferenceRequest request;
    request.id = "warm-up " + std::to_string(i);
    request.prompt_tokens = prompts[i];
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = options.warmup_tokens;
    request.sampling.ignore_eos = true;
    PDS_RETURN_IF_ERROR(core->add(std::move(request), [](SequenceDelta) {}));
  }
  while (core->step()) {
  }
  const SpecDecodeCounts warm = core->stats().spec_decode;
  std::vector<std::vector<Clock::time_point>> times(prompts.size());
  RunFigures figures;
  figures.outputs.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    InferenceRequest request;
    request.id = std::to_string(i);
    request.prompt_tokens = prompts[i];
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = max_tokens;
    request.sampling.ignore_eos = true;
    PDS_RETURN_IF_ERROR(core->add(std::move(request), [&, i](SequenceDelta delta) {
      for (int32_t token : delta.token_ids) {
        figures.outputs[i].push_back(token);
        times[i].push_back(Clock::now());
      }
    }));
  }
  const Clock::time_point start = Clock::now();
  while (core->step()) {
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t tokens = 0;
  double tpot_sum = 0;
  for (const auto& request_times : times) {
    tokens += static_cast<int64_t>(request_times.size());
    if (request_times.size() > 1) {
      tpot_sum +=
          std::chrono::duration<double, std::milli>(request_times.back() - request_times.front())
              .count() /
          static_cast<double>(request_times.size() - 1);
    }
  }
  figures.tokens_per_second = static_cast<double>(tokens) / wall;
  figures.tpot_ms = tpot_sum / static_cast<double>(times.size());
  figures.counts = core->stats().spec_decode;
  figures.counts.num_drafts -= warm.num_drafts;
  figures.counts.num_draft_tokens -= warm.num_draft_tokens;
  figures.counts.num_accepted_tokens -= warm.num_accepted_tokens;
  return figures;
}

Status run(const Options& options) {
  PDS_ASSIGN_OR_RETURN(const ModelLoadOptions load, model_load_options("cpu", options.threads, ""));
  PDS_ASSIGN_OR_RETURN(LoadedModel model, load_model(options.model, load));
  std::vector<AcceptanceProfile> profiles;
  if (!options.profile.empty()) {
    PDS_ASSIGN_OR_RETURN(profiles, read_acceptance_profiles(options.profile));
  }
  std::vector<std::string> workloads = options.workloads;
  if (!profiles.empty()) {
    workloads.clear();
    for (const AcceptanceProfile& profile : profiles) workloads.push_back(profile.name);
  }
  for (size_t w = 0; w < workloads.size(); ++w) {
    const std::string& workload = workloads[w];
    const AcceptanceProfile* profile = profiles.empty() ? nullptr : &profiles[w];
    // A copying workload replays at most its reference's length.
    const int max_tokens = profile != nullptr ? std::min(options.max_tokens,
                                                         static_cast<int>(profile->proposed.size()))
                                              : options.max_tokens;
    if (profile != nullptr) {
      std::printf(
          "workload=%s prompt_tokens=%zu reference_tokens=%zu offline_ngram_acceptance=%.3f\n",
          workload.c_str(), profile->prompt_ids.size(), profile->proposed.size(),
          profile->offline_acceptance);
    }
    for (const int batch : options.batches) {
      const auto prompts =
          profile != nullptr ? profile_prompts(*profile, batch) : make_prompts(workload, batch);
      std::vector<std::vector<int32_t>> known;
      for (int round = 0; round < options.rounds; ++round) {
        for (const std::string& mode : options.modes) {
          std::unique_ptr<Proposer> proposer;
          if (mode == "ngram") {
            SpeculativeConfig config;
            config.prompt_lookup_min = 1;
            config.prompt_lookup_max = 3;
            proposer = std::make_unique<NgramProposer>(config);
          } else if (mode == "oracle") {
            if (known.empty()) return invalid_argument("--modes must list off before oracle");
            proposer = std::make_unique<ReplayProposer>(known);
          } else if (mode == "profile") {
            if (profile == nullptr) return invalid_argument("mode profile needs --profile");
            if (known.empty()) return invalid_argument("--modes must list off before profile");
            proposer = std::make_unique<ProfileReplayProposer>(
                known, prompts.front().size(), *profile, model.model->config().vocab_size);
          } else if (mode == "wrong") {
            proposer = std::make_unique<ReplayProposer>(std::vector<std::vector<int32_t>>{});
          } else if (mode != "off") {
            return invalid_argument("unknown mode '" + mode + "'");
          }
          PDS_ASSIGN_OR_RETURN(RunFigures figures,
                               run_once(model, options, max_tokens, prompts, std::move(proposer)));
          if (mode == "off" && known.empty()) {
            for (size_t i = 0; i < prompts.size(); ++i) {
              known.push_back(prompts[i]);
              known.back().insert(known.back().end(), figures.outputs[i].begin(),
                                  figures.outputs[i].end());
            }
          }
          // Greedy speculation must give the output of the run without it, token for token.
          bool same_as_off = true;
          for (size_t i = 0; i < prompts.size(); ++i) {
            same_as_off =
                same_as_off && known[i].size() == prompts[i].size() + figures.outputs[i].size() &&
                std::equal(figures.outputs[i].begin(), figures.outputs[i].end(),
                           known[i].begin() + static_cast<std::ptrdiff_t>(prompts[i].size()));
          }
          const SpecDecodeCounts& c = figures.counts;
          std::printf(
              "workload=%s batch=%d mode=%s round=%d tokens_per_s=%.2f tpot_ms=%.1f "
              "drafts=%lld draft_tokens=%lld accepted=%lld acceptance=%s same_as_off=%d\n",
              workload.c_str(), batch, mode.c_str(), round, figures.tokens_per_second,
              figures.tpot_ms, static_cast<long long>(c.num_drafts),
              static_cast<long long>(c.num_draft_tokens),
              static_cast<long long>(c.num_accepted_tokens),
              c.num_draft_tokens > 0 ? std::to_string(static_cast<double>(c.num_accepted_tokens) /
                                                      static_cast<double>(c.num_draft_tokens))
                                           .c_str()
                                     : "-",
              same_as_off ? 1 : 0);
          std::fflush(stdout);
        }
      }
    }
  }
  return Status::ok_status();
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-bench-spec-decode: speculative decoding's speed on one engine"};
  app.add_option("--model", options.model, "Model folder")->required();
  app.add_option("--batch", options.batches, "Batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--workloads", options.workloads, "repeat, random")->delimiter(',');
  app.add_option("--modes", options.modes, "off, ngram, oracle, wrong, profile (off first)")
      ->delimiter(',');
  app.add_option("--profile", options.profile,
                 "Acceptance profiles from copy_workload.py: its workloads replace --workloads");
  app.add_option("--max-tokens", options.max_tokens, "Tokens per request")->capture_default_str();
  app.add_option("--warmup-tokens", options.warmup_tokens,
                 "Tokens per request of the warm-up batch each engine serves first (0: none)")
      ->capture_default_str();
  app.add_option("--k", options.k, "num_speculative_tokens")->capture_default_str();
  app.add_option("--rounds", options.rounds, "Rounds of the alternated modes")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "CPU threads (0: all)")->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
