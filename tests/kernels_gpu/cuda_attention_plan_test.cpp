// The CUDA attention launch plan: decode batches get split-K until the device is busy,
// prefill tiles stay whole, every key is covered exactly once, and unsupported head sizes
// are refused with a message.
#include <gtest/gtest.h>

#include "kernels/cuda_attention_plan.h"

namespace pdserve {
namespace {

constexpr int kH100Sms = 132;

AttentionShape decode(int seqs, int context, int heads = 32, int kv_heads = 8) {
  return {seqs, seqs, 1, context, heads, kv_heads, 128};
}

void expect_keys_covered(const AttentionPlan& plan, int context) {
  EXPECT_EQ(plan.keys_per_split % kAttentionKeysPerTile, 0);
  EXPECT_GE(int64_t{plan.num_splits} * plan.keys_per_split, context);
  EXPECT_LT(int64_t{plan.num_splits - 1} * plan.keys_per_split, context) << "an empty split";
  EXPECT_EQ(plan.grid_x, plan.row_tiles * plan.num_splits);
}

TEST(CudaAttentionPlan, SingleSequenceDecodeIsSplitAcrossTheDevice) {
  const AttentionPlan plan = plan_paged_attention(decode(1, 8192), kH100Sms).value();
  EXPECT_EQ(plan.group, 4);
  EXPECT_EQ(plan.row_tiles, 1);
  // 8 KV heads x 1 tile = 8 blocks; 33 splits would fill 264, 256-key minimum caps at 32.
  EXPECT_EQ(plan.num_splits, 32);
  expect_keys_covered(plan, 8192);
  EXPECT_EQ(plan.workspace_floats, size_t{32} * 1 * 32 * (128 + 2));
}

TEST(CudaAttentionPlan, ShortContextsAreNotSplitBelowTheMinimum) {
  const AttentionPlan plan = plan_paged_attention(decode(1, 300), kH100Sms).value();
  EXPECT_EQ(plan.num_splits, 2);
  expect_keys_covered(plan, 300);
  const AttentionPlan tiny = plan_paged_attention(decode(1, 1), kH100Sms).value();
  EXPECT_EQ(tiny.num_splits, 1);
  EXPECT_EQ(tiny.workspace_floats, 0u);
}

TEST(CudaAttentionPlan, LargeBatchesNeedNoSplit) {
  const AttentionPlan plan = plan_paged_attention(decode(256, 1024), kH100Sms).value();
  EXPECT_EQ(plan.num_splits, 1);
  EXPECT_EQ(plan.workspace_floats, 0u);
  expect_keys_covered(plan, 1024);
}

TEST(CudaAttentionPlan, SplitsNeverExceedTheCapAndAlwaysCoverTheContext) {
  for (int seqs : {1, 2, 3, 8, 64}) {
    for (int context : {1, 31, 32, 33, 255, 257, 1000, 4096, 40960, 131072}) {
      const AttentionPlan plan = plan_paged_attention(decode(seqs, context), kH100Sms).value();
      EXPECT_LE(plan.num_splits, kAttentionMaxSplits);
      EXPECT_GE(plan.num_splits, 1);
      expect_keys_covered(plan, context);
    }
  }
}

TEST(CudaAttentionPlan, PrefillPacksGroupHeadsIntoRowTiles) {
  // 4k prompt, 16 heads over 8 KV heads: 4096 * 2 rows / 32 = 256 tiles per KV head.
  const AttentionShape prefill{1, 4096, 4096, 4096, 16, 8, 128};
  const AttentionPlan plan = plan_paged_attention(prefill, kH100Sms).value();
  EXPECT_EQ(plan.group, 2);
  EXPECT_EQ(plan.row_tiles, 256);
  EXPECT_EQ(plan.num_splits, 1);
  // Q, padded K and V tiles of 32 rows/keys in float.
  EXPECT_EQ(plan.shared_bytes, sizeof(float) * (32 * 128 + 32 * 129 + 32 * 128));
}

TEST(CudaAttentionPlan, RefusesHeadDimsAndShapesTheKernelCannotRun) {
  AttentionShape shape = decode(1, 100);
  shape.head_dim = 80;
  EXPECT_EQ(plan_paged_attention(shape, kH100Sms).status().code(), StatusCode::kUnimplemented);
  shape.head_dim = 512;
  EXPECT_EQ(plan_paged_attention(shape, kH100Sms).status().code(), StatusCode::kUnimplemented);
  shape = decode(1, 100, 12, 8);  // 12 heads over 8 KV heads
  EXPECT_EQ(plan_paged_attention(shape, kH100Sms).status().code(), StatusCode::kInvalidArgument);
  shape = decode(2, 100);
  shape.max_context_len = 0;
  EXPECT_EQ(plan_paged_attention(shape, kH100Sms).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
