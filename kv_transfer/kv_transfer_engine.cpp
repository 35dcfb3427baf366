#include "kv_transfer/kv_transfer_engine.h"

#include <cstring>
#include <functional>
#include <map>

#include "common/core/log.h"
#include "kv_transfer/ucx_handles.h"

namespace pdserve::kv_transfer {
namespace {

constexpr unsigned kCompletionAmId = 1;
constexpr unsigned kAckAmId = 2;

struct CompletionMessage {
  std::uint64_t transfer_id;
  std::uint64_t request_tag;
  std::uint64_t bytes;
  std::uint64_t blocks;
};

struct AckMessage {
  std::uint64_t transfer_id;
};

// kOpen: puts may still be added (layer-by-layer sending); kPutting: flushing the last ones;
// kCancelling: cancelled, flushing the puts already issued (then kFailed, no completion message).
enum class Stage { kOpen, kPutting, kNotifying, kCancelling, kDone, kFailed };

// Puts whose local bytes their sender wants back (add_puts with on_released): a staging
// buffer is reused once UCX reads it no more.
struct PutGroup {
  std::vector<void*> requests;
  std::function<void()> on_released;
};

struct Transfer {
  PeerId peer = 0;
  Stage stage = Stage::kPutting;
  bool acknowledged = false;
  std::vector<void*> requests;  // outstanding UCX requests of the current stage
  std::vector<PutGroup> put_groups;  // puts issued with a release callback, not yet released
  std::chrono::steady_clock::time_point deadline;
  CompletionMessage message{};  // UCX reads it until the send completes: lives here
  Status error;
};

struct Peer {
  PeerDescriptor descriptor;
  std::unique_ptr<UcpEndpoint> endpoint;
  std::unique_ptr<RemoteKey> rkey;
  ucs_status_t failure = UCS_OK;  // set by UCX's error callback or a deadline
  bool closed = false;
  // UCX reports this peer's failure itself; otherwise (shared memory in UCX 1.13) a transfer's
  // deadline is the only failure detector and fails the whole peer.
  bool detects_failure = true;
};

// How long a transfer stopped at its deadline may take to flush the puts it issued before its
// peer is failed instead. Well inside the receiver's hold of its blocks after a failure (the
// transfer timeout plus a grace period, ucx_kv_connector.h).
constexpr auto kExpiredFlushGrace = std::chrono::seconds(1);

// An acknowledgement owed to a sender, sent from progress() rather than inside the callback.
struct PendingAck {
  ucp_ep_h reply_endpoint = nullptr;
  std::unique_ptr<AckMessage> message;
  void* request = nullptr;
  bool sent = false;
};

void on_peer_error(void* arg, ucp_ep_h /*endpoint*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failure == UCS_OK) peer->failure = status;
}

// Frees the requests that finished; the first failure is returned, OK once all have finished.
Result<bool> settle(std::vector<void*>& requests) {
  Status failure;
  std::erase_if(requests, [&](void* request) {
    const ucs_status_t status = ucp_request_check_status(request);
    if (status == UCS_INPROGRESS) return false;
    if (status != UCS_OK && failure.ok()) failure = ucx_error(status, "KV transfer operation");
    ucp_request_free(request);
    return true;
  });
  if (!failure.ok()) return failure;
  return requests.empty();
}

void free_requests(std::vector<void*>& requests) {
  for (void* request : requests) ucp_request_free(request);
  requests.clear();
}

// Ends every put group of a transfer whose operations are over (finished, or ended by a forced
// endpoint close): UCX reads their local bytes no more.
void release_put_groups(Transfer& transfer) {
  std::vector<PutGroup> groups = std::move(transfer.put_groups);
  transfer.put_groups.clear();
  for (PutGroup& group : groups) {
    free_requests(group.requests);
    if (group.on_released) group.on_released();
  }
}

// Keeps a request returned by an nbx call; false with the error when the call failed at once.
Status keep_request(ucs_status_ptr_t result, std::vector<void*>& requests, const char* what) {
  if (UCS_PTR_IS_ERR(result)) return ucx_error(UCS_PTR_STATUS(result), what);
  if (result != nullptr) requests.push_back(result);
  return {};
}

bool range_fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t extent) {
  return offset <= extent && bytes <= extent - offset;
}

}  // namespace

struct KvTransferEngine::Impl {
  // Destruction runs bottom-up: peers close (UCX finishes with every request), then the
  // worker, and only then the message buffers UCX may have been reading.
  std::unique_ptr<UcpContext> context;
  std::map<TransferId, Transfer> transfers;
  std::vector<PendingAck> acks;
  std::vector<ReceivedTransfer> received;
  std::unique_ptr<UcpWorker> worker;
  std::unique_ptr<MemoryRegion> pool;
  std::map<PeerId, std::unique_ptr<Peer>> peers;
  std::uint8_t* pool_base = nullptr;
  std::size_t pool_bytes = 0;
  PeerId next_peer = 1;
  TransferId next_transfer = 1;

  ~Impl() {
    for (auto& ack : acks) {
      if (ack.request != nullptr) ucp_request_free(ack.request);
    }
    for (auto& [id, transfer] : transfers) {
      free_requests(transfer.requests);
      // Their owners are going away with the engine: no callback.
      for (PutGroup& group : transfer.put_groups) free_requests(group.requests);
    }
    peers.clear();
  }

  Status install_handlers() {
    PDS_RETURN_IF_ERROR(set_handler(kCompletionAmId, &Impl::on_completion));
    return set_handler(kAckAmId, &Impl::on_ack);
  }

  Status set_handler(unsigned id, ucp_am_recv_callback_t callback) {
    ucp_am_handler_param_t params{};
    params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
    params.id = id;
    params.cb = callback;
    params.arg = this;
    const ucs_status_t status = ucp_worker_set_am_recv_handler(worker->get(), &params);
    if (status != UCS_OK) return ucx_error(status, "ucp_worker_set_am_recv_handler");
    return {};
  }

  static ucs_status_t on_completion(void* arg, const void* header, std::size_t header_length,
                                    void* /*data*/, std::size_t /*length*/,
                                    const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (header_length != sizeof(CompletionMessage)) {
      PDS_LOG_WARN("KV completion message of " + std::to_string(header_length) +
                   " bytes (expected " + std::to_string(sizeof(CompletionMessage)) + "): dropped");
      return UCS_OK;
    }
    CompletionMessage message;
    std::memcpy(&message, header, sizeof message);
    self->received.push_back({message.request_tag, message.bytes, message.blocks});
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 && param->reply_ep != nullptr) {
      self->acks.push_back({param->reply_ep,
                            std::make_unique<AckMessage>(AckMessage{message.transfer_id}), nullptr,
                            false});
    } else {
      PDS_LOG_WARN("KV completion message without a reply endpoint: cannot acknowledge");
    }
    return UCS_OK;
  }

  static ucs_status_t on_ack(void* arg, const void* header, std::size_t header_length,
                             void* /*data*/, std::size_t /*length*/,
                             const ucp_am_recv_param_t* /*param*/) {
    auto* self = static_cast<Impl*>(arg);
    AckMessage message;
    if (header_length != sizeof message) {
      PDS_LOG_WARN("KV acknowledgement of " + std::to_string(header_length) + " bytes: dropped");
      return UCS_OK;
    }
    std::memcpy(&message, header, sizeof message);
    auto it = self->transfers.find(message.transfer_id);
    if (it == self->transfers.end() || it->second.stage != Stage::kNotifying) {
      PDS_LOG_WARN("KV acknowledgement for transfer " + std::to_string(message.transfer_id) +
                   " that is not awaiting one: dropped");
      return UCS_OK;
    }
    it->second.acknowledged = true;
    return UCS_OK;
  }

  void send_acks() {
    for (auto& ack : acks) {
      if (ack.sent) continue;
      ack.sent = true;
      ucp_request_param_t params{};
      ucs_status_ptr_t result = ucp_am_send_nbx(ack.reply_endpoint, kAckAmId, ack.message.get(),
                                                sizeof(AckMessage), nullptr, 0, &params);
      if (UCS_PTR_IS_ERR(result)) {
        PDS_LOG_WARN("KV acknowledgement not sent: " +
                     std::string(ucs_status_string(UCS_PTR_STATUS(result))));
      } else {
        ack.request = result;
      }
    }
    std::erase_if(acks, [](PendingAck& ack) {
      if (!ack.sent) return false;
      if (ack.request == nullptr) return true;
      if (ucp_request_check_status(ack.request) == UCS_INPROGRESS) return false;
      ucp_request_free(ack.request);
      return true;
    });
  }

  // Hands back the put groups whose puts have all completed locally; false (with the transfer's
  // error set) when one of them failed.
  bool settle_put_groups(TransferId id, Transfer& transfer) {
    bool failed = false;
    std::vector<std::function<void()>> released;
    std::erase_if(transfer.put_groups, [&](PutGroup& group) {
      Result<bool> done = settle(group.requests);
      if (!done.ok()) {
        if (!failed) transfer.error = done.status().with_context("transfer " + std::to_string(id));
        failed = true;
        return false;  // released with the peer's endpoint
      }
      if (!*done) return false;
      released.push_back(std::move(group.on_released));
      return true;
    });
    for (auto& callback : released) {
      if (callback) callback();
    }
    return !failed;
  }

  void advance(TransferId id, Transfer& transfer, Peer& peer) {
    if (!settle_put_groups(id, transfer)) {
      peer.failure = UCS_ERR_IO_ERROR;
      return;
    }
    Result<bool> settled = settle(transfer.requests);
    if (!settled.ok()) {
      transfer.error = settled.status().with_context("transfer " + std::to_string(id));
      peer.failure = UCS_ERR_IO_ERROR;
      return;
    }
    if (!*settled || transfer.stage == Stage::kOpen) return;
    if (transfer.stage == Stage::kCancelling) {
      // Every put of it is remotely complete: nothing more of it can land.
      transfer.stage = Stage::kFailed;
      return;
    }
    if (transfer.stage == Stage::kPutting) {
      // The puts are remotely complete (flushed): tell the receiver.
      ucp_request_param_t params{};
      params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      params.flags = UCP_AM_SEND_FLAG_REPLY;
      Status sent =
          keep_request(ucp_am_send_nbx(peer.endpoint->get(), kCompletionAmId, &transfer.message,
                                       sizeof transfer.message, nullptr, 0, &params),
                       transfer.requests, "KV completion message");
      if (!sent.ok()) {
        transfer.error = sent;
        peer.failure = UCS_ERR_IO_ERROR;
        return;
      }
      transfer.stage = Stage::kNotifying;
    } else if (transfer.stage == Stage::kNotifying && transfer.acknowledged) {
      transfer.stage = Stage::kDone;
    }
  }

  // Closes the peer's endpoint (forced: UCX ends its outstanding operations) and fails the
  // peer's unfinished transfers.
  void fail_peer(PeerId id, Peer& peer, const Status& reason) {
    peer.rkey.reset();
    peer.endpoint.reset();
    peer.closed = true;
    for (auto& [transfer_id, transfer] : transfers) {
      if (transfer.peer != id || transfer.stage == Stage::kDone ||
          transfer.stage == Stage::kFailed) {
        continue;
      }
      free_requests(transfer.requests);
      release_put_groups(transfer);  // the endpoint is closed: no put reads its buffer now
      transfer.stage = Stage::kFailed;
      if (transfer.error.ok()) transfer.error = reason;
    }
  }

  // Stops one transfer: no more puts, no completion message; it fails with `reason` once the
  // puts it issued are remotely complete (an endpoint flush), and the endpoint stays open.
  void begin_cancel(TransferId id, Transfer& transfer, Peer& peer, Status reason) {
    transfer.stage = Stage::kCancelling;
    transfer.error = std::move(reason);
    if (transfer.requests.empty() && transfer.put_groups.empty() && transfer.message.blocks == 0) {
      transfer.stage = Stage::kFailed;  // no put was issued
      return;
    }
    // The flush completes when every put issued on the endpoint so far is remotely complete
    // (this transfer's and, harmlessly, any other's).
    ucp_request_param_t params{};
    const Status issued = keep_request(ucp_ep_flush_nbx(peer.endpoint->get(), &params),
                                       transfer.requests, "ucp_ep_flush_nbx");
    if (!issued.ok()) {
      fail_peer(transfer.peer, peer,
                issued.with_context("cancelling transfer " + std::to_string(id)));
    }
  }

  // A transfer still putting when its deadline passes fails alone where UCX watches the peer:
  // its puts are stopped and flushed for a short grace, and only a flush that does not finish
  // fails the peer (its other transfers with it). The peer fails at once where the deadline is
  // the only failure detector, for a transfer already cancelling, and for one whose completion
  // message is out (UCX may still read its buffer: only closing the endpoint ends that). One
  // that issued no put fails alone on any transport.
  void expire(TransferId id, Transfer& transfer, Peer& peer,
              std::chrono::steady_clock::time_point now) {
    Status reason = deadline_exceeded("KV transfer " + std::to_string(id) + " to peer " +
                                      std::to_string(transfer.peer) + " ran past its deadline");
    const bool putting = transfer.stage == Stage::kOpen || transfer.stage == Stage::kPutting;
    if (putting && transfer.requests.empty() && transfer.put_groups.empty() &&
        transfer.message.blocks == 0) {
      // Nothing of it was issued (a staged transfer still waiting for a send buffer): nothing
      // can land, so it fails alone on any transport.
      transfer.error = std::move(reason);
      transfer.stage = Stage::kFailed;
      return;
    }
    if (!peer.detects_failure || !putting) {
      if (transfer.stage != Stage::kCancelling) transfer.error = std::move(reason);
      peer.failure = UCS_ERR_TIMED_OUT;
      return;
    }
    transfer.deadline = now + kExpiredFlushGrace;
    begin_cancel(id, transfer, peer, std::move(reason));
  }

  bool progress() {
    bool active = false;
    for (int i = 0; i < 64 && ucp_worker_progress(worker->get()) != 0; ++i) active = true;
    send_acks();
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, transfer] : transfers) {
      if (transfer.stage == Stage::kDone || transfer.stage == Stage::kFailed) continue;
      Peer& peer = *peers.at(transfer.peer);
      if (peer.failure != UCS_OK) continue;
      if (now > transfer.deadline) {
        expire(id, transfer, peer, now);
        continue;
      }
      advance(id, transfer, peer);
    }
    for (auto& [id, peer] : peers) {
      if (peer->failure == UCS_OK || peer->closed) continue;
      fail_peer(id, *peer, ucx_error(peer->failure, "KV peer " + std::to_string(id) + " failed"));
    }
    return active;
  }
};

KvTransferEngine::KvTransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvTransferEngine::~KvTransferEngine() = default;

Result<std::unique_ptr<KvTransferEngine>> KvTransferEngine::create(
    const KvTransferOptions& options) {
  auto impl = std::make_unique<Impl>();
  PDS_ASSIGN_OR_RETURN(impl->context, UcpContext::create(options.transports));
  PDS_ASSIGN_OR_RETURN(impl->worker, UcpWorker::create(*impl->context));
  PDS_RETURN_IF_ERROR(impl->install_handlers());
  return std::unique_ptr<KvTransferEngine>(new KvTransferEngine(std::move(impl)));
}

bool KvTransferEngine::supports_cuda_memory() const {
  return impl_->context->supports_cuda_memory();
}

Status KvTransferEngine::register_pool(void* base, std::size_t bytes, PoolMemory memory) {
  if (impl_->pool != nullptr) return failed_precondition("the KV pool is already registered");
  if (base == nullptr || bytes == 0) return invalid_argument("register_pool: empty KV pool");
  const bool cuda = memory == PoolMemory::kCuda;
  if (cuda && !impl_->context->supports_cuda_memory()) {
    return unimplemented(
        "register_pool: the KV pool is in CUDA memory and this UCX build has no CUDA memory "
        "support (no cuda_copy/cuda_ipc transport loaded: see `ucx_info -d`, UCX_TLS); use the "
        "staging path (--kv-transfer-path staged or auto), which copies through pinned host "
        "buffers");
  }
  PDS_ASSIGN_OR_RETURN(impl_->pool, MemoryRegion::create(*impl_->context, base, bytes, cuda));
  impl_->pool_base = static_cast<std::uint8_t*>(base);
  impl_->pool_bytes = bytes;
  return {};
}

Result<PeerDescriptor> KvTransferEngine::local_descriptor() const {
  if (impl_->pool == nullptr) {
    return failed_precondition("local_descriptor: register the KV pool first");
  }
  PeerDescriptor descriptor;
  descriptor.worker_address = impl_->worker->address();
  descriptor.packed_rkey = impl_->pool->packed_rkey();
  descriptor.pool_base = reinterpret_cast<std::uintptr_t>(impl_->pool_base);
  descriptor.pool_bytes = impl_->pool_bytes;
  return descriptor;
}

Result<PeerId> KvTransferEngine::connect(const PeerDescriptor& descriptor) {
  if (descriptor.worker_address.empty() || descriptor.packed_rkey.empty() ||
      descriptor.pool_bytes == 0) {
    return invalid_argument("connect: incomplete KV peer descriptor");
  }
  auto peer = std::make_unique<Peer>();
  peer->descriptor = descriptor;
  // Prefer UCX's peer-failure reports; where the transports cannot give them (shared memory
  // in UCX 1.13) the transfer deadline is the only failure detector.
  auto endpoint = UcpEndpoint::create(*impl_->worker, descriptor.worker_address,
                                      /*detect_peer_failure=*/true, &on_peer_error, peer.get());
  if (!endpoint.ok() && endpoint.status().code() == StatusCode::kUnavailable) {
    PDS_LOG_INFO("KV peer: transports without peer-failure detection; relying on deadlines");
    endpoint = UcpEndpoint::create(*impl_->worker, descriptor.worker_address,
                                   /*detect_peer_failure=*/false, &on_peer_error, peer.get());
    peer->detects_failure = false;
  }
  if (!endpoint.ok()) return endpoint.status();
  peer->endpoint = std::move(endpoint).value();
  PDS_ASSIGN_OR_RETURN(peer->rkey, RemoteKey::create(*peer->endpoint, descriptor.packed_rkey));
  const PeerId id = impl_->next_peer++;
  impl_->peers.emplace(id, std::move(peer));
  return id;
}

Status KvTransferEngine::disconnect(PeerId id) {
  auto it = impl_->peers.find(id);
  if (it == impl_->peers.end()) return not_found("disconnect: no KV peer " + std::to_string(id));
  impl_->fail_peer(id, *it->second, cancelled("KV peer " + std::to_string(id) + " disconnected"));
  return {};
}

Result<TransferId> KvTransferEngine::submit_puts(PeerId peer_id, std::span<const BlockCopy> copies,
                                                 std::uint64_t request_tag,
                                                 std::chrono::milliseconds timeout) {
  if (copies.empty()) return invalid_argument("submit_puts: no blocks");
  PDS_ASSIGN_OR_RETURN(const TransferId id, open_transfer(peer_id, request_tag, timeout));
  // A bad range fails the transfer (reported by poll()) before any put is issued.
  if (const Status added = add_puts(id, copies); added.code() == StatusCode::kInvalidArgument) {
    impl_->transfers.erase(id);
    return added;
  }
  (void)close_transfer(id);  // any failure is the transfer's, reported by poll()
  return id;
}

Result<TransferId> KvTransferEngine::open_transfer(PeerId peer_id, std::uint64_t request_tag,
                                                   std::chrono::milliseconds timeout) {
  if (impl_->pool == nullptr) return failed_precondition("open_transfer: no registered KV pool");
  auto it = impl_->peers.find(peer_id);
  if (it == impl_->peers.end()) {
    return not_found("open_transfer: no KV peer " + std::to_string(peer_id));
  }
  const Peer& peer = *it->second;
  if (peer.closed || peer.failure != UCS_OK) {
    return unavailable("open_transfer: KV peer " + std::to_string(peer_id) + " has failed");
  }
  if (timeout.count() <= 0) return invalid_argument("open_transfer: the timeout must be positive");
  const TransferId id = impl_->next_transfer++;
  Transfer& transfer = impl_->transfers[id];
  transfer.peer = peer_id;
  transfer.stage = Stage::kOpen;
  transfer.deadline = std::chrono::steady_clock::now() + timeout;
  transfer.message = {id, request_tag, 0, 0};
  return id;
}

Status KvTransferEngine::add_puts(TransferId id, std::span<const BlockCopy> copies,
                                  std::function<void()> on_released) {
  auto it = impl_->transfers.find(id);
  if (it == impl_->transfers.end() || it->second.stage != Stage::kOpen) {
    if (on_released) on_released();  // nothing was issued
    return failed_precondition("add_puts: KV transfer " + std::to_string(id) + " is not open");
  }
  Transfer& transfer = it->second;
  Peer& peer = *impl_->peers.at(transfer.peer);
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const BlockCopy& copy = copies[i];
    if (copy.bytes == 0 || !range_fits(copy.local_offset, copy.bytes, impl_->pool_bytes) ||
        !range_fits(copy.remote_offset, copy.bytes, peer.descriptor.pool_bytes)) {
      const Status bad = invalid_argument(
          "add_puts: block " + std::to_string(i) + " (local " + std::to_string(copy.local_offset) +
          ", remote " + std::to_string(copy.remote_offset) + ", " + std::to_string(copy.bytes) +
          " bytes) is empty or outside a pool");
      // The transfer fails; puts already issued end with the peer's endpoint.
      transfer.error = bad.with_context("transfer " + std::to_string(id));
      if (on_released) on_released();  // nothing of this call was issued
      if (transfer.requests.empty() && transfer.put_groups.empty() &&
          transfer.message.blocks == 0) {
        transfer.stage = Stage::kFailed;
      } else {
        impl_->fail_peer(transfer.peer, peer, transfer.error);
      }
      return bad;
    }
  }
  // With a release callback the puts are a group of their own, settled in progress() (and
  // ended with the endpoint when the peer fails).
  std::vector<void*>* requests = &transfer.requests;
  if (on_released) {
    transfer.put_groups.push_back({{}, std::move(on_released)});
    requests = &transfer.put_groups.back().requests;
  }
  ucp_request_param_t params{};
  Status issued;
  for (const BlockCopy& copy : copies) {
    issued = keep_request(
        ucp_put_nbx(peer.endpoint->get(), impl_->pool_base + copy.local_offset, copy.bytes,
                    peer.descriptor.pool_base + copy.remote_offset, peer.rkey->get(), &params),
        *requests, "ucp_put_nbx");
    if (!issued.ok()) break;
    transfer.message.bytes += copy.bytes;
    ++transfer.message.blocks;
  }
  if (!issued.ok()) {
    // Reported through poll() like any later failure; the peer's endpoint is closed.
    transfer.error = issued.with_context("transfer " + std::to_string(id));
    impl_->fail_peer(transfer.peer, peer, transfer.error);
  }
  return issued;
}

Status KvTransferEngine::close_transfer(TransferId id) {
  auto it = impl_->transfers.find(id);
  if (it == impl_->transfers.end() || it->second.stage != Stage::kOpen) {
    return failed_precondition("close_transfer: KV transfer " + std::to_string(id) +
                               " is not open");
  }
  Transfer& transfer = it->second;
  Peer& peer = *impl_->peers.at(transfer.peer);
  transfer.stage = Stage::kPutting;
  ucp_request_param_t params{};
  Status issued = keep_request(ucp_ep_flush_nbx(peer.endpoint->get(), &params), transfer.requests,
                               "ucp_ep_flush_nbx");
  if (!issued.ok()) {
    transfer.error = issued.with_context("transfer " + std::to_string(id));
    impl_->fail_peer(transfer.peer, peer, transfer.error);
  }
  return issued;
}

Status KvTransferEngine::cancel_transfer(TransferId id) {
  auto it = impl_->transfers.find(id);
  if (it == impl_->transfers.end()) {
    return not_found("cancel_transfer: no KV transfer " + std::to_string(id));
  }
  Transfer& transfer = it->second;
  if (transfer.stage == Stage::kCancelling) return {};
  if (transfer.stage != Stage::kOpen && transfer.stage != Stage::kPutting) {
    return failed_precondition("cancel_transfer: KV transfer " + std::to_string(id) +
                               " has sent its completion message or has finished");
  }
  impl_->begin_cancel(id, transfer, *impl_->peers.at(transfer.peer),
                      cancelled("KV transfer " + std::to_string(id) + " was cancelled"));
  return {};
}

bool KvTransferEngine::detects_peer_failure(PeerId id) const {
  auto it = impl_->peers.find(id);
  return it != impl_->peers.end() && it->second->detects_failure;
}

bool KvTransferEngine::peer_usable(PeerId id) const {
  auto it = impl_->peers.find(id);
  return it != impl_->peers.end() && !it->second->closed && it->second->failure == UCS_OK;
}

Result<TransferStatus> KvTransferEngine::poll(TransferId id) {
  auto it = impl_->transfers.find(id);
  if (it == impl_->transfers.end()) {
    return not_found("poll: no KV transfer " + std::to_string(id));
  }
  Transfer& transfer = it->second;
  if (transfer.stage == Stage::kDone) {
    // The flush completed every put: any group left is over.
    release_put_groups(transfer);
    impl_->transfers.erase(it);
    return TransferStatus{TransferState::kDone, {}};
  }
  if (transfer.stage == Stage::kFailed) {
    // Failed transfers end their puts with the endpoint or after a flush.
    release_put_groups(transfer);
    TransferStatus status{TransferState::kFailed, transfer.error};
    impl_->transfers.erase(it);
    return status;
  }
  return TransferStatus{};
}

bool KvTransferEngine::progress() {
  return impl_->progress();
}

std::vector<ReceivedTransfer> KvTransferEngine::take_received() {
  return std::exchange(impl_->received, {});
}

}  // namespace pdserve::kv_transfer
