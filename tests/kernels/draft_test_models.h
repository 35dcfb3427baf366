// The models and the oracle of the draft-model proposer's tests: the tiny synthetic Qwen3 of
// the serving tests as the target (and as its own draft), smaller or incompatible drafts written
// beside it, and the non-speculative engine's greedy continuation of a prompt.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/model/synthetic_checkpoint.h"
#include "kernels/model/draft_model_proposer.h"
#include "serving/engine_assembly.h"

namespace pdserve::draft_test {

using namespace std::chrono_literals;

// A synthetic checkpoint beside the target: tiny.json with `edit` applied to its config.
// Removed at the end of the test process.
class ScratchCheckpoint {
 public:
  ScratchCheckpoint(const std::string& name, uint64_t seed, int num_layers,
                    const std::function<void(nlohmann::json&)>& edit = {}, bool tied = true) {
    dir_ = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
           (name + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_.parent_path());
    const std::filesystem::path tiny =
        std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference" / "configs" / "tiny.json";
    nlohmann::json config = nlohmann::json::parse(std::ifstream(tiny));
    if (edit) edit(config);
    const std::filesystem::path config_path = dir_.string() + ".config.json";
    std::ofstream(config_path) << config.dump(2);
    SyntheticCheckpointOptions options;
    options.config_path = config_path;
    options.out_dir = dir_;
    options.seed = seed;
    options.num_layers = num_layers;
    options.dtype = DType::kBF16;
    options.tie_word_embeddings = tied;
    options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
    const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
    EXPECT_TRUE(written.ok()) << written.status().to_string();
    std::filesystem::remove(config_path);
  }
  ~ScratchCheckpoint() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// The target: tiny.json's shape with 2 layers and untied embeddings (with tied ones the random
// weights' greedy continuation repeats one token, too easy a check), loaded as the engine loads
// a model.
struct TargetModel {
  ScratchCheckpoint checkpoint{"draft-target", 7, 2, {}, /*tied=*/false};
  LoadedModel loaded = load_model(checkpoint.dir().string(), ModelLoadOptions{}).value();
  const std::filesystem::path& dir() const { return checkpoint.dir(); }
};

inline TargetModel& target_model() {
  static TargetModel model;
  return model;
}

// A draft config over `model_dir` for the tiny target: k tokens, a pool of num_blocks x 16,
// small forwards (prompts of more than 48 tokens take several chunks, more than 3 sequences
// several forwards per step).
inline DraftModelProposerConfig draft_config(const std::filesystem::path& model_dir, int k,
                                             int num_blocks) {
  DraftModelProposerConfig config;
  config.model = model_dir.string();
  config.num_speculative_tokens = k;
  config.num_blocks = num_blocks;
  config.block_size = 16;
  config.limits.max_num_tokens = 48;
  config.limits.max_num_seqs = 3;
  config.limits.max_model_len = 512;
  config.target_vocab_size = target_model().loaded.model->config().vocab_size;
  config.target_model_dir = target_model().dir();
  return config;
}

inline std::vector<int32_t> random_tokens(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = token(random);
  return tokens;
}

// The oracle: each prompt's first `count` greedy tokens from the non-speculative engine
// (LlmEngine over Qwen3ModelRunner) on `model`, all prompts submitted at once.
inline std::vector<std::vector<int32_t>> engine_greedy(
    LoadedModel& model, const std::vector<std::vector<int32_t>>& prompts, int count) {
  const Tokenizer tokenizer = Tokenizer::from_model_dir(model.model_dir).value();
  EngineConfig config;
  config.kv_cache_memory_gib = 0.05;
  config.max_model_len = 512;
  std::unique_ptr<LlmEngine> engine = make_llm_engine(model, tokenizer, config).value();
  EXPECT_TRUE(engine->start().ok());
  std::mutex mutex;
  std::condition_variable done;
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  size_t finished = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    InferenceRequest request;
    request.id = "oracle-" + std::to_string(i);
    request.prompt_tokens = prompts[i];
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = count;
    request.sampling.ignore_eos = true;
    const Status submitted = engine->submit(std::move(request), [&, i](SequenceDelta delta) {
      std::lock_guard lock(mutex);
      EXPECT_TRUE(delta.error.ok()) << delta.error.to_string();
      outputs[i].insert(outputs[i].end(), delta.token_ids.begin(), delta.token_ids.end());
      if (delta.finished) {
        ++finished;
        done.notify_all();
      }
    });
    EXPECT_TRUE(submitted.ok()) << submitted.to_string();
  }
  {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, 120s, [&] { return finished == prompts.size(); }))
        << "the oracle engine never finished";
  }
  engine->stop();
  return outputs;
}

// propose() for (seq id, tokens, max proposals) triples; asserts it succeeds.
struct Ask {
  SeqId seq_id = 0;
  std::vector<int32_t> tokens;
  int max_proposals = 0;
};

inline std::vector<std::vector<int32_t>> propose_ok(Proposer& proposer,
                                                    const std::vector<Ask>& asks) {
  std::vector<ProposalRequest> requests;
  for (const Ask& ask : asks) requests.push_back({ask.seq_id, ask.tokens, ask.max_proposals});
  std::vector<std::vector<int32_t>> proposals(asks.size(), std::vector<int32_t>{-1});
  const Status status = proposer.propose(requests, proposals);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return proposals;
}

}  // namespace pdserve::draft_test
