// Speculative decoding's parts on their own: the --speculative-config parser, prompt lookup,
// the rejection sampler (its output distribution against the sampler's own, chi-square), the
// adaptive policy, and the scheduler's verify rows with the block manager's invariants.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <vector>

#include "common/engine/scheduler.h"
#include "common/engine/spec_decode/adaptive_speculation.h"
#include "common/engine/spec_decode/ngram_proposer.h"
#include "common/engine/spec_decode/rejection_sampler.h"
#include "common/engine/spec_decode/speculative_config.h"
#include "common/sampling/sampler.h"

namespace pdserve {
namespace {

TEST(SpeculativeConfigTest, ParsesVllmKeysAndDefaults) {
  const SpeculativeConfig ngram =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4})").value();
  EXPECT_EQ(ngram.method, SpeculativeMethod::kNgram);
  EXPECT_EQ(ngram.num_speculative_tokens, 4);
  EXPECT_EQ(ngram.prompt_lookup_min, 5);  // vLLM's defaults
  EXPECT_EQ(ngram.prompt_lookup_max, 5);
  const SpeculativeConfig only_max =
      parse_speculative_config(
          R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})")
          .value();
  EXPECT_EQ(only_max.prompt_lookup_min, 3);
  EXPECT_EQ(only_max.prompt_lookup_max, 3);
  const SpeculativeConfig both =
      parse_speculative_config(
          R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
          "prompt_lookup_max": 4})")
          .value();
  EXPECT_EQ(both.prompt_lookup_min, 1);
  EXPECT_EQ(both.prompt_lookup_max, 4);
  // vLLM infers a draft model from "model".
  const SpeculativeConfig draft =
      parse_speculative_config(R"({"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3})")
          .value();
  EXPECT_EQ(draft.method, SpeculativeMethod::kDraftModel);
  EXPECT_EQ(draft.model, "Qwen/Qwen3-0.6B");
}

TEST(SpeculativeConfigTest, RefusesBadInputWithItsName) {
  const std::map<std::string, std::string> cases = {
      {"not json", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({"method": "ngram"})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 99})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": "4"})", "num_speculative_tokens"},
      {R"({"method": "eagle", "num_speculative_tokens": 4})", "method"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "typo": 1})", "unknown key 'typo'"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 0})",
       "prompt_lookup_min"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 4,
           "prompt_lookup_max": 2})",
       "prompt_lookup_max"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "model": "x"})", "model"},
      {R"({"method": "draft_model", "num_speculative_tokens": 4})", "model"},
      {R"({"num_speculative_tokens": 4})", "method"},
  };
  for (const auto& [json, expected] : cases) {
    const Result<SpeculativeConfig> parsed = parse_speculative_config(json);
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(parsed.status().message().find(expected), std::string::npos)
        << json << " -> " << parsed.status().message();
  }
}

TEST(NgramLookupTest, LongestSuffixFirstThenEarliestMatch) {
  // Suffix [7 8]: the 2-gram occurs at 1 (followed by 1 2 7) and at 5 (followed by 9 9 7).
  const std::vector<int32_t> tokens = {0, 7, 8, 1, 2, 7, 8, 9, 9, 7, 8};
  EXPECT_EQ(ngram_lookup(tokens, 1, 2, 3), (std::vector<int32_t>{1, 2, 7}));
  // The 3-gram [9 7 8] never occurred before: n = 2 answers.
  EXPECT_EQ(ngram_lookup(tokens, 2, 3, 2), (std::vector<int32_t>{1, 2}));
  // The longer n-gram wins over an earlier shorter one: [4 5 8] at 3 (followed by 2 3) beats
  // [5 8] at 0 (followed by 1 4).
  const std::vector<int32_t> nested = {5, 8, 1, 4, 5, 8, 2, 3, 4, 5, 8};
  EXPECT_EQ(ngram_lookup(nested, 2, 3, 2), (std::vector<int32_t>{2, 3}));
  // A loop: the earliest occurrence leaves all k tokens to propose.
  const std::vector<int32_t> repeated = {9, 9, 9, 9, 9, 9};
  EXPECT_EQ(ngram_lookup(repeated, 1, 3, 2), (std::vector<int32_t>{9, 9}));
  // Only 3-grams allowed: none matches.
  EXPECT_TRUE(ngram_lookup(tokens, 3, 3, 4).empty());
  // The continuation is cut at the sequence's end (here it runs into the suffix itself).
  const std::vector<int32_t> loop = {5, 6, 5, 6};
  EXPECT_EQ(ngram_lookup(loop, 2, 2, 5), (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram_lookup(tokens, 1, 2, 0).empty());
}

TEST(NgramLookupTest, ProposerAnswersEveryRequest) {
  SpeculativeConfig config;
  config.num_speculative_tokens = 3;
  config.prompt_lookup_min = 1;
  config.prompt_lookup_max = 2;
  NgramProposer proposer(config);
  const std::vector<int32_t> a = {1, 2, 3, 1, 2};
  const std::vector<int32_t> b = {4, 5, 6};
  const std::vector<ProposalRequest> requests = {{0, a, 3}, {1, b, 3}, {2, a, 1}};
  std::vector<std::vector<int32_t>> proposals = {{99}, {99}, {99}};
  ASSERT_TRUE(proposer.propose(requests, proposals).ok());
  EXPECT_EQ(proposals[0], (std::vector<int32_t>{3, 1, 2}));
  EXPECT_TRUE(proposals[1].empty());
  EXPECT_EQ(proposals[2], (std::vector<int32_t>{3}));
}

Sequence make_sequence(std::vector<int32_t> prompt, SamplingParams params, int vocab) {
  StopChecker checker = StopChecker::create(params, {}, vocab).value();
  return Sequence(0, std::move(prompt), std::move(params), std::move(checker), 0,
                  std::chrono::steady_clock::now());
}

// Chi-square goodness of fit of `counts` against `expected` probabilities (cells with
// expected count >= 5 only; the rest pooled).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected,
                  int64_t total, int* degrees) {
  double statistic = 0.0;
  double pooled_observed = 0.0;
  double pooled_expected = 0.0;
  int cells = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    const double e = expected[t] * static_cast<double>(total);
    if (e < 5.0) {
      pooled_observed += static_cast<double>(counts[t]);
      pooled_expected += e;
      continue;
    }
    statistic += (static_cast<double>(counts[t]) - e) * (static_cast<double>(counts[t]) - e) / e;
    ++cells;
  }
  if (pooled_expected >= 5.0) {
    statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  *degrees = cells - 1;
  return statistic;
}

// Upper 1e-4 quantiles of chi-square with 1..8 degrees of freedom.
double chi_square_critical(int degrees) {
  static const double kCritical[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83};
  return kCritical[degrees];
}

// Each emitted position must follow the distribution non-speculative sampling draws from
// (Sampler::distribution, after bias, penalties, temperature, min-p, top-k, top-p), given the
// tokens before it: position 0 always, position j > 0 on the runs whose earlier drafts were
// all accepted. Logits rows do not depend on the tokens here, so the target is fixed per
// position. 40000 seeded runs; each test's false-alarm rate is 1e-4 (fixed seed: the outcome
// is deterministic, the rate says how unlucky a seed would have to be).
TEST(RejectionSamplerTest, EmittedTokensFollowTheNonSpeculativeDistribution) {
  constexpr int kVocab = 8;
  constexpr int kRuns = 40000;
  const std::vector<float> rows = {
      // position 0, 1, 2 (the bonus row when both drafts are accepted)
      1.0f, 0.2f, 2.0f, -1.0f, 0.5f, 1.5f, 0.0f, -0.5f,  //
      0.3f, 2.5f, 0.1f, 1.9f,  -2.f, 0.0f, 1.0f, 0.4f,   //
      1.2f, 1.1f, 1.0f, 0.9f,  0.8f, 0.7f, 0.6f, 0.5f,
  };
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 6;
  params.top_p = 0.95f;
  params.min_p = 0.02f;
  params.repetition_penalty = 1.2f;  // over the prompt: the same at every position
  params.max_tokens = 16;
  const std::vector<int32_t> drafts = {2, 3};  // likely, then less likely
  Sequence seq = make_sequence({5, 1}, params, kVocab);

  Sampler reference;
  std::vector<std::vector<double>> expected(3, std::vector<double>(kVocab, 0.0));
  std::vector<int32_t> output;
  for (size_t j = 0; j < 3; ++j) {
    const auto distribution =
        reference
            .distribution(std::span<const float>(rows).subspan(j * kVocab, kVocab), params,
                          seq.prompt_tokens(), output)
            .value();
    for (const TokenProbability& entry : distribution) expected[j][entry.token] = entry.probability;
    if (j < drafts.size()) output.push_back(drafts[j]);
  }

  RejectionSampler verifier;
  std::vector<std::vector<int64_t>> counts(3, std::vector<int64_t>(kVocab, 0));
  std::vector<int64_t> reached(3, 0);
  SamplerRng rng(2024);
  for (int run = 0; run < kRuns; ++run) {
    const VerifiedRun verified = verifier.verify(seq, drafts, rows, kVocab, rng).value();
    ASSERT_EQ(verified.tokens.size(), static_cast<size_t>(verified.num_accepted) + 1);
    for (size_t j = 0; j < verified.tokens.size(); ++j) {
      ++counts[j][verified.tokens[j].token];
      ++reached[j];
    }
  }
  for (size_t j = 0; j < 3; ++j) {
    ASSERT_GT(reached[j], 2000) << "position " << j << " is reached too rarely to test";
    int degrees = 0;
    const double statistic = chi_square(counts[j], expected[j], reached[j], &degrees);
    ASSERT_GE(degrees, 1);
    EXPECT_LT(statistic, chi_square_critical(degrees))
        << "position " << j << ": chi-square " << statistic << " with " << degrees << " dof";
  }
  // The test can fail: a verifier that always accepts the draft gives position 0 the token 2
  // every time, far from p_0.
  std::vector<int64_t> always_accepted(kVocab, 0);
  always_accepted[2] = reached[0];
  int degrees = 0;
  EXPECT_GT(chi_square(always_accepted, expected[0], reached[0], &degrees),
            chi_square_critical(degrees));
}

TEST(RejectionSamplerTest, GreedyAcceptsTheArgmaxPrefixAndCorrects) {
  constexpr int kVocab = 4;
  const std::vector<float> rows = {0.f, 3.f, 1.f, 2.f,   // argmax 1
                                   5.f, 0.f, 1.f, 2.f,   // argmax 0
                                   0.f, 1.f, 2.f, 9.f};  // argmax 3
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 8;
  params.want_logprobs = true;
  params.logprobs = 1;
  Sequence seq = make_sequence({2}, params, kVocab);
  RejectionSampler verifier;
  SamplerRng rng(1);
  const SamplerRng::State before = rng.state();
  const VerifiedRun all =
      verifier.verify(seq, std::vector<int32_t>{1, 0}, rows, kVocab, rng).value();
  EXPECT_EQ(all.num_accepted, 2);
  ASSERT_EQ(all.tokens.size(), 3u);
  EXPECT_EQ(all.tokens[2].token, 3);  // the bonus
  EXPECT_NEAR(all.tokens[0].logprob, 3.0 - std::log(1 + std::exp(3.) + std::exp(1.) + std::exp(2.)),
              1e-5);
  const VerifiedRun second_wrong =
      verifier.verify(seq, std::vector<int32_t>{1, 2}, rows, kVocab, rng).value();
  EXPECT_EQ(second_wrong.num_accepted, 1);
  ASSERT_EQ(second_wrong.tokens.size(), 2u);
  EXPECT_EQ(second_wrong.tokens[1].token, 0);  // the correction: position 1's argmax
  EXPECT_EQ(rng.state(), before) << "greedy verification draws nothing";
}

TEST(RejectionSamplerTest, BansStopTokensBeforeMinTokens) {
  constexpr int kVocab = 3;
  const std::vector<float> rows = {0.f, 0.f, 9.f, 0.f, 0.f, 9.f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 8;
  params.min_tokens = 2;
  params.stop_token_ids = {2};
  Sequence seq = make_sequence({0}, params, kVocab);
  RejectionSampler verifier;
  SamplerRng rng(1);
  // Token 2 is the argmax but banned while fewer than 2 tokens are out: rejected, corrected.
  const VerifiedRun run = verifier.verify(seq, std::vector<int32_t>{2}, rows, kVocab, rng).value();
  EXPECT_EQ(run.num_accepted, 0);
  EXPECT_EQ(run.tokens[0].token, 0);
}

TEST(AdaptiveSpeculationTest, TurnsOffOnLowAcceptanceAndProbes) {
  AdaptiveSpeculation policy(4);
  EXPECT_FALSE(policy.should_propose(1)) << "no plain step timed yet: the cost is unknown";
  policy.record_step(1, 0, std::chrono::milliseconds(10));
  EXPECT_TRUE(policy.should_propose(1)) << "a new engine's sequences try";
  // Verify steps cost 3x plain ones (as 5-token rows do on a CPU).
  for (int i = 0; i < 20; ++i) {
    policy.record_step(1, 0, std::chrono::milliseconds(10));
    policy.record_step(1, 1, std::chrono::milliseconds(30));
  }
  EXPECT_NEAR(policy.cost_ratio(), 3.0, 1e-6);
  EXPECT_EQ(policy.probe_interval(), 100) << "(3 - 1) / 2 %: probes cost 2 % of decoding";
  for (int i = 0; i < 3; ++i) policy.record_verify(1, 0);
  int proposed = 0;
  for (int step = 0; step < 4 * policy.probe_interval(); ++step) {
    proposed += policy.should_propose(1) ? 1 : 0;
  }
  EXPECT_EQ(proposed, 4) << "one probe per probe_interval() steps";
  // A probe that finds the drafts accepted again turns it back on.
  policy.record_verify(1, 4);
  policy.record_verify(1, 4);
  EXPECT_TRUE(policy.should_propose(1));
  EXPECT_TRUE(policy.should_propose(1));
  // High acceptance stays on.
  for (int i = 0; i < 10; ++i) policy.record_verify(2, 3);
  for (int step = 0; step < 10; ++step) EXPECT_TRUE(policy.should_propose(2));
  // After many failed drafts a new sequence starts off (the engine's prior).
  for (int i = 0; i < 30; ++i) policy.record_verify(1, 0);
  EXPECT_FALSE(policy.should_propose(3));
  EXPECT_LT(policy.mean_accepted(3), 0.1);
  // Cheap verify steps probe at least every kMinProbeInterval steps.
  AdaptiveSpeculation cheap(4);
  cheap.record_step(1, 0, std::chrono::milliseconds(10));
  cheap.record_step(1, 1, std::chrono::milliseconds(11));
  EXPECT_EQ(cheap.probe_interval(), AdaptiveSpeculation::kMinProbeInterval);
}

SchedulerConfig small_config(int num_blocks) {
  SchedulerConfig config;
  config.num_blocks = num_blocks;
  config.block_size = 4;
  config.max_num_batched_tokens = 64;
  config.max_num_seqs = 8;
  config.vocab_size = 100;
  return config;
}

SamplingParams decode_params(int max_tokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// Runs the prefill step of every queued request (all fit one step here).
void prefill(Scheduler& scheduler, int32_t first_token) {
  const ScheduledBatch batch = scheduler.schedule();
  std::vector<int32_t> tokens(static_cast<size_t>(batch.num_samples), first_token);
  ASSERT_TRUE(scheduler.postprocess(batch, tokens).ok());
}

TEST(SchedulerVerifyTest, VerifyRowsAfterDecodesCountOnlyAcceptedTokens) {
  Scheduler scheduler = Scheduler::create(small_config(64)).value();
  const SeqId a = scheduler.add_request({1, 2, 3, 4, 5, 6}, decode_params(20)).value();
  const SeqId b = scheduler.add_request({7, 8, 9}, decode_params(20)).value();
  prefill(scheduler, 10);
  ASSERT_TRUE(scheduler.set_draft_tokens(b, {11, 12, 13, 14, 15}).ok());
  const SeqId c =
      scheduler.add_request({21, 22, 23, 24, 25, 26, 27, 28, 29, 30}, decode_params(4)).value();

  ScheduledBatch batch = scheduler.schedule();
  ASSERT_EQ(batch.entries.size(), 3u);
  EXPECT_EQ(batch.num_decodes, 1);
  EXPECT_EQ(batch.num_verify_rows, 1);
  EXPECT_EQ(batch.entries[0].sequence->id(), a);
  const ScheduledSequence& row = batch.entries[1];
  EXPECT_EQ(row.sequence->id(), b);
  EXPECT_EQ(row.num_new_tokens, 6);
  EXPECT_EQ(std::vector<int32_t>(row.new_tokens().begin(), row.new_tokens().end()),
            (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(batch.entries[2].sequence->id(), c);  // the prefill chunk
  EXPECT_EQ(batch.num_batched_tokens, 1 + 6 + 10);
  // b's table grew to hold its 4 tokens and 5 drafts: 3 blocks of 4.
  EXPECT_EQ(row.block_table.size(), 3u);
  ASSERT_TRUE(scheduler.block_manager().check_invariants().ok());

  // Two drafts accepted, then a correction: 3 tokens for b.
  const std::vector<std::vector<int32_t>> runs = {{}, {11, 12, 40}, {}};
  const auto updates = scheduler.postprocess(batch, std::vector<int32_t>{20, 0, 30}, runs).value();
  ASSERT_EQ(updates.size(), 5u);
  EXPECT_EQ(updates[1].seq_id, b);
  EXPECT_EQ(updates[3].token, 40);
  const Sequence& seq_b = *scheduler.find(b);
  EXPECT_EQ(seq_b.num_tokens(), 3 + 1 + 3);
  // The last token and two accepted drafts have KV; the correction does not yet.
  EXPECT_EQ(seq_b.num_computed_tokens(), 6);
  // Surplus blocks freed: 7 tokens need 2 blocks.
  EXPECT_EQ(scheduler.block_manager().block_table(b).size(), 2u);
  ASSERT_TRUE(scheduler.block_manager().check_invariants().ok());
  EXPECT_TRUE(seq_b.draft_tokens().empty());
}

TEST(SchedulerVerifyTest, StopsMidRunAndCutsDraftsToBudgetAndPool) {
  SchedulerConfig config = small_config(64);
  config.max_num_batched_tokens = 3;
  Scheduler scheduler = Scheduler::create(config).value();
  SamplingParams params = decode_params(20);
  params.stop_token_ids = {50};
  params.ignore_eos = false;
  const SeqId a = scheduler.add_request({1, 2}, params).value();
  prefill(scheduler, 10);
  ASSERT_TRUE(scheduler.set_draft_tokens(a, {11, 12, 13, 14}).ok());
  ScheduledBatch batch = scheduler.schedule();
  ASSERT_EQ(batch.num_verify_rows, 1);
  EXPECT_EQ(batch.entries[0].num_new_tokens, 3) << "the budget of 3 keeps 2 drafts";
  // Refused: a run longer than 1 + drafts, and a run for a plain entry.
  EXPECT_FALSE(scheduler
                   .postprocess(batch, std::vector<int32_t>{0},
                                std::vector<std::vector<int32_t>>{{11, 12, 13, 14}})
                   .ok());
  // The stop token ends the run: the token after it is dropped.
  const auto updates = scheduler
                           .postprocess(batch, std::vector<int32_t>{0},
                                        std::vector<std::vector<int32_t>>{{11, 50, 13}})
                           .value();
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[1].finish_reason, FinishReason::kStop);
  EXPECT_EQ(scheduler.find(a), nullptr);
  EXPECT_EQ(scheduler.block_manager().num_used_blocks(), 0);
  ASSERT_TRUE(scheduler.block_manager().check_invariants().ok());
}

TEST(SchedulerVerifyTest, PreemptionDropsDraftsAndAFullPoolDecodesPlainly) {
  // 3 blocks of 4: two sequences of 5 tokens fill them after one decode.
  Scheduler scheduler = Scheduler::create(small_config(3)).value();
  const SeqId a = scheduler.add_request({1, 2, 3, 4, 5}, decode_params(6)).value();
  const SeqId b = scheduler.add_request({1, 2, 3}, decode_params(6)).value();
  prefill(scheduler, 10);
  // a holds 2 blocks (6 tokens), b 1 (4 tokens): 4 drafts for a do not fit the free pool.
  ASSERT_TRUE(scheduler.set_draft_tokens(a, {1, 2, 3, 4}).ok());
  ScheduledBatch batch = scheduler.schedule();
  EXPECT_EQ(batch.num_verify_rows, 0);
  EXPECT_EQ(batch.num_decodes, 2);
  ASSERT_TRUE(scheduler.postprocess(batch, std::vector<int32_t>{11, 11}).ok());
  // b's drafts, then b is preempted by a's next decode: its drafts go with its blocks.
  ASSERT_TRUE(scheduler.set_draft_tokens(b, {5}).ok());
  for (int step = 0; step < 8 && scheduler.has_unfinished(); ++step) {
    batch = scheduler.schedule();
    std::vector<int32_t> tokens(static_cast<size_t>(batch.num_samples), 12);
    std::vector<std::vector<int32_t>> runs(static_cast<size_t>(batch.num_samples));
    size_t slot = 0;
    for (const ScheduledSequence& entry : batch.entries) {
      if (!entry.samples) continue;
      if (entry.verifies()) runs[slot] = {entry.draft_tokens()[0], 13};
      ++slot;
    }
    ASSERT_TRUE(scheduler.postprocess(batch, tokens, runs).ok());
    ASSERT_TRUE(scheduler.block_manager().check_invariants().ok());
    if (!batch.preempted.empty()) {
      const Sequence* preempted = scheduler.find(batch.preempted[0]);
      ASSERT_NE(preempted, nullptr);
      EXPECT_TRUE(preempted->draft_tokens().empty());
    }
  }
  (void)b;
}

}  // namespace
}  // namespace pdserve
