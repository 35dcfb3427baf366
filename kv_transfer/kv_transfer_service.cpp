#include "kv_transfer/kv_transfer_service.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/core/log.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;

// After this long without UCX activity the thread sleeps between checks (a peer's first put
// then waits at most kIdleSleep to be noticed).
constexpr auto kSpinAfterActivity = std::chrono::milliseconds(2);
constexpr auto kIdleSleep = std::chrono::microseconds(500);

struct SendCommand {
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
  std::deque<SendCommand> commands;
  bool stopping = false;
  std::thread thread;

  // Transfer thread only.
  struct Pending {
    SendCommand command;
    PeerId peer = 0;
    Clock::time_point started;
    uint64_t bytes = 0;
  };
  std::map<std::string, PeerId> peers;  // by descriptor
  std::map<TransferId, Pending> pending;

  static void report(const SendCommand& command, KvTransferReport report) {
    if (command.done) command.done(report);
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

  void start(SendCommand command) {
    Result<PeerId> peer = peer_for(command.peer);
    if (!peer.ok()) {
      report(command, {peer.status().with_context("connecting to the KV receiver")});
      return;
    }
    Result<TransferId> id = engine->submit_puts(*peer, command.copies, command.tag, command.timeout);
    if (!id.ok()) {
      report(command, {id.status()});
      return;
    }
    uint64_t bytes = 0;
    for (const BlockCopy& copy : command.copies) bytes += copy.bytes;
    pending.emplace(*id, Pending{std::move(command), *peer, Clock::now(), bytes});
  }

  void finish_transfers() {
    for (auto it = pending.begin(); it != pending.end();) {
      Result<TransferStatus> status = engine->poll(it->first);
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
        // The engine closed the peer's endpoint; the next send must connect again.
        forget_peer(it->second.peer);
      }
      report(it->second.command, result);
      it = pending.erase(it);
    }
  }

  void run() {
    Clock::time_point last_activity = Clock::now();
    for (;;) {
      std::deque<SendCommand> batch;
      {
        std::unique_lock lock(mutex);
        if (commands.empty() && pending.empty() && !stopping &&
            Clock::now() - last_activity > kSpinAfterActivity) {
          wake.wait_for(lock, kIdleSleep);
        }
        if (stopping) break;
        batch.swap(commands);
      }
      for (SendCommand& command : batch) start(std::move(command));
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
    std::deque<SendCommand> left;
    {
      std::lock_guard lock(mutex);
      left.swap(commands);
    }
    const Status stopped = unavailable("the KV transfer service is stopping");
    for (SendCommand& command : left) report(command, {stopped});
    for (auto& [id, transfer] : pending) report(transfer.command, {stopped});
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
  PDS_RETURN_IF_ERROR(capture_status([&] {
    raw->thread = std::thread([raw] { raw->run(); });
    return Status::ok_status();
  }));
  return std::unique_ptr<KvTransferService>(
      new KvTransferService(std::move(impl), std::move(encoded)));
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
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->stopping) {
      impl_->commands.push_back(
          {std::move(peer_descriptor_base64), std::move(copies), tag, timeout, std::move(done)});
      impl_->wake.notify_one();
      return;
    }
  }
  KvTransferReport report;
  report.status = unavailable("the KV transfer service is stopping");
  if (done) done(report);
}

}  // namespace pdserve::kv_transfer
