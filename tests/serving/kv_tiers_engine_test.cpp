// The lower KV tiers through the whole engine on the tiny real model (CPU backend): a prompt's
// prefix evicted from a small pool comes back from the host tier, from the disk tier, and from
// a disk tier kept across an engine restart, with output identical to the same engine without
// tiers (greedy; the CPU backend is batch-invariant) and only the blocks not reloaded computed
// (the oracles: tiers-off output and the prompt tokens each request's prefill chunks computed).
// A corrupt disk block costs the cache only, and the reload rule declines a reload estimated
// slower than recomputing.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "serving/engine_assembly.h"
#include "tests/serving/tiny_model.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

constexpr int kBlockSize = 16;
constexpr int kPoolBlocks = 8;

serving_test::TinyModel& tiny_model() {
  static const std::unique_ptr<serving_test::TinyModel> model =
      serving_test::make_tiny_model("kv-tiers-tiny");
  return *model;
}

KvLayout pool_layout(int num_blocks) {
  const LoadedModel& loaded = tiny_model().loaded;
  return kv_layout_for(loaded.model->config(), num_blocks, kBlockSize,
                       loaded.backend->default_kv_dtype(loaded.model->weight_dtype()));
}

double gib(uint64_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(1ull << 30);
}

std::vector<int32_t> random_prompt(uint32_t seed, int length) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& t : prompt) t = token(random);
  return prompt;
}

struct Outcome {
  std::vector<int32_t> tokens;
  SequenceDelta last;
  int computed_prompt_tokens = 0;  // by the request's prefill chunks
};

// Runs one greedy request to its end.
Outcome run(LlmEngine& engine, const std::vector<int32_t>& prompt, const std::string& id) {
  InferenceRequest request;
  request.id = id;
  request.prompt_tokens = prompt;
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = 4;
  request.sampling.ignore_eos = true;
  std::mutex mutex;
  std::condition_variable done;
  Outcome outcome;
  bool finished = false;
  const Status submitted = engine.submit(request, [&](SequenceDelta delta) {
    std::lock_guard lock(mutex);
    outcome.tokens.insert(outcome.tokens.end(), delta.token_ids.begin(), delta.token_ids.end());
    finished = delta.finished;
    outcome.last = std::move(delta);
    done.notify_all();
  });
  EXPECT_TRUE(submitted.ok()) << submitted.to_string();
  std::unique_lock lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, 120s, [&] { return finished; })) << id << " never finished";
  EXPECT_TRUE(outcome.last.error.ok()) << id << ": " << outcome.last.error.to_string();
  for (const PrefillChunkTiming& chunk : outcome.last.timings.prefill_chunks) {
    outcome.computed_prompt_tokens += chunk.prompt_tokens;
  }
  return outcome;
}

class KvTiersEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-kv-tiers" /
           (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A pool of kPoolBlocks; host tier of `host_blocks` (0: no tiers), disk of `disk_blocks`.
  EngineConfig config(int host_blocks, int disk_blocks = 0) const {
    EngineConfig config;
    config.block_size = kBlockSize;
    config.kv_cache_memory_gib = gib(pool_layout(kPoolBlocks).total_bytes());
    config.max_model_len = kPoolBlocks * kBlockSize;
    config.kv_tier_policy.reload = KvTierPolicy::Reload::kAlways;
    const uint64_t block_bytes = pool_layout(1).bytes_per_block();
    config.kv_offload_host_gib = gib(static_cast<uint64_t>(host_blocks) * block_bytes);
    if (disk_blocks > 0) {
      config.kv_offload_disk_dir = dir_.string();
      config.kv_offload_disk_gib = gib(static_cast<uint64_t>(disk_blocks) * (block_bytes + 4096));
    }
    return config;
  }
  std::unique_ptr<LlmEngine> engine(const EngineConfig& config) const {
    serving_test::TinyModel& model = tiny_model();
    Result<std::unique_ptr<LlmEngine>> made =
        make_llm_engine(model.loaded, *model.tokenizer, config);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    EXPECT_TRUE((*made)->start().ok());
    return std::move(*made);
  }
  // Four other 100-token prompts: together they take the whole pool several times over.
  void evict_from_pool(LlmEngine& engine) const {
    for (uint32_t seed = 11; seed < 15; ++seed) {
      (void)run(engine, random_prompt(seed, 100), "other-" + std::to_string(seed));
    }
  }

  // The prompt whose prefix comes back: 80 tokens, 4 whole blocks before its last token.
  const std::vector<int32_t> prompt_ = random_prompt(7, 80);
  std::filesystem::path dir_;
};

TEST_F(KvTiersEngineTest, APrefixEvictedFromThePoolComesBackFromTheHostTier) {
  auto plain = engine(config(0));
  const Outcome expected = run(*plain, prompt_, "alone");
  ASSERT_EQ(expected.computed_prompt_tokens, 80);
  evict_from_pool(*plain);
  EXPECT_EQ(run(*plain, prompt_, "again").computed_prompt_tokens, 80);  // the pool lost it

  auto tiered = engine(config(32));
  ASSERT_EQ(run(*tiered, prompt_, "first").tokens, expected.tokens);
  evict_from_pool(*tiered);
  const Outcome again = run(*tiered, prompt_, "again");
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.computed_prompt_tokens, 16);
  EXPECT_EQ(again.last.cached_prompt_tokens, 64);
  ASSERT_TRUE(again.last.timings.kv_reload.has_value());
  EXPECT_TRUE(again.last.timings.kv_reload->ok);
  EXPECT_EQ(again.last.timings.kv_reload->host_blocks, 4);
  EXPECT_EQ(again.last.timings.kv_reload->tokens, 64);
  const ServiceStats stats = tiered->stats();
  EXPECT_EQ(stats.kv_tiers.reloaded_tokens_total, 64);
  EXPECT_EQ(stats.kv_tiers.host.hit_blocks_total, 4);
  EXPECT_GT(stats.kv_tiers.offloaded_blocks_total, 4);
  EXPECT_EQ(stats.kv_tiers.reloads_failed_total, 0);
}

TEST_F(KvTiersEngineTest, APrefixSpilledToDiskComesBackFromTheDiskTier) {
  auto plain = engine(config(0));
  const Outcome expected = run(*plain, prompt_, "alone");

  // Two host slots (one kept free): every other block goes down to the disk.
  auto tiered = engine(config(2, 64));
  ASSERT_EQ(run(*tiered, prompt_, "first").tokens, expected.tokens);
  evict_from_pool(*tiered);
  const Outcome again = run(*tiered, prompt_, "again");
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.computed_prompt_tokens, 16);
  ASSERT_TRUE(again.last.timings.kv_reload.has_value());
  EXPECT_EQ(again.last.timings.kv_reload->disk_blocks, 4);
  EXPECT_EQ(tiered->stats().kv_tiers.disk.hit_blocks_total, 4);
}

TEST_F(KvTiersEngineTest, TheDiskTierServesTheSamePrefixAfterARestart) {
  auto plain = engine(config(0));
  const Outcome expected = run(*plain, prompt_, "alone");
  {
    auto before = engine(config(2, 64));
    (void)run(*before, prompt_, "first");
    evict_from_pool(*before);
    before->stop();
  }
  auto after = engine(config(2, 64));
  const Outcome again = run(*after, prompt_, "after-restart");
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.computed_prompt_tokens, 16);
  EXPECT_EQ(after->stats().kv_tiers.disk.hit_blocks_total, 4);
}

TEST_F(KvTiersEngineTest, ACorruptDiskBlockCostsTheCacheNotTheRequest) {
  auto plain = engine(config(0));
  const Outcome expected = run(*plain, prompt_, "alone");
  {
    auto before = engine(config(2, 64));
    (void)run(*before, prompt_, "first");
    evict_from_pool(*before);
    before->stop();
  }
  // Flip a byte near the end (the KV payload) of every block file.
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "blocks")) {
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-3, std::ios::end);
    const char byte = static_cast<char>(file.get());
    file.seekp(-3, std::ios::end);
    file.put(static_cast<char>(byte ^ 0x40));
  }
  auto after = engine(config(2, 64));
  const Outcome again = run(*after, prompt_, "after-corruption");
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.computed_prompt_tokens, 80);
  ASSERT_TRUE(again.last.timings.kv_reload.has_value());
  EXPECT_FALSE(again.last.timings.kv_reload->ok);
  const ServiceStats stats = after->stats();
  EXPECT_EQ(stats.kv_tiers.reloads_failed_total, 1);
  EXPECT_GE(stats.kv_tiers.checksum_mismatches_total, 1);
}

TEST_F(KvTiersEngineTest, AReloadEstimatedSlowerThanRecomputingIsDeclined) {
  auto plain = engine(config(0));
  const Outcome expected = run(*plain, prompt_, "alone");
  EngineConfig slow = config(32);
  slow.kv_tier_policy.reload = KvTierPolicy::Reload::kWhenFaster;
  slow.kv_tier_policy.prior_host_bytes_per_second = 1.0;  // a block would take hours
  auto tiered = engine(slow);
  (void)run(*tiered, prompt_, "first");  // measures the prefill rate
  evict_from_pool(*tiered);
  const Outcome again = run(*tiered, prompt_, "again");
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.computed_prompt_tokens, 80);
  EXPECT_FALSE(again.last.timings.kv_reload.has_value());
  EXPECT_EQ(tiered->stats().kv_tiers.reloads_declined_total, 1);
}

TEST_F(KvTiersEngineTest, BadTierSettingsAreRefused) {
  serving_test::TinyModel& model = tiny_model();
  EngineConfig missing_dir = config(4, 4);
  missing_dir.kv_offload_disk_dir = (dir_ / "missing").string();
  EXPECT_EQ(make_llm_engine(model.loaded, *model.tokenizer, missing_dir).status().code(),
            StatusCode::kInvalidArgument);
  EngineConfig disk_without_host = config(0);
  disk_without_host.kv_offload_disk_dir = dir_.string();
  disk_without_host.kv_offload_disk_gib = 1;
  EXPECT_EQ(make_llm_engine(model.loaded, *model.tokenizer, disk_without_host).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
