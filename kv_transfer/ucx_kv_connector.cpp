#include "kv_transfer/ucx_kv_connector.h"

#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/core/log.h"
#include "kv_transfer/kv_checksum.h"

namespace pdserve::kv_transfer {
namespace {

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
  KvLayout layout;
  std::byte* pool = nullptr;
  uint64_t test_blocks_landed = 0;  // engine thread: for options.test_corrupt_every

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

  // Flips the most significant byte of the first K element of every Nth landed block (its
  // sign and exponent bits: undetected, it would change the output).
  void corrupt_for_test(std::span<const int32_t> blocks) {
    for (int32_t block : blocks) {
      if (++test_blocks_landed % static_cast<uint64_t>(options.test_corrupt_every) != 0) continue;
      pool[layout.offset(0, block, false) + layout.element_bytes() - 1] ^= std::byte{0xff};
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
  KvTransferOptions transfer_options;
  transfer_options.transports = options.transports;
  transfer_options.pool_memory = options.pool_memory;
  transfer_options.bind_thread = options.bind_thread;
  PDS_ASSIGN_OR_RETURN(
      impl->service, KvTransferService::create(transfer_options, pool_base, pool_bytes,
                                               [raw](const ReceivedTransfer& received) {
                                                 raw->remote_prefill->landed(received.request_tag);
                                               }));
  RemotePrefillOptions client_options;
  client_options.cluster_token = options.cluster_token;
  client_options.transfer_timeout = options.transfer_timeout;
  client_options.release_grace = options.release_grace;
  client_options.http_threads = options.http_threads;
  // The checksums read the pool on the host (issue #14 for device pools).
  client_options.verify_checksums = options.pool_memory == PoolMemory::kHost;
  PDS_ASSIGN_OR_RETURN(
      impl->remote_prefill,
      RemotePrefillClient::create(
          client_options, {impl->service->descriptor_base64(), layout},
          // Engine thread, no put can still land in `blocks` (remote_prefill_client.h).
          [raw](std::span<const int32_t> blocks, int first_block, int num_prompt_tokens) {
            if (raw->options.test_corrupt_every > 0) raw->corrupt_for_test(blocks);
            return prompt_block_checksums(raw->pool, raw->layout, blocks, first_block,
                                          num_prompt_tokens);
          }));
  return std::unique_ptr<UcxKvConnector>(new UcxKvConnector(std::move(impl)));
}

UcxKvConnector::UcxKvConnector(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxKvConnector::~UcxKvConnector() {
  // Stop the threads before the state they call into goes away.
  impl_->service.reset();
  impl_->remote_prefill.reset();
}

const KvLayout& UcxKvConnector::layout() const {
  return impl_->layout;
}

const std::string& UcxKvConnector::descriptor_base64() const {
  return impl_->service->descriptor_base64();
}

void UcxKvConnector::set_wakeup(std::function<void()> wakeup) {
  impl_->remote_prefill->set_wakeup(wakeup);
  std::lock_guard lock(impl_->mutex);
  impl_->wakeup = std::move(wakeup);
}

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
  if (target.checksum && impl_->options.pool_memory == PoolMemory::kHost) {
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
  impl_->remote_prefill->set_kv_checksum(on && impl_->options.pool_memory == PoolMemory::kHost);
}

Status UcxKvConnector::start_import(const InferenceRequest& request,
                                    std::span<const int32_t> block_table, int num_cached_tokens) {
  return impl_->remote_prefill->start(request, block_table, num_cached_tokens);
}

void UcxKvConnector::cancel_import(const std::string& request_id) {
  impl_->remote_prefill->cancel(request_id);
}

std::vector<KvEvent> UcxKvConnector::poll() {
  std::vector<KvEvent> events = impl_->remote_prefill->poll();
  std::lock_guard lock(impl_->mutex);
  events.insert(events.end(), std::make_move_iterator(impl_->events.begin()),
                std::make_move_iterator(impl_->events.end()));
  impl_->events.clear();
  return events;
}

}  // namespace pdserve::kv_transfer
