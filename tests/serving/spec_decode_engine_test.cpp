// Speculative decoding through the engine on the REAL model (the tiny synthetic Qwen3 on the
// CPU backend, which is bitwise batch-invariant): with any proposer, greedy output must be
// token-identical to the same requests without speculation (the oracle: the engine without a
// SpecDecoder, itself checked against pdserve-generate's loop by serving_engine_test), over
// many prompts, staggered arrivals that mix verify rows with decodes and prefill chunks, a
// KV pool small enough to preempt, stops in the middle of a run, logprobs and penalties.
// The proposers: prompt lookup (n-gram) on prompts that repeat text, a test proposer that
// replays the known output with some tokens corrupted (long accepted runs and rejections at
// chosen places), and one that proposes random tokens (rejected). After every step the block
// manager's invariants must hold.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/spec_decode/ngram_proposer.h"
#include "kernels/model/model_runner.h"
#include "tests/serving/tiny_model.h"

namespace pdserve {
namespace {

using serving_test::TinyModel;

TinyModel& tiny_model() {
  static const std::unique_ptr<TinyModel> model = [] {
    return serving_test::make_tiny_model("spec-decode-tiny");
  }();
  return *model;
}

// Replays known outputs (prompt + output per request), corrupting each proposed token with
// probability `corruption`; or, with no known outputs, proposes random tokens.
class TestProposer final : public Proposer {
 public:
  TestProposer(std::vector<std::vector<int32_t>> known, double corruption, uint64_t seed)
      : known_(std::move(known)), corruption_(corruption), random_(seed) {}

  std::string_view method() const override { return "test"; }
  Status propose(std::span<const ProposalRequest> requests,
                 std::span<std::vector<int32_t>> proposals) override {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::uniform_int_distribution<int32_t> token(0, 151000);
    for (size_t i = 0; i < requests.size(); ++i) {
      proposals[i].clear();
      const std::vector<int32_t>* full = find(requests[i].tokens);
      for (int t = 0; t < requests[i].max_proposals; ++t) {
        const size_t position = requests[i].tokens.size() + static_cast<size_t>(t);
        if (full != nullptr && position >= full->size()) break;
        const bool corrupt = full == nullptr || unit(random_) < corruption_;
        proposals[i].push_back(corrupt ? token(random_) : (*full)[position]);
      }
    }
    return Status::ok_status();
  }

 private:
  const std::vector<int32_t>* find(std::span<const int32_t> tokens) const {
    for (const std::vector<int32_t>& full : known_) {
      if (full.size() >= tokens.size() && std::equal(tokens.begin(), tokens.end(), full.begin()))
        return &full;
    }
    return nullptr;
  }

  std::vector<std::vector<int32_t>> known_;
  double corruption_;
  std::mt19937_64 random_;
};

struct Output {
  std::vector<int32_t> tokens;
  std::vector<SampledTokenLogprobs> logprobs;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;
  SpecDecodeCounts spec;
  int finals = 0;
};

struct RunOptions {
  int num_blocks = 512;
  int block_size = 16;
  int max_num_batched_tokens = 64;
  int max_num_seqs = 8;
  int stagger = 2;  // request i is added after i / 2 * stagger steps
  int num_speculative_tokens = 3;
  // Aborted after this many steps (0: never).
  std::map<size_t, int> abort_after;
};

struct RunResult {
  std::vector<Output> outputs;
  ServiceStats stats;
};

RunResult run(const std::vector<InferenceRequest>& requests, std::unique_ptr<Proposer> proposer,
              const RunOptions& options) {
  TinyModel& model = tiny_model();
  ModelRunnerConfig runner_config;
  runner_config.num_blocks = options.num_blocks;
  runner_config.block_size = options.block_size;
  runner_config.kv_dtype =
      model.loaded.backend->default_kv_dtype(model.loaded.model->weight_dtype());
  runner_config.limits.max_num_tokens = options.max_num_batched_tokens;
  runner_config.limits.max_num_seqs = options.max_num_seqs;
  runner_config.limits.max_model_len = 1024;
  std::unique_ptr<Qwen3ModelRunner> runner =
      Qwen3ModelRunner::create(*model.loaded.backend, *model.loaded.model, runner_config).value();
  SchedulerConfig config;
  config.num_blocks = options.num_blocks;
  config.block_size = options.block_size;
  config.max_num_batched_tokens = options.max_num_batched_tokens;
  config.max_num_seqs = options.max_num_seqs;
  config.max_model_len = 1024;
  config.vocab_size = runner->vocab_size();
  config.eos_token_ids = model.loaded.eos_token_ids();
  std::unique_ptr<SpecDecoder> spec;
  if (proposer) {
    SpeculativeConfig spec_config;
    spec_config.num_speculative_tokens = options.num_speculative_tokens;
    spec = SpecDecoder::create(spec_config, std::move(proposer), *runner).value();
  }
  EngineCoreParts parts;
  parts.spec_decoder = std::move(spec);
  std::unique_ptr<EngineCore> core =
      EngineCore::create(config, *runner, *model.tokenizer, std::move(parts)).value();

  RunResult result;
  result.outputs.resize(requests.size());
  size_t added = 0;
  for (int step = 0; step < 5000; ++step) {
    while (added < requests.size() && static_cast<int>(added / 2) * options.stagger <= step) {
      Output& output = result.outputs[added];
      EXPECT_TRUE(core->add(requests[added],
                            [&output](SequenceDelta delta) {
                              output.tokens.insert(output.tokens.end(), delta.token_ids.begin(),
                                                   delta.token_ids.end());
                              output.logprobs.insert(output.logprobs.end(), delta.logprobs.begin(),
                                                     delta.logprobs.end());
                              output.text += delta.text;
                              output.spec = delta.spec_decode;
                              if (delta.finished) {
                                ++output.finals;
                                output.finish_reason = delta.finish_reason;
                                output.error = delta.error;
                              }
                            })
                      .ok());
      ++added;
    }
    for (const auto& [index, after] : options.abort_after) {
      if (after == step) core->abort(requests[index].id, cancelled("test abort"));
    }
    const bool ran = core->step();
    const Status invariants = core->scheduler().block_manager().check_invariants();
    EXPECT_TRUE(invariants.ok()) << "step " << step << ": " << invariants.to_string();
    if (!invariants.ok()) break;
    if (!ran && added == requests.size() && !core->has_unfinished()) break;
  }
  for (const Output& output : result.outputs) EXPECT_EQ(output.finals, 1);
  EXPECT_EQ(core->scheduler().block_manager().num_used_blocks(), 0);
  result.stats = core->stats();
  return result;
}

InferenceRequest request(size_t index, std::vector<int32_t> prompt, SamplingParams params) {
  InferenceRequest req;
  req.id = "r" + std::to_string(index);
  req.prompt_tokens = std::move(prompt);
  req.sampling = std::move(params);
  return req;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// Prompts that repeat a phrase (so prompt lookup finds matches) and plain random ones.
std::vector<InferenceRequest> mixed_requests(size_t count, uint64_t seed,
                                             const SamplingParams& base) {
  std::mt19937 random(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<InferenceRequest> requests;
  for (size_t i = 0; i < count; ++i) {
    std::vector<int32_t> prompt;
    if (i % 2 == 0) {
      std::vector<int32_t> phrase(4 + i % 5);
      for (int32_t& t : phrase) t = token(random);
      for (size_t r = 0; r < 3 + i % 4; ++r)
        prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    } else {
      for (size_t t = 0; t < 5 + (i * 13) % 70; ++t) prompt.push_back(token(random));
    }
    SamplingParams params = base;
    params.max_tokens = 12 + static_cast<int>((i * 7) % 21);
    requests.push_back(request(i, std::move(prompt), params));
  }
  return requests;
}

std::vector<std::vector<int32_t>> known_outputs(const std::vector<InferenceRequest>& requests,
                                                const std::vector<Output>& outputs) {
  std::vector<std::vector<int32_t>> known;
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t> full = requests[i].prompt_tokens;
    full.insert(full.end(), outputs[i].tokens.begin(), outputs[i].tokens.end());
    known.push_back(std::move(full));
  }
  return known;
}

void expect_same_outputs(const std::vector<Output>& expected, const std::vector<Output>& actual,
                         const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].tokens, expected[i].tokens) << what << ", request " << i;
    EXPECT_EQ(actual[i].text, expected[i].text) << what << ", request " << i;
    EXPECT_EQ(actual[i].finish_reason, expected[i].finish_reason) << what << ", request " << i;
    EXPECT_EQ(actual[i].error.ok(), expected[i].error.ok()) << what << ", request " << i;
  }
}

std::unique_ptr<Proposer> ngram(int min_n, int max_n) {
  SpeculativeConfig config;
  config.prompt_lookup_min = min_n;
  config.prompt_lookup_max = max_n;
  return std::make_unique<NgramProposer>(config);
}

TEST(SpecDecodeEngineTest, GreedyNgramIsTokenIdenticalOverManyPromptsAndBatchMixes) {
  const std::vector<InferenceRequest> requests = mixed_requests(16, 11, greedy(16));
  RunOptions options;
  const RunResult plain = run(requests, nullptr, options);
  for (const auto& [batched, stagger] :
       std::vector<std::pair<int, int>>{{64, 2}, {24, 1}, {256, 0}}) {
    options.max_num_batched_tokens = batched;
    options.stagger = stagger;
    const RunResult speculative = run(requests, ngram(1, 3), options);
    expect_same_outputs(plain.outputs, speculative.outputs,
                        "ngram, budget " + std::to_string(batched));
    EXPECT_GT(speculative.stats.spec_decode.num_draft_tokens, 0);
    EXPECT_EQ(speculative.stats.spec_decode_method, "ngram");
  }
}

TEST(SpecDecodeEngineTest, GreedyIsIdenticalWhenDraftsAreAcceptedAndRejectedAnywhere) {
  const std::vector<InferenceRequest> requests = mixed_requests(12, 5, greedy(16));
  RunOptions options;
  options.num_speculative_tokens = 4;
  const RunResult plain = run(requests, nullptr, options);
  const auto known = known_outputs(requests, plain.outputs);
  for (const double corruption : {0.0, 0.25, 1.0}) {
    const RunResult speculative =
        run(requests, std::make_unique<TestProposer>(known, corruption, 3), options);
    expect_same_outputs(plain.outputs, speculative.outputs,
                        "corruption " + std::to_string(corruption));
    const SpecDecodeCounts& counts = speculative.stats.spec_decode;
    EXPECT_GT(counts.num_draft_tokens, 0);
    if (corruption == 0.0) {
      EXPECT_EQ(counts.num_accepted_tokens, counts.num_draft_tokens) << "the oracle's drafts";
      // Accepted runs of up to 4 drafts: fewer steps than tokens.
      EXPECT_GT(counts.accepted_per_position[3], 0);
    } else if (corruption < 1.0) {
      EXPECT_GT(counts.num_accepted_tokens, 0);
      EXPECT_LT(counts.num_accepted_tokens, counts.num_draft_tokens);
    }
    int64_t request_drafts = 0;
    for (const Output& output : speculative.outputs) request_drafts += output.spec.num_draft_tokens;
    EXPECT_EQ(request_drafts, counts.num_draft_tokens) << "per-request counts add up";
  }
}

TEST(SpecDecodeEngineTest, PreemptionAndAbortMidRunKeepTheOutputAndTheBlocks) {
  const std::vector<InferenceRequest> requests = mixed_requests(10, 21, greedy(16));
  RunOptions options;
  options.num_blocks = 8;  // 128 tokens for ten sequences of up to ~107: preempts
  options.block_size = 16;
  options.stagger = 0;
  options.num_speculative_tokens = 4;
  const RunResult plain = run(requests, nullptr, options);
  ASSERT_GT(plain.stats.preemptions_total, 0) << "the pool must be small enough to preempt";
  const auto known = known_outputs(requests, plain.outputs);
  const RunResult speculative =
      run(requests, std::make_unique<TestProposer>(known, 0.2, 9), options);
  EXPECT_GT(speculative.stats.preemptions_total, 0);
  expect_same_outputs(plain.outputs, speculative.outputs, "preempting");

  // Aborted between steps with drafts pending: the others are unchanged.
  options.abort_after = {{1, 6}, {4, 9}};
  const RunResult aborted = run(requests, std::make_unique<TestProposer>(known, 0.2, 9), options);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i == 1 || i == 4) {
      EXPECT_EQ(aborted.outputs[i].error.code(), StatusCode::kCancelled);
      continue;
    }
    EXPECT_EQ(aborted.outputs[i].tokens, plain.outputs[i].tokens) << "request " << i;
  }
}

TEST(SpecDecodeEngineTest, StopsInsideARunEndTheOutputWhereDecodingWould) {
  std::vector<InferenceRequest> requests = mixed_requests(8, 33, greedy(24));
  RunOptions options;
  options.num_speculative_tokens = 5;
  const RunResult free_running = run(requests, nullptr, options);
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t>& out = free_running.outputs[i].tokens;
    ASSERT_GE(out.size(), 12u);
    switch (i % 4) {
      case 0:  // a stop token id in the middle
        requests[i].sampling.stop_token_ids = {out[6]};
        requests[i].sampling.ignore_eos = false;
        break;
      case 1:  // the same stop token, banned until min_tokens
        requests[i].sampling.stop_token_ids = {out[3]};
        requests[i].sampling.min_tokens = 5;
        requests[i].sampling.ignore_eos = false;
        break;
      case 2:  // a stop string from the middle of the text
        if (free_running.outputs[i].text.size() > 12) {
          requests[i].stop = {free_running.outputs[i].text.substr(8, 3)};
        }
        break;
      case 3:  // max_tokens in the middle of a run
        requests[i].sampling.max_tokens = 7;
        break;
    }
  }
  const RunResult plain = run(requests, nullptr, options);
  const auto known = known_outputs(requests, free_running.outputs);
  const RunResult speculative =
      run(requests, std::make_unique<TestProposer>(known, 0.0, 1), options);
  expect_same_outputs(plain.outputs, speculative.outputs, "stops");
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 4 == 1) continue;  // the stop token may not come back after min_tokens
    EXPECT_LT(speculative.outputs[i].tokens.size(), free_running.outputs[i].tokens.size())
        << "request " << i << " must stop early";
  }
}

TEST(SpecDecodeEngineTest, LogprobsAndPenaltiesSeeTheirOwnPosition) {
  SamplingParams params = greedy(16);
  params.want_logprobs = true;
  params.logprobs = 3;
  params.repetition_penalty = 1.3f;
  params.frequency_penalty = 0.4f;
  params.presence_penalty = 0.2f;
  const std::vector<InferenceRequest> requests = mixed_requests(8, 44, params);
  RunOptions options;
  const RunResult plain = run(requests, nullptr, options);
  const auto known = known_outputs(requests, plain.outputs);
  const RunResult speculative =
      run(requests, std::make_unique<TestProposer>(known, 0.2, 5), options);
  expect_same_outputs(plain.outputs, speculative.outputs, "logprobs and penalties");
  EXPECT_GT(speculative.stats.spec_decode.num_accepted_tokens, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& expected = plain.outputs[i].logprobs;
    const auto& actual = speculative.outputs[i].logprobs;
    ASSERT_EQ(actual.size(), expected.size()) << "request " << i;
    for (size_t t = 0; t < actual.size(); ++t) {
      EXPECT_EQ(actual[t].token, expected[t].token);
      EXPECT_NEAR(actual[t].logprob, expected[t].logprob, 1e-5)
          << "request " << i << " token " << t;
      ASSERT_EQ(actual[t].top.size(), expected[t].top.size());
      for (size_t k = 0; k < actual[t].top.size(); ++k) {
        EXPECT_EQ(actual[t].top[k].token, expected[t].top[k].token);
      }
    }
  }
}

TEST(SpecDecodeEngineTest, SeededSamplingRepeatsItself) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.9f;
  params.max_tokens = 20;
  params.ignore_eos = true;
  params.seed = 1234;
  const std::vector<InferenceRequest> requests = mixed_requests(6, 55, params);
  RunOptions options;
  const RunResult greedy_known = run(mixed_requests(6, 55, greedy(20)), nullptr, options);
  const auto known = known_outputs(requests, greedy_known.outputs);
  const RunResult first = run(requests, std::make_unique<TestProposer>(known, 0.3, 8), options);
  const RunResult second = run(requests, std::make_unique<TestProposer>(known, 0.3, 8), options);
  expect_same_outputs(first.outputs, second.outputs, "the same seed twice");
  EXPECT_GT(first.stats.spec_decode.num_draft_tokens, 0);
}

}  // namespace
}  // namespace pdserve
