#include "kv_transfer/ucx_kv_connector.h"

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/log.h"
#include "common/protocol/pdserve_headers.h"
#include "kv_transfer/kv_checksum.h"
#include "kv_transfer/remote_prefill_state.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

// One import in flight on the decode side: the exchange's data; its lifecycle (and when its
// blocks may be freed) is the RemotePrefillState.
struct Import {
  std::string request_id;
  uint64_t tag = 0;
  PrefillWork work;
  std::vector<std::string> urls;
  size_t url_index = 0;
  std::shared_ptr<http::ClientCall> call;
  int http_status = 0;
  std::string pending_bytes;  // of the event stream, up to the next '\n'
  std::string error_body;     // of a non-200 answer
  std::optional<PrefillEvent> first_token;
  std::optional<PrefillEvent> kv_sent;
  std::string traceparent;  // sent with the work
  // The exchange with the current prefill node, for the request's timeline.
  Clock::time_point work_posted;
  Clock::time_point head_received;
  Clock::time_point first_token_received;
  Clock::time_point started;
  RemotePrefillState state;

  Import(Clock::time_point deadline, Clock::duration hold, bool verify)
      : state(deadline, hold, verify) {}
};

// How far an export got, shared with its report callback (which runs on the transfer thread).
struct ExportProgress {
  std::atomic<int> layers_sent{0};
  std::atomic<int> layers_overlapped{0};  // sent before the forward returned
  std::mutex mutex;
  std::vector<uint64_t> block_checksums;  // set before the completion message
};

// One export started and not yet finished or aborted (engine thread only).
struct Export {
  uint64_t stream = 0;
  std::vector<std::vector<BlockCopy>> layers;  // each layer's puts, K and V
  int next_layer = 0;
  bool layerwise = true;
  std::shared_ptr<ExportProgress> progress;
  // For the checksums (empty when the receiver asked for none): the sent blocks here.
  std::vector<int32_t> checksum_blocks;
  int first_block = 0;
  int num_prompt_tokens = 0;
};

}  // namespace

struct UcxKvConnector::Impl : std::enable_shared_from_this<UcxKvConnector::Impl> {
  UcxKvConnectorOptions options;
  PoolLayout layout;
  std::byte* pool = nullptr;
  std::atomic<bool> kv_checksum{true};  // set by the node's main thread
  uint64_t test_blocks_landed = 0;      // engine thread: for options.test_corrupt_every

  std::mutex mutex;
  std::function<void()> wakeup;
  std::vector<KvEvent> events;
  std::map<std::string, Import> imports;       // by request id
  std::map<uint64_t, std::string> tag_owners;  // transfer tag -> request id
  uint64_t next_tag = 1;

  // Export side: the engine thread only.
  std::map<std::string, Export> exports;  // by request id
  std::atomic<bool> layerwise{true};      // set by the node's main thread
  bool stopping = false;  // the connector is being destroyed: no new HTTP calls (mutex held)

  // Posts layers [export.next_layer, end) of an export.
  void send_layers(Export& export_state, int end, bool overlapped) {
    for (; export_state.next_layer < end; ++export_state.next_layer) {
      service->put(export_state.stream,
                   std::move(export_state.layers[static_cast<size_t>(export_state.next_layer)]));
      ++export_state.progress->layers_sent;
      if (overlapped) ++export_state.progress->layers_overlapped;
    }
  }

  // Declared last: destroyed first, so no callback runs into destroyed state.
  std::unique_ptr<http::HttpClient> http;
  std::unique_ptr<KvTransferService> service;

  void wake() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mutex);
      fn = wakeup;
    }
    if (fn) fn();
  }

  // ---- import side; all with the mutex held -------------------------------------------

  const std::string& url_of(const Import& import) const { return import.urls[import.url_index]; }

  // Carries out what the state machine decided. `verify` is left to the engine thread's next
  // poll() (verify_landed), which the caller wakes.
  void apply(Import& import, const ImportActions& actions) {
    if (actions.report_first_token) report_first_token(import);
    if (actions.report_failure) {
      events.push_back({KvEventKind::kImportFailed, import.request_id, *actions.report_failure,
                        std::nullopt, std::nullopt});
    }
    if (actions.report_ready) {
      events.push_back({KvEventKind::kImportReady, import.request_id, Status::ok_status(),
                        std::nullopt, stats_of(import)});
    }
    if (actions.cancel_call && import.call) import.call->cancel();
    if (actions.send_cancel) send_cancel(import);
    if (actions.retry_next_node) {
      PDS_LOG_WARN("prefill node " + url_of(import) + " did not take request '" +
                   import.request_id + "'; trying the next prefill node");
      ++import.url_index;
      import.state.restart();
      send_work(import);
    }
  }

  RemotePrefillStats stats_of(const Import& import) const {
    RemotePrefillStats stats;
    const PrefillEvent& first = *import.first_token;
    stats.prefill_url = url_of(import);
    stats.remote_cached_tokens = first.cached_tokens;
    stats.queue_seconds = first.queue_ms / 1000.0;
    stats.compute_seconds = first.compute_ms / 1000.0;
    stats.work_posted = import.work_posted;
    stats.head_received = import.head_received;
    stats.first_token_received = import.first_token_received;
    stats.head_sent_ms = first.head_sent_ms;
    stats.spans = first.spans;
    if (import.kv_sent) {
      stats.transfer_bytes = import.kv_sent->bytes;
      stats.transfer_blocks = import.kv_sent->blocks;
      stats.transfer_seconds = import.kv_sent->transfer_ms / 1000.0;
      stats.transfer_layers = import.kv_sent->layers;
      stats.transfer_layers_overlapped = import.kv_sent->layers_overlapped;
      stats.spans.insert(stats.spans.end(), import.kv_sent->spans.begin(),
                         import.kv_sent->spans.end());
    } else {
      stats.transfer_blocks = static_cast<int>(import.work.block_ids.size());
    }
    return stats;
  }

  // The first token goes to the engine at once; the KV follows.
  void report_first_token(const Import& import) {
    RemotePrefillResult result;
    const PrefillEvent& first = *import.first_token;
    result.first_token = first.token;
    if (first.logprob) {
      result.first_logprobs = SampledTokenLogprobs{first.token, *first.logprob, first.top_logprobs};
    }
    result.rng_state = first.rng_state;
    result.stats = stats_of(import);
    events.push_back({KvEventKind::kFirstToken, import.request_id, Status::ok_status(),
                      std::move(result), std::nullopt});
  }

  void handle_line(Import& import, std::string_view line) {
    const Clock::time_point now = Clock::now();
    Result<PrefillEvent> event = parse_prefill_event(line);
    if (!event.ok()) {
      apply(import,
            import.state.fail(event.status().with_context("prefill node " + url_of(import)), now));
      return;
    }
    switch (event->kind) {
      case PrefillEvent::Kind::kFirstToken: {
        if (!import.first_token) {
          import.first_token = std::move(*event);
          import.first_token_received = now;
        }
        // The KV follows; give it the transfer's own deadline from now.
        apply(import, import.state.first_token(
                          now, now + options.transfer_timeout + options.release_grace));
        break;
      }
      case PrefillEvent::Kind::kKvSent:
        import.kv_sent = std::move(*event);
        apply(import, import.state.kv_sent());
        break;
      case PrefillEvent::Kind::kKvFailed:
        // The sender's transfer ended without its completion: nothing more can land.
        apply(import, import.state.prefill_ended_without_kv(
                          unavailable("prefill node " + url_of(import) +
                                      ": the KV transfer failed: " + event->error)));
        break;
      case PrefillEvent::Kind::kError:
        // The prefill failed (or was aborted) before its export.
        apply(import, import.state.prefill_ended_without_kv(
                          unavailable("prefill node " + url_of(import) + ": " + event->error)));
        break;
    }
  }

  http::ClientRequest internal_request(std::string target, std::string body,
                                       Clock::duration timeout) const {
    http::ClientRequest request;
    request.method = "POST";
    request.target = std::move(target);
    request.headers.emplace_back(std::string(kAuthorizationHeader),
                                 cluster_auth_header_value(options.cluster_token));
    request.body = std::move(body);
    request.timeout = timeout;
    return request;
  }

  void send_work(Import& import) {
    if (stopping) return;
    import.http_status = 0;
    import.pending_bytes.clear();
    import.error_body.clear();
    Result<http::BaseUrl> url = http::parse_base_url(url_of(import));
    if (!url.ok()) {
      // Nothing was sent: the call "ended" before sending.
      apply(import, import.state.call_ended(url.status().with_context("prefill node"),
                                            import.url_index + 1 < import.urls.size(),
                                            Clock::now()));
      return;
    }
    http::ClientRequest request = internal_request(
        "/internal/v1/prefill", prefill_work_to_json(import.work).dump(),
        std::chrono::duration_cast<Clock::duration>(import.state.deadline() - Clock::now()) +
            options.transfer_timeout);
    if (!import.traceparent.empty())
      request.headers.emplace_back(std::string(kTraceparentHeader), import.traceparent);
    const std::string id = import.request_id;
    std::weak_ptr<Impl> weak = weak_from_this();
    http::StreamCallbacks callbacks;
    callbacks.on_sending = [weak, id] {
      if (auto self = weak.lock())
        self->with_import(id, [&](Import& target) { self->apply(target, target.state.work_sent()); });
    };
    callbacks.on_head = [weak, id](int status, const http::HeaderList&) {
      const Clock::time_point arrived = Clock::now();
      if (auto self = weak.lock())
        self->with_import(id, [&](Import& target) {
          target.http_status = status;
          target.head_received = arrived;
          self->apply(target, target.state.head(status));
        });
    };
    callbacks.on_body = [weak, id](std::string_view bytes) {
      if (auto self = weak.lock())
        self->with_import(id, [&](Import& target) {
          if (target.http_status != 200) {
            if (target.error_body.size() < 4096) target.error_body.append(bytes);
            return;
          }
          target.pending_bytes.append(bytes);
          size_t end;
          while ((end = target.pending_bytes.find('\n')) != std::string::npos) {
            const std::string line = target.pending_bytes.substr(0, end);
            target.pending_bytes.erase(0, end + 1);
            if (!line.empty()) self->handle_line(target, line);
          }
        });
    };
    callbacks.on_done = [weak, id](const Status& outcome) {
      if (auto self = weak.lock())
        self->with_import(id, [&](Import& target) { self->call_ended(target, outcome); });
    };
    import.work_posted = Clock::now();
    import.call = http->stream(*url, std::move(request), std::move(callbacks));
  }

  // Asks the prefill node to abort this work (it answers on the work's event stream, which
  // stays open: kv_failed or an error event once no put of it can land). When the cancel call
  // fails (a prefill node without the endpoint, a network error), the work's call is closed
  // instead, which also makes the prefill node abort the work, but nothing confirms it: the
  // blocks wait for the hold deadline.
  void send_cancel(const Import& import) {
    if (stopping) return;
    Result<http::BaseUrl> url = http::parse_base_url(url_of(import));
    if (!url.ok()) {
      if (import.call) import.call->cancel();
      return;
    }
    PrefillCancel cancel{import.request_id, import.tag};
    const std::string where = url_of(import);
    std::weak_ptr<Impl> weak = weak_from_this();
    http->fetch(*url,
                internal_request("/internal/v1/prefill/cancel",
                                 prefill_cancel_to_json(cancel).dump(), std::chrono::seconds(5)),
                [weak, where, id = import.request_id](Result<http::ClientResponse> response) {
                  if (response.ok() && response->status == 200) return;
                  PDS_LOG_WARN("cancelling request '" + id + "' on prefill node " + where +
                               " failed: " +
                               (response.ok() ? "HTTP " + std::to_string(response->status)
                                              : response.status().message()) +
                               "; closing its call instead, its blocks are held until the "
                               "deadline");
                  if (auto self = weak.lock())
                    self->with_import(id, [](Import& target) {
                      if (target.call) target.call->cancel();
                    });
                });
  }

  void call_ended(Import& import, const Status& outcome) {
    import.call.reset();
    Status why = outcome;
    if (import.http_status != 0 && import.http_status != 200) {
      why = unavailable("prefill node " + url_of(import) + " answered HTTP " +
                        std::to_string(import.http_status) + ": " +
                        import.error_body.substr(0, 300));
    } else if (!import.first_token) {
      why = unavailable("prefill node " + url_of(import) +
                        " ended the exchange without a first token" +
                        (outcome.ok() ? std::string() : ": " + outcome.message()));
    }
    apply(import, import.state.call_ended(why, import.url_index + 1 < import.urls.size(),
                                          Clock::now()));
  }

  static bool needs_poll(const Import& import) {
    return import.state.state() == ImportState::kVerifying ||
           import.state.releasable(Clock::now());
  }

  // Engine thread (poll): compares the landed blocks of every import in kVerifying with the
  // checksums of its kv_sent. The pool is read without the mutex: only the engine thread frees
  // blocks, after a poll reports them released, so they cannot change meanwhile.
  void verify_landed() {
    struct Job {
      std::string request_id;
      std::vector<int32_t> blocks;
      int first_block = 0;
      int num_prompt_tokens = 0;
      std::vector<uint64_t> sent;
    };
    std::vector<Job> jobs;
    {
      std::lock_guard lock(mutex);
      for (const auto& [id, import] : imports) {
        if (import.state.state() != ImportState::kVerifying) continue;
        jobs.push_back({id, import.work.block_ids, import.work.first_block,
                        static_cast<int>(import.work.prompt_token_ids.size()),
                        import.kv_sent ? import.kv_sent->block_checksums
                                       : std::vector<uint64_t>()});
      }
    }
    for (const Job& job : jobs) {
      if (options.test_corrupt_every > 0) corrupt_for_test(job.blocks);
      const std::vector<uint64_t> landed =
          prompt_block_checksums(pool, layout, job.blocks, job.first_block, job.num_prompt_tokens);
      Status outcome = compare_block_checksums(job.sent, landed);
      std::lock_guard lock(mutex);
      auto it = imports.find(job.request_id);
      if (it == imports.end()) continue;
      if (!outcome.ok()) {
        outcome = outcome.with_context("request '" + job.request_id + "', KV from prefill node " +
                                       url_of(it->second));
        PDS_LOG_WARN(outcome.message() + "; prefilling it here instead");
      }
      apply(it->second, it->second.state.verified(outcome));
    }
  }

  // Flips the most significant byte of the first K element of every Nth landed block (its
  // sign and exponent bits: undetected, it would change the output).
  void corrupt_for_test(const std::vector<int32_t>& blocks) {
    for (int32_t block : blocks) {
      if (++test_blocks_landed % static_cast<uint64_t>(options.test_corrupt_every) != 0) continue;
      pool[layout.offset(0, block, false) + layout.element_bytes - 1] ^= std::byte{0xff};
    }
  }

  template <typename Fn>
  void with_import(const std::string& id, Fn&& fn) {
    bool signal = false;
    {
      std::lock_guard lock(mutex);
      auto it = imports.find(id);
      if (it == imports.end()) return;
      const size_t before = events.size();
      fn(it->second);
      // New events, blocks to verify, or blocks that may now be freed (a confirmation reports
      // nothing new).
      signal = events.size() != before || needs_poll(it->second);
    }
    if (signal) wake();
  }

  void on_received(const ReceivedTransfer& received) {
    bool signal = false;
    {
      std::lock_guard lock(mutex);
      auto owner = tag_owners.find(received.request_tag);
      if (owner == tag_owners.end()) {
        PDS_LOG_WARN("KV transfer: a completion message with tag " +
                     std::to_string(received.request_tag) + " matches no pending request; ignored");
        return;
      }
      Import& import = imports.at(owner->second);
      const size_t before = events.size();
      // The completion message follows every put: after a cancel, nothing more can land.
      apply(import, import.state.landed_now());
      signal = events.size() != before || needs_poll(import);
    }
    if (signal) wake();
  }
};

Result<std::unique_ptr<UcxKvConnector>> UcxKvConnector::create(const UcxKvConnectorOptions& options,
                                                               void* pool_base,
                                                               std::size_t pool_bytes,
                                                               const PoolLayout& layout) {
  if (layout.element_bytes == 0 || layout.num_blocks < 1 || layout.block.num_layers < 1) {
    return invalid_argument("KV connector: an empty pool layout");
  }
  if (layout.offset(0, 0, true) * 2 != pool_bytes) {
    return invalid_argument("KV connector: the pool has " + std::to_string(pool_bytes) +
                            " bytes, its layout says " +
                            std::to_string(layout.offset(0, 0, true) * 2));
  }
  if (options.test_corrupt_every < 0) {
    return invalid_argument("KV connector: test_corrupt_every must be >= 0");
  }
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->layout = layout;
  impl->pool = static_cast<std::byte*>(pool_base);
  // The checksums read the pool on the host (issue #14 for device pools).
  impl->kv_checksum = options.pool_memory == PoolMemory::kHost;
  if (options.test_corrupt_every > 0) {
    PDS_LOG_WARN("KV connector: TEST ONLY: one byte of every " +
                 std::to_string(options.test_corrupt_every) +
                 "th imported block is flipped after it lands");
  }
  PDS_ASSIGN_OR_RETURN(impl->http, http::HttpClient::create(options.http_threads));
  Impl* raw = impl.get();
  KvTransferOptions transfer_options;
  transfer_options.transports = options.transports;
  transfer_options.pool_memory = options.pool_memory;
  PDS_ASSIGN_OR_RETURN(
      impl->service, KvTransferService::create(
                         transfer_options, pool_base, pool_bytes,
                         [raw](const ReceivedTransfer& received) { raw->on_received(received); }));
  return std::unique_ptr<UcxKvConnector>(new UcxKvConnector(std::move(impl)));
}

UcxKvConnector::UcxKvConnector(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxKvConnector::~UcxKvConnector() {
  // Stop the threads before the state they call into goes away; the HTTP calls' last
  // callbacks start no new call.
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->service.reset();
  impl_->http.reset();
}

const PoolLayout& UcxKvConnector::layout() const {
  return impl_->layout;
}

const std::string& UcxKvConnector::descriptor_base64() const {
  return impl_->service->descriptor_base64();
}

void UcxKvConnector::set_wakeup(std::function<void()> wakeup) {
  std::lock_guard lock(impl_->mutex);
  impl_->wakeup = std::move(wakeup);
}

Status UcxKvConnector::start_export(const std::string& request_id, const KvExportTarget& target,
                                    std::span<const int32_t> block_table, int num_prompt_tokens) {
  const PoolLayout& local = impl_->layout;
  const int block_size = local.block.block_size;
  const int prompt_blocks = (num_prompt_tokens + block_size - 1) / block_size;
  if (static_cast<int>(block_table.size()) < prompt_blocks) {
    return internal_error("KV export of '" + request_id +
                          "': the block table is shorter than the prompt");
  }
  if (target.first_block < 0 || target.first_block >= prompt_blocks ||
      static_cast<int>(target.peer_blocks.size()) != prompt_blocks - target.first_block) {
    return invalid_argument("KV export of '" + request_id + "': the receiver offered " +
                            std::to_string(target.peer_blocks.size()) + " blocks from block " +
                            std::to_string(target.first_block) + " for a prompt of " +
                            std::to_string(prompt_blocks) + " blocks");
  }
  PoolLayout remote = local;
  remote.num_blocks = target.peer_num_blocks;
  for (int32_t block : target.peer_blocks) {
    if (block < 0 || block >= remote.num_blocks) {
      return invalid_argument("KV export of '" + request_id + "': receiver block " +
                              std::to_string(block) + " is outside its pool");
    }
  }
  // One put per run of blocks consecutive on both sides, per layer and half.
  Export export_state;
  export_state.layerwise = impl_->layerwise;
  export_state.progress = std::make_shared<ExportProgress>();
  if (target.checksum && impl_->options.pool_memory == PoolMemory::kHost) {
    export_state.checksum_blocks.assign(block_table.begin() + target.first_block,
                                        block_table.begin() + prompt_blocks);
    export_state.first_block = target.first_block;
    export_state.num_prompt_tokens = num_prompt_tokens;
  }
  const std::uint64_t run_unit = local.layer_block_bytes();
  for (int layer = 0; layer < local.block.num_layers; ++layer) {
    std::vector<BlockCopy>& copies = export_state.layers.emplace_back();
    for (bool value_half : {false, true}) {
      for (int i = target.first_block; i < prompt_blocks;) {
        int run = 1;
        while (i + run < prompt_blocks &&
               block_table[static_cast<size_t>(i + run)] ==
                   block_table[static_cast<size_t>(i)] + run &&
               target.peer_blocks[static_cast<size_t>(i + run - target.first_block)] ==
                   target.peer_blocks[static_cast<size_t>(i - target.first_block)] + run) {
          ++run;
        }
        copies.push_back(
            {local.offset(layer, block_table[static_cast<size_t>(i)], value_half),
             remote.offset(layer, target.peer_blocks[static_cast<size_t>(i - target.first_block)],
                           value_half),
             run_unit * static_cast<std::uint64_t>(run)});
        i += run;
      }
    }
  }
  const int num_blocks = prompt_blocks - target.first_block;
  // From here on_finished is sure to follow (open() reports every failure through it).
  if (target.on_started) target.on_started();
  std::weak_ptr<Impl> weak = impl_;
  const std::optional<uint64_t> stream = impl_->service->open(
      target.peer_descriptor, target.transfer_tag, target.timeout,
      [weak, request_id, num_blocks, progress = export_state.progress,
       on_finished = target.on_finished](KvTransferReport report) {
        report.blocks = num_blocks;
        report.layers = progress->layers_sent.load();
        report.layers_overlapped = progress->layers_overlapped.load();
        if (report.status.ok()) {
          std::lock_guard lock(progress->mutex);
          report.block_checksums = progress->block_checksums;
        }
        if (on_finished) on_finished(report);
        if (auto self = weak.lock()) {
          {
            std::lock_guard lock(self->mutex);
            self->events.push_back({KvEventKind::kExportReleased, request_id, report.status,
                                    std::nullopt, std::nullopt});
          }
          self->wake();
        }
      });
  // Without a stream the service is stopping and has already reported the failure.
  if (stream) {
    export_state.stream = *stream;
    impl_->exports.insert_or_assign(request_id, std::move(export_state));
  }
  return Status::ok_status();
}

void UcxKvConnector::layer_written(int layer) {
  for (auto& [request_id, export_state] : impl_->exports) {
    if (export_state.layerwise) impl_->send_layers(export_state, layer + 1, /*overlapped=*/true);
  }
}

void UcxKvConnector::finish_export(const std::string& request_id) {
  auto it = impl_->exports.find(request_id);
  if (it == impl_->exports.end()) return;
  Export& export_state = it->second;
  impl_->send_layers(export_state, static_cast<int>(export_state.layers.size()),
                     /*overlapped=*/false);
  if (!export_state.checksum_blocks.empty()) {
    // Every layer is written (the forward is over) and the blocks stay pinned until the
    // export's report: the bytes checksummed are the bytes the puts read.
    std::vector<uint64_t> sums =
        prompt_block_checksums(impl_->pool, impl_->layout, export_state.checksum_blocks,
                               export_state.first_block, export_state.num_prompt_tokens);
    std::lock_guard lock(export_state.progress->mutex);
    export_state.progress->block_checksums = std::move(sums);
  }
  impl_->service->close(export_state.stream);
  impl_->exports.erase(it);
}

void UcxKvConnector::abort_export(const std::string& request_id) {
  auto it = impl_->exports.find(request_id);
  if (it == impl_->exports.end()) return;
  impl_->service->abort(it->second.stream);
  impl_->exports.erase(it);
}

void UcxKvConnector::set_layerwise(bool layerwise) {
  impl_->layerwise = layerwise;
}

void UcxKvConnector::set_kv_checksum(bool on) {
  impl_->kv_checksum = on && impl_->options.pool_memory == PoolMemory::kHost;
}

Status UcxKvConnector::start_import(const InferenceRequest& request,
                                    std::span<const int32_t> block_table, int num_cached_tokens) {
  const PoolLayout& layout = impl_->layout;
  const int block_size = layout.block.block_size;
  const int prompt_tokens = static_cast<int>(request.prompt_tokens.size());
  const int prompt_blocks = (prompt_tokens + block_size - 1) / block_size;
  const int first_block = num_cached_tokens / block_size;
  if (!request.kv_import || request.kv_import->prefill_urls.empty()) {
    return invalid_argument("KV import of '" + request.id + "': no prefill node");
  }
  if (static_cast<int>(block_table.size()) < prompt_blocks || first_block >= prompt_blocks) {
    return internal_error("KV import of '" + request.id +
                          "': the block table does not cover the prompt");
  }
  std::lock_guard lock(impl_->mutex);
  if (impl_->imports.contains(request.id)) {
    return invalid_argument("KV import of '" + request.id + "' is already in flight");
  }
  const Clock::time_point started = Clock::now();
  const bool verify = impl_->kv_checksum;
  Import import(started + request.kv_import->prefill_timeout,
                impl_->options.transfer_timeout + impl_->options.release_grace, verify);
  import.request_id = request.id;
  import.tag = impl_->next_tag++;
  import.urls = request.kv_import->prefill_urls;
  import.traceparent = request.kv_import->traceparent;
  import.started = started;
  PrefillWork& work = import.work;
  work.request_id = request.id;
  work.transfer_tag = import.tag;
  work.prompt_token_ids = request.prompt_tokens;
  work.sampling = request.sampling;
  work.kv_descriptor = impl_->service->descriptor_base64();
  work.kv_num_blocks = layout.num_blocks;
  work.kv_layout = layout.block;
  work.first_block = first_block;
  work.block_ids.assign(block_table.begin() + first_block, block_table.begin() + prompt_blocks);
  work.timeout_ms = impl_->options.transfer_timeout.count();
  work.kv_checksum = verify;
  auto [it, inserted] = impl_->imports.emplace(request.id, std::move(import));
  impl_->tag_owners.emplace(it->second.tag, request.id);
  impl_->send_work(it->second);
  return Status::ok_status();
}

void UcxKvConnector::cancel_import(const std::string& request_id) {
  bool signal = false;
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->imports.find(request_id);
    if (it == impl_->imports.end()) return;
    Import& import = it->second;
    const size_t before = impl_->events.size();
    impl_->apply(import, import.state.cancel(
                             cancelled("request '" + request_id + "' was cancelled"), Clock::now()));
    signal = impl_->events.size() != before || Impl::needs_poll(import);
  }
  if (signal) impl_->wake();
}

std::vector<KvEvent> UcxKvConnector::poll() {
  impl_->verify_landed();
  std::lock_guard lock(impl_->mutex);
  const Clock::time_point now = Clock::now();
  for (auto it = impl_->imports.begin(); it != impl_->imports.end();) {
    Import& import = it->second;
    if (import.state.overdue(now)) {
      impl_->apply(import,
                   import.state.fail(deadline_exceeded("request '" + import.request_id + "': no " +
                                                       (import.first_token ? "KV" : "first token") +
                                                       " from prefill node " +
                                                       impl_->url_of(import) + " in time"),
                                     now));
    }
    if (import.state.releasable(now)) {
      if (import.call) import.call->cancel();
      impl_->events.push_back({KvEventKind::kImportReleased, import.request_id, Status::ok_status(),
                               std::nullopt, std::nullopt});
      impl_->tag_owners.erase(import.tag);
      it = impl_->imports.erase(it);
      continue;
    }
    ++it;
  }
  return std::exchange(impl_->events, {});
}

}  // namespace pdserve::kv_transfer
