// The InferenceService of one node: an EngineCore driven by its own thread. Front ends call
// submit/abort/stats from any thread; they only touch a mutex-protected intake queue and
// abort list, which the engine thread drains at the start of each step, so a slow client or
// a busy I/O thread never blocks the model and the model never blocks I/O. When idle the
// engine thread sleeps on a condition variable, with a deadline on every wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/inference_service.h"
#include "common/engine/kv_connector.h"
#include "common/engine/kv_tier.h"
#include "common/engine/model_executor.h"
#include "common/engine/prefix_cache_journal.h"
#include "common/engine/tiered_key_source.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

struct LlmEngineConfig {
  SchedulerConfig scheduler;  // max_num_waiting also bounds the intake queue
  std::string model_name;     // the served name; ModelInfo's other fields come from `scheduler`
  SamplingDefaults generation_defaults;
  std::chrono::milliseconds idle_wait{20};  // longest sleep between checks when idle
  // Threads that compile structured outputs (the first request with a new JSON schema pays
  // seconds for it, on neither an I/O thread nor the engine thread).
  int grammar_compile_threads = 2;
  // Speculative decoding (--speculative-config); its proposer comes in LlmEngineParts.
  std::optional<SpeculativeConfig> speculative;
  KvTierPolicy kv_tier_policy;  // with lower KV tiers (LlmEngineParts::tiers)
};

// The optional units an engine drives besides its model.
struct LlmEngineParts {
  std::unique_ptr<KvConnector> connector;  // a disaggregated node's KV transport
  std::unique_ptr<KvTierStore> tiers;      // the node's lower KV tiers (kv_tiers/)
  // Required with LlmEngineConfig::speculative, ignored without it.
  std::unique_ptr<Proposer> proposer;
};

class LlmEngine : public InferenceService {
 public:
  // InvalidArgument for a bad config or an executor that does not match it.
  // InvalidArgument for a bad config or an executor that does not match it. Every part is
  // optional; the engine owns them and drives them from the engine thread.
  static Result<std::unique_ptr<LlmEngine>> create(std::unique_ptr<ModelExecutor> executor,
                                                   Tokenizer tokenizer, LlmEngineConfig config,
                                                   LlmEngineParts parts = {});
  ~LlmEngine() override;  // stop()

  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Starts the engine thread and the grammar compile threads. FailedPrecondition when already
  // started or stopped; the error of executor.bind_current_thread() on the engine thread (which
  // then does not run). Requests submitted before start() wait in the intake queue.
  Status start();
  // Ends every unfinished request with a final Unavailable error delta and joins the engine
  // thread. Later submits answer Unavailable. Idempotent. A grammar being compiled is finished
  // first (xgrammar cannot be interrupted).
  void stop();

  // A request with a structured output whose constraint is not compiled yet goes to a compile
  // thread first and joins the intake queue once compiled; a compile failure ends it with a
  // final error delta. It counts as waiting meanwhile.
  Status submit(InferenceRequest request, DeltaSink sink) override;
  void abort(const std::string& request_id) override;
  ServiceStats stats() const override;
  const ModelInfo& model_info() const override { return model_info_; }

  // The prefix cache's changes for the node's heartbeats (PrefixCacheJournal), from any thread:
  // what changed since the last take; changes given back when their heartbeat failed; and a
  // snapshot of every key (the proxy has just registered this node), made by the engine thread
  // within a step or an idle wait and taken by a later take. Nothing is kept before the first
  // resync, and a journal that overflowed gets one snapshot per take, not one per step.
  PrefixCacheChanges take_prefix_cache_changes();
  void restore_prefix_cache_changes(const PrefixCacheChanges& older);
  void resync_prefix_cache();
  // The keys held in the node's lower KV tiers, for its heartbeats (thread-safe); null when the
  // node has no tiers. Valid as long as the engine.
  TieredKeySource* tiered_key_source() const { return tiers_.get(); }

 private:
  struct Submission {
    InferenceRequest request;
    DeltaSink sink;
  };

  LlmEngine(std::unique_ptr<ModelExecutor> executor, std::unique_ptr<KvConnector> connector,
            std::unique_ptr<KvTierStore> tiers, std::unique_ptr<EngineCore> core,
            LlmEngineConfig config);

  // The engine thread: binds to the executor's device (the result goes to start()), then
  // steps until stopped.
  void run(std::promise<Status> bound);
  // A compile thread: compiles queued structured outputs and moves them to the intake queue.
  void compile_grammars();
  // Moves the intake queue and the abort list into the core, after waiting (up to idle_wait)
  // for something to do when the previous step was idle; false when stopping.
  bool drain_requests(bool idle);
  void publish_stats();
  // Fails whatever is queued or running; on the engine thread, or on the caller's when the
  // thread never started.
  void shut_down_core();
  DeltaSink release_id_when_finished(const std::string& request_id, DeltaSink sink);

  LlmEngineConfig config_;
  ModelInfo model_info_;
  std::unique_ptr<ModelExecutor> executor_;
  std::unique_ptr<KvConnector> connector_;
  std::unique_ptr<KvTierStore> tiers_;  // reads and writes the executor's pool
  std::unique_ptr<EngineCore> core_;  // used by the engine thread only (or by stop())

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Submission> intake_;
  std::condition_variable compile_wake_;
  std::deque<Submission> to_compile_;
  std::unordered_set<std::string> compiling_ids_;  // in to_compile_ or being compiled
  std::unordered_set<std::string> aborted_while_compiling_;
  std::vector<std::string> aborts_;
  std::unordered_set<std::string> in_flight_ids_;  // submitted, final delta not yet delivered
  ServiceStats published_stats_;
  PrefixCacheJournal prefix_changes_{kPrefixJournalCapacity};  // published with the stats
  bool prefix_feed_started_ = false;    // a node agent reads the journal
  bool prefix_snapshot_wanted_ = false;  // a take found the journal waiting for a snapshot
  bool connector_signalled_ = false;     // the connector or the tier store has news for it
  bool started_ = false;
  bool stopping_ = false;
  std::mutex stop_mutex_;  // serializes stop() callers
  std::thread thread_;
  std::vector<std::thread> compile_threads_;
};

}  // namespace pdserve
