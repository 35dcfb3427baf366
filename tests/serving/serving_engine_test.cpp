// The whole engine on the REAL model (a tiny synthetic Qwen3 on the CPU backend): concurrent
// greedy requests through LlmEngine + Qwen3ModelRunner must produce exactly the tokens that
// each prompt gives when run alone through Qwen3Model the way pdserve-generate runs it
// (whole-prompt prefill, then one token per step). The CPU backend is bitwise
// batch-invariant, so batching, chunked prefill, preemption by recompute and prefix-cache
// hits may not change a single token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/model/synthetic_checkpoint.h"
#include "common/sampling/sampler.h"
#include "serving/engine_assembly.h"
#include "tests/serving/tiny_model.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

using serving_test::TinyModel;

TinyModel& tiny_model() {
  static const std::unique_ptr<TinyModel> model = [] {
    return serving_test::make_tiny_model("serving-tiny");
  }();
  return *model;
}

struct Prompt {
  std::vector<int32_t> tokens;
  int max_tokens = 0;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// pdserve-generate's loop: the whole prompt in one forward, then one token per step.
std::vector<int32_t> generate_alone(const Prompt& prompt) {
  TinyModel& model = tiny_model();
  Qwen3Model& qwen = *model.loaded.model;
  Backend& backend = *model.loaded.backend;
  const ModelConfig& config = qwen.config();
  constexpr int kBlockSize = 16;
  const int context_len = static_cast<int>(prompt.tokens.size()) + prompt.max_tokens;
  const int blocks = (context_len + kBlockSize - 1) / kBlockSize;
  KvCache cache =
      KvCache::create(backend, kv_layout_for(config, blocks, kBlockSize,
                                             backend.default_kv_dtype(qwen.weight_dtype())))
          .value();
  ForwardLimits limits;
  limits.max_num_tokens = static_cast<int>(prompt.tokens.size());
  limits.max_num_seqs = 1;
  limits.max_model_len = context_len;
  ForwardContext context = ForwardContext::create(backend, config, limits, kBlockSize).value();
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = b;
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  SequenceSlice slice{prompt.tokens, 0, table};
  EXPECT_TRUE(qwen.forward({&slice, 1}, cache, context, logits).ok());
  Sampler sampler;
  SamplerRng rng(0);
  const SamplingParams params = greedy(prompt.max_tokens);
  std::vector<int32_t> output;
  while (static_cast<int>(output.size()) < prompt.max_tokens) {
    output.push_back(sampler.sample(logits, params, prompt.tokens, output, rng).value().token);
    slice = {std::span<const int32_t>(&output.back(), 1),
             static_cast<int>(prompt.tokens.size() + output.size() - 1), table};
    EXPECT_TRUE(qwen.forward({&slice, 1}, cache, context, logits).ok());
  }
  return output;
}

// 32 prompts of 1 to ~100 random tokens, 4 to 16 new tokens each.
std::vector<Prompt> mixed_prompts() {
  std::mt19937 random(1234);
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<Prompt> prompts(32);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t length = 1 + (i * 37) % 101;
    for (size_t t = 0; t < length; ++t) prompts[i].tokens.push_back(token(random));
    prompts[i].max_tokens = 4 + static_cast<int>(i % 13);
  }
  return prompts;
}

// A shared 70-token system prompt, then a different question of 3 to 20 tokens.
std::vector<Prompt> shared_prefix_prompts() {
  std::mt19937 random(99);
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<int32_t> system(70);
  for (int32_t& t : system) t = token(random);
  std::vector<Prompt> prompts(32);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].tokens = system;
    for (size_t t = 0; t < 3 + i % 18; ++t) prompts[i].tokens.push_back(token(random));
    prompts[i].max_tokens = 6 + static_cast<int>(i % 7);
  }
  return prompts;
}

const std::vector<std::vector<int32_t>>& expected_for(const std::vector<Prompt>& prompts,
                                                      const std::string& key) {
  static std::map<std::string, std::vector<std::vector<int32_t>>> computed;
  auto it = computed.find(key);
  if (it == computed.end()) {
    std::vector<std::vector<int32_t>> outputs;
    for (const Prompt& prompt : prompts) outputs.push_back(generate_alone(prompt));
    it = computed.emplace(key, std::move(outputs)).first;
  }
  return it->second;
}

class Results {
 public:
  DeltaSink sink(size_t index) {
    return [this, index](SequenceDelta delta) {
      std::lock_guard lock(mutex_);
      Result& result = results_[index];
      EXPECT_EQ(result.finals, 0) << "request " << index << ": a delta after the final one";
      result.tokens.insert(result.tokens.end(), delta.token_ids.begin(), delta.token_ids.end());
      if (delta.finished) {
        ++result.finals;
        ++finals_;
        done_.notify_all();
      }
      result.last = std::move(delta);
    };
  }
  bool wait_for(int count) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, 300s, [&] { return finals_ >= count; });
  }

  struct Result {
    std::vector<int32_t> tokens;
    int finals = 0;
    SequenceDelta last;
  };
  std::map<size_t, Result> results() const {
    std::lock_guard lock(mutex_);
    return results_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_;
  std::map<size_t, Result> results_;
  int finals_ = 0;
};

double gib_for_blocks(int num_blocks, int block_size) {
  const LoadedModel& loaded = tiny_model().loaded;
  const KvLayout shape =
      kv_layout_for(loaded.model->config(), num_blocks, block_size,
                    loaded.backend->default_kv_dtype(loaded.model->weight_dtype()));
  return static_cast<double>(shape.total_bytes()) / static_cast<double>(1ull << 30);
}

InferenceRequest make_request(size_t index, const Prompt& prompt) {
  InferenceRequest request;
  request.id = "p" + std::to_string(index);
  request.prompt_tokens = prompt.tokens;
  request.sampling = greedy(prompt.max_tokens);
  return request;
}

// Submits the prompts from four threads at once, waits for every final delta and checks each
// output against running the prompt alone. Returns the engine's stats after the run.
ServiceStats run_and_compare(const EngineConfig& config, const std::vector<Prompt>& prompts,
                             const std::vector<std::vector<int32_t>>& expected,
                             size_t submit_first_alone = 0) {
  TinyModel& model = tiny_model();
  std::unique_ptr<LlmEngine> engine =
      make_llm_engine(model.loaded, *model.tokenizer, config).value();
  EXPECT_TRUE(engine->start().ok());
  Results results;
  for (size_t i = 0; i < submit_first_alone; ++i) {
    EXPECT_TRUE(engine->submit(make_request(i, prompts[i]), results.sink(i)).ok());
    EXPECT_TRUE(results.wait_for(static_cast<int>(i + 1)));
  }
  std::vector<std::thread> submitters;
  for (size_t t = 0; t < 4; ++t) {
    submitters.emplace_back([&, t] {
      for (size_t i = submit_first_alone + t; i < prompts.size(); i += 4) {
        const Status status = engine->submit(make_request(i, prompts[i]), results.sink(i));
        EXPECT_TRUE(status.ok()) << status.to_string();
      }
    });
  }
  for (std::thread& thread : submitters) thread.join();
  EXPECT_TRUE(results.wait_for(static_cast<int>(prompts.size()))) << "requests never finished";
  const std::map<size_t, Results::Result> all = results.results();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Results::Result& result = all.at(i);
    EXPECT_EQ(result.finals, 1) << "request " << i;
    EXPECT_TRUE(result.last.error.ok()) << "request " << i << ": " << result.last.error.to_string();
    EXPECT_EQ(result.tokens, expected[i])
        << "request " << i << " (prompt of " << prompts[i].tokens.size() << " tokens)";
  }
  engine->stop();
  const ServiceStats stats = engine->stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  return stats;
}

TEST(ServingEngineTest, ConcurrentGreedyRequestsEqualEachPromptRunAlone) {
  const std::vector<Prompt> prompts = mixed_prompts();
  EngineConfig config;
  config.kv_cache_memory_gib = gib_for_blocks(1024, 16);
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 32;
  config.max_model_len = 256;
  const ServiceStats stats = run_and_compare(config, prompts, expected_for(prompts, "mixed"));
  EXPECT_EQ(stats.preemptions_total, 0);
}

TEST(ServingEngineTest, PreemptionByRecomputeChangesNoToken) {
  const std::vector<Prompt> prompts = mixed_prompts();
  EngineConfig config;
  config.block_size = 4;
  // The longest request needs 29 blocks; 40 cannot hold many at once.
  config.kv_cache_memory_gib = gib_for_blocks(40, 4);
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 32;
  config.max_model_len = 256;
  const ServiceStats stats = run_and_compare(config, prompts, expected_for(prompts, "mixed"));
  EXPECT_GT(stats.preemptions_total, 0);
  EXPECT_EQ(stats.kv_blocks_total, 40);
}

TEST(ServingEngineTest, ChunkedPrefillUnderASmallTokenBudgetChangesNoToken) {
  const std::vector<Prompt> prompts = mixed_prompts();
  EngineConfig config;
  config.kv_cache_memory_gib = gib_for_blocks(1024, 16);
  config.max_num_batched_tokens = 7;  // most prompts take several steps
  config.max_num_seqs = 32;
  config.max_model_len = 256;
  run_and_compare(config, prompts, expected_for(prompts, "mixed"));
}

TEST(ServingEngineTest, ASharedSystemPromptIsServedFromThePrefixCache) {
  const std::vector<Prompt> prompts = shared_prefix_prompts();
  EngineConfig config;
  config.kv_cache_memory_gib = gib_for_blocks(1024, 16);
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 32;
  config.max_model_len = 256;
  // The first request computes the system prompt's blocks; the others find them cached.
  const ServiceStats stats =
      run_and_compare(config, prompts, expected_for(prompts, "shared"), /*submit_first_alone=*/1);
  EXPECT_GE(stats.prefix_cache_hit_tokens, 31 * 64);  // 4 full blocks of the 70 shared tokens
}

// --gpu-memory-utilization sizes a CUDA pool; on the CPU the KV flags stay and an
// out-of-range utilization is refused anyway (exit 2 in the binaries).
TEST(ServingEngineTest, GpuMemoryUtilizationIsCheckedAndTheCpuKeepsItsKvFlags) {
  TinyModel& model = tiny_model();
  for (double utilization : {0.0, -0.1, 1.5, std::nan("")}) {
    EngineConfig config;
    config.gpu_memory_utilization = utilization;
    const Status status = make_llm_engine(model.loaded, *model.tokenizer, config).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << utilization;
    EXPECT_NE(status.message().find("--gpu-memory-utilization"), std::string::npos)
        << status.to_string();
  }
  // The CPU holds no block back: the scheduler gets the whole pool.
  EngineConfig config;
  config.max_model_len = 256;
  config.kv_cache_memory_gib = gib_for_blocks(40, 16);
  std::unique_ptr<LlmEngine> engine =
      std::move(make_llm_engine(model.loaded, *model.tokenizer, config)).value();
  EXPECT_EQ(engine->stats().kv_blocks_total, 40);
}

// Where the CPU weights live: a private copy (the checkpoint's files are no longer mapped once
// load_model returns) or, with weights_mmap, the checkpoint's mmap (still mapped: the model
// computes on it). /proc/self/maps is the oracle.
bool safetensors_of_mapped(const std::filesystem::path& dir) {
  std::ifstream maps("/proc/self/maps");
  const std::string prefix = std::filesystem::canonical(dir).string() + "/";
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(prefix) != std::string::npos && line.find(".safetensors") != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST(ServingLoad, CpuWeightsAreAPrivateCopyUnlessWeightsMmap) {
  const std::filesystem::path dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
                                    ("weights-mmap-" + std::to_string(::getpid()));
  SyntheticCheckpointOptions options;
  options.config_path =
      std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference" / "configs" / "tiny.json";
  options.out_dir = dir;
  options.seed = 3;
  options.num_layers = 1;
  options.dtype = DType::kBF16;
  options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  ASSERT_TRUE(write_synthetic_checkpoint(options).ok());
  {
    const LoadedModel copied = load_model(dir.string(), ModelLoadOptions{}).value();
    EXPECT_FALSE(safetensors_of_mapped(dir));
  }
  {
    ModelLoadOptions load;
    load.weights_mmap = true;
    const LoadedModel mapped = load_model(dir.string(), load).value();
    EXPECT_TRUE(safetensors_of_mapped(dir));
  }
  EXPECT_FALSE(safetensors_of_mapped(dir));  // released with the model
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace pdserve
