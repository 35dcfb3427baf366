// Prompt logprobs (SamplingParams::prompt_logprobs) through the whole engine on the REAL model:
// the tiny synthetic Qwen3 whose float64 reference logits are committed as
// tests/data/reference/tiny.json (tests/reference/). The prompt is the golden's 40 prompt tokens
// followed by the 16 tokens its reference decode fed, so every position has reference logits:
// each position's alternatives (logprob = logit - logsumexp) and, where the reference lists
// the prompt token (its top 16 or its 256 probes), the token's own logprob and rank.
//
// Tolerance: the CPU backend runs its float32 path (PDSERVE_CPU_ISA is set to avx512 where the
// CPU would pick avx512_bf16, which rounds linear inputs to bf16): per logprob
// |ours - ref| <= 3e-5 + 1e-5 * |ref| (the forward's golden test holds logits and the
// log-sum-exp to 1e-5 each). Ids are compared only where the reference's neighbouring logits
// differ by more than the tolerance.
//
// Chunked prefill, a warm prefix cache (requests that want prompt logprobs bypass it) and
// preemption by recompute must not change one bit: the CPU backend is batch-invariant.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/files.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cpu_isa.h"
#include "serving/engine_assembly.h"
#include "tests/serving/tiny_model.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

constexpr int kTop = 16;  // the golden's top list
constexpr double kAbsTol = 3e-5;
constexpr double kRelTol = 1e-5;

using serving_test::TinyModel;

// The golden's checkpoint (tests/reference/README.md).
TinyModel& tiny_model() {
  static const std::unique_ptr<TinyModel> model = [] {
    if (best_cpu_isa() == CpuIsa::kAvx512Bf16) ::setenv("PDSERVE_CPU_ISA", "avx512", 1);
    return serving_test::make_tiny_model("prompt-logprobs-tiny");
  }();
  return *model;
}

struct Reference {
  std::vector<int32_t> prompt;          // prompt_ids, then the decode steps' input tokens
  std::vector<nlohmann::json> entries;  // logits summary at positions 0 .. prompt.size() - 1
  std::vector<int32_t> probes;
};

const Reference& reference() {
  static const Reference loaded = [] {
    const nlohmann::json golden =
        read_json_file(std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference" / "tiny.json")
            .value();
    Reference ref;
    ref.prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    ref.probes = golden["probe_ids"].get<std::vector<int32_t>>();
    for (const nlohmann::json& entry : golden["prompt_positions"]) ref.entries.push_back(entry);
    for (const nlohmann::json& step : golden["decode_steps"]) {
      ref.prompt.push_back(step["input_token"].get<int32_t>());
      ref.entries.push_back(step);
    }
    return ref;
  }();
  return loaded;
}

class Outcomes {
 public:
  DeltaSink sink(const std::string& id) {
    return [this, id](SequenceDelta delta) {
      std::lock_guard lock(mutex_);
      Outcome& outcome = outcomes_[id];
      if (!delta.prompt_logprobs.empty() || outcome.deltas == 0) {
        EXPECT_EQ(outcome.deltas, 0) << id << ": prompt logprobs after the first delta";
        outcome.prompt_logprobs = std::move(delta.prompt_logprobs);
      }
      ++outcome.deltas;
      if (delta.finished) {
        outcome.error = delta.error;
        outcome.cached_prompt_tokens = delta.cached_prompt_tokens;
        ++finished_;
        done_.notify_all();
      }
    };
  }
  bool wait_for(int count) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, 120s, [&] { return finished_ >= count; });
  }
  struct Outcome {
    std::vector<PromptTokenLogprob> prompt_logprobs;
    int deltas = 0;
    int cached_prompt_tokens = 0;
    Status error;
  };
  Outcome get(const std::string& id) {
    std::lock_guard lock(mutex_);
    return outcomes_.at(id);
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<std::string, Outcome> outcomes_;
  int finished_ = 0;
};

InferenceRequest prompt_logprobs_request(const std::string& id, std::vector<int32_t> prompt,
                                         std::optional<int> top) {
  InferenceRequest request;
  request.id = id;
  request.prompt_tokens = std::move(prompt);
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = 2;
  request.sampling.ignore_eos = true;
  request.sampling.prompt_logprobs = top;
  return request;
}

EngineConfig engine_config(int max_num_batched_tokens, int num_blocks, int block_size = 16) {
  const LoadedModel& loaded = tiny_model().loaded;
  const KvLayout shape =
      kv_layout_for(loaded.model->config(), num_blocks, block_size,
                    loaded.backend->default_kv_dtype(loaded.model->weight_dtype()));
  EngineConfig config;
  config.kv_cache_memory_gib =
      static_cast<double>(shape.total_bytes()) / static_cast<double>(1ull << 30);
  config.block_size = block_size;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = 16;
  config.max_model_len = 256;
  return config;
}

bool close(double ours, double ref) {
  return std::fabs(ours - ref) <= kAbsTol + kRelTol * std::fabs(ref);
}

TEST(PromptLogprobsTest, EqualTheFloat64ReferenceAtEveryPromptPosition) {
  TinyModel& model = tiny_model();
  const Reference& ref = reference();
  std::unique_ptr<LlmEngine> engine =
      make_llm_engine(model.loaded, *model.tokenizer, engine_config(512, 64)).value();
  ASSERT_TRUE(engine->start().ok());
  Outcomes outcomes;
  ASSERT_TRUE(
      engine->submit(prompt_logprobs_request("a", ref.prompt, kTop), outcomes.sink("a")).ok());
  ASSERT_TRUE(outcomes.wait_for(1));
  const Outcomes::Outcome got = outcomes.get("a");
  ASSERT_TRUE(got.error.ok()) << got.error.to_string();
  ASSERT_EQ(got.prompt_logprobs.size(), ref.prompt.size() - 1);
  int own_checked = 0;
  for (size_t p = 1; p < ref.prompt.size(); ++p) {
    const PromptTokenLogprob& ours = got.prompt_logprobs[p - 1];
    const nlohmann::json& entry = ref.entries[p - 1];
    const double lse = entry["logsumexp"].get<double>();
    const std::vector<int32_t> top_ids = entry["top_ids"].get<std::vector<int32_t>>();
    const std::vector<double> top_logits = entry["top_logits"].get<std::vector<double>>();
    ASSERT_EQ(ours.token, ref.prompt[p]);
    ASSERT_EQ(ours.top.size(), static_cast<size_t>(kTop)) << "position " << p;
    for (size_t i = 0; i < top_ids.size(); ++i) {
      EXPECT_TRUE(close(ours.top[i].logprob, top_logits[i] - lse))
          << "position " << p << " alternative " << i << ": " << ours.top[i].logprob << " vs "
          << top_logits[i] - lse;
      const bool apart_above = i == 0 || top_logits[i - 1] - top_logits[i] > 2 * kAbsTol;
      const bool apart_below =
          i + 1 == top_ids.size() || top_logits[i] - top_logits[i + 1] > 2 * kAbsTol;
      if (apart_above && apart_below) {
        EXPECT_EQ(ours.top[i].token, top_ids[i]) << "position " << p << " alternative " << i;
      }
    }
    // The prompt token's own logit, where the reference lists it.
    std::optional<double> logit;
    for (size_t i = 0; i < top_ids.size(); ++i) {
      if (top_ids[i] == ours.token) {
        logit = top_logits[i];
        const bool apart =
            (i == 0 || top_logits[i - 1] - top_logits[i] > 2 * kAbsTol) &&
            (i + 1 == top_ids.size() || top_logits[i] - top_logits[i + 1] > 2 * kAbsTol);
        if (apart) {
          EXPECT_EQ(ours.rank, static_cast<int>(i) + 1) << "position " << p;
        }
      }
    }
    const std::vector<double> probe_logits = entry["probe_logits"].get<std::vector<double>>();
    for (size_t i = 0; i < ref.probes.size(); ++i) {
      if (ref.probes[i] == ours.token) logit = probe_logits[i];
    }
    if (!logit) {
      // Unlisted: below the reference's 16th logit, so ranked after it.
      EXPECT_LT(ours.logprob, top_logits.back() - lse + kAbsTol) << "position " << p;
      EXPECT_GT(ours.rank, kTop - 1) << "position " << p;
      continue;
    }
    ++own_checked;
    EXPECT_TRUE(close(ours.logprob, *logit - lse))
        << "position " << p << ": " << ours.logprob << " vs " << *logit - lse;
  }
  // The 16 decode-step tokens are the reference's greedy picks, so in its top list.
  EXPECT_GE(own_checked, 15);
  engine->stop();
}

TEST(PromptLogprobsTest, ChunkingAWarmPrefixCacheAndPreemptionChangeNoBit) {
  TinyModel& model = tiny_model();
  const std::vector<int32_t>& prompt = reference().prompt;
  std::vector<PromptTokenLogprob> whole;
  {
    std::unique_ptr<LlmEngine> engine =
        make_llm_engine(model.loaded, *model.tokenizer, engine_config(512, 64)).value();
    ASSERT_TRUE(engine->start().ok());
    Outcomes outcomes;
    ASSERT_TRUE(
        engine->submit(prompt_logprobs_request("whole", prompt, 5), outcomes.sink("whole")).ok());
    ASSERT_TRUE(outcomes.wait_for(1));
    whole = outcomes.get("whole").prompt_logprobs;
    ASSERT_EQ(whole.size(), prompt.size() - 1);
    engine->stop();
  }
  // Chunks of 7 tokens (a max_token_logits() of 16 rows splits none further), then the same
  // prompt again with its blocks cached, then a request without prompt logprobs that uses them.
  std::unique_ptr<LlmEngine> engine =
      make_llm_engine(model.loaded, *model.tokenizer, engine_config(7, 64)).value();
  ASSERT_TRUE(engine->start().ok());
  Outcomes outcomes;
  ASSERT_TRUE(
      engine->submit(prompt_logprobs_request("cold", prompt, 5), outcomes.sink("cold")).ok());
  ASSERT_TRUE(outcomes.wait_for(1));
  ASSERT_TRUE(
      engine->submit(prompt_logprobs_request("warm", prompt, 5), outcomes.sink("warm")).ok());
  ASSERT_TRUE(outcomes.wait_for(2));
  ASSERT_TRUE(
      engine->submit(prompt_logprobs_request("plain", prompt, std::nullopt), outcomes.sink("plain"))
          .ok());
  ASSERT_TRUE(outcomes.wait_for(3));
  EXPECT_EQ(outcomes.get("cold").prompt_logprobs, whole);
  EXPECT_EQ(outcomes.get("warm").prompt_logprobs, whole);
  EXPECT_EQ(outcomes.get("warm").cached_prompt_tokens, 0) << "prompt logprobs bypass the cache";
  EXPECT_GT(outcomes.get("plain").cached_prompt_tokens, 0) << "their blocks were still cached";
  EXPECT_TRUE(outcomes.get("plain").prompt_logprobs.empty());
  engine->stop();

  // Eight at once in a pool of 29 four-token blocks: two prompts (14 blocks each) fit, and
  // the second to need a 15th block for its output is preempted and recomputed (its prompt
  // logprobs are not computed twice). Four-token blocks split the attention differently from
  // sixteen-token ones, so the bitwise oracle is the same prompt run alone on this engine
  // (itself within 1e-5 of the sixteen-token run).
  std::unique_ptr<LlmEngine> crowded =
      make_llm_engine(model.loaded, *model.tokenizer, engine_config(64, 29, 4)).value();
  ASSERT_TRUE(crowded->start().ok());
  Outcomes crowd;
  ASSERT_TRUE(
      crowded->submit(prompt_logprobs_request("alone", prompt, 5), crowd.sink("alone")).ok());
  ASSERT_TRUE(crowd.wait_for(1));
  const std::vector<PromptTokenLogprob> alone = crowd.get("alone").prompt_logprobs;
  ASSERT_EQ(alone.size(), whole.size());
  for (size_t p = 0; p < whole.size(); ++p) {
    EXPECT_NEAR(alone[p].logprob, whole[p].logprob, 1e-5) << "position " << p + 1;
  }
  for (int i = 0; i < 8; ++i) {
    InferenceRequest request = prompt_logprobs_request("c" + std::to_string(i), prompt, 5);
    request.sampling.max_tokens = 4;
    ASSERT_TRUE(crowded->submit(std::move(request), crowd.sink("c" + std::to_string(i))).ok());
  }
  ASSERT_TRUE(crowd.wait_for(9));
  for (int i = 0; i < 8; ++i) {
    const Outcomes::Outcome got = crowd.get("c" + std::to_string(i));
    EXPECT_TRUE(got.error.ok()) << got.error.to_string();
    EXPECT_EQ(got.prompt_logprobs, alone) << "request " << i;
  }
  crowded->stop();
  EXPECT_GT(crowded->stats().preemptions_total, 0);
}

TEST(PromptLogprobsTest, AOneTokenPromptHasNoneAndAnOutOfRangeCountIsRefused) {
  TinyModel& model = tiny_model();
  std::unique_ptr<LlmEngine> engine =
      make_llm_engine(model.loaded, *model.tokenizer, engine_config(512, 64)).value();
  ASSERT_TRUE(engine->start().ok());
  Outcomes outcomes;
  ASSERT_TRUE(engine->submit(prompt_logprobs_request("one", {42}, 3), outcomes.sink("one")).ok());
  ASSERT_TRUE(outcomes.wait_for(1));
  EXPECT_TRUE(outcomes.get("one").error.ok());
  EXPECT_TRUE(outcomes.get("one").prompt_logprobs.empty());
  const Status refused =
      engine->submit(prompt_logprobs_request("many", {1, 2}, 21), outcomes.sink("many"));
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  engine->stop();
}

}  // namespace
}  // namespace pdserve
