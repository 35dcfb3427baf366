#include "common/engine/llm_engine.h"

#include <future>
#include <utility>

namespace pdserve {
namespace {

void deliver_error(const DeltaSink& sink, const InferenceRequest& request, const Status& status) {
  SequenceDelta delta;
  delta.request_id = request.id;
  delta.finished = true;
  delta.error = status;
  delta.prompt_tokens = static_cast<int>(request.prompt_tokens.size());
  delta.timings.arrival = request.arrival;
  delta.timings.finished = std::chrono::steady_clock::now();
  deliver_delta(sink, std::move(delta));
}

// cudaSetDevice creates the device's context on first use: seconds, never minutes.
constexpr std::chrono::seconds kBindDeadline{120};

Status shutting_down() {
  return unavailable("the engine is shutting down");
}

}  // namespace

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(std::unique_ptr<ModelExecutor> executor,
                                                     Tokenizer tokenizer, LlmEngineConfig config,
                                                     LlmEngineParts parts) {
  if (executor == nullptr) return invalid_argument("engine: no model executor");
  if (config.idle_wait.count() <= 0) return invalid_argument("engine: idle_wait must be > 0");
  if (config.grammar_compile_threads < 1) {
    return invalid_argument("engine: grammar_compile_threads must be >= 1");
  }
  std::unique_ptr<SpecDecoder> spec_decoder;
  if (config.speculative) {
    PDS_ASSIGN_OR_RETURN(spec_decoder,
                         SpecDecoder::create(*config.speculative, std::move(parts.proposer), *executor));
  }
  EngineCoreParts core_parts;
  core_parts.connector = parts.connector.get();
  core_parts.tiers = parts.tiers.get();
  core_parts.tier_policy = config.kv_tier_policy;
  core_parts.spec_decoder = std::move(spec_decoder);
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core,
                       EngineCore::create(config.scheduler, *executor, std::move(tokenizer),
                                          std::move(core_parts)));
  std::unique_ptr<LlmEngine> engine(new LlmEngine(std::move(executor), std::move(parts.connector),
                                                  std::move(parts.tiers), std::move(core),
                                                  std::move(config)));
  LlmEngine* self = engine.get();
  auto wakeup = [self] {
    {
      std::lock_guard lock(self->mutex_);
      self->connector_signalled_ = true;
    }
    self->wake_.notify_one();
  };
  if (engine->connector_ != nullptr) engine->connector_->set_wakeup(wakeup);
  if (engine->tiers_ != nullptr) engine->tiers_->set_wakeup(wakeup);
  return engine;
}

LlmEngine::LlmEngine(std::unique_ptr<ModelExecutor> executor,
                     std::unique_ptr<KvConnector> connector, std::unique_ptr<KvTierStore> tiers,
                     std::unique_ptr<EngineCore> core, LlmEngineConfig config)
    : config_(std::move(config)),
      executor_(std::move(executor)),
      connector_(std::move(connector)),
      tiers_(std::move(tiers)),
      core_(std::move(core)) {
  model_info_.name = config_.model_name;
  model_info_.max_model_len = config_.scheduler.max_model_len;
  model_info_.vocab_size = config_.scheduler.vocab_size;
  model_info_.eos_token_ids = config_.scheduler.eos_token_ids;
  model_info_.generation_defaults = config_.generation_defaults;
  published_stats_ = core_->stats();
}

LlmEngine::~LlmEngine() {
  stop();
  // Their threads call the wakeup, which uses members destroyed before them.
  core_.reset();
  tiers_.reset();
  connector_.reset();
}

Status LlmEngine::start() {
  std::lock_guard lock(mutex_);
  if (started_ || stopping_) return failed_precondition("the engine was already started");
  std::promise<Status> bound;
  std::future<Status> bind_result = bound.get_future();
  PDS_RETURN_IF_ERROR(capture_status([&] {
    thread_ = std::thread(&LlmEngine::run, this, std::move(bound));
    return Status::ok_status();
  }));
  // The engine thread binds itself to the model's device before it takes any work.
  if (bind_result.wait_for(kBindDeadline) != std::future_status::ready) {
    stopping_ = true;  // the thread shuts down once (if ever) the bind returns
    return deadline_exceeded("the engine thread did not bind to the model's device within " +
                             std::to_string(kBindDeadline.count()) + " s");
  }
  const Status bind_status = bind_result.get();
  if (!bind_status.ok()) {
    thread_.join();  // it returned without running
    return bind_status.with_context("engine thread");
  }
  return capture_status([&] {
    for (int i = 0; i < config_.grammar_compile_threads; ++i) {
      compile_threads_.emplace_back(&LlmEngine::compile_grammars, this);
    }
    started_ = true;
    return Status::ok_status();
  });
}

void LlmEngine::stop() {
  std::lock_guard stop_lock(stop_mutex_);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  compile_wake_.notify_all();
  for (std::thread& compile_thread : compile_threads_) {
    if (compile_thread.joinable()) compile_thread.join();
  }
  if (thread_.joinable()) {
    thread_.join();
  } else {
    shut_down_core();
  }
}

Status LlmEngine::submit(InferenceRequest request, DeltaSink sink) {
  if (!sink) return invalid_argument("request '" + request.id + "': no delta sink");
  // Reads only the core's immutable configuration, so it is safe off the engine thread.
  PDS_RETURN_IF_ERROR(core_->validate(request));
  const bool needs_compile = request.sampling.structured_output && !request.constraint;
  std::string id = request.id;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return shutting_down();
    if (in_flight_ids_.contains(id)) {
      return invalid_argument("request '" + id + "' is already in flight");
    }
    const size_t limit = static_cast<size_t>(config_.scheduler.max_num_waiting);
    if (intake_.size() + compiling_ids_.size() +
            static_cast<size_t>(published_stats_.num_waiting) >=
        limit) {
      return resource_exhausted("the waiting queue is full (" + std::to_string(limit) +
                                " requests); retry later");
    }
    in_flight_ids_.insert(id);
    Submission submission{std::move(request), release_id_when_finished(id, std::move(sink))};
    if (needs_compile) {
      compiling_ids_.insert(id);
      to_compile_.push_back(std::move(submission));
    } else {
      intake_.push_back(std::move(submission));
    }
  }
  (needs_compile ? compile_wake_ : wake_).notify_one();
  return Status::ok_status();
}

void LlmEngine::abort(const std::string& request_id) {
  {
    std::lock_guard lock(mutex_);
    if (!in_flight_ids_.contains(request_id)) return;
    if (compiling_ids_.contains(request_id)) {
      // Not in the core yet: its compile thread ends it instead of queueing it.
      aborted_while_compiling_.insert(request_id);
      return;
    }
    aborts_.push_back(request_id);
  }
  wake_.notify_one();
}

ServiceStats LlmEngine::stats() const {
  std::lock_guard lock(mutex_);
  ServiceStats stats = published_stats_;
  stats.num_waiting += static_cast<int>(intake_.size() + compiling_ids_.size());
  return stats;
}

DeltaSink LlmEngine::release_id_when_finished(const std::string& request_id, DeltaSink sink) {
  return [this, request_id, sink = std::move(sink)](SequenceDelta delta) {
    if (delta.finished) {
      std::lock_guard lock(mutex_);
      in_flight_ids_.erase(request_id);
    }
    sink(std::move(delta));
  };
}

void LlmEngine::compile_grammars() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (to_compile_.empty()) {
      // submit() and stop() notify; the deadline only bounds a missed wakeup.
      compile_wake_.wait_for(lock, std::chrono::seconds(1));
      continue;
    }
    Submission submission = std::move(to_compile_.front());
    to_compile_.pop_front();
    const std::string id = submission.request.id;
    Status failure = Status::ok_status();
    if (!aborted_while_compiling_.contains(id)) {
      lock.unlock();
      Result<ConstraintHandle> compiled =
          core_->constraint_compiler().compile(*submission.request.sampling.structured_output);
      lock.lock();
      if (compiled.ok()) {
        submission.request.constraint = std::move(compiled).value();
      } else {
        failure = compiled.status().with_context("request '" + id + "'");
      }
    }
    compiling_ids_.erase(id);
    if (aborted_while_compiling_.erase(id) > 0) {
      failure = cancelled("request '" + id + "' was aborted");
    } else if (failure.ok() && stopping_) {
      failure = shutting_down();
    }
    if (failure.ok()) {
      intake_.push_back(std::move(submission));
      wake_.notify_one();
      continue;
    }
    // The sink takes the mutex to release the id.
    lock.unlock();
    deliver_error(submission.sink, submission.request, failure);
    lock.lock();
  }
}

void LlmEngine::run(std::promise<Status> bound) {
  Status bind_status = capture_status([&] { return executor_->bind_current_thread(); });
  const bool ok = bind_status.ok();
  bound.set_value(std::move(bind_status));
  if (!ok) return;  // start() reports it; stop() shuts the core down on its caller's thread
  bool idle = false;
  while (drain_requests(idle)) {
    idle = !core_->step();
    publish_stats();
  }
  shut_down_core();
}

bool LlmEngine::drain_requests(bool idle) {
  std::deque<Submission> submissions;
  std::vector<std::string> aborts;
  {
    std::unique_lock lock(mutex_);
    if (idle && !stopping_ && intake_.empty() && aborts_.empty() && !connector_signalled_) {
      wake_.wait_for(lock, config_.idle_wait);
    }
    connector_signalled_ = false;
    if (stopping_) return false;
    submissions.swap(intake_);
    aborts.swap(aborts_);
    // Until the next publish_stats these requests sit in the core's waiting queue: count
    // them there now, so submit() never admits more than the scheduler will take.
    published_stats_.num_waiting += static_cast<int>(submissions.size());
  }
  for (Submission& submission : submissions) {
    // The core keeps the sink only on success; on failure the request still gets its one
    // final delta.
    Status added = core_->add(submission.request, submission.sink);
    if (!added.ok()) deliver_error(submission.sink, submission.request, added);
  }
  for (const std::string& id : aborts) {
    core_->abort(id, cancelled("request '" + id + "' was aborted"));
  }
  return true;
}

void LlmEngine::publish_stats() {
  const ServiceStats stats = core_->stats();
  bool feeding = false;
  {
    std::lock_guard lock(mutex_);
    published_stats_ = stats;
    feeding = prefix_feed_started_;
  }
  // Without a reader the block manager's journal overflows once and then records nothing.
  if (!feeding) return;
  const PrefixCacheChanges changes = core_->take_prefix_cache_changes();
  bool snapshot_due = false;
  {
    std::lock_guard lock(mutex_);
    prefix_changes_.merge_newer(changes);
    snapshot_due = prefix_changes_.needs_snapshot() && prefix_snapshot_wanted_;
  }
  if (!snapshot_due) return;
  const std::vector<uint64_t> keys = core_->prefix_cache_keys();
  std::lock_guard lock(mutex_);
  prefix_changes_.set_snapshot(keys);
  prefix_snapshot_wanted_ = false;
}

PrefixCacheChanges LlmEngine::take_prefix_cache_changes() {
  std::lock_guard lock(mutex_);
  // One snapshot per take at most, however fast the cache churns between two takes.
  if (prefix_changes_.needs_snapshot()) prefix_snapshot_wanted_ = true;
  return prefix_changes_.take();
}

void LlmEngine::restore_prefix_cache_changes(const PrefixCacheChanges& older) {
  std::lock_guard lock(mutex_);
  prefix_changes_.restore_older(older);
}

void LlmEngine::resync_prefix_cache() {
  std::lock_guard lock(mutex_);
  prefix_feed_started_ = true;
  prefix_changes_.request_snapshot();
  prefix_snapshot_wanted_ = true;
}

void LlmEngine::shut_down_core() {
  std::deque<Submission> submissions;
  {
    std::lock_guard lock(mutex_);
    submissions.swap(intake_);
    // Stopping: the compile threads take nothing more from their queue.
    for (Submission& waiting : to_compile_) {
      compiling_ids_.erase(waiting.request.id);
      aborted_while_compiling_.erase(waiting.request.id);
      submissions.push_back(std::move(waiting));
    }
    to_compile_.clear();
    aborts_.clear();
  }
  for (Submission& submission : submissions) {
    deliver_error(submission.sink, submission.request, shutting_down());
  }
  core_->abort_all(shutting_down());
  publish_stats();
}

}  // namespace pdserve
