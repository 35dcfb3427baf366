// LlmEngine's threading on a scripted model: many submitting threads with aborts, shutdown
// with requests in flight, a full intake queue. Whatever happens, every accepted request's
// sink gets exactly one final delta, and finished requests carry exactly their script.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/llm_engine.h"
#include "common/engine/warm_up.h"
#include "scripted_executor.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::ScriptedExecutor;

constexpr int kVocab = 151936;

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

// Deltas of every request, from the engine thread, readable from the test thread.
class Collector {
 public:
  struct Stream {
    std::vector<int32_t> tokens;
    std::string text;
    int deltas = 0;
    int finals = 0;
    SequenceDelta last;
  };

  DeltaSink sink(const std::string& id) {
    return [this, id](SequenceDelta delta) {
      std::lock_guard lock(mutex_);
      Stream& stream = streams_[id];
      EXPECT_EQ(stream.finals, 0) << id << ": a delta after the final one";
      stream.tokens.insert(stream.tokens.end(), delta.token_ids.begin(), delta.token_ids.end());
      stream.text += delta.text;
      ++stream.deltas;
      num_tokens_ += static_cast<int>(delta.token_ids.size());
      if (delta.finished) {
        finished_order_.push_back(id);
        ++stream.finals;
        ++num_finals_;
      }
      changed_.notify_all();
      stream.last = std::move(delta);
    };
  }

  // Waits (with a deadline) until `count` final deltas arrived.
  bool wait_for_finals(int count, std::chrono::seconds deadline = 60s) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, deadline, [&] { return num_finals_ >= count; });
  }
  // Waits (with a deadline) until `count` tokens arrived, over all requests.
  bool wait_for_tokens(int count, std::chrono::seconds deadline = 60s) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, deadline, [&] { return num_tokens_ >= count; });
  }
  int total_tokens() const {
    std::lock_guard lock(mutex_);
    int total = 0;
    for (const auto& [id, stream] : streams_) total += static_cast<int>(stream.tokens.size());
    return total;
  }
  std::map<std::string, Stream> streams() const {
    std::lock_guard lock(mutex_);
    return streams_;
  }
  std::vector<std::string> finished_order() const {
    std::lock_guard lock(mutex_);
    return finished_order_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Stream> streams_;
  std::vector<std::string> finished_order_;
  int num_finals_ = 0;
  int num_tokens_ = 0;
};

LlmEngineConfig engine_config(int max_num_waiting = 512) {
  LlmEngineConfig config;
  config.scheduler.num_blocks = 256;
  config.scheduler.block_size = 4;
  config.scheduler.max_num_batched_tokens = 32;
  config.scheduler.max_num_seqs = 16;
  config.scheduler.max_num_waiting = max_num_waiting;
  config.scheduler.max_model_len = 512;
  config.scheduler.vocab_size = kVocab;
  config.scheduler.eos_token_ids = {151645};
  config.model_name = "scripted";
  return config;
}

InferenceRequest request(const std::string& id, int32_t first_token, int max_tokens) {
  InferenceRequest r;
  r.id = id;
  r.prompt_tokens = {first_token, 11, 12, 13, 14, 15, 16};
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::vector<int32_t> script_for(int32_t first_token) {
  return {first_token + 1, first_token + 2, first_token + 3};
}

std::vector<int32_t> expected_tokens(int32_t first_token, int max_tokens) {
  const std::vector<int32_t> script = script_for(first_token);
  std::vector<int32_t> tokens;
  for (int k = 0; k < max_tokens; ++k) tokens.push_back(script[static_cast<size_t>(k) % 3]);
  return tokens;
}

std::unique_ptr<LlmEngine> make_engine(const std::vector<int32_t>& first_tokens,
                                       LlmEngineConfig config = engine_config(),
                                       std::chrono::microseconds step_delay = 0us) {
  auto executor = std::make_unique<ScriptedExecutor>(kVocab);
  for (int32_t first : first_tokens) executor->set_script(first, script_for(first));
  executor->set_step_delay(step_delay);
  return LlmEngine::create(std::move(executor), tokenizer(), std::move(config)).value();
}

TEST(LlmEngineTest, ManySubmittersWithAbortsEachGetExactlyOneFinalDelta) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20;
  std::vector<int32_t> firsts;
  for (int t = 0; t < kThreads * kPerThread; ++t) firsts.push_back(1000 + 10 * t);
  std::unique_ptr<LlmEngine> engine = make_engine(firsts);
  ASSERT_TRUE(engine->start().ok());
  EXPECT_EQ(engine->model_info().name, "scripted");
  EXPECT_EQ(engine->model_info().vocab_size, kVocab);
  EXPECT_EQ(engine->model_info().max_model_len, 512);

  Collector collector;
  std::atomic<int> submit_errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<uint32_t>(t));
      for (int i = 0; i < kPerThread; ++i) {
        const int n = t * kPerThread + i;
        const std::string id = "req" + std::to_string(n);
        const int max_tokens = 1 + n % 17;
        if (!engine
                 ->submit(request(id, firsts[static_cast<size_t>(n)], max_tokens),
                          collector.sink(id))
                 .ok()) {
          submit_errors.fetch_add(1);
        }
        if (n % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
          engine->abort(id);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(submit_errors.load(), 0);
  ASSERT_TRUE(collector.wait_for_finals(kThreads * kPerThread)) << "some request never ended";

  int aborted = 0;
  for (const auto& [id, stream] : collector.streams()) {
    EXPECT_EQ(stream.finals, 1) << id;
    const int n = std::stoi(id.substr(3));
    const int max_tokens = 1 + n % 17;
    if (stream.last.error.ok()) {
      EXPECT_EQ(stream.last.finish_reason, FinishReason::kLength) << id;
      EXPECT_EQ(stream.tokens, expected_tokens(firsts[static_cast<size_t>(n)], max_tokens)) << id;
    } else {
      ++aborted;
      EXPECT_EQ(n % 3, 0) << id << " failed without an abort: " << stream.last.error.to_string();
      EXPECT_EQ(stream.last.error.code(), StatusCode::kCancelled) << id;
      EXPECT_LT(static_cast<int>(stream.tokens.size()), max_tokens) << id;
    }
  }
  std::printf("aborted before finishing: %d of %d\n", aborted, kThreads * kPerThread / 3);
  engine->stop();
  const ServiceStats stats = engine->stats();
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.generation_tokens_total, collector.total_tokens());
}

TEST(LlmEngineTest, StopEndsEveryRequestInFlightWithOneUnavailableFinalDelta) {
  std::vector<int32_t> firsts;
  for (int r = 0; r < 40; ++r) firsts.push_back(2000 + 10 * r);
  std::unique_ptr<LlmEngine> engine = make_engine(firsts, engine_config(), 200us);
  ASSERT_TRUE(engine->start().ok());
  Collector collector;
  for (int r = 0; r < 40; ++r) {
    const std::string id = "long" + std::to_string(r);
    ASSERT_TRUE(
        engine->submit(request(id, firsts[static_cast<size_t>(r)], 400), collector.sink(id)).ok());
  }
  // Let some tokens flow so that requests are caught mid-decode, mid-prefill and waiting.
  ASSERT_TRUE(collector.wait_for_tokens(20)) << "no tokens flowed";
  engine->stop();
  ASSERT_TRUE(collector.wait_for_finals(40, 1s)) << "stop() returned before every final delta";
  for (const auto& [id, stream] : collector.streams()) {
    EXPECT_EQ(stream.finals, 1) << id;
    EXPECT_EQ(stream.last.error.code(), StatusCode::kUnavailable) << id;
    EXPECT_EQ(stream.last.completion_tokens, static_cast<int>(stream.tokens.size())) << id;
  }
  EXPECT_EQ(engine->submit(request("late", 2000, 3), collector.sink("late")).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(engine->start().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  engine->stop();  // idempotent
}

TEST(LlmEngineTest, AFullQueueIsRefusedSynchronouslyAndQueuedRequestsRunAfterStart) {
  std::unique_ptr<LlmEngine> engine = make_engine({3000, 3010, 3020, 3030, 3040}, engine_config(4));
  Collector collector;
  for (int r = 0; r < 4; ++r) {
    const std::string id = "q" + std::to_string(r);
    ASSERT_TRUE(engine->submit(request(id, 3000 + 10 * r, 5), collector.sink(id)).ok());
  }
  EXPECT_EQ(engine->stats().num_waiting, 4);
  const Status full = engine->submit(request("q4", 3040, 5), collector.sink("q4"));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.to_string();
  const Status duplicate = engine->submit(request("q0", 3000, 5), collector.sink("q0-again"));
  EXPECT_EQ(duplicate.code(), StatusCode::kInvalidArgument) << duplicate.to_string();
  InferenceRequest too_long = request("too-long", 3000, 600);
  EXPECT_EQ(engine->submit(too_long, collector.sink("too-long")).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine->submit(request("no-sink", 3000, 5), DeltaSink()).code(),
            StatusCode::kInvalidArgument);

  ASSERT_TRUE(engine->start().ok());
  ASSERT_TRUE(collector.wait_for_finals(4));
  const auto streams = collector.streams();
  EXPECT_EQ(streams.size(), 4u);  // the refused requests' sinks were never called
  for (int r = 0; r < 4; ++r) {
    const Collector::Stream& stream = streams.at("q" + std::to_string(r));
    EXPECT_TRUE(stream.last.error.ok()) << stream.last.error.to_string();
    EXPECT_EQ(stream.tokens, expected_tokens(3000 + 10 * r, 5));
  }
  // Finished ids may be used again.
  ASSERT_TRUE(engine->submit(request("q0", 3000, 2), collector.sink("q0-second")).ok());
  ASSERT_TRUE(collector.wait_for_finals(5));
}

// Polls take_prefix_cache_changes (the node agent's call) until it gives something: the feed
// has no event to wait on (the node agent polls it too).
PrefixCacheChanges next_changes(LlmEngine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    PrefixCacheChanges changes = engine.take_prefix_cache_changes();
    if (!changes.empty()) return changes;
    std::this_thread::sleep_for(5ms);
  }
  ADD_FAILURE() << "no prefix-cache changes within 10 s";
  return {};
}

bool holds(const std::vector<uint64_t>& keys, uint64_t key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

TEST(LlmEngineTest, ThePrefixCacheFeedStartsWithASnapshotThenReportsChanges) {
  std::unique_ptr<LlmEngine> engine = make_engine({3000, 3100});
  ASSERT_TRUE(engine->start().ok());
  Collector collector;
  ASSERT_TRUE(engine->submit(request("before", 3000, 3), collector.sink("before")).ok());
  ASSERT_TRUE(collector.wait_for_finals(1));
  // Nobody reads the feed yet: nothing is kept for it, also once the engine has stepped past
  // that request's end (a second request ran to its end after it).
  ASSERT_TRUE(engine->submit(request("before-2", 3000, 3), collector.sink("before-2")).ok());
  ASSERT_TRUE(collector.wait_for_finals(2));
  EXPECT_TRUE(engine->take_prefix_cache_changes().empty());

  const uint64_t before_key = hash_block_tokens(kRootBlockHash, std::vector<int32_t>{3000, 11, 12, 13});
  engine->resync_prefix_cache();  // the agent has just registered
  const PrefixCacheChanges snapshot = next_changes(*engine);
  EXPECT_TRUE(snapshot.reset);
  EXPECT_TRUE(holds(snapshot.stored, before_key));

  ASSERT_TRUE(engine->submit(request("after", 3100, 3), collector.sink("after")).ok());
  ASSERT_TRUE(collector.wait_for_finals(3));
  const PrefixCacheChanges changes = next_changes(*engine);
  EXPECT_FALSE(changes.reset);
  EXPECT_TRUE(holds(changes.stored,
                    hash_block_tokens(kRootBlockHash, std::vector<int32_t>{3100, 11, 12, 13})));
  EXPECT_FALSE(holds(changes.stored, before_key));
  engine->stop();
}

TEST(LlmEngineTest, StopWithoutStartEndsTheQueuedRequests) {
  std::unique_ptr<LlmEngine> engine = make_engine({4000});
  Collector collector;
  ASSERT_TRUE(engine->submit(request("queued", 4000, 5), collector.sink("queued")).ok());
  engine->stop();
  ASSERT_TRUE(collector.wait_for_finals(1, 1s));
  EXPECT_EQ(collector.streams().at("queued").last.error.code(), StatusCode::kUnavailable);
}

InferenceRequest constrained(const std::string& id, int32_t first_token, std::string regex) {
  InferenceRequest r = request(id, first_token, 16);
  r.sampling.ignore_eos = false;
  r.sampling.structured_output = StructuredOutput{StructuredOutput::Kind::kRegex, std::move(regex)};
  return r;
}

// A new grammar compiles on a compile thread (for this 151,936-token vocabulary its first
// compile takes far longer than a few scripted steps): submit() does not wait for it, a request
// submitted after it runs meanwhile, and the constrained request runs once its grammar is ready.
TEST(LlmEngineTest, ANewGrammarCompilesOnItsOwnThreadWhileOtherRequestsRun) {
  std::unique_ptr<LlmEngine> engine = make_engine({5000, 5010});
  ASSERT_TRUE(engine->start().ok());
  Collector collector;
  ASSERT_TRUE(
      engine->submit(constrained("grammar", 5000, "(ab){2}"), collector.sink("grammar")).ok());
  EXPECT_EQ(engine->stats().num_waiting, 1);  // compiling counts as waiting
  // Longer than the constrained one: it still ends first.
  ASSERT_TRUE(engine->submit(request("plain", 5010, 12), collector.sink("plain")).ok());
  ASSERT_TRUE(collector.wait_for_finals(2));
  EXPECT_EQ(collector.finished_order(), (std::vector<std::string>{"plain", "grammar"}));
  const auto streams = collector.streams();
  const Collector::Stream& grammar = streams.at("grammar");
  EXPECT_TRUE(grammar.last.error.ok()) << grammar.last.error.to_string();
  EXPECT_EQ(grammar.text, "abab");
  EXPECT_EQ(grammar.last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(streams.at("plain").tokens, expected_tokens(5010, 12));
}

// Before start() the compile threads do not run, so these requests are caught in the compile
// queue: an abort there, a constraint the compiler refuses, and stop() each end theirs with
// exactly one final delta, and none of them reaches the core.
TEST(LlmEngineTest, RequestsEndedWhileWaitingForTheirGrammarGetOneFinalDelta) {
  {
    std::unique_ptr<LlmEngine> engine = make_engine({5100});
    Collector collector;
    ASSERT_TRUE(engine->submit(constrained("aborted", 5100, "a+"), collector.sink("aborted")).ok());
    InferenceRequest broken = constrained("broken", 5100, "(unclosed");
    ASSERT_TRUE(engine->submit(std::move(broken), collector.sink("broken")).ok());
    engine->abort("aborted");
    ASSERT_TRUE(engine->start().ok());
    ASSERT_TRUE(collector.wait_for_finals(2));
    const auto streams = collector.streams();
    EXPECT_EQ(streams.at("aborted").last.error.code(), StatusCode::kCancelled);
    EXPECT_EQ(streams.at("broken").last.error.code(), StatusCode::kInvalidArgument)
        << streams.at("broken").last.error.to_string();
    for (const auto& [id, stream] : streams) EXPECT_TRUE(stream.tokens.empty()) << id;
    // The ids are free again once their final delta went out.
    ASSERT_TRUE(engine->submit(request("aborted", 5100, 2), collector.sink("again")).ok());
    ASSERT_TRUE(collector.wait_for_finals(3));
    EXPECT_EQ(engine->stats().num_waiting, 0);
  }
  {
    std::unique_ptr<LlmEngine> engine = make_engine({5200});
    Collector collector;
    ASSERT_TRUE(engine->submit(constrained("queued", 5200, "a+"), collector.sink("queued")).ok());
    engine->stop();
    ASSERT_TRUE(collector.wait_for_finals(1, 1s));
    EXPECT_EQ(collector.streams().at("queued").last.error.code(), StatusCode::kUnavailable);
  }
}

// The engine's stats once nothing runs or waits (they are published after each step), or after
// 10 s: polled, as the engine has no idle event (its callers, /metrics and the agent, poll).
ServiceStats stats_once_idle(const LlmEngine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  ServiceStats stats = engine.stats();
  while (stats.num_running + stats.num_waiting > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    stats = engine.stats();
  }
  return stats;
}

// The warm-up a node runs before it serves: one prefill step and one decode step, then the
// engine is idle again with nothing held.
TEST(LlmEngineTest, WarmUpRunsOnePrefillAndOneDecodeStepAndLeavesTheEngineIdle) {
  auto executor = std::make_unique<ScriptedExecutor>(kVocab);
  ScriptedExecutor& steps = *executor;
  std::unique_ptr<LlmEngine> engine =
      LlmEngine::create(std::move(executor), tokenizer(), engine_config()).value();
  ASSERT_TRUE(engine->start().ok());
  const Result<WarmUpReport> warmed = warm_up(*engine, 30s);
  ASSERT_TRUE(warmed.ok()) << warmed.status().to_string();
  EXPECT_EQ(warmed->generated_tokens, 2);
  EXPECT_EQ(steps.steps(), 2);
  const ServiceStats stats = stats_once_idle(*engine);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.generation_tokens_total, 2);
}

// A model that fails a step, or one too slow for the deadline, fails the warm-up (the node then
// exits instead of taking traffic); an overrun warm-up request is aborted, not left running.
TEST(LlmEngineTest, AWarmUpFailsWhenTheModelFailsOrOverrunsTheDeadline) {
  {
    auto executor = std::make_unique<ScriptedExecutor>(kVocab);
    executor->fail_at_step(1);  // the prefill step
    std::unique_ptr<LlmEngine> engine =
        LlmEngine::create(std::move(executor), tokenizer(), engine_config()).value();
    ASSERT_TRUE(engine->start().ok());
    const Result<WarmUpReport> warmed = warm_up(*engine, 30s);
    ASSERT_FALSE(warmed.ok());
    EXPECT_EQ(warmed.status().code(), StatusCode::kInternal) << warmed.status().to_string();
    EXPECT_NE(warmed.status().message().find("injected model failure"), std::string::npos)
        << warmed.status().to_string();
  }
  {
    auto executor = std::make_unique<ScriptedExecutor>(kVocab);
    executor->set_step_delay(300ms);
    std::unique_ptr<LlmEngine> engine =
        LlmEngine::create(std::move(executor), tokenizer(), engine_config()).value();
    ASSERT_TRUE(engine->start().ok());
    const Result<WarmUpReport> warmed = warm_up(*engine, 100ms);
    EXPECT_EQ(warmed.status().code(), StatusCode::kDeadlineExceeded)
        << warmed.status().to_string();
    const ServiceStats stats = stats_once_idle(*engine);
    EXPECT_EQ(stats.num_running + stats.num_waiting, 0) << "the overrun warm-up still runs";
    EXPECT_LT(stats.generation_tokens_total, 2);
  }
}

}  // namespace
}  // namespace pdserve
