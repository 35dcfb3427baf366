// Decode graph buckets and batch padding. The padding property that matters is checked with
// the CPU backend: attention over a padded batch gives every real sequence exactly the
// output it gets unpadded, and padding writes no KV outside the scratch block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_attention_plan.h"
#include "kernels/model/forward_batch.h"
#include "kernels/model/gpu_decode_graphs.h"

namespace pdserve {
namespace {

TEST(DecodeGraphBuckets, PowersOfTwoUpToTheBatchLimitCappedAt256) {
  EXPECT_EQ(decode_graph_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(decode_graph_buckets(8), (std::vector<int>{1, 2, 4, 8}));
  // Never more than the forward context holds.
  EXPECT_EQ(decode_graph_buckets(9), (std::vector<int>{1, 2, 4, 8, 9}));
  EXPECT_EQ(decode_graph_buckets(100), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(decode_graph_buckets(1000), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_TRUE(decode_graph_buckets(0).empty());
}

TEST(DecodeGraphBuckets, ChoosesTheSmallestBucketThatHoldsTheBatch) {
  const std::vector<int> buckets = decode_graph_buckets(256);
  for (int n = 1; n <= 256; ++n) {
    const int bucket = choose_decode_bucket(buckets, n).value();
    EXPECT_GE(bucket, n);
    EXPECT_LT(bucket, 2 * n) << "bucket " << bucket << " wastes more than half for " << n;
  }
  EXPECT_FALSE(choose_decode_bucket(buckets, 257).has_value());
  EXPECT_FALSE(choose_decode_bucket(buckets, 0).has_value());
}

TEST(DecodeGraphBuckets, ContextBucketsDoubleFrom1024UpToMaxModelLen) {
  EXPECT_EQ(decode_context_buckets(40960),
            (std::vector<int>{1024, 2048, 4096, 8192, 16384, 32768, 40960}));
  EXPECT_EQ(decode_context_buckets(4096), (std::vector<int>{1024, 2048, 4096}));
  EXPECT_EQ(decode_context_buckets(1025), (std::vector<int>{1024, 1025}));
  EXPECT_EQ(decode_context_buckets(1024), (std::vector<int>{1024}));
  EXPECT_EQ(decode_context_buckets(256), (std::vector<int>{256}));
  EXPECT_TRUE(decode_context_buckets(0).empty());
}

TEST(DecodeGraphBuckets, AStepTakesTheSmallestBatchAndContextBucketsHoldingIt) {
  const std::vector<int> batches = decode_graph_buckets(64);
  const std::vector<int> contexts = decode_context_buckets(40960);
  EXPECT_EQ(choose_decode_graph(batches, contexts, 3, 100), (DecodeGraphKey{4, 1024}));
  EXPECT_EQ(choose_decode_graph(batches, contexts, 4, 1024), (DecodeGraphKey{4, 1024}));
  EXPECT_EQ(choose_decode_graph(batches, contexts, 5, 1025), (DecodeGraphKey{8, 2048}));
  EXPECT_EQ(choose_decode_graph(batches, contexts, 64, 40960), (DecodeGraphKey{64, 40960}));
  EXPECT_EQ(choose_decode_graph(batches, contexts, 1, 32769), (DecodeGraphKey{1, 40960}));
  EXPECT_FALSE(choose_decode_graph(batches, contexts, 65, 100).has_value());
  EXPECT_FALSE(choose_decode_graph(batches, contexts, 1, 40961).has_value());
  EXPECT_FALSE(choose_decode_graph(batches, contexts, 0, 100).has_value());
  EXPECT_FALSE(choose_decode_graph(batches, contexts, 1, 0).has_value());
}

// What context buckets are for: the split-K plan a graph freezes is chosen for its bucket, so
// a step's keys spread over at least half as many splits as a plan made for the step's own
// context would use, for every context and batch size (Qwen3-8B's attention on 132 SMs).
// Frozen at max_model_len, a 1k-context step would use 1 split where its own plan has 4.
TEST(DecodeGraphBuckets, ABucketsSplitPlanKeepsAtLeastHalfTheStepsOwnSplits) {
  constexpr int kSms = 132;
  constexpr int kMaxModelLen = 40960;
  const std::vector<int> contexts = decode_context_buckets(kMaxModelLen);
  const auto plan = [&](int seqs, int context) {
    AttentionShape shape;
    shape.num_seqs = shape.num_tokens = seqs;
    shape.max_query_len = 1;
    shape.max_context_len = context;
    shape.num_heads = 32;
    shape.num_kv_heads = 8;
    shape.head_dim = 128;
    return plan_paged_attention(shape, kSms).value();
  };
  // The splits that hold any of a context's keys under a plan made for a longer one.
  const auto active_splits = [](const AttentionPlan& p, int context) {
    return (context + p.keys_per_split - 1) / p.keys_per_split;
  };
  for (int batch : {1, 2, 4, 8, 16, 64, 256}) {
    for (int context = 1; context <= kMaxModelLen; context += 97) {
      const DecodeGraphKey key =
          choose_decode_graph(decode_graph_buckets(256), contexts, batch, context).value();
      const int own = plan(key.batch, context).num_splits;
      const int bucketed = active_splits(plan(key.batch, key.context), context);
      ASSERT_GE(2 * bucketed, own) << "batch " << batch << ", context " << context;
    }
  }
  EXPECT_LT(2 * active_splits(plan(1, kMaxModelLen), 1024), plan(1, 1024).num_splits)
      << "a plan frozen at max_model_len starves a short step";
}

struct DecodeFixture {
  static constexpr int kBlockSize = 4;
  static constexpr int kNumBlocks = 12;
  static constexpr int kScratchBlock = 11;
  static constexpr int kHeads = 4;
  static constexpr int kKvHeads = 2;
  static constexpr int kHeadDim = 8;
  std::vector<std::vector<int32_t>> tables = {{0, 1, 2}, {3}, {4, 5, 6, 7}};
  std::vector<std::vector<int32_t>> tokens = {{5}, {6}, {7}};
  std::vector<int> cached = {9, 2, 13};
  HostBatch batch;

  DecodeFixture() {
    std::vector<SequenceSlice> slices;
    for (size_t i = 0; i < tables.size(); ++i) {
      slices.push_back({tokens[i], cached[i], tables[i]});
    }
    BatchLimits limits;
    limits.max_num_tokens = 64;
    limits.max_num_seqs = 8;
    limits.max_blocks_per_seq = 4;
    limits.block_size = kBlockSize;
    limits.num_blocks = kNumBlocks;
    limits.vocab_size = 100;
    limits.max_position_embeddings = 16;
    EXPECT_TRUE(build_host_batch(slices, limits, batch).ok());
  }
};

TEST(PadDecodeBatch, PaddingSequencesUseOnlyTheScratchBlock) {
  DecodeFixture f;
  const HostBatch original = f.batch;
  ASSERT_TRUE(
      pad_decode_batch(f.batch, 8, DecodeFixture::kScratchBlock, DecodeFixture::kBlockSize, 24)
          .ok());
  EXPECT_EQ(f.batch.num_seqs, 8);
  EXPECT_EQ(f.batch.num_tokens, 8);
  EXPECT_EQ(f.batch.max_context_len, 24);
  ASSERT_EQ(f.batch.query_start.size(), 9u);
  // Rows re-strided from 4 entries to the graph's 24 / 4 = 6, real entries kept.
  EXPECT_EQ(original.max_blocks_per_seq, 4);
  ASSERT_EQ(f.batch.max_blocks_per_seq, 6);
  ASSERT_EQ(f.batch.block_tables.size(), 8u * 6u);
  for (size_t s = 0; s < 3; ++s) {
    const int used =
        (original.context_lens[s] + DecodeFixture::kBlockSize - 1) / DecodeFixture::kBlockSize;
    for (size_t b = 0; b < static_cast<size_t>(used); ++b) {
      EXPECT_EQ(f.batch.block_tables[s * 6 + b], original.block_tables[s * 4 + b]);
    }
  }
  for (size_t b = 0; b < 6; ++b) {
    EXPECT_EQ(f.batch.block_tables[3 * 6 + b], DecodeFixture::kScratchBlock);
  }
  for (int s = 0; s < 8; ++s) EXPECT_EQ(f.batch.query_start[static_cast<size_t>(s) + 1], s + 1);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(f.batch.slot_mapping[s], original.slot_mapping[s]);
    EXPECT_EQ(f.batch.context_lens[s], original.context_lens[s]);
  }
  for (size_t s = 3; s < 8; ++s) {
    EXPECT_EQ(f.batch.slot_mapping[s] / DecodeFixture::kBlockSize, DecodeFixture::kScratchBlock);
    EXPECT_EQ(f.batch.context_lens[s], 1);
    EXPECT_EQ(f.batch.logits_rows[s], static_cast<int32_t>(s));
  }
}

TEST(PadDecodeBatch, RefusesPrefillBatchesSmallBucketsAndLongContexts) {
  DecodeFixture f;
  EXPECT_EQ(pad_decode_batch(f.batch, 2, 11, 4, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pad_decode_batch(f.batch, 4, 11, 4, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pad_decode_batch(f.batch, 4, -1, 4, 16).code(), StatusCode::kInvalidArgument);
  HostBatch prefill = f.batch;
  prefill.num_tokens = 4;
  prefill.max_query_len = 2;
  EXPECT_EQ(pad_decode_batch(prefill, 4, 11, 4, 16).code(), StatusCode::kInvalidArgument);
}

AttentionBatch view_of(HostBatch& host) {
  AttentionBatch batch;
  batch.num_seqs = host.num_seqs;
  batch.num_tokens = host.num_tokens;
  batch.max_blocks_per_seq = host.max_blocks_per_seq;
  batch.max_query_len = host.max_query_len;
  batch.max_context_len = host.max_context_len;
  batch.query_start = host.query_start.data();
  batch.context_lens = host.context_lens.data();
  batch.block_tables = host.block_tables.data();
  batch.positions = host.positions.data();
  batch.slot_mapping = host.slot_mapping.data();
  return batch;
}

TEST(PadDecodeBatch, RealSequencesGetTheSameAttentionOutputAndKvWhenPadded) {
  using F = DecodeFixture;
  std::unique_ptr<Backend> cpu = std::move(create_backend(BackendOptions{})).value();
  const KvLayout layout{1, F::kNumBlocks, F::kBlockSize, F::kKvHeads, F::kHeadDim, DType::kF32};
  const int64_t token_elements = layout.token_elements();
  const auto pool = static_cast<size_t>(layout.layer_elements());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> k_pool(pool), v_pool(pool);
  for (float& x : k_pool) x = normal(rng);
  for (float& x : v_pool) x = normal(rng);
  std::vector<float> norm_weight(F::kHeadDim, 1.0f);

  const auto run = [&](bool padded, std::vector<float>& k, std::vector<float>& v) {
    DecodeFixture f;
    if (padded) {
      EXPECT_TRUE(pad_decode_batch(f.batch, 8, F::kScratchBlock, F::kBlockSize, 24).ok());
    }
    const int64_t tokens = f.batch.num_tokens;
    std::vector<float> q(static_cast<size_t>(tokens * F::kHeads * F::kHeadDim));
    std::vector<float> new_k(static_cast<size_t>(tokens * token_elements));
    std::vector<float> new_v(new_k.size());
    std::mt19937 input_rng(5);  // token by token, so the real rows get the same inputs
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < F::kHeads * F::kHeadDim; ++j) {
        q[static_cast<size_t>(t * F::kHeads * F::kHeadDim + j)] = normal(input_rng);
      }
      for (int64_t j = 0; j < token_elements; ++j) {
        new_k[static_cast<size_t>(t * token_elements + j)] = normal(input_rng);
        new_v[static_cast<size_t>(t * token_elements + j)] = normal(input_rng);
      }
    }
    KvCacheView cache{k.data(), v.data(), layout};
    QkNormRopeParams rope;
    rope.q_norm_weight = {norm_weight.data(), DType::kF32, F::kHeadDim};
    rope.k_norm_weight = rope.q_norm_weight;
    rope.num_heads = F::kHeads;
    rope.num_kv_heads = F::kKvHeads;
    rope.head_dim = F::kHeadDim;
    const AttentionBatch batch = view_of(f.batch);
    const auto m = [&](std::vector<float>& data, int64_t cols) {
      return MatrixView::dense(data.data(), DType::kF32, tokens, cols);
    };
    EXPECT_TRUE(cpu->qk_norm_rope_kv_write(m(q, F::kHeads * F::kHeadDim), m(new_k, token_elements),
                                           m(new_v, token_elements), rope, batch, cache, 0)
                    .ok());
    std::vector<float> out(q.size(), std::nanf(""));
    EXPECT_TRUE(cpu->paged_attention(m(q, F::kHeads * F::kHeadDim), batch, cache, 0, F::kHeads,
                                     0.35f, m(out, F::kHeads * F::kHeadDim))
                    .ok());
    return out;
  };
  std::vector<float> k_plain = k_pool, v_plain = v_pool, k_padded = k_pool, v_padded = v_pool;
  const std::vector<float> plain = run(false, k_plain, v_plain);
  const std::vector<float> padded = run(true, k_padded, v_padded);
  ASSERT_GT(padded.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], padded[i]) << i;
  // Outside the scratch block the pools are bitwise the same.
  const auto scratch_begin =
      static_cast<size_t>(kv_element(layout, 0, kv_slot(layout, F::kScratchBlock, 0)));
  for (size_t i = 0; i < scratch_begin; ++i) {
    ASSERT_EQ(k_plain[i], k_padded[i]) << i;
    ASSERT_EQ(v_plain[i], v_padded[i]) << i;
  }
}

}  // namespace
}  // namespace pdserve
