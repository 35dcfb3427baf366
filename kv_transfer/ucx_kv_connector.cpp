#include "kv_transfer/ucx_kv_connector.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "common/core/log.h"
#include "kv_transfer/kv_checksum.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

// How long a closing connector waits for copies from the landing area into the pool.
constexpr auto kLandingCopyDrain = std::chrono::seconds(5);

// How far an export got, shared with its report callback (which runs on the transfer thread).
struct ExportProgress {
  std::atomic<int> layers_sent{0};
  std::atomic<int> layers_overlapped{0};  // sent before the forward returned
  std::mutex mutex;
  std::vector<uint64_t> block_checksums;  // set before the completion message
  // Staged path: the checksums computed from the staged bytes (transfer thread only), and the
  // first inconsistency it met.
  std::unique_ptr<BlockChecksumStream> checksum_stream;
  Status checksum_error;
};

// A staged import that holds blocks of the landing area (engine thread only).
struct LandingImport {
  std::vector<int32_t> landing;     // landing blocks of prompt blocks first_block..
  std::vector<int32_t> pool;        // the pool's blocks for the same prompt blocks
  std::optional<CopyBatchId> copy;  // landing -> pool, from the ready event on
  std::vector<KvEvent> held;        // the import's events held behind that copy
};

// A staged import waiting for landing blocks.
struct WaitingImport {
  InferenceRequest request;
  std::vector<int32_t> block_table;
  int num_cached_tokens = 0;
  int blocks = 0;
  Clock::time_point deadline;
};

KvEvent import_failed_event(const std::string& request_id, Status why) {
  return {KvEventKind::kImportFailed, request_id, std::move(why), std::nullopt, std::nullopt};
}

KvEvent import_released_event(const std::string& request_id) {
  return {KvEventKind::kImportReleased, request_id, Status::ok_status(), std::nullopt,
          std::nullopt};
}

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
  KvLayout layout;
  std::byte* pool = nullptr;
  uint64_t test_blocks_landed = 0;  // engine thread: for options.test_corrupt_every
  // Where imported KV lands and is checksummed: the pool itself on the direct path, the
  // landing area (a small pool of its own layout) on the staged one.
  bool staged = false;
  std::byte* landing = nullptr;
  KvLayout landing_layout;
  // Staged imports (engine thread only).
  std::set<int32_t> free_landing;  // lowest first: runs of consecutive blocks stay likely
  std::map<std::string, LandingImport> landing_imports;  // by request id
  std::deque<WaitingImport> waiting_imports;
  std::vector<KvEvent> staging_events;  // of imports that never reached the client

  std::mutex mutex;
  std::function<void()> wakeup;
  std::vector<KvEvent> events;  // kExportReleased, from the transfer thread

  // Export side: the engine thread only.
  std::map<std::string, Export> exports;  // by request id
  std::atomic<bool> layerwise{true};      // set by the node's main thread

  // Posts layers [export.next_layer, end) of an export.
  void send_layers(Export& export_state, int end, bool overlapped) {
    for (; export_state.next_layer < end; ++export_state.next_layer) {
      service->put(export_state.stream,
                   std::move(export_state.layers[static_cast<size_t>(export_state.next_layer)]));
      ++export_state.progress->layers_sent;
      if (overlapped) ++export_state.progress->layers_overlapped;
    }
  }

  // Declared last: destroyed first (the service, whose completion messages go to the
  // client, before the client), so no callback runs into destroyed state.
  std::unique_ptr<RemotePrefillClient> remote_prefill;
  std::unique_ptr<KvTransferService> service;

  void wake() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mutex);
      fn = wakeup;
    }
    if (fn) fn();
  }

  bool landing_on_host() const { return staged || options.pool_memory == PoolMemory::kHost; }

  // Flips the most significant byte of the first K element of every Nth landed block (its
  // sign and exponent bits: undetected, it would change the output).
  void corrupt_for_test(std::span<const int32_t> blocks) {
    for (int32_t block : blocks) {
      if (++test_blocks_landed % static_cast<uint64_t>(options.test_corrupt_every) != 0) continue;
      landing[landing_layout.offset(0, block, false) + landing_layout.element_bytes() - 1] ^=
          std::byte{0xff};
    }
  }

  // ---- the staged path's imports (engine thread) -------------------------------------------

  // Takes landing blocks for the import and hands it to the client, which names them in the
  // PrefillWork in place of the pool's.
  Status begin_landing(const InferenceRequest& request, std::span<const int32_t> block_table,
                       int num_cached_tokens, int blocks) {
    const int first_block = num_cached_tokens / layout.block_size;
    std::vector<int32_t> landing_table(static_cast<size_t>(first_block + blocks), 0);
    LandingImport import;
    for (int i = 0; i < blocks; ++i) {
      const int32_t block = *free_landing.begin();
      free_landing.erase(free_landing.begin());
      import.landing.push_back(block);
      landing_table[static_cast<size_t>(first_block + i)] = block;
    }
    import.pool.assign(block_table.begin() + first_block,
                       block_table.begin() + first_block + blocks);
    const Status started = remote_prefill->start(request, landing_table, num_cached_tokens);
    if (!started.ok()) {
      free_landing.insert(import.landing.begin(), import.landing.end());
      return started;
    }
    landing_imports.insert_or_assign(request.id, std::move(import));
    return Status::ok_status();
  }

  // Starts waiting imports for which landing blocks are free now, in arrival order, and fails
  // those whose wait ran past its deadline.
  void start_waiting_imports() {
    const Clock::time_point now = Clock::now();
    while (!waiting_imports.empty()) {
      WaitingImport& next = waiting_imports.front();
      if (static_cast<int>(free_landing.size()) >= next.blocks) {
        const Status started =
            begin_landing(next.request, next.block_table, next.num_cached_tokens, next.blocks);
        if (!started.ok()) {
          staging_events.push_back(import_failed_event(next.request.id, started));
          staging_events.push_back(import_released_event(next.request.id));
        }
        waiting_imports.pop_front();
        continue;
      }
      if (now < next.deadline) break;
      staging_events.push_back(import_failed_event(
          next.request.id,
          resource_exhausted("request '" + next.request.id + "': no " +
                             std::to_string(next.blocks) + " free KV landing blocks within " +
                             std::to_string(options.transfer_timeout.count()) +
                             " ms (the staging area holds " +
                             std::to_string(landing_layout.num_blocks) + "; --kv-staging-mib)")));
      staging_events.push_back(import_released_event(next.request.id));
      waiting_imports.pop_front();
    }
  }

  // The copies of a ready import's landed blocks into the pool: per layer and half, one per
  // run of blocks consecutive on both sides.
  std::vector<PoolCopy> landing_copies(const LandingImport& import) const {
    std::vector<PoolCopy> copies;
    const std::uint64_t unit = layout.layer_block_bytes();
    const size_t count = import.landing.size();
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (bool value_half : {false, true}) {
        for (size_t i = 0; i < count;) {
          size_t run = 1;
          while (i + run < count && import.landing[i + run] == import.landing[i] + int32_t(run) &&
                 import.pool[i + run] == import.pool[i] + int32_t(run)) {
            ++run;
          }
          copies.push_back({layout.offset(layer, import.pool[i], value_half),
                            landing + landing_layout.offset(layer, import.landing[i], value_half),
                            unit * run});
          i += run;
        }
      }
    }
    return copies;
  }

  // Passes one event of a staged import on, or holds it: a ready import's KV is copied into
  // the pool first, and its events wait behind that copy; a released import gives its landing
  // blocks back.
  void route_landing_event(KvEvent event, LandingImport& import, std::vector<KvEvent>& out) {
    if (import.copy) {
      import.held.push_back(std::move(event));
      return;
    }
    if (event.kind == KvEventKind::kImportReady) {
      const std::vector<PoolCopy> copies = landing_copies(import);
      Result<CopyBatchId> batch = options.copier->start(CopyDirection::kToPool, copies);
      if (!batch.ok()) {
        out.push_back(import_failed_event(
            event.request_id, batch.status().with_context("copying the landed KV into the pool")));
        return;
      }
      import.copy = *batch;
      import.held.push_back(std::move(event));
      return;
    }
    if (event.kind == KvEventKind::kImportReleased) {
      free_landing.insert(import.landing.begin(), import.landing.end());
      const std::string id = event.request_id;
      out.push_back(std::move(event));
      landing_imports.erase(id);
      return;
    }
    out.push_back(std::move(event));
  }

  // The engine's view of staged imports: the client's events, held or passed on, the events
  // of imports whose copy into the pool finished, and those of imports that never started.
  std::vector<KvEvent> route_landing_events(std::vector<KvEvent> client_events) {
    std::vector<KvEvent> out;
    for (KvEvent& event : client_events) {
      auto it = landing_imports.find(event.request_id);
      if (it == landing_imports.end()) {
        out.push_back(std::move(event));
        continue;
      }
      route_landing_event(std::move(event), it->second, out);
    }
    for (auto it = landing_imports.begin(); it != landing_imports.end();) {
      LandingImport& import = it->second;
      if (!import.copy) {
        ++it;
        continue;
      }
      const Result<bool> done = options.copier->finished(*import.copy);
      if (done.ok() && !*done) {
        ++it;
        continue;
      }
      import.copy.reset();
      bool released = false;
      for (KvEvent& event : std::exchange(import.held, {})) {
        if (event.kind == KvEventKind::kImportReady && !done.ok()) {
          // The pool did not get the KV: the engine prefills the request itself.
          event = import_failed_event(
              event.request_id, done.status().with_context("copying the landed KV into the pool"));
        }
        released = released || event.kind == KvEventKind::kImportReleased;
        out.push_back(std::move(event));
      }
      if (released) {
        free_landing.insert(import.landing.begin(), import.landing.end());
        it = landing_imports.erase(it);
      } else {
        ++it;
      }
    }
    start_waiting_imports();
    out.insert(out.end(), std::make_move_iterator(staging_events.begin()),
               std::make_move_iterator(staging_events.end()));
    staging_events.clear();
    return out;
  }

  // Before the landing area goes: copies still reading it must end.
  void drain_landing_copies() {
    const auto give_up = Clock::now() + kLandingCopyDrain;
    for (auto& [id, import] : landing_imports) {
      while (import.copy) {
        const Result<bool> done = options.copier->finished(*import.copy);
        if (!done.ok() || *done) {
          import.copy.reset();
        } else if (Clock::now() > give_up) {
          PDS_LOG_ERROR(
              "KV staging: a copy from the landing area into the pool did not finish "
              "within 5 s; freeing the landing area anyway");
          return;
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
    }
  }
};

Result<std::unique_ptr<UcxKvConnector>> UcxKvConnector::create(const UcxKvConnectorOptions& options,
                                                               void* pool_base,
                                                               std::size_t pool_bytes,
                                                               const KvLayout& layout) {
  if (layout.token_elements() < 1 || layout.num_blocks < 1 || layout.num_layers < 1) {
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
  if (options.test_corrupt_every > 0) {
    PDS_LOG_WARN("KV connector: TEST ONLY: one byte of every " +
                 std::to_string(options.test_corrupt_every) +
                 "th imported block is flipped after it lands");
  }
  Impl* raw = impl.get();
  KvTransferServiceOptions transfer_options;
  transfer_options.transports = options.transports;
  transfer_options.pool_memory = options.pool_memory;
  transfer_options.path = options.path;
  transfer_options.copier = options.copier;
  KvLayout landing_layout = layout;
  landing_layout.num_blocks = static_cast<int>(options.staging_receive_bytes /
                                               std::max<std::size_t>(1, layout.bytes_per_block()));
  transfer_options.landing_bytes = landing_layout.total_bytes();
  transfer_options.send_bytes = options.staging_send_bytes;
  transfer_options.staging_unit = layout.layer_block_bytes();
  transfer_options.bind_thread = options.bind_thread;
  PDS_ASSIGN_OR_RETURN(
      impl->service, KvTransferService::create(transfer_options, pool_base, pool_bytes,
                                               [raw](const ReceivedTransfer& received) {
                                                 raw->remote_prefill->landed(received.request_tag);
                                               }));
  impl->staged = impl->service->staged();
  if (impl->staged) {
    impl->landing = impl->service->landing_area();
    impl->landing_layout = landing_layout;
    for (int32_t block = 0; block < landing_layout.num_blocks; ++block) {
      impl->free_landing.insert(block);
    }
    std::weak_ptr<Impl> weak = impl;
    options.copier->set_on_finished([weak] {
      if (auto self = weak.lock()) self->wake();
    });
    PDS_LOG_INFO("KV transfer: staged path through host memory (" + options.copier->description() +
                 " pool): landing area of " + std::to_string(landing_layout.num_blocks) +
                 " blocks, send ring of " + std::to_string(impl->service->send_slots()) + " x " +
                 std::to_string(impl->service->send_slot_bytes() >> 10) + " KiB");
  } else {
    impl->landing = impl->pool;
    impl->landing_layout = layout;
  }
  RemotePrefillOptions client_options;
  client_options.cluster_token = options.cluster_token;
  client_options.transfer_timeout = options.transfer_timeout;
  client_options.release_grace = options.release_grace;
  client_options.http_threads = options.http_threads;
  // The checksums read landed KV on the host: a host pool, or the staged path's landing area.
  client_options.verify_checksums = impl->landing_on_host();
  PDS_ASSIGN_OR_RETURN(
      impl->remote_prefill,
      RemotePrefillClient::create(
          client_options,
          {impl->service->descriptor_base64(), impl->landing_layout, options.kv_k_scales,
           options.kv_v_scales},
          // Engine thread, no put can still land in `blocks` (remote_prefill_client.h).
          [raw](std::span<const int32_t> blocks, int first_block, int num_prompt_tokens) {
            if (raw->options.test_corrupt_every > 0) raw->corrupt_for_test(blocks);
            return prompt_block_checksums(raw->landing, raw->landing_layout, blocks, first_block,
                                          num_prompt_tokens);
          }));
  return std::unique_ptr<UcxKvConnector>(new UcxKvConnector(std::move(impl)));
}

UcxKvConnector::UcxKvConnector(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxKvConnector::~UcxKvConnector() {
  // The engine may be going away: no copy that finishes from now on wakes it.
  if (impl_->options.copier) impl_->options.copier->set_on_finished({});
  {
    std::lock_guard lock(impl_->mutex);
    impl_->wakeup = nullptr;
  }
  // Stop the threads before the state they call into goes away, and the copies out of the
  // landing area before its memory (the service's) goes.
  if (impl_->staged) impl_->drain_landing_copies();
  impl_->service.reset();
  impl_->remote_prefill.reset();
}

const KvLayout& UcxKvConnector::layout() const {
  return impl_->layout;
}

KvBlockLayout UcxKvConnector::block_layout() const {
  return kv_block_layout(impl_->layout, impl_->options.kv_k_scales, impl_->options.kv_v_scales);
}

const std::string& UcxKvConnector::descriptor_base64() const {
  return impl_->service->descriptor_base64();
}

bool UcxKvConnector::staged() const {
  return impl_->staged;
}

int UcxKvConnector::landing_blocks() const {
  return impl_->staged ? impl_->landing_layout.num_blocks : 0;
}

void UcxKvConnector::set_wakeup(std::function<void()> wakeup) {
  impl_->remote_prefill->set_wakeup(wakeup);
  std::lock_guard lock(impl_->mutex);
  impl_->wakeup = std::move(wakeup);
}

namespace {

// Feeds an export's staged bytes to its checksum stream (none when no checksum was asked for).
StagedBytes staged_checksums(const std::shared_ptr<ExportProgress>& progress) {
  if (!progress->checksum_stream) return {};
  return [progress](uint64_t pool_offset, const std::byte* data, uint64_t bytes) {
    if (!progress->checksum_error.ok()) return;
    progress->checksum_error = progress->checksum_stream->add(pool_offset, data, bytes);
  };
}

}  // namespace

Status UcxKvConnector::start_export(const std::string& request_id, const KvExportTarget& target,
                                    std::span<const int32_t> block_table, int num_prompt_tokens) {
  const KvLayout& local = impl_->layout;
  const int block_size = local.block_size;
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
  KvLayout remote = local;
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
  if (target.checksum && impl_->staged) {
    // Computed from the staged bytes as they pass through the send ring.
    export_state.progress->checksum_stream = std::make_unique<BlockChecksumStream>(
        local,
        std::span<const int32_t>(block_table.data() + target.first_block,
                                 static_cast<size_t>(prompt_blocks - target.first_block)),
        target.first_block, num_prompt_tokens);
  } else if (target.checksum && impl_->options.pool_memory == PoolMemory::kHost) {
    export_state.checksum_blocks.assign(block_table.begin() + target.first_block,
                                        block_table.begin() + prompt_blocks);
    export_state.first_block = target.first_block;
    export_state.num_prompt_tokens = num_prompt_tokens;
  }
  const std::uint64_t run_unit = local.layer_block_bytes();
  for (int layer = 0; layer < local.num_layers; ++layer) {
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
        if (report.status.ok() && progress->checksum_stream) {
          // Staged: every put has gone through the ring (transfer thread, as the stream's adds).
          Result<std::vector<uint64_t>> sums =
              progress->checksum_error.ok()
                  ? progress->checksum_stream->finish()
                  : Result<std::vector<uint64_t>>(progress->checksum_error);
          if (sums.ok()) {
            report.block_checksums = std::move(*sums);
          } else {
            // Sent, but without checksums that match: the receiver must not use it.
            report.status =
                internal_error("KV export of '" + request_id +
                               "': checksums of the staged bytes: " + sums.status().message());
          }
        } else if (report.status.ok()) {
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
      },
      staged_checksums(export_state.progress));
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
  impl_->remote_prefill->set_kv_checksum(on && impl_->landing_on_host());
}

Status UcxKvConnector::start_import(const InferenceRequest& request,
                                    std::span<const int32_t> block_table, int num_cached_tokens) {
  if (!impl_->staged) return impl_->remote_prefill->start(request, block_table, num_cached_tokens);
  const int block_size = impl_->layout.block_size;
  const int prompt_blocks =
      (static_cast<int>(request.prompt_tokens.size()) + block_size - 1) / block_size;
  const int first_block = num_cached_tokens / block_size;
  if (static_cast<int>(block_table.size()) < prompt_blocks || first_block >= prompt_blocks) {
    return internal_error("KV import of '" + request.id +
                          "': the block table does not cover the prompt");
  }
  if (!request.kv_import || request.kv_import->prefill_urls.empty()) {
    return invalid_argument("KV import of '" + request.id + "': no prefill node");
  }
  const int blocks = prompt_blocks - first_block;
  if (blocks > impl_->landing_layout.num_blocks) {
    // It could never land here: the engine prefills it itself.
    impl_->staging_events.push_back(import_failed_event(
        request.id, resource_exhausted(
                        "request '" + request.id + "' needs " + std::to_string(blocks) +
                        " KV landing blocks; the staging "
                        "area holds " +
                        std::to_string(impl_->landing_layout.num_blocks) + " (--kv-staging-mib)")));
    impl_->staging_events.push_back(import_released_event(request.id));
    impl_->wake();
    return Status::ok_status();
  }
  if (impl_->waiting_imports.empty() && static_cast<int>(impl_->free_landing.size()) >= blocks) {
    return impl_->begin_landing(request, block_table, num_cached_tokens, blocks);
  }
  impl_->waiting_imports.push_back({request,
                                    {block_table.begin(), block_table.end()},
                                    num_cached_tokens,
                                    blocks,
                                    Clock::now() + impl_->options.transfer_timeout});
  return Status::ok_status();
}

void UcxKvConnector::cancel_import(const std::string& request_id) {
  auto waiting = std::find_if(impl_->waiting_imports.begin(), impl_->waiting_imports.end(),
                              [&](const WaitingImport& w) { return w.request.id == request_id; });
  if (waiting == impl_->waiting_imports.end()) {
    impl_->remote_prefill->cancel(request_id);
    return;
  }
  // Nothing was sent for it.
  impl_->waiting_imports.erase(waiting);
  impl_->staging_events.push_back(
      import_failed_event(request_id, cancelled("request '" + request_id + "' was cancelled")));
  impl_->staging_events.push_back(import_released_event(request_id));
  impl_->wake();
}

std::vector<KvEvent> UcxKvConnector::poll() {
  std::vector<KvEvent> events = impl_->remote_prefill->poll();
  if (impl_->staged) events = impl_->route_landing_events(std::move(events));
  std::lock_guard lock(impl_->mutex);
  events.insert(events.end(), std::make_move_iterator(impl_->events.begin()),
                std::make_move_iterator(impl_->events.end()));
  impl_->events.clear();
  return events;
}

}  // namespace pdserve::kv_transfer
