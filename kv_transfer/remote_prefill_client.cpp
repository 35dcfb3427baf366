#include "kv_transfer/remote_prefill_client.h"

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/log.h"
#include "common/http/http_client.h"
#include "common/protocol/pdserve_headers.h"
#include "kv_transfer/kv_checksum.h"
#include "kv_transfer/remote_prefill_state.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

// One import in flight: the exchange's data; its lifecycle (and when its blocks may be freed)
// is the RemotePrefillState.
struct Import {
  std::string request_id;
  uint64_t tag = 0;
  PrefillWork work;
  std::vector<std::string> urls;
  size_t url_index = 0;
  // Which call the HTTP callbacks belong to: a re-fetch abandons a call that may still talk.
  uint64_t attempt = 0;
  std::shared_ptr<http::ClientCall> call;
  int http_status = 0;
  std::string pending_bytes;  // of the event stream, up to the next '\n'
  std::string error_body;     // of a non-200 answer
  std::optional<PrefillEvent> first_token;
  std::optional<PrefillEvent> kv_sent;
  int checksum_mismatches = 0;  // landings whose checksums did not match
  int refetches = 0;            // then fetched again from the next node
  std::chrono::milliseconds prefill_timeout{0};
  std::string traceparent;  // sent with the work
  // The exchange with the current prefill node, for the request's timeline.
  Clock::time_point work_posted;
  Clock::time_point head_received;
  Clock::time_point first_token_received;
  RemotePrefillState state;

  Import(Clock::time_point deadline, Clock::duration hold, bool verify)
      : state(deadline, hold, verify) {}

  bool another_node() const { return url_index + 1 < urls.size(); }
};

}  // namespace

struct RemotePrefillClient::Impl : std::enable_shared_from_this<RemotePrefillClient::Impl> {
  RemotePrefillOptions options;
  ImportDestination destination;
  LandedChecksums landed_checksums;
  std::atomic<bool> verify_checksums{true};  // set by the node's main thread

  std::mutex mutex;
  std::function<void()> wakeup;
  std::vector<KvEvent> events;
  std::map<std::string, Import> imports;       // by request id
  std::map<uint64_t, std::string> tag_owners;  // transfer tag -> request id
  uint64_t next_tag = 1;
  bool stopping = false;  // being destroyed: no new HTTP calls

  // Declared last: destroyed first, so no callback runs into destroyed state.
  std::unique_ptr<http::HttpClient> http;

  void wake() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mutex);
      fn = wakeup;
    }
    if (fn) fn();
  }

  // ---- all with the mutex held ------------------------------------------------------------

  const std::string& url_of(const Import& import) const { return import.urls[import.url_index]; }

  // Carries out what the state machine decided. `verify` is left to the engine thread's next
  // poll() (verify_landed), which the caller wakes.
  void apply(Import& import, const ImportActions& actions) {
    if (actions.report_first_token) report_first_token(import);
    if (actions.report_failure) {
      std::optional<RemotePrefillStats> figures;  // the mismatches this failure ends
      if (import.checksum_mismatches > 0) {
        figures.emplace();
        figures->checksum_mismatches = import.checksum_mismatches;
        figures->refetches = import.refetches;
      }
      events.push_back({KvEventKind::kImportFailed, import.request_id, *actions.report_failure,
                        std::nullopt, std::move(figures)});
    }
    if (actions.report_ready) {
      events.push_back({KvEventKind::kImportReady, import.request_id, Status::ok_status(),
                        std::nullopt, stats_of(import)});
    }
    if (actions.cancel_call && import.call) import.call->cancel();
    if (actions.send_cancel) send_cancel(import);
    if (actions.retry_next_node) retry_next_node(import);
  }

  void retry_next_node(Import& import) {
    const bool refetch = import.state.refetching();
    PDS_LOG_WARN(
        "prefill node " + url_of(import) +
        (refetch ? " sent KV that failed its checksums for request '" : " did not take request '") +
        import.request_id + "'; trying the next prefill node");
    if (import.call) import.call->cancel();  // a re-fetch's old call may still be open
    import.call.reset();
    ++import.url_index;
    // A new transfer tag: a late message of the last transfer matches nothing.
    tag_owners.erase(import.tag);
    import.tag = next_tag++;
    tag_owners.emplace(import.tag, import.request_id);
    import.work.transfer_tag = import.tag;
    import.first_token.reset();
    import.kv_sent.reset();
    if (refetch) ++import.refetches;
    // A re-fetch is a whole new prefill; a refused work keeps the first call's deadline.
    import.state.restart(refetch ? Clock::now() + import.prefill_timeout : import.state.deadline());
    send_work(import);
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
    stats.checksum_mismatches = import.checksum_mismatches;
    stats.refetches = import.refetches;
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
    result.prompt_logprobs = first.prompt_logprobs;
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
        apply(import,
              import.state.prefill_ended_without_kv(unavailable(
                  "prefill node " + url_of(import) + ": the KV transfer failed: " + event->error)));
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
                                            import.another_node(), Clock::now()));
      return;
    }
    http::ClientRequest request = internal_request(
        "/internal/v1/prefill", prefill_work_to_json(import.work).dump(),
        std::chrono::duration_cast<Clock::duration>(import.state.deadline() - Clock::now()) +
            options.transfer_timeout);
    if (!import.traceparent.empty())
      request.headers.emplace_back(std::string(kTraceparentHeader), import.traceparent);
    const std::string id = import.request_id;
    const uint64_t attempt = ++import.attempt;
    std::weak_ptr<Impl> weak = weak_from_this();
    http::StreamCallbacks callbacks;
    callbacks.on_sending = [weak, id, attempt, hook = options.test_before_work_sent] {
      if (hook) hook(id);
      if (auto self = weak.lock())
        self->with_import(id, attempt,
                          [&](Import& target) { self->apply(target, target.state.work_sent()); });
    };
    callbacks.on_head = [weak, id, attempt, hook = options.test_after_head](
                            int status, const http::HeaderList&) {
      const Clock::time_point arrived = Clock::now();
      if (auto self = weak.lock())
        self->with_import(id, attempt, [&](Import& target) {
          target.http_status = status;
          target.head_received = arrived;
          self->apply(target, target.state.head(status));
        });
      if (hook) hook(id);
    };
    callbacks.on_body = [weak, id, attempt](std::string_view bytes) {
      if (auto self = weak.lock())
        self->with_import(id, attempt, [&](Import& target) {
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
    callbacks.on_done = [weak, id, attempt](const Status& outcome) {
      if (auto self = weak.lock())
        self->with_import(id, attempt, [&](Import& target) { self->call_ended(target, outcome); });
    };
    import.work_posted = Clock::now();
    import.call = http->stream(*url, std::move(request), std::move(callbacks));
  }

  // Asks the prefill node to abort this work. It confirms on the work's event stream, if that
  // is still open (kv_failed or an error event once no put of it can land), and with the
  // cancel's own answer, which it sends only once no put can land (settled); the answer also
  // reaches an import whose work call was closed while the work went out. An older prefill
  // node answers at once, unsettled: its stream confirms. When the cancel call fails (a prefill
  // node without the endpoint, a network error), the work's call is closed instead, which also
  // makes the prefill node abort the work, but nothing confirms it: the blocks wait for the
  // hold deadline.
  void send_cancel(const Import& import) {
    if (stopping) return;
    Result<http::BaseUrl> url = http::parse_base_url(url_of(import));
    if (!url.ok()) {
      if (import.call) import.call->cancel();
      return;
    }
    PrefillCancel cancel{import.request_id, import.tag};
    const std::string where = url_of(import);
    const uint64_t attempt = import.attempt;
    std::weak_ptr<Impl> weak = weak_from_this();
    http->fetch(
        *url,
        // The answer may wait for an export under way to end: up to the hold.
        internal_request("/internal/v1/prefill/cancel", prefill_cancel_to_json(cancel).dump(),
                         options.transfer_timeout + options.release_grace),
        [weak, where, attempt, id = import.request_id](Result<http::ClientResponse> response) {
          if (response.ok() && response->status == 200) {
            Result<PrefillCancelAnswer> answer = parse_prefill_cancel_answer(response->body);
            if (!answer.ok()) {
              PDS_LOG_WARN("prefill node " + where + " answered the cancel of request '" + id +
                           "' with " + answer.status().message() + "; waiting for its stream");
              return;
            }
            if (!answer->settled) return;  // an older prefill node: its stream confirms
            if (auto self = weak.lock())
              self->with_import(id, attempt, [&](Import& target) {
                self->apply(target, target.state.prefill_settled());
              });
            return;
          }
          PDS_LOG_WARN("cancelling request '" + id + "' on prefill node " + where + " failed: " +
                       (response.ok() ? "HTTP " + std::to_string(response->status)
                                      : response.status().message()) +
                       "; closing its call instead, its blocks are held until the "
                       "deadline");
          if (auto self = weak.lock())
            self->with_import(id, attempt, [](Import& target) {
              if (target.call) target.call->cancel();
            });
        });
  }

  void call_ended(Import& import, const Status& outcome) {
    import.call.reset();
    Status why = outcome;
    if (import.http_status != 0 && import.http_status != 200) {
      why =
          unavailable("prefill node " + url_of(import) + " answered HTTP " +
                      std::to_string(import.http_status) + ": " + import.error_body.substr(0, 300));
    } else if (!import.first_token) {
      why = unavailable("prefill node " + url_of(import) +
                        " ended the exchange without a first token" +
                        (outcome.ok() ? std::string() : ": " + outcome.message()));
    }
    apply(import, import.state.call_ended(why, import.another_node(), Clock::now()));
  }

  static bool needs_poll(const Import& import) {
    return import.state.state() == ImportState::kVerifying || import.state.releasable(Clock::now());
  }

  // Engine thread (poll): compares the landed blocks of every import in kVerifying with the
  // checksums of its kv_sent. The blocks are read without the mutex: only the engine thread
  // frees blocks, after a poll reports them released, and no put can land after the
  // completion message, so they cannot change meanwhile.
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
        jobs.push_back(
            {id, import.work.block_ids, import.work.first_block,
             static_cast<int>(import.work.prompt_token_ids.size()),
             import.kv_sent ? import.kv_sent->block_checksums : std::vector<uint64_t>()});
      }
    }
    for (const Job& job : jobs) {
      const std::vector<uint64_t> landed =
          landed_checksums(job.blocks, job.first_block, job.num_prompt_tokens);
      Status outcome = compare_block_checksums(job.sent, landed);
      std::lock_guard lock(mutex);
      auto it = imports.find(job.request_id);
      if (it == imports.end()) continue;
      Import& import = it->second;
      if (!outcome.ok()) {
        ++import.checksum_mismatches;
        outcome = outcome.with_context("request '" + job.request_id + "', KV from prefill node " +
                                       url_of(import));
        PDS_LOG_WARN(outcome.message());
      }
      apply(import, import.state.verified(outcome, import.another_node()));
    }
  }

  // Runs `fn` on the import `id` if its current call is `attempt` (0: any), then wakes the
  // engine if that produced something to poll.
  template <typename Fn>
  void with_import(const std::string& id, uint64_t attempt, Fn&& fn) {
    bool signal = false;
    {
      std::lock_guard lock(mutex);
      auto it = imports.find(id);
      if (it == imports.end() || (attempt != 0 && it->second.attempt != attempt)) return;
      const size_t before = events.size();
      fn(it->second);
      // New events, blocks to verify, or blocks that may now be freed (a confirmation reports
      // nothing new).
      signal = events.size() != before || needs_poll(it->second);
    }
    if (signal) wake();
  }
};

Result<std::unique_ptr<RemotePrefillClient>> RemotePrefillClient::create(
    const RemotePrefillOptions& options, ImportDestination destination,
    LandedChecksums landed_checksums) {
  if (!landed_checksums) return invalid_argument("remote prefill: no landed-block checksums");
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->destination = std::move(destination);
  impl->landed_checksums = std::move(landed_checksums);
  impl->verify_checksums = options.verify_checksums;
  PDS_ASSIGN_OR_RETURN(impl->http, http::HttpClient::create(options.http_threads));
  return std::unique_ptr<RemotePrefillClient>(new RemotePrefillClient(std::move(impl)));
}

RemotePrefillClient::RemotePrefillClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemotePrefillClient::~RemotePrefillClient() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->http.reset();
}

void RemotePrefillClient::set_wakeup(std::function<void()> wakeup) {
  std::lock_guard lock(impl_->mutex);
  impl_->wakeup = std::move(wakeup);
}

void RemotePrefillClient::set_kv_checksum(bool on) {
  impl_->verify_checksums = on;
}

Status RemotePrefillClient::start(const InferenceRequest& request,
                                  std::span<const int32_t> block_table, int num_cached_tokens) {
  const ImportDestination& destination = impl_->destination;
  const int block_size = destination.pool.block_size;
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
  const bool verify = impl_->verify_checksums;
  Import import(Clock::now() + request.kv_import->prefill_timeout,
                impl_->options.transfer_timeout + impl_->options.release_grace, verify);
  import.request_id = request.id;
  import.tag = impl_->next_tag++;
  import.urls = request.kv_import->prefill_urls;
  import.prefill_timeout = request.kv_import->prefill_timeout;
  import.traceparent = request.kv_import->traceparent;
  PrefillWork& work = import.work;
  work.request_id = request.id;
  work.transfer_tag = import.tag;
  work.prompt_token_ids = request.prompt_tokens;
  work.sampling = request.sampling;
  work.kv_descriptor = destination.kv_descriptor;
  work.kv_num_blocks = destination.pool.num_blocks;
  work.kv_layout = kv_block_layout(destination.pool, destination.k_scales, destination.v_scales);
  work.first_block = first_block;
  work.block_ids.assign(block_table.begin() + first_block, block_table.begin() + prompt_blocks);
  work.timeout_ms = impl_->options.transfer_timeout.count();
  work.kv_checksum = verify;
  auto [it, inserted] = impl_->imports.emplace(request.id, std::move(import));
  impl_->tag_owners.emplace(it->second.tag, request.id);
  impl_->send_work(it->second);
  return Status::ok_status();
}

void RemotePrefillClient::cancel(const std::string& request_id) {
  impl_->with_import(request_id, 0, [&](Import& import) {
    impl_->apply(
        import,
        import.state.cancel(cancelled("request '" + request_id + "' was cancelled"), Clock::now()));
  });
}

void RemotePrefillClient::landed(uint64_t tag) {
  std::string owner;
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->tag_owners.find(tag);
    if (it == impl_->tag_owners.end()) {
      PDS_LOG_WARN("KV transfer: a completion message with tag " + std::to_string(tag) +
                   " matches no pending request; ignored");
      return;
    }
    owner = it->second;
  }
  // The completion message follows every put: after a cancel, nothing more can land.
  impl_->with_import(owner, 0,
                     [&](Import& import) { impl_->apply(import, import.state.landed_now()); });
}

std::vector<KvEvent> RemotePrefillClient::poll() {
  impl_->verify_landed();
  std::lock_guard lock(impl_->mutex);
  const Clock::time_point now = Clock::now();
  for (auto it = impl_->imports.begin(); it != impl_->imports.end();) {
    Import& import = it->second;
    if (import.state.overdue(now)) {
      impl_->apply(
          import, import.state.fail(
                      deadline_exceeded("request '" + import.request_id + "': no " +
                                        (import.first_token ? "KV" : "first token") +
                                        " from prefill node " + impl_->url_of(import) + " in time"),
                      now));
    }
    if (import.state.releasable(now)) {
      if (import.call) import.call->cancel();
      Status released = Status::ok_status();
      if (import.state.hold_expired(now)) {
        released = deadline_exceeded(
            "request '" + import.request_id + "': " + std::to_string(import.work.block_ids.size()) +
            " KV blocks freed at the hold deadline (transfer timeout + grace, " +
            std::to_string(
                (impl_->options.transfer_timeout + impl_->options.release_grace).count()) +
            " ms): prefill node " + impl_->url_of(import) +
            " never confirmed that no put of transfer " + std::to_string(import.tag) +
            " can land; held because " + import.state.hold_reason().message());
        PDS_LOG_WARN(released.message());
      }
      impl_->events.push_back(
          {KvEventKind::kImportReleased, import.request_id, released, std::nullopt, std::nullopt});
      impl_->tag_owners.erase(import.tag);
      it = impl_->imports.erase(it);
      continue;
    }
    ++it;
  }
  return std::exchange(impl_->events, {});
}

}  // namespace pdserve::kv_transfer
