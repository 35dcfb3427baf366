// pdserve-bench-gpu's KV pool sizing: from the free memory, never beyond it, at every batch.
#include "bench/gpu/bench_kv_plan.h"

#include <gtest/gtest.h>

#include "common/model/model_config.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/kv_cache.h"

namespace pdserve {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// The Qwen3-8B shape's KV block: 36 layers x 8 KV heads x 128 x (K, V) x bf16 x 16 tokens.
size_t qwen3_8b_block_bytes() {
  ModelConfig config;
  config.num_hidden_layers = 36;
  config.num_key_value_heads = 8;
  config.head_dim = 128;
  return kv_layout_for(config, 1, 16, DType::kBF16).total_bytes();
}

BenchKvInputs h100_after_8b_weights() {
  BenchKvInputs in;
  in.free_bytes = 79 * kGiB - 16 * kGiB;  // an H100 once the 8B shape's bf16 weights are placed
  in.reserve_bytes = 4 * kGiB;
  in.block_bytes = qwen3_8b_block_bytes();
  in.block_size = 16;
  in.context = 1024;
  in.prompt = 4096;
  in.batches = {1, 8, 64, 256};
  return in;
}

TEST(BenchKvPlan, TheDefaultsFitAnH100AfterThe8BWeights) {
  const BenchKvInputs in = h100_after_8b_weights();
  EXPECT_EQ(in.block_bytes, 2359296u);  // 147,456 bytes per token
  const BenchKvPlan plan = plan_bench_kv(in).value();
  EXPECT_EQ(plan.decode_blocks_per_seq, 65);  // 1025 tokens
  EXPECT_EQ(plan.prefill_blocks, 256);
  EXPECT_EQ(plan.batches, (std::vector<int>{1, 8, 64, 256}));
  EXPECT_TRUE(plan.skipped.empty());
  EXPECT_EQ(plan.num_blocks, 256 * 65 + 1);
  EXPECT_EQ(plan.scratch_block, 256 * 65);
  EXPECT_LE(plan.num_blocks * in.block_bytes, in.free_bytes - in.reserve_bytes);
  // The sizing it replaces: max(prompt, context + 1) tokens for each of 256 sequences.
  const size_t old_bytes = size_t{256} * 256 * in.block_bytes;
  EXPECT_GT(old_bytes, 150 * size_t{1000000000}) << "the old sizing asked for ~155 GB";
}

TEST(BenchKvPlan, BatchesThatDoNotFitAreSkippedNotAllocated) {
  BenchKvInputs in = h100_after_8b_weights();
  in.free_bytes = 20 * kGiB;  // a smaller card: 16 GiB usable = 7281 blocks
  const BenchKvPlan plan = plan_bench_kv(in).value();
  EXPECT_EQ(plan.batches, (std::vector<int>{1, 8, 64}));
  EXPECT_EQ(plan.skipped, (std::vector<int>{256}));
  EXPECT_EQ(plan.num_blocks, 64 * 65 + 1);
  EXPECT_LE(plan.num_blocks * in.block_bytes, in.free_bytes - in.reserve_bytes);
}

TEST(BenchKvPlan, APromptLongerThanTheDecodeNeedSetsThePool) {
  BenchKvInputs in = h100_after_8b_weights();
  in.batches = {1};
  const BenchKvPlan plan = plan_bench_kv(in).value();
  EXPECT_EQ(plan.num_blocks, 256 + 1) << "the prompt's 256 blocks, shared with the decode ones";
}

TEST(BenchKvPlan, NothingFitsIsAClearError) {
  BenchKvInputs in = h100_after_8b_weights();
  in.free_bytes = in.reserve_bytes + 100 * in.block_bytes;  // not even the 4k prompt
  const Result<BenchKvPlan> plan = plan_bench_kv(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("4096-token prompt"), std::string::npos)
      << plan.status().to_string();
  in.prompt = 16;
  in.batches = {8};  // 8 x 65 blocks do not fit in 100
  EXPECT_EQ(plan_bench_kv(in).status().code(), StatusCode::kResourceExhausted);
  in.batches = {0};
  EXPECT_EQ(plan_bench_kv(in).status().code(), StatusCode::kInvalidArgument);
  in.free_bytes = 0;  // less free than the reserve
  in.batches = {1};
  EXPECT_EQ(plan_bench_kv(in).status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pdserve
