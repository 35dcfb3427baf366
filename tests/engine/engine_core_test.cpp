// EngineCore on a scripted model: what each request streams (tokens, text, logprobs, finish
// reasons) against independent oracles (the tokenizer's whole decode, apply_stop_strings, the
// Sampler run alone, a float64 log-softmax), and that every request gets exactly one final
// delta whatever happens to it (aborts at every step, model and sampling failures).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/engine/engine_core.h"
#include "engine_test_util.h"
#include "scripted_executor.h"

namespace pdserve {
namespace {

using testing::kFallbackLogit;
using testing::kFallbackToken;
using testing::kScriptLogit;
using testing::ScriptedExecutor;

constexpr int kVocab = 151936;  // the Qwen3 embedding rows; the tokenizer knows fewer ids
constexpr int32_t kImEnd = 151645;
constexpr int32_t kEndOfText = 151643;
constexpr int32_t kUnknownToTokenizer = 151900;

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

std::vector<int32_t> encode(const std::string& text) {
  return tokenizer().encode(text).value();
}

std::string decode(std::span<const int32_t> ids, bool skip_special = true) {
  return tokenizer().decode(ids, skip_special).value();
}

using testing::Stream;

class EngineCoreTest : public ::testing::Test {
 protected:
  EngineCoreTest() : executor_(kVocab) {}

  static SchedulerConfig default_config() {
    SchedulerConfig config;
    config.num_blocks = 64;
    config.block_size = 4;
    config.max_num_batched_tokens = 64;
    config.max_num_seqs = 8;
    config.max_num_waiting = 16;
    config.max_model_len = 256;
    config.vocab_size = kVocab;
    config.eos_token_ids = {kImEnd, kEndOfText};
    return config;
  }

  void make_core(SchedulerConfig config = default_config()) {
    core_ = EngineCore::create(std::move(config), executor_, tokenizer()).value();
  }

  // A greedy request whose prompt starts with `first_token` (which selects its script).
  static InferenceRequest request(const std::string& id, int32_t first_token, int max_tokens,
                                  int prompt_len = 5) {
    InferenceRequest r;
    r.id = id;
    r.prompt_tokens.push_back(first_token);
    for (int i = 1; i < prompt_len; ++i) r.prompt_tokens.push_back(100 + i);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    return r;
  }

  DeltaSink sink(const std::string& id) {
    return [this, id](SequenceDelta delta) {
      EXPECT_EQ(delta.request_id, id);
      Stream& stream = streams_[id];
      EXPECT_EQ(stream.finals, 0) << id << ": a delta after the final one";
      if (delta.finished) ++stream.finals;
      stream.deltas.push_back(std::move(delta));
    };
  }

  void add(InferenceRequest r) {
    const std::string id = r.id;
    const Status status = core_->add(std::move(r), sink(id));
    ASSERT_TRUE(status.ok()) << status.to_string();
  }

  void run_to_completion() {
    for (int steps = 0; core_->step(); ++steps) ASSERT_LT(steps, 10000) << "the engine never idles";
    EXPECT_FALSE(core_->has_unfinished());
  }

  // Exactly one final delta, the last one; every block back in the pool.
  void expect_clean_end() {
    for (const auto& [id, stream] : streams_) {
      EXPECT_EQ(stream.finals, 1) << id;
      if (!stream.deltas.empty()) {
        EXPECT_TRUE(stream.last().finished) << id;
      }
    }
    const BlockManager& blocks = core_->scheduler().block_manager();
    EXPECT_EQ(blocks.num_used_blocks(), 0);
    const Status invariants = blocks.check_invariants();
    EXPECT_TRUE(invariants.ok()) << invariants.to_string();
  }

  ScriptedExecutor executor_;
  std::unique_ptr<EngineCore> core_;
  std::map<std::string, Stream> streams_;
};

const std::string kFoxText = "The quick brown fox jumps over the lazy dog, again and again.";

TEST_F(EngineCoreTest, StreamsTheScriptUntilMaxTokens) {
  const std::vector<int32_t> script = encode(kFoxText);
  ASSERT_GE(script.size(), 10u);
  executor_.set_script(1000, script);
  make_core();
  add(request("a", 1000, 8, 9));
  run_to_completion();
  expect_clean_end();
  const Stream& stream = streams_["a"];
  const std::vector<int32_t> expected(script.begin(), script.begin() + 8);
  EXPECT_EQ(stream.tokens(), expected);
  EXPECT_EQ(stream.text(), decode(expected));
  ASSERT_EQ(stream.deltas.size(), 8u);  // one per step: decodes are never held back
  const SequenceDelta& last = stream.last();
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(last.error.ok());
  EXPECT_EQ(last.prompt_tokens, 9);
  EXPECT_EQ(last.completion_tokens, 8);
  ASSERT_TRUE(last.timings.first_scheduled && last.timings.first_token && last.timings.finished);
  EXPECT_LE(last.timings.arrival, *last.timings.first_scheduled);
  EXPECT_LE(*last.timings.first_scheduled, *last.timings.first_token);
  EXPECT_LE(*last.timings.first_token, *last.timings.finished);
  const ServiceStats stats = core_->stats();
  EXPECT_EQ(stats.generation_tokens_total, 8);
  EXPECT_EQ(stats.prompt_tokens_total, 9);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

// The number of script tokens after which the whole-text oracle first reports a match.
size_t tokens_until_match(const std::vector<int32_t>& script,
                          const std::vector<std::string>& stops) {
  for (size_t n = 1; n <= script.size(); ++n) {
    if (apply_stop_strings(decode(std::span(script).first(n)), stops).match) return n;
  }
  return 0;
}

TEST_F(EngineCoreTest, StopStringsSpanningTokensEndTheSequenceWithoutLeakingAPartialMatch) {
  const std::vector<int32_t> script = encode(kFoxText);
  const std::string full = decode(script);
  struct Case {
    std::vector<std::string> stops;
    bool include;
  };
  const std::vector<Case> cases = {
      {{"brown fox j"}, false},
      {{"brown fox j"}, true},
      {{"zebra", "lazy d", "over the"}, false},  // the first to complete wins
      {{"fox jumps over the lazy cat"}, false},  // held back, then released by later text
      {{"again. The end"}, false},               // held back until the final delta
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    executor_.set_script(static_cast<int32_t>(2000 + c), script);
  }
  make_core();
  const int max_tokens = static_cast<int>(script.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    InferenceRequest r =
        request("stop" + std::to_string(c), static_cast<int32_t>(2000 + c), max_tokens);
    r.stop = cases[c].stops;
    r.include_stop_str_in_output = cases[c].include;
    add(std::move(r));
  }
  run_to_completion();
  expect_clean_end();
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const Stream& stream = streams_["stop" + std::to_string(c)];
    const StopStringResult expected = apply_stop_strings(full, cases[c].stops, cases[c].include);
    EXPECT_EQ(stream.text(), expected.text);
    // No delta ever shows text beyond what the final answer keeps.
    std::string so_far;
    for (const SequenceDelta& d : stream.deltas) {
      so_far += d.text;
      EXPECT_EQ(expected.text.compare(0, so_far.size(), so_far), 0) << "streamed: " << so_far;
    }
    if (expected.match) {
      EXPECT_EQ(stream.last().finish_reason, FinishReason::kStop);
      EXPECT_EQ(stream.last().matched_stop, expected.match->stop);
      const size_t n = tokens_until_match(script, cases[c].stops);
      EXPECT_EQ(stream.tokens(), std::vector<int32_t>(script.begin(), script.begin() + n));
    } else {
      EXPECT_EQ(stream.last().finish_reason, FinishReason::kLength);
      EXPECT_EQ(stream.last().matched_stop, "");
      EXPECT_EQ(stream.tokens(), script);
    }
  }
}

TEST_F(EngineCoreTest, MinTokensBansEosUntilReachedAndEosTextIsLeftOut) {
  std::vector<int32_t> words = encode(" one two three four five six seven");
  ASSERT_GE(words.size(), 7u);
  const std::vector<int32_t> script = {words[0], words[1], kImEnd, words[3],
                                       words[4], words[5], kImEnd, words[6]};
  executor_.set_script(3000, script);
  executor_.set_script(3001, script);
  make_core();
  InferenceRequest with_min = request("min", 3000, 20);
  with_min.sampling.min_tokens = 4;
  add(std::move(with_min));
  add(request("plain", 3001, 20));
  run_to_completion();
  expect_clean_end();

  const std::vector<int32_t> expected_min = {words[0], words[1], kFallbackToken, words[3],
                                             words[4], words[5], kImEnd};
  EXPECT_EQ(streams_["min"].tokens(), expected_min);
  EXPECT_EQ(streams_["min"].last().finish_reason, FinishReason::kStop);
  EXPECT_EQ(streams_["min"].text(), decode(std::span(expected_min).first(6)));

  const std::vector<int32_t> expected_plain = {words[0], words[1], kImEnd};
  EXPECT_EQ(streams_["plain"].tokens(), expected_plain);
  EXPECT_EQ(streams_["plain"].last().finish_reason, FinishReason::kStop);
  EXPECT_EQ(streams_["plain"].text(), decode(std::span(expected_plain).first(2)));
}

TEST_F(EngineCoreTest, StopTokenIdsEndTheSequenceAndTheirTextShowsOnlyWhenAsked) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(4000, script);
  executor_.set_script(4001, script);
  make_core();
  for (int include = 0; include < 2; ++include) {
    InferenceRequest r = request("ids" + std::to_string(include), 4000 + include, 30);
    r.sampling.stop_token_ids = {script[3]};
    r.include_stop_str_in_output = include == 1;
    add(std::move(r));
  }
  run_to_completion();
  expect_clean_end();
  const std::vector<int32_t> expected(script.begin(), script.begin() + 4);
  for (int include = 0; include < 2; ++include) {
    const Stream& stream = streams_["ids" + std::to_string(include)];
    EXPECT_EQ(stream.tokens(), expected);
    EXPECT_EQ(stream.last().finish_reason, FinishReason::kStop);
    EXPECT_EQ(stream.text(), decode(std::span(expected).first(include == 1 ? 4 : 3)));
  }
}

TEST_F(EngineCoreTest, IgnoreEosKeepsGoingAndSpecialTokensShowOnlyWhenNotSkipped) {
  const std::vector<int32_t> script = {encode("Hi")[0], kImEnd, kUnknownToTokenizer,
                                       encode("!")[0]};
  executor_.set_script(5000, script);
  executor_.set_script(5001, script);
  make_core();
  for (int skip = 0; skip < 2; ++skip) {
    InferenceRequest r = request("skip" + std::to_string(skip), 5000 + skip, 6);
    r.sampling.ignore_eos = true;
    r.skip_special_tokens = skip == 1;
    add(std::move(r));
  }
  run_to_completion();
  expect_clean_end();
  const std::vector<int32_t> expected = {script[0], script[1], script[2],
                                         script[3], script[0], script[1]};
  // Ids the tokenizer does not know (padded vocabulary rows) produce no text.
  std::vector<int32_t> known;
  for (int32_t id : expected) {
    if (id != kUnknownToTokenizer) known.push_back(id);
  }
  for (int skip = 0; skip < 2; ++skip) {
    const Stream& stream = streams_["skip" + std::to_string(skip)];
    EXPECT_EQ(stream.tokens(), expected);
    EXPECT_EQ(stream.last().finish_reason, FinishReason::kLength);
    EXPECT_EQ(stream.text(), decode(known, skip == 1));
  }
}

TEST_F(EngineCoreTest, LogprobsMatchAFloat64LogSoftmaxOfTheRawLogits) {
  const std::vector<int32_t> script = encode(" alpha beta gamma");
  for (int32_t id : script) ASSERT_NE(id, kFallbackToken);
  executor_.set_script(6000, script);
  make_core();
  InferenceRequest r = request("lp", 6000, 3);
  r.sampling.want_logprobs = true;
  r.sampling.logprobs = 2;
  add(std::move(r));
  run_to_completion();
  expect_clean_end();
  const double log_z = std::log(std::exp(double{kScriptLogit}) + std::exp(double{kFallbackLogit}) +
                                static_cast<double>(kVocab - 2));
  const Stream& stream = streams_["lp"];
  ASSERT_EQ(stream.tokens().size(), 3u);
  size_t k = 0;
  for (const SequenceDelta& d : stream.deltas) {
    ASSERT_EQ(d.logprobs.size(), d.token_ids.size());
    for (const SampledTokenLogprobs& lp : d.logprobs) {
      EXPECT_EQ(lp.token, script[k]);
      EXPECT_NEAR(lp.logprob, kScriptLogit - log_z, 1e-5);
      ASSERT_EQ(lp.top.size(), 2u);
      EXPECT_EQ(lp.top[0].token, script[k]);
      EXPECT_NEAR(lp.top[0].logprob, kScriptLogit - log_z, 1e-5);
      EXPECT_EQ(lp.top[1].token, kFallbackToken);
      EXPECT_NEAR(lp.top[1].logprob, kFallbackLogit - log_z, 1e-5);
      ++k;
    }
  }
}

TEST_F(EngineCoreTest, SeededSamplingEqualsTheSamplerRunAloneAndRepeats) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(7000, script);
  executor_.set_script(7001, script);
  make_core();
  const int max_tokens = 12;
  for (int i = 0; i < 2; ++i) {
    InferenceRequest r = request("seed" + std::to_string(i), 7000 + i, max_tokens);
    r.sampling.temperature = 4.0f;  // flat enough that the fallback and other tokens get drawn
    r.sampling.seed = 42;
    add(std::move(r));
  }
  run_to_completion();
  expect_clean_end();

  // The oracle: the same logits sampled directly, one token at a time.
  InferenceRequest reference = request("ref", 7000, max_tokens);
  reference.sampling.temperature = 4.0f;
  reference.sampling.seed = 42;
  Sampler sampler;
  SamplerRng rng(42);
  std::vector<int32_t> output;
  std::vector<float> logits(kVocab);
  for (int k = 0; k < max_tokens; ++k) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    logits[kFallbackToken] = kFallbackLogit;
    logits[static_cast<size_t>(executor_.next_token(7000, k))] = kScriptLogit;
    output.push_back(
        sampler.sample(logits, reference.sampling, reference.prompt_tokens, output, rng)
            .value()
            .token);
  }
  EXPECT_EQ(streams_["seed0"].tokens(), output);
  EXPECT_EQ(streams_["seed1"].tokens(), output);
}

TEST_F(EngineCoreTest, AbortAfterEveryStepGivesEachRequestExactlyOneFinalDelta) {
  const std::vector<int32_t> script = encode(kFoxText);
  SchedulerConfig config = default_config();
  config.max_num_batched_tokens = 8;  // chunked prefill
  config.max_num_seqs = 2;            // the rest wait
  for (int32_t r = 0; r < 4; ++r) executor_.set_script(8000 + r, script);
  for (int abort_after = 0; abort_after < 14; ++abort_after) {
    SCOPED_TRACE("abort after step " + std::to_string(abort_after));
    streams_.clear();
    make_core(config);
    const int lengths[] = {20, 3, 11, 6};
    for (int32_t r = 0; r < 4; ++r) add(request("r" + std::to_string(r), 8000 + r, 5, lengths[r]));
    for (int s = 0; s < abort_after; ++s) core_->step();
    std::map<std::string, bool> done_before;
    for (const auto& [id, stream] : streams_) done_before[id] = stream.finals == 1;
    for (int32_t r = 0; r < 4; ++r) core_->abort("r" + std::to_string(r), cancelled("client gone"));
    core_->abort("never-submitted", cancelled("client gone"));
    EXPECT_FALSE(core_->has_unfinished());
    EXPECT_FALSE(core_->step());
    for (int32_t r = 0; r < 4; ++r) {
      const std::string id = "r" + std::to_string(r);
      Stream& stream = streams_[id];
      ASSERT_EQ(stream.finals, 1) << id;
      const SequenceDelta& last = stream.last();
      if (done_before[id]) {
        EXPECT_EQ(last.finish_reason, FinishReason::kLength) << id;
        EXPECT_TRUE(last.error.ok()) << id;
      } else {
        EXPECT_EQ(last.finish_reason, FinishReason::kNone) << id;
        EXPECT_EQ(last.error.code(), StatusCode::kCancelled) << id;
      }
      EXPECT_EQ(static_cast<int>(stream.tokens().size()), last.completion_tokens) << id;
    }
    expect_clean_end();
    EXPECT_EQ(core_->stats().kv_blocks_used, 0);
  }
}

TEST_F(EngineCoreTest, AModelFailureFailsItsBatchOnlyAndTheOthersFinish) {
  const std::vector<int32_t> script = encode(kFoxText);
  SchedulerConfig config = default_config();
  config.max_num_seqs = 2;
  for (int32_t r = 0; r < 4; ++r) executor_.set_script(9000 + r, script);
  executor_.fail_at_step(3);
  make_core(config);
  for (int32_t r = 0; r < 4; ++r) add(request("f" + std::to_string(r), 9000 + r, 4));
  run_to_completion();
  expect_clean_end();
  for (int32_t r = 0; r < 4; ++r) {
    const std::string id = "f" + std::to_string(r);
    const SequenceDelta& last = streams_[id].last();
    if (r < 2) {  // running at step 3
      EXPECT_EQ(last.error.code(), StatusCode::kInternal) << id;
      EXPECT_NE(last.error.message().find("model step 3"), std::string::npos)
          << last.error.message();
      EXPECT_NE(last.error.message().find("injected model failure"), std::string::npos);
      EXPECT_EQ(streams_[id].tokens().size(), 2u) << id;
    } else {
      EXPECT_TRUE(last.error.ok()) << id << ": " << last.error.to_string();
      EXPECT_EQ(streams_[id].tokens(), std::vector<int32_t>(script.begin(), script.begin() + 4));
    }
  }
}

TEST_F(EngineCoreTest, ASamplingFailureFailsOnlyThatRequest) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(9100, script);
  executor_.set_script(9101, script);
  executor_.nan_for(9101);
  make_core();
  add(request("good", 9100, 4));
  add(request("nan", 9101, 4));
  run_to_completion();
  expect_clean_end();
  EXPECT_TRUE(streams_["good"].last().error.ok());
  EXPECT_EQ(streams_["good"].tokens().size(), 4u);
  const Status& error = streams_["nan"].last().error;
  EXPECT_EQ(error.code(), StatusCode::kInternal);
  EXPECT_NE(error.message().find("sampling request 'nan'"), std::string::npos) << error.message();
  EXPECT_TRUE(streams_["nan"].tokens().empty());
}

TEST_F(EngineCoreTest, InvalidRequestsAreRefusedAndTheirSinkIsNeverCalled) {
  make_core();
  const auto refuse = [&](InferenceRequest r, StatusCode code, const std::string& mention) {
    const std::string id = r.id;
    const Status status = core_->add(std::move(r), sink(id));
    EXPECT_EQ(status.code(), code) << status.to_string();
    EXPECT_NE(status.message().find(mention), std::string::npos) << status.to_string();
  };
  add(request("dup", 1, 3));
  refuse(request("dup", 1, 3), StatusCode::kInvalidArgument, "already in flight");
  InferenceRequest empty = request("empty", 1, 3);
  empty.prompt_tokens.clear();
  refuse(empty, StatusCode::kInvalidArgument, "prompt is empty");
  InferenceRequest outside = request("outside", 1, 3);
  outside.prompt_tokens[2] = kVocab;
  refuse(outside, StatusCode::kInvalidArgument, "prompt token 2");
  InferenceRequest top_p = request("top_p", 1, 3);
  top_p.sampling.top_p = 0.0f;
  refuse(top_p, StatusCode::kInvalidArgument, "top_p");
  InferenceRequest empty_stop = request("stop", 1, 3);
  empty_stop.stop = {"x", ""};
  refuse(empty_stop, StatusCode::kInvalidArgument, "stop string 1");
  refuse(request("long", 1, 252), StatusCode::kOutOfRange, "context length 256");
  refuse(request("", 1, 3), StatusCode::kInvalidArgument, "request id");
  for (const auto& [id, stream] : streams_) EXPECT_TRUE(stream.deltas.empty()) << id;
  run_to_completion();
  expect_clean_end();
}

TEST_F(EngineCoreTest, AThrowingSinkDoesNotStopTheEngine) {
  executor_.set_script(9200, encode(kFoxText));
  make_core();
  int calls = 0;
  ASSERT_TRUE(core_
                  ->add(request("throws", 9200, 3),
                        [&](SequenceDelta) {
                          ++calls;
                          throw std::runtime_error("front-end bug");
                        })
                  .ok());
  add(request("fine", 9200, 3));
  run_to_completion();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(streams_["fine"].tokens().size(), 3u);
  expect_clean_end();
}

// Each forward step that computed prompt tokens is recorded once per request: the chunks add up
// to the prompt, come in order between the first schedule and the first token, and name the
// step's whole token count.
TEST_F(EngineCoreTest, PrefillChunksCoverThePromptInOrder) {
  const std::vector<int32_t> script = encode(kFoxText);
  SchedulerConfig config = default_config();
  config.max_num_batched_tokens = 8;
  executor_.set_script(9300, script);
  executor_.set_script(9301, script);
  make_core(config);
  add(request("long", 9300, 3, 21));
  add(request("short", 9301, 3, 2));
  run_to_completion();
  expect_clean_end();
  for (const auto& [id, prompt] : {std::pair<std::string, int>{"long", 21}, {"short", 2}}) {
    SCOPED_TRACE(id);
    const RequestTimings& timings = streams_[id].last().timings;
    ASSERT_FALSE(timings.prefill_chunks.empty());
    int tokens = 0;
    SteadyTime previous_end = *timings.first_scheduled;
    for (const PrefillChunkTiming& chunk : timings.prefill_chunks) {
      EXPECT_GT(chunk.prompt_tokens, 0);
      EXPECT_LE(chunk.prompt_tokens, chunk.batch_tokens);
      EXPECT_LE(chunk.batch_tokens, config.max_num_batched_tokens);
      EXPECT_LE(previous_end, chunk.start);
      EXPECT_LE(chunk.start, chunk.end);
      previous_end = chunk.end;
      tokens += chunk.prompt_tokens;
    }
    EXPECT_EQ(tokens, prompt);
    EXPECT_LE(previous_end, *timings.first_token);
  }
  // 21 tokens in chunks of at most 8: at least three steps.
  EXPECT_GE(streams_["long"].last().timings.prefill_chunks.size(), 3u);
}

// A stream resumed on another engine from any point (the proxy's failover) continues with the
// same tokens and text as the uninterrupted run: seeded sampling, a stop string that is held
// back across the cut, usage counting the tokens generated before.
TEST_F(EngineCoreTest, AResumedStreamContinuesExactlyWhereTheFirstEngineStopped) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(9500, script);
  make_core();
  const auto base = [&](const std::string& id) {
    InferenceRequest r = request(id, 9500, 14);
    // The script token or the fallback "B", drawn (about 78% / 22%).
    r.sampling.temperature = 4.0f;
    r.sampling.top_k = 2;
    r.sampling.seed = 7;
    r.stop = {"fox jumps over the lazy cat"};  // held back for several tokens, then released
    r.report_sampler_state = true;
    return r;
  };
  add(base("whole"));
  run_to_completion();
  const Stream whole = streams_["whole"];
  const std::vector<int32_t> tokens = whole.tokens();
  ASSERT_EQ(whole.deltas.size(), 14u);  // one token per delta
  for (const SequenceDelta& delta : whole.deltas) ASSERT_TRUE(delta.sampler_state.has_value());
  EXPECT_NE(tokens, std::vector<int32_t>(script.begin(), script.begin() + 14)) << "nothing drawn";
  int cuts_with_held_back_text = 0;

  for (const size_t cut : {1u, 3u, 5u, 8u, 13u}) {
    SCOPED_TRACE("resumed after " + std::to_string(cut) + " tokens");
    const std::string id = "resumed" + std::to_string(cut);
    InferenceRequest r = base(id);
    r.resume = ResumedOutput{std::vector<int32_t>(tokens.begin(), tokens.begin() + cut),
                             *whole.deltas[cut - 1].sampler_state};
    add(std::move(r));
    run_to_completion();
    const Stream& resumed = streams_[id];
    ASSERT_FALSE(resumed.deltas.empty());
    std::string delivered;
    for (size_t i = 0; i < cut; ++i) delivered += whole.deltas[i].text;
    cuts_with_held_back_text += delivered != decode(std::span(tokens).first(cut));
    ASSERT_TRUE(resumed.deltas.front().resumed_text.has_value());
    EXPECT_EQ(*resumed.deltas.front().resumed_text, delivered);
    for (size_t i = 1; i < resumed.deltas.size(); ++i) {
      EXPECT_FALSE(resumed.deltas[i].resumed_text.has_value());
    }
    EXPECT_EQ(resumed.tokens(), std::vector<int32_t>(tokens.begin() + cut, tokens.end()));
    EXPECT_EQ(delivered + resumed.text(), whole.text());
    EXPECT_EQ(resumed.last().finish_reason, whole.last().finish_reason);
    EXPECT_EQ(resumed.last().completion_tokens, whole.last().completion_tokens);
    EXPECT_EQ(resumed.last().prompt_tokens, whole.last().prompt_tokens);
  }
  EXPECT_GT(cuts_with_held_back_text, 0) << "no cut fell inside a possible stop string";
  expect_clean_end();
}

TEST_F(EngineCoreTest, ResumptionsThatCannotContinueAreRefused) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(9600, script);
  make_core();
  const auto refuse = [&](const std::string& id, std::vector<int32_t> output,
                          SamplerRng::State state, const std::string& mention) {
    InferenceRequest r = request(id, 9600, 6);
    r.resume = ResumedOutput{std::move(output), state};
    const Status status = core_->add(std::move(r), sink(id));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(mention), std::string::npos) << status.to_string();
  };
  const SamplerRng::State state = SamplerRng(1).state();
  refuse("none", {}, state, "without its output tokens");
  refuse("more", std::vector<int32_t>(script.begin(), script.begin() + 7), state,
         "more than max_tokens");
  refuse("outside", {script[0], kVocab}, state, "outside");
  refuse("rng", {script[0]}, SamplerRng::State{}, "");
  for (const auto& [id, stream] : streams_) EXPECT_TRUE(stream.deltas.empty()) << id;
  run_to_completion();
  expect_clean_end();
}

// A stream cut between its last token's event and its finish chunk: the delivered tokens
// already end it (max_tokens, a stop token, a stop string). The resumed request generates
// nothing and ends at once with the finish the first node would have sent, and the text the
// client has for the front end's parsers (the tokenizer's decode is the oracle).
TEST_F(EngineCoreTest, ResumptionsWhoseOutputAlreadyEndedFinishAtOnce) {
  const std::vector<int32_t> script = encode(kFoxText);
  executor_.set_script(9600, script);
  make_core();
  const auto ended = [&](const std::string& id, std::vector<std::string> stop,
                         std::vector<int32_t> output, FinishReason reason,
                         const std::string& text) {
    InferenceRequest r = request(id, 9600, 6);
    r.stop = std::move(stop);
    const int delivered = static_cast<int>(output.size());
    r.resume = ResumedOutput{std::move(output), SamplerRng(1).state()};
    add(std::move(r));
    const Stream& stream = streams_[id];
    ASSERT_EQ(stream.deltas.size(), 1u) << id << ": ended at once, before any step";
    const SequenceDelta& last = stream.last();
    EXPECT_TRUE(last.finished && last.error.ok() && last.ended_before_resume) << id;
    EXPECT_EQ(last.finish_reason, reason) << id;
    EXPECT_TRUE(last.token_ids.empty() && last.text.empty()) << id;
    EXPECT_EQ(last.completion_tokens, delivered) << id;
    EXPECT_EQ(last.prompt_tokens, 5) << id;
    EXPECT_EQ(last.resumed_text, text) << id;
  };
  const auto decode = [&](size_t tokens) {
    return tokenizer().decode({script.begin(), script.begin() + tokens}, true).value();
  };
  ended("all", {}, std::vector<int32_t>(script.begin(), script.begin() + 6),
        FinishReason::kLength, decode(6));
  const std::string two = decode(2);
  ASSERT_NE(two.find("quick"), std::string::npos);
  ended("stopped", {"quick"}, std::vector<int32_t>(script.begin(), script.begin() + 2),
        FinishReason::kStop, two.substr(0, two.find("quick")));
  ended("eos", {}, {script[0], kImEnd}, FinishReason::kStop, decode(1));
  EXPECT_FALSE(core_->has_unfinished());
  run_to_completion();
  expect_clean_end();
}

// Structured outputs: the script and the flat logits would give anything; the grammar's mask
// leaves only what the schema allows, EOS only once the JSON is complete, through preemptions
// (a pool too small for all of them at once).
const std::string kBoundedSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 3}},
  "required": ["name", "n", "tags"], "additionalProperties": false})";

InferenceRequest structured_request(const std::string& id, int32_t first_token, uint64_t seed) {
  InferenceRequest r;
  r.id = id;
  r.prompt_tokens = {first_token, 101, 102, 103, 104};
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.sampling.max_tokens = 90;
  r.sampling.structured_output =
      StructuredOutput{StructuredOutput::Kind::kJsonSchema, kBoundedSchema};
  return r;
}

void expect_bounded_schema(const std::string& text) {
  const nlohmann::json value = nlohmann::json::parse(text);
  ASSERT_EQ(value.size(), 3u) << text;
  EXPECT_LE(value.at("n").get<int>(), 999);
  EXPECT_LE(value.at("tags").size(), 3u);
  for (const auto& tag : value.at("tags")) EXPECT_TRUE(tag == "x" || tag == "yz") << text;
}

TEST_F(EngineCoreTest, StructuredOutputsFollowTheirGrammarThroughPreemption) {
  executor_.set_script(9600, encode(kFoxText));
  SchedulerConfig config = default_config();
  config.num_blocks = 24;  // 96 token slots for 8 sequences: some are preempted
  make_core(config);
  for (uint64_t i = 0; i < 8; ++i) add(structured_request("s" + std::to_string(i), 9600, i));
  run_to_completion();
  expect_clean_end();
  EXPECT_GT(core_->stats().preemptions_total, 0);
  for (const auto& [id, stream] : streams_) {
    SCOPED_TRACE(id);
    EXPECT_EQ(stream.last().finish_reason, FinishReason::kStop) << stream.text();
    expect_bounded_schema(stream.text());
  }
}

TEST_F(EngineCoreTest, AResumedStructuredStreamCatchesItsGrammarUp) {
  executor_.set_script(9601, encode(kFoxText));
  make_core();
  InferenceRequest whole_request = structured_request("whole", 9601, 3);
  whole_request.report_sampler_state = true;
  add(whole_request);
  run_to_completion();
  const Stream whole = streams_["whole"];
  const std::vector<int32_t> tokens = whole.tokens();
  expect_bounded_schema(whole.text());
  ASSERT_GT(tokens.size(), 6u);
  for (const size_t cut : {1u, 5u}) {
    const std::string id = "resumed" + std::to_string(cut);
    InferenceRequest r = structured_request(id, 9601, 3);
    r.report_sampler_state = true;
    r.resume = ResumedOutput{std::vector<int32_t>(tokens.begin(), tokens.begin() + cut),
                             *whole.deltas[cut - 1].sampler_state};
    add(std::move(r));
    run_to_completion();
    EXPECT_EQ(streams_[id].tokens(), std::vector<int32_t>(tokens.begin() + cut, tokens.end()));
  }
  // Output the grammar never allowed cannot be resumed under it.
  InferenceRequest broken = structured_request("broken", 9601, 3);
  broken.resume = ResumedOutput{encode("Hello"), *whole.deltas[0].sampler_state};
  EXPECT_EQ(core_->add(std::move(broken), sink("broken")).code(), StatusCode::kInvalidArgument);
  expect_clean_end();
}

TEST_F(EngineCoreTest, StructuredOutputsThatCannotRunAreRefused) {
  make_core();
  InferenceRequest bad_schema = structured_request("bad", 9602, 1);
  bad_schema.sampling.structured_output->spec = R"({"type": "no such type"})";
  EXPECT_EQ(core_->add(std::move(bad_schema), sink("bad")).code(), StatusCode::kInvalidArgument);
  InferenceRequest ignore_eos = structured_request("ignore_eos", 9602, 1);
  ignore_eos.sampling.ignore_eos = true;
  EXPECT_EQ(core_->add(std::move(ignore_eos), sink("ignore_eos")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(streams_.empty());
}

}  // namespace
}  // namespace pdserve
