#include "kv_transfer/kv_transfer_service.h"

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/core/log.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

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
};

}  // namespace

struct KvTransferService::Impl {
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
          if (engine->add_puts(it->second.transfer, command.copies).ok()) {
            for (const BlockCopy& copy : command.copies) it->second.bytes += copy.bytes;
          }
        }
        return;
      case Command::Op::kClose:
        if (auto it = pending.find(command.stream); it != pending.end()) {
          (void)engine->close_transfer(it->second.transfer);
        }
        return;
      case Command::Op::kAbort:
        // This transfer only: no more puts, no completion message; it is reported (failed,
        // Cancelled) once its issued puts are remotely complete. The peer's other transfers
        // go on. A transfer whose completion message is out finishes as usual.
        if (auto it = pending.find(command.stream); it != pending.end()) {
          (void)engine->cancel_transfer(it->second.transfer);
        }
        return;
    }
  }

  void open(Command& command) {
    Result<PeerId> peer = peer_for(command.peer);
    if (!peer.ok()) {
      report(command.done, {peer.status().with_context("connecting to the KV receiver")});
      return;
    }
    Result<TransferId> id = engine->open_transfer(*peer, command.tag, command.timeout);
    if (!id.ok()) {
      report(command.done, {id.status()});
      return;
    }
    pending.emplace(command.stream, Pending{std::move(command.done), *id, *peer, Clock::now(), 0});
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
      if (!status.ok()) {
        result.status = status.status();
      } else if (status->state == TransferState::kFailed) {
        result.status = status->error;
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
    pending.clear();
  }
};

Result<std::unique_ptr<KvTransferService>> KvTransferService::create(
    const KvTransferOptions& options, void* pool_base, std::size_t pool_bytes,
    std::function<void(const ReceivedTransfer&)> on_received) {
  auto impl = std::make_unique<Impl>();
  PDS_ASSIGN_OR_RETURN(impl->engine, KvTransferEngine::create(options));
  PDS_RETURN_IF_ERROR(impl->engine->register_pool(pool_base, pool_bytes));
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
                                                std::function<void(const KvTransferReport&)> done) {
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
                                 std::move(done)});
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
  impl_->commands.push_back({Command::Op::kPut, stream, {}, std::move(copies), 0, {}, {}});
  impl_->wake.notify_one();
}

void KvTransferService::close(uint64_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->commands.push_back({Command::Op::kClose, stream, {}, {}, 0, {}, {}});
  impl_->wake.notify_one();
}

void KvTransferService::abort(uint64_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->commands.push_back({Command::Op::kAbort, stream, {}, {}, 0, {}, {}});
  impl_->wake.notify_one();
}

}  // namespace pdserve::kv_transfer
