// A serving engine's draft-model proposer (serving/draft_proposer_factory.h): the node's settings
// mapped to the draft's config, and the proposer make_proposer builds from it on the target's
// backend proposing the target's own greedy continuation when the draft is the target (oracle: the
// non-speculative engine under the same settings).
#include <gtest/gtest.h>

#include "common/engine/spec_decode/speculative_config.h"
#include "kernels/model/proposer_factory.h"
#include "serving/draft_proposer_factory.h"
#include "tests/kernels/draft_test_models.h"

namespace pdserve {
namespace {

using draft_test::engine_greedy;
using draft_test::random_tokens;
using draft_test::target_model;

EngineConfig engine_settings() {
  EngineConfig engine;
  engine.block_size = 16;
  engine.max_num_batched_tokens = 256;
  engine.max_num_seqs = 8;
  return engine;
}

TEST(DraftProposerFactory, MapsTheNodesSettingsToTheDraftsConfig) {
  const LoadedModel& target = target_model().loaded;
  DraftProposerSettings settings;
  settings.model = "some/draft";
  settings.num_speculative_tokens = 3;
  settings.target_pool_tokens = 1000;
  EngineConfig engine = engine_settings();
  engine.kv_cache_dtype = DType::kF32;
  const DraftModelProposerConfig config = draft_proposer_config(target, engine, settings).value();
  EXPECT_EQ(config.model, "some/draft");
  EXPECT_EQ(config.num_speculative_tokens, 3);
  EXPECT_EQ(config.num_blocks, 62);  // 1000 tokens in blocks of 16
  EXPECT_EQ(config.block_size, 16);
  EXPECT_EQ(config.dtype, target.model->weight_dtype());
  EXPECT_EQ(config.kv_cache_dtype, DType::kF32);
  EXPECT_EQ(config.limits.max_num_tokens, 256);
  EXPECT_EQ(config.limits.max_num_seqs, 8);
  EXPECT_EQ(config.limits.max_model_len, target.model->config().max_position_embeddings);
  EXPECT_EQ(config.target_vocab_size, target.model->config().vocab_size);
  EXPECT_EQ(config.target_model_dir, target.model_dir);
  // Unset on the node: the backend's default for the weights, as the target's pool.
  EXPECT_FALSE(draft_proposer_config(target, engine_settings(), settings).value().kv_cache_dtype);

  settings.draft_pool_tokens = 160;
  EXPECT_EQ(draft_proposer_config(target, engine_settings(), settings).value().num_blocks, 10);
  settings.draft_pool_tokens = 15;  // less than a block
  const Result<DraftModelProposerConfig> refused =
      draft_proposer_config(target, engine_settings(), settings);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST(DraftProposerFactory, ASelfDraftProposesTheEnginesGreedyContinuation) {
  LoadedModel& target = target_model().loaded;
  DraftProposerSettings settings;
  settings.model = target.model_dir.string();
  settings.num_speculative_tokens = 4;
  settings.target_pool_tokens = 4096;
  SpeculativeConfig speculative;
  speculative.method = SpeculativeMethod::kDraftModel;
  speculative.model = settings.model;
  speculative.num_speculative_tokens = settings.num_speculative_tokens;
  const std::unique_ptr<Proposer> proposer =
      make_proposer(speculative, target,
                    draft_proposer_config(target, engine_settings(), settings).value())
          .value();
  EXPECT_EQ(proposer->method(), "draft_model");
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(300, 1), random_tokens(9, 2)};
  const std::vector<std::vector<int32_t>> greedy = engine_greedy(target, prompts, 4);
  std::vector<ProposalRequest> requests = {{1, prompts[0], 4}, {2, prompts[1], 4}};
  std::vector<std::vector<int32_t>> proposals(2);
  ASSERT_TRUE(proposer->propose(requests, proposals).ok());
  EXPECT_EQ(proposals, greedy);
}

}  // namespace
}  // namespace pdserve
