// The draft-model proposer of speculative decoding (kernels/model/draft_model_proposer.h) on the
// CPU backend with tiny synthetic Qwen3 checkpoints. Oracles: the non-speculative engine's
// greedy output (LlmEngine; a draft equal to the target must propose exactly its greedy
// continuation, i.e. acceptance 1.0), a fresh proposer (a rolled-back one must propose what a
// proposer that never saw the old tokens proposes) and the pool's invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "kernels/model/draft_model_proposer.h"
#include "tests/kernels/draft_test_models.h"

namespace pdserve {
namespace {

using draft_test::Ask;
using draft_test::draft_config;
using draft_test::engine_greedy;
using draft_test::propose_ok;
using draft_test::random_tokens;
using draft_test::ScratchCheckpoint;
using draft_test::target_model;

std::unique_ptr<DraftModelProposer> make_proposer(const DraftModelProposerConfig& config) {
  Result<std::unique_ptr<DraftModelProposer>> proposer =
      DraftModelProposer::create(config, *target_model().loaded.backend);
  EXPECT_TRUE(proposer.ok()) << proposer.status().to_string();
  return std::move(proposer).value();
}

std::vector<int32_t> concat(const std::vector<int32_t>& a, std::span<const int32_t> b) {
  std::vector<int32_t> joined = a;
  joined.insert(joined.end(), b.begin(), b.end());
  return joined;
}

// Prompts of 1 to 130 tokens: single tokens, block boundaries (16, 17) and prompts taking
// several 48-token chunks.
std::vector<std::vector<int32_t>> mixed_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  const size_t lengths[] = {1, 5, 16, 17, 47, 60, 130};
  for (size_t i = 0; i < std::size(lengths); ++i) {
    prompts.push_back(random_tokens(lengths[i], 100 + static_cast<uint32_t>(i)));
  }
  return prompts;
}

// The engine's use, with every proposal accepted: each round a changing mix of sequences asks
// for 1 to 6 proposals (k = 4 caps them) and then takes the accepted tokens plus the target's
// next token. Proposals must be the target's greedy continuation at every round.
TEST(DraftModelProposer, SelfDraftProposesTheTargetsGreedyContinuation) {
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  constexpr int kContinuation = 40;
  const std::vector<std::vector<int32_t>> greedy =
      engine_greedy(target_model().loaded, prompts, kContinuation);
  std::unique_ptr<DraftModelProposer> proposer =
      make_proposer(draft_config(target_model().dir(), 4, 256));
  for (const std::vector<int32_t>& output : greedy) {  // a continuation worth predicting
    EXPECT_GT(std::set<int32_t>(output.begin(), output.end()).size(), 5u);
  }
  std::vector<size_t> position(prompts.size(), 0);  // output tokens the engine has so far
  int proposed = 0, accepted = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<Ask> asks;
    std::vector<size_t> who;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if ((i + static_cast<size_t>(round)) % 3 == 0) continue;  // not in this step's batch
      const int max_proposals = 1 + static_cast<int>((i + static_cast<size_t>(round)) % 6);
      if (position[i] + 4 + 1 > greedy[i].size()) continue;
      asks.push_back({static_cast<SeqId>(i),
                      concat(prompts[i], std::span(greedy[i]).first(position[i])), max_proposals});
      who.push_back(i);
    }
    const std::vector<std::vector<int32_t>> proposals = propose_ok(*proposer, asks);
    for (size_t a = 0; a < asks.size(); ++a) {
      const size_t i = who[a];
      const size_t expected_count = static_cast<size_t>(std::min(asks[a].max_proposals, 4));
      const std::span<const int32_t> expected =
          std::span(greedy[i]).subspan(position[i], expected_count);
      EXPECT_EQ(proposals[a], std::vector<int32_t>(expected.begin(), expected.end()))
          << "prompt " << i << " (" << prompts[i].size() << " tokens) at output " << position[i];
      proposed += static_cast<int>(proposals[a].size());
      for (size_t t = 0; t < proposals[a].size() && proposals[a][t] == expected[t]; ++t) ++accepted;
      position[i] += proposals[a].size() + 1;  // the accepted tokens and the target's bonus token
    }
    ASSERT_TRUE(proposer->sequences().check_invariants().ok());
  }
  EXPECT_GT(proposed, 100);
  EXPECT_EQ(accepted, proposed) << "acceptance " << accepted << "/" << proposed;
}

// Tokens that diverge from earlier proposals (a rejected draft token replaced by the target's,
// fewer tokens, a block boundary crossed backwards, a sequence replaced under its id): the
// proposals equal those of a fresh proposer on the same tokens.
TEST(DraftModelProposer, RolledBackSequencesProposeAsAFreshProposer) {
  const DraftModelProposerConfig config = draft_config(target_model().dir(), 5, 256);
  std::unique_ptr<DraftModelProposer> proposer = make_proposer(config);
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  std::vector<Ask> first;
  for (size_t i = 0; i < prompts.size(); ++i)
    first.push_back({static_cast<SeqId>(i), prompts[i], 5});
  const std::vector<std::vector<int32_t>> earlier = propose_ok(*proposer, first);

  std::vector<Ask> diverging;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& drafted = earlier[i];
    ASSERT_EQ(drafted.size(), 5u);
    std::vector<int32_t> tokens = prompts[i];
    switch (i % 4) {
      case 0:  // two accepted, the third replaced by another token
        tokens.insert(tokens.end(), drafted.begin(), drafted.begin() + 2);
        tokens.push_back((drafted[2] + 1) % 151936);
        break;
      case 1:  // the first rejected
        tokens.push_back((drafted[0] + 7) % 151936);
        break;
      case 2:  // cut back into the prompt (across a block boundary for the longer ones)
        tokens.resize(tokens.size() > 17 ? tokens.size() - 17 : 1);
        break;
      default:  // another sequence under the same id
        tokens = random_tokens(tokens.size() + 3, 900 + static_cast<uint32_t>(i));
        break;
    }
    diverging.push_back({static_cast<SeqId>(i), tokens, 5});
  }
  const std::vector<std::vector<int32_t>> rolled_back = propose_ok(*proposer, diverging);
  std::unique_ptr<DraftModelProposer> fresh = make_proposer(config);
  const std::vector<std::vector<int32_t>> expected = propose_ok(*fresh, diverging);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(rolled_back[i].size(), 5u) << "sequence " << i;
    EXPECT_EQ(rolled_back[i], expected[i]) << "sequence " << i << " (case " << i % 4 << ")";
  }
  EXPECT_TRUE(proposer->sequences().check_invariants().ok());
  // And the other way: the rolled-back proposer keeps agreeing as the sequences go on.
  for (size_t i = 0; i < diverging.size(); ++i) {
    diverging[i].tokens = concat(diverging[i].tokens, std::span(expected[i]).first(3));
  }
  EXPECT_EQ(propose_ok(*proposer, diverging), propose_ok(*make_proposer(config), diverging));
}

// A smaller draft (1 layer, other weights, same tokenizer) proposes valid ids: exactly its own
// greedy continuation, as the non-speculative engine gives it on the draft model.
TEST(DraftModelProposer, ASmallerDraftProposesItsOwnGreedyContinuation) {
  const ScratchCheckpoint small("draft-small", 11, 1, {}, /*tied=*/false);
  std::unique_ptr<DraftModelProposer> proposer = make_proposer(draft_config(small.dir(), 3, 64));
  EXPECT_EQ(proposer->draft_config().num_hidden_layers, 1);
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  LoadedModel draft = load_model(small.dir().string(), ModelLoadOptions{}).value();
  const std::vector<std::vector<int32_t>> greedy = engine_greedy(draft, prompts, 3);
  std::vector<Ask> asks;
  for (size_t i = 0; i < prompts.size(); ++i)
    asks.push_back({static_cast<SeqId>(i), prompts[i], 3});
  const std::vector<std::vector<int32_t>> proposals = propose_ok(*proposer, asks);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(proposals[i], greedy[i]) << "prompt " << i;
    for (const int32_t token : proposals[i]) {
      EXPECT_TRUE(token >= 0 && token < 151936) << token;
    }
  }
  // It is not the target: some proposal differs from the target's own continuation.
  EXPECT_NE(proposals, engine_greedy(target_model().loaded, prompts, 3));
}

TEST(DraftModelProposer, ADraftWithAnotherVocabularyIsRefused) {
  const ScratchCheckpoint other("draft-vocab", 11, 1,
                                [](nlohmann::json& config) { config["vocab_size"] = 152064; });
  const Result<std::unique_ptr<Proposer>> made =
      make_draft_model_proposer(draft_config(other.dir(), 3, 16), *target_model().loaded.backend);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("vocab_size is 152064, the target model's 151936"),
            std::string::npos)
      << made.status().to_string();
  EXPECT_NE(made.status().message().find(other.dir().string()), std::string::npos);
}

TEST(DraftModelProposer, ADraftWithAnotherTokenizerIsRefused) {
  const ScratchCheckpoint other("draft-tokenizer", 11, 1);
  // The same vocab size, one token's text changed.
  const std::filesystem::path file = other.dir() / "tokenizer.json";
  nlohmann::json tokenizer = nlohmann::json::parse(std::ifstream(file));
  nlohmann::json& vocab = tokenizer["model"]["vocab"];
  const std::string key = vocab.begin().key();
  const int id = vocab.begin().value().get<int>();
  vocab.erase(key);
  vocab[key + "-not-in-qwen3"] = id;
  std::ofstream(file) << tokenizer.dump();
  const Result<std::unique_ptr<Proposer>> made =
      make_draft_model_proposer(draft_config(other.dir(), 3, 16), *target_model().loaded.backend);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("tokenizer.json differs"), std::string::npos)
      << made.status().to_string();
}

TEST(DraftModelProposer, BadConfigsAreRefusedClearly) {
  DraftModelProposerConfig config = draft_config(target_model().dir(), 0, 16);
  Result<std::unique_ptr<Proposer>> made =
      make_draft_model_proposer(config, *target_model().loaded.backend);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("num_speculative_tokens must be 1 to 32, got 0"),
            std::string::npos);
  config = draft_config(target_model().dir(), 3, 0);
  made = make_draft_model_proposer(config, *target_model().loaded.backend);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  config = draft_config(std::filesystem::path(PDSERVE_BINARY_DIR) / "no-such-draft", 3, 16);
  made = make_draft_model_proposer(config, *target_model().loaded.backend);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kNotFound) << made.status().to_string();
}

// Requests it cannot serve get no proposals, never an error, and leave the others' alone.
TEST(DraftModelProposer, UnservableRequestsGetNoProposals) {
  DraftModelProposerConfig config = draft_config(target_model().dir(), 4, 64);
  config.limits.max_model_len = 40;
  std::unique_ptr<DraftModelProposer> proposer = make_proposer(config);
  const std::vector<int32_t> prompt = random_tokens(20, 5);
  std::vector<Ask> asks = {{1, prompt, 4},
                           {2, {}, 4},                     // no tokens
                           {3, {1, 151936, 2}, 4},         // an id outside the vocabulary
                           {4, {1, -1}, 4},                // a negative id
                           {5, prompt, 0},                 // no proposals asked for
                           {6, random_tokens(40, 6), 4},   // at max_model_len: one proposal
                           {7, random_tokens(41, 7), 4}};  // past it
  const std::vector<std::vector<int32_t>> proposals = propose_ok(*proposer, asks);
  EXPECT_EQ(proposals[0], propose_ok(*make_proposer(config), {asks[0]})[0]);
  EXPECT_EQ(proposals[0].size(), 4u);
  for (size_t i : {1, 2, 3, 4, 6}) EXPECT_TRUE(proposals[i].empty()) << "request " << i;
  EXPECT_EQ(proposals[5].size(), 1u);
  // A sequence twice in one call is the caller's bug: no proposals for anyone.
  std::vector<ProposalRequest> twice = {{8, prompt, 2}, {8, prompt, 2}};
  std::vector<std::vector<int32_t>> lists(2);
  EXPECT_EQ(proposer->propose(twice, lists).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(proposer->propose(twice, std::span(lists).first(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(proposer->sequences().check_invariants().ok());
}

// A pool of 4 blocks of 16: a 40-token sequence proposing 4 needs 3, so a second one gets
// nothing until the first is released; a held sequence outgrowing the pool gives its blocks
// back; release() leaves the pool empty.
TEST(DraftModelProposer, AFullPoolProposesNothingAndReleaseEmptiesIt) {
  const DraftModelProposerConfig config = draft_config(target_model().dir(), 4, 4);
  std::unique_ptr<DraftModelProposer> proposer = make_proposer(config);
  const DraftSequenceTable& pool = proposer->sequences();
  const std::vector<int32_t> a = random_tokens(40, 21), b = random_tokens(30, 22);
  std::unique_ptr<DraftModelProposer> oracle =
      make_proposer(draft_config(target_model().dir(), 4, 256));
  const std::vector<std::vector<int32_t>> expected = propose_ok(*oracle, {{1, a, 4}, {2, b, 4}});

  std::vector<std::vector<int32_t>> got = propose_ok(*proposer, {{1, a, 4}, {2, b, 4}});
  EXPECT_EQ(got[0], expected[0]);
  EXPECT_TRUE(got[1].empty());
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.state(2), DraftSeqState::kStarved);
  // Still held: the starved one is not retried (nothing was released).
  got = propose_ok(*proposer, {{2, b, 4}, {1, a, 4}});
  EXPECT_TRUE(got[0].empty());
  EXPECT_EQ(got[1], expected[0]);
  ASSERT_TRUE(pool.check_invariants().ok());

  proposer->release(1);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  got = propose_ok(*proposer, {{2, b, 4}});
  EXPECT_EQ(got[0], expected[1]);
  EXPECT_EQ(pool.state(2), DraftSeqState::kHeld);

  // Sequence 2 grows past the pool (80 positions > 64): it gives its blocks back.
  got = propose_ok(*proposer, {{2, concat(b, random_tokens(47, 23)), 4}});
  EXPECT_TRUE(got[0].empty());
  EXPECT_EQ(pool.state(2), DraftSeqState::kStarved);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  // A sequence longer than the whole pool never fits.
  got = propose_ok(*proposer, {{3, random_tokens(70, 24), 2}});
  EXPECT_TRUE(got[0].empty());
  ASSERT_TRUE(pool.check_invariants().ok());

  proposer->release(2);
  proposer->release(3);
  proposer->release(99);  // unknown: ignored
  EXPECT_EQ(pool.num_sequences(), 0);
  EXPECT_EQ(pool.num_free_blocks(), pool.num_blocks());
  EXPECT_TRUE(pool.check_invariants().ok());
  // Released ids start over.
  EXPECT_EQ(propose_ok(*proposer, {{1, a, 4}})[0], expected[0]);
}

}  // namespace
}  // namespace pdserve
