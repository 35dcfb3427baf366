#include "kv_transfer/kv_transfer_service.h"

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/core/log.h"
#include "kv_transfer/send_staging.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

// How long a stopping service waits for the staging copies still running before it frees the
// memory they write (a copy of a few MiB takes milliseconds).
constexpr auto kStagingCopyDrain = std::chrono::seconds(5);
// cudaSetDevice creates the device's context on first use: seconds, never minutes.
constexpr std::chrono::seconds kBindDeadline{120};

// After this long without UCX activity the thread sleeps between checks (a peer's first put
// then waits at most kIdleSleep to be noticed).
constexpr auto kSpinAfterActivity = std::chrono::milliseconds(2);
constexpr auto kIdleSleep = std::chrono::microseconds(500);

// One step of a stream (see the header); kOpen carries the peer, tag, timeout and callback.
struct Command {
  enum class Op { kOpen, kPut, kClose, kAbort };
  Op op = Op::kOpen;
  uint64_t stream = 0;
  std::string peer;
  std::vector<BlockCopy> copies;
  uint64_t tag = 0;
  std::chrono::milliseconds timeout{};
  std::function<void(const KvTransferReport&)> done;
  StagedBytes staged;
};

}  // namespace

Result<TransferPath> parse_transfer_path(std::string_view name) {
  if (name == "auto") return TransferPath::kAuto;
  if (name == "direct") return TransferPath::kDirect;
  if (name == "staged") return TransferPath::kStaged;
  return invalid_argument("--kv-transfer-path must be auto, direct or staged, got '" +
                          std::string(name) + "'");
}

std::string_view transfer_path_name(TransferPath path) {
  switch (path) {
    case TransferPath::kAuto:
      return "auto";
    case TransferPath::kDirect:
      return "direct";
    case TransferPath::kStaged:
      return "staged";
  }
  return "?";
}

struct KvTransferService::Impl {
  // Destroyed bottom-up: the engine (UCX reads the staging memory until its endpoints close)
  // before the ring's bookkeeping and the memory itself, and the copier (shared with the
  // connector) last.
  std::shared_ptr<PoolCopier> copier;
  StagingMemory staging;  // [landing area | send ring], registered instead of the pool
  std::uint64_t landing_bytes = 0;
  std::unique_ptr<SendStaging> send_staging;  // null on the direct path
  std::unique_ptr<KvTransferEngine> engine;
  std::function<void(const ReceivedTransfer&)> on_received;

  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Command> commands;
  uint64_t next_stream = 1;
  bool stopping = false;
  std::thread thread;

  // Transfer thread only.
  struct Pending {
    std::function<void(const KvTransferReport&)> done;
    TransferId transfer = 0;
    PeerId peer = 0;
    Clock::time_point started;
    uint64_t bytes = 0;
    StagedBytes staged;
    bool close_requested = false;  // staged: close once the last put has gone
    Status failure;                // staged: why the stream was cancelled (a failed copy)
  };
  std::map<std::string, PeerId> peers;  // by descriptor
  std::map<uint64_t, Pending> pending;  // by stream; a stream that failed to open is absent

  static void report(const std::function<void(const KvTransferReport&)>& done,
                     KvTransferReport report) {
    if (done) done(report);
  }

  Result<PeerId> peer_for(const std::string& descriptor_base64) {
    if (auto it = peers.find(descriptor_base64); it != peers.end()) return it->second;
    PDS_ASSIGN_OR_RETURN(const std::string bytes, base64_decode(descriptor_base64));
    PDS_ASSIGN_OR_RETURN(const PeerDescriptor descriptor, parse_descriptor(bytes));
    PDS_ASSIGN_OR_RETURN(const PeerId peer, engine->connect(descriptor));
    peers.emplace(descriptor_base64, peer);
    return peer;
  }

  void forget_peer(PeerId peer) {
    for (auto it = peers.begin(); it != peers.end(); ++it) {
      if (it->second == peer) {
        (void)engine->disconnect(peer);
        peers.erase(it);
        return;
      }
    }
  }

  void apply(Command& command) {
    switch (command.op) {
      case Command::Op::kOpen:
        open(command);
        return;
      case Command::Op::kPut:
        if (auto it = pending.find(command.stream); it != pending.end()) {
          // A failure fails the transfer; poll() reports it.
          // The report times the puts, not the wait for their data (a stream opens before
          // the forward whose layers it carries).
          if (it->second.bytes == 0) it->second.started = Clock::now();
          if (send_staging) {
            stage(command.stream, it->second, command.copies);
          } else if (engine->add_puts(it->second.transfer, command.copies).ok()) {
            for (const BlockCopy& copy : command.copies) it->second.bytes += copy.bytes;
          }
        }
        return;
      case Command::Op::kClose:
        if (auto it = pending.find(command.stream); it != pending.end()) {
          it->second.close_requested = true;
          close_if_staged(command.stream, it->second);
        }
        return;
      case Command::Op::kAbort:
        // This transfer only: no more puts, no completion message; it is reported (failed,
        // Cancelled) once its issued puts are remotely complete. The peer's other transfers
        // go on. A transfer whose completion message is out finishes as usual.
        if (auto it = pending.find(command.stream); it != pending.end()) {
          if (send_staging) send_staging->drop(command.stream);
          (void)engine->cancel_transfer(it->second.transfer);
        }
        return;
    }
  }

  // Staged: the copies wait in the send ring's queue for their buffers.
  void stage(uint64_t stream, Pending& transfer, const std::vector<BlockCopy>& copies) {
    if (const Status queued = send_staging->enqueue(stream, copies); !queued.ok()) {
      transfer.failure = queued;
      send_staging->drop(stream);
      (void)engine->cancel_transfer(transfer.transfer);
    }
  }

  // Closes a stream whose close was asked for, once nothing of it waits in the send ring (at
  // once on the direct path).
  void close_if_staged(uint64_t stream, Pending& transfer) {
    if (!transfer.close_requested) return;
    if (send_staging && !send_staging->idle(stream)) return;
    transfer.close_requested = false;
    (void)engine->close_transfer(transfer.transfer);
  }

  // Staged: fills free send buffers, and posts the puts of the buffers that were filled, in
  // each stream's order; a buffer is free again once UCX reads it no more.
  bool pump_staging() {
    std::vector<std::pair<uint64_t, Status>> failed;
    std::vector<SendStaging::Filled> filled = send_staging->advance(failed);
    for (auto& [stream, why] : failed) {
      if (auto it = pending.find(stream); it != pending.end()) {
        it->second.failure = why;
        (void)engine->cancel_transfer(it->second.transfer);
      }
    }
    for (SendStaging::Filled& fill : filled) {
      auto it = pending.find(fill.stream);
      if (it == pending.end()) {
        send_staging->release(fill.slot);  // never handed out after a drop; for safety
        continue;
      }
      Pending& transfer = it->second;
      const std::byte* data = send_staging->slot_data(fill.slot);
      std::vector<BlockCopy> puts;
      puts.reserve(fill.segments.size());
      uint64_t bytes = 0;
      for (const SendStaging::Segment& segment : fill.segments) {
        if (transfer.staged) {
          transfer.staged(segment.pool_offset, data + segment.slot_offset, segment.bytes);
        }
        puts.push_back({send_staging->slot_region_offset(fill.slot) + segment.slot_offset,
                        segment.remote_offset, segment.bytes});
        bytes += segment.bytes;
      }
      SendStaging* ring = send_staging.get();
      const int slot = fill.slot;
      if (engine->add_puts(transfer.transfer, puts, [ring, slot] { ring->release(slot); }).ok()) {
        transfer.bytes += bytes;
      }
    }
    for (auto& [stream, transfer] : pending) close_if_staged(stream, transfer);
    return !filled.empty() || !failed.empty();
  }

  // After the thread stopped: the copies still filling send buffers must end before their
  // memory goes.
  void drain_staging_copies() {
    if (!send_staging) return;
    for (auto& [stream, transfer] : pending) send_staging->drop(stream);
    const auto give_up = Clock::now() + kStagingCopyDrain;
    std::vector<std::pair<uint64_t, Status>> ignored;
    while (send_staging->filling() > 0 && Clock::now() < give_up) {
      (void)send_staging->advance(ignored);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (send_staging->filling() > 0) {
      PDS_LOG_ERROR(
          "KV staging: copies into the send ring did not finish in time; its memory "
          "is left allocated");
      (void)staging.release();
    }
  }

  void open(Command& command) {
    Result<PeerId> peer = peer_for(command.peer);
    if (!peer.ok()) {
      KvTransferReport refused{peer.status().with_context("connecting to the KV receiver")};
      // An unreadable or incomplete descriptor never reached UCX.
      refused.refused = peer.status().code() == StatusCode::kInvalidArgument ||
                        peer.status().code() == StatusCode::kDataLoss;
      report(command.done, std::move(refused));
      return;
    }
    Result<TransferId> id = engine->open_transfer(*peer, command.tag, command.timeout);
    if (!id.ok()) {
      report(command.done, {id.status()});
      return;
    }
    pending.emplace(command.stream, Pending{std::move(command.done),
                                            *id,
                                            *peer,
                                            Clock::now(),
                                            0,
                                            std::move(command.staged),
                                            false,
                                            {}});
  }

  void finish_transfers() {
    for (auto it = pending.begin(); it != pending.end();) {
      Result<TransferStatus> status = engine->poll(it->second.transfer);
      if (status.ok() && status->state == TransferState::kPending) {
        ++it;
        continue;
      }
      KvTransferReport result;
      result.bytes = it->second.bytes;
      result.seconds = std::chrono::duration<double>(Clock::now() - it->second.started).count();
      const bool waited_for_ring = send_staging && send_staging->waiting_for_slot(it->first);
      if (send_staging) send_staging->drop(it->first);
      if (!status.ok()) {
        result.status = status.status();
      } else if (status->state == TransferState::kFailed) {
        result.status = !it->second.failure.ok() ? it->second.failure : status->error;
        result.refused = status->refused;
        if (waited_for_ring && it->second.failure.ok()) {
          result.status = result.status.with_context("still waiting for a free KV staging buffer");
        }
        // When the engine closed the peer's endpoint, the next send must connect again (a
        // cancelled transfer leaves the peer usable).
        if (!engine->peer_usable(it->second.peer)) forget_peer(it->second.peer);
      }
      report(it->second.done, result);
      it = pending.erase(it);
    }
  }

  void run() {
    Clock::time_point last_activity = Clock::now();
    for (;;) {
      std::deque<Command> batch;
      {
        std::unique_lock lock(mutex);
        if (commands.empty() && pending.empty() && !stopping &&
            Clock::now() - last_activity > kSpinAfterActivity) {
          wake.wait_for(lock, kIdleSleep);
        }
        if (stopping) break;
        batch.swap(commands);
      }
      for (Command& command : batch) apply(command);
      bool active = engine->progress();
      if (send_staging && pump_staging()) active = true;
      for (const ReceivedTransfer& received : engine->take_received()) {
        active = true;
        if (on_received) on_received(received);
      }
      if (!pending.empty()) finish_transfers();
      if (active || !batch.empty()) last_activity = Clock::now();
      if (!active) std::this_thread::yield();
    }
    // Fail what is left, so every caller hears back.
    std::deque<Command> left;
    {
      std::lock_guard lock(mutex);
      left.swap(commands);
    }
    const Status stopped = unavailable("the KV transfer service is stopping");
    for (Command& command : left) report(command.done, {stopped});
    for (auto& [stream, transfer] : pending) report(transfer.done, {stopped});
    drain_staging_copies();
    pending.clear();
  }

  // Chooses the path and registers the pool or the staging area.
  Status register_memory(const KvTransferServiceOptions& options, void* pool_base,
                         std::size_t pool_bytes) {
    bool staged = options.path == TransferPath::kStaged;
    if (options.path == TransferPath::kAuto) {
      staged = options.pool_memory == PoolMemory::kCuda && !engine->supports_cuda_memory();
    }
    if (!staged) return engine->register_pool(pool_base, pool_bytes, options.pool_memory);
    if (!options.copier) return invalid_argument("the staged KV path needs a pool copier");
    if (options.landing_bytes + options.send_bytes == 0) {
      return invalid_argument("the staged KV path needs staging memory (--kv-staging-mib)");
    }
    copier = options.copier;
    PDS_ASSIGN_OR_RETURN(staging,
                         copier->allocate_staging(options.landing_bytes + options.send_bytes));
    landing_bytes = options.landing_bytes;
    if (options.send_bytes > 0) {
      PDS_ASSIGN_OR_RETURN(
          send_staging, SendStaging::create(*copier, staging.get() + landing_bytes, landing_bytes,
                                            options.send_bytes, options.staging_unit));
    }
    return engine->register_pool(staging.get(), options.landing_bytes + options.send_bytes,
                                 PoolMemory::kHost);
  }
};

Result<std::unique_ptr<KvTransferService>> KvTransferService::create(
    const KvTransferServiceOptions& options, void* pool_base, std::size_t pool_bytes,
    std::function<void(const ReceivedTransfer&)> on_received) {
  auto impl = std::make_unique<Impl>();
  PDS_ASSIGN_OR_RETURN(impl->engine, KvTransferEngine::create({options.transports}));
  PDS_RETURN_IF_ERROR(impl->register_memory(options, pool_base, pool_bytes));
  PDS_ASSIGN_OR_RETURN(const PeerDescriptor descriptor, impl->engine->local_descriptor());
  impl->on_received = std::move(on_received);
  std::string encoded = base64_encode(serialize_descriptor(descriptor));
  Impl* raw = impl.get();
  std::promise<Status> bound;
  std::future<Status> bind_result = bound.get_future();
  PDS_RETURN_IF_ERROR(capture_status([&] {
    raw->thread =
        std::thread([raw, bind = options.bind_thread, bound = std::move(bound)]() mutable {
          // The thread that drives UCX uses the pool's device before anything else; when that
          // fails it ends at once (the destructor joins it).
          Status status = bind ? capture_status(bind) : Status::ok_status();
          const bool ok = status.ok();
          bound.set_value(std::move(status));
          if (ok) raw->run();
        });
    return Status::ok_status();
  }));
  std::unique_ptr<KvTransferService> service(
      new KvTransferService(std::move(impl), std::move(encoded)));
  if (bind_result.wait_for(kBindDeadline) != std::future_status::ready) {
    return deadline_exceeded("the KV transfer thread did not bind to the pool's device within " +
                             std::to_string(kBindDeadline.count()) + " s");
  }
  PDS_RETURN_IF_ERROR(bind_result.get().with_context("KV transfer thread"));
  return service;
}

KvTransferService::KvTransferService(std::unique_ptr<Impl> impl, std::string descriptor_base64)
    : impl_(std::move(impl)), descriptor_base64_(std::move(descriptor_base64)) {}

bool KvTransferService::staged() const {
  return impl_->staging != nullptr;
}

std::byte* KvTransferService::landing_area() const {
  return impl_->landing_bytes > 0 ? impl_->staging.get() : nullptr;
}

std::uint64_t KvTransferService::landing_bytes() const {
  return impl_->landing_bytes;
}

int KvTransferService::send_slots() const {
  return impl_->send_staging ? impl_->send_staging->num_slots() : 0;
}

std::uint64_t KvTransferService::send_slot_bytes() const {
  return impl_->send_staging ? impl_->send_staging->slot_bytes() : 0;
}

KvTransferService::~KvTransferService() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void KvTransferService::send(std::string peer_descriptor_base64, std::vector<BlockCopy> copies,
                             uint64_t tag, std::chrono::milliseconds timeout,
                             std::function<void(const KvTransferReport&)> done) {
  const std::optional<uint64_t> stream =
      open(std::move(peer_descriptor_base64), tag, timeout, std::move(done));
  if (!stream) return;
  put(*stream, std::move(copies));
  close(*stream);
}

std::optional<uint64_t> KvTransferService::open(std::string peer_descriptor_base64, uint64_t tag,
                                                std::chrono::milliseconds timeout,
                                                std::function<void(const KvTransferReport&)> done,
                                                StagedBytes staged) {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->stopping) {
      const uint64_t stream = impl_->next_stream++;
      impl_->commands.push_back({Command::Op::kOpen,
                                 stream,
                                 std::move(peer_descriptor_base64),
                                 {},
                                 tag,
                                 timeout,
                                 std::move(done),
                                 std::move(staged)});
      impl_->wake.notify_one();
      return stream;
    }
  }
  KvTransferReport report;
  report.status = unavailable("the KV transfer service is stopping");
  if (done) done(report);
  return std::nullopt;
}

void KvTransferService::put(uint64_t stream, std::vector<BlockCopy> copies) {
  std::lock_guard lock(impl_->mutex);
  impl_->commands.push_back({Command::Op::kPut, stream, {}, std::move(copies), 0, {}, {}, {}});
  impl_->wake.notify_one();
}

void KvTransferService::close(uint64_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->commands.push_back({Command::Op::kClose, stream, {}, {}, 0, {}, {}, {}});
  impl_->wake.notify_one();
}

void KvTransferService::abort(uint64_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->commands.push_back({Command::Op::kAbort, stream, {}, {}, 0, {}, {}, {}});
  impl_->wake.notify_one();
}

}  // namespace pdserve::kv_transfer
