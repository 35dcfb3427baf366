#include "kv_transfer/kv_transfer_engine.h"

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "common/core/log.h"
#include "kv_transfer/engine_records.h"

namespace pdserve::kv_transfer {
using namespace engine_records;  // this file's own private records (engine_records.h)

struct KvTransferEngine::Impl {
  // Destruction runs bottom-up: peers close (UCX finishes with every request), then the
  // worker, and only then the message buffers UCX may have been reading.
  std::unique_ptr<UcpContext> context;
  std::map<TransferId, Transfer> transfers;
  std::vector<PendingReply> replies;
  std::vector<PendingHello> hellos;
  std::vector<ReceivedTransfer> received;
  std::unique_ptr<UcpWorker> worker;
  std::unique_ptr<MemoryRegion> pool;
  std::map<PeerId, std::unique_ptr<Peer>> peers;
  std::uint8_t* pool_base = nullptr;
  std::size_t pool_bytes = 0;
  PeerId next_peer = 1;
  TransferId next_transfer = 1;
  std::mt19937_64 handshake_ids{std::random_device{}()};
  KvTransferEngineStats stats;

  ~Impl() {
    for (auto& reply : replies) {
      if (reply.request != nullptr) ucp_request_free(reply.request);
    }
    for (auto& [id, transfer] : transfers) {
      free_requests(transfer.requests);
      // Their owners are going away with the engine: no callback.
      for (PutGroup& group : transfer.put_groups) free_requests(group.requests);
    }
    for (auto& [id, peer] : peers) free_requests(peer->hello_requests);
    peers.clear();
  }

  Status install_handlers() {
    PDS_RETURN_IF_ERROR(set_handler(kCompletionAmId, &Impl::on_completion));
    PDS_RETURN_IF_ERROR(set_handler(kAckAmId, &Impl::on_ack));
    PDS_RETURN_IF_ERROR(set_handler(kHelloAmId, &Impl::on_hello));
    return set_handler(kHelloReplyAmId, &Impl::on_hello_reply);
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
      self->replies.push_back({param->reply_ep, kAckAmId,
                               message_bytes(AckMessage{message.transfer_id}), nullptr, false});
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

  // A peer's claim about this node's pool: copied, answered from progress().
  static ucs_status_t on_hello(void* arg, const void* header, std::size_t header_length, void* data,
                               std::size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
      PDS_LOG_WARN("KV handshake without a reply endpoint: dropped");
      return UCS_OK;
    }
    PendingHello hello;
    hello.reply_endpoint = param->reply_ep;
    // The key must have come inline (the sender forces eager: readable in this callback) and
    // be of a sane length.
    hello.readable = header_length == sizeof(HelloMessage) &&
                     (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && length > 0 &&
                     length <= kMaxPackedRkeyBytes;
    if (hello.readable) {
      std::memcpy(&hello.claim, header, sizeof hello.claim);
      hello.readable = hello.claim.magic == kHelloMagic;
      const auto* bytes = static_cast<const std::uint8_t*>(data);
      hello.rkey.assign(bytes, bytes + length);
    } else if (header_length >= 2 * sizeof(std::uint64_t)) {
      // Enough to name the handshake in the refusal.
      std::memcpy(&hello.claim.handshake_id,
                  static_cast<const std::uint8_t*>(header) + sizeof(std::uint64_t),
                  sizeof hello.claim.handshake_id);
    }
    self->hellos.push_back(std::move(hello));
    return UCS_OK;
  }

  static ucs_status_t on_hello_reply(void* arg, const void* header, std::size_t header_length,
                                     void* /*data*/, std::size_t /*length*/,
                                     const ucp_am_recv_param_t* /*param*/) {
    auto* self = static_cast<Impl*>(arg);
    HelloReply reply;
    if (header_length != sizeof reply) {
      PDS_LOG_WARN("KV handshake reply of " + std::to_string(header_length) + " bytes: dropped");
      return UCS_OK;
    }
    std::memcpy(&reply, header, sizeof reply);
    for (auto& [id, peer] : self->peers) {
      if (peer->state == PeerState::kHandshaking &&
          peer->hello.handshake_id == reply.handshake_id && !peer->hello_answer) {
        peer->hello_answer = reply.mismatch;
        return UCS_OK;
      }
    }
    PDS_LOG_WARN("KV handshake reply that answers no pending handshake: dropped");
    return UCS_OK;
  }

  // Answers the claims that arrived: whether each is exactly this node's registered pool.
  void answer_hellos() {
    if (hellos.empty()) return;
    std::vector<PendingHello> pending = std::exchange(hellos, {});
    std::optional<PeerDescriptor> local;
    if (pool != nullptr) {
      local = PeerDescriptor{
          {}, pool->packed_rkey(), reinterpret_cast<std::uintptr_t>(pool_base), pool_bytes};
    }
    for (PendingHello& hello : pending) {
      HelloReply reply{hello.claim.handshake_id, kMalformedHello};
      if (hello.readable) {
        reply.mismatch = compare_claim(local ? &*local : nullptr, hello.claim, hello.rkey);
      }
      ++stats.hellos_answered;
      if (reply.mismatch != 0) {
        ++stats.hellos_refused;
        PDS_LOG_WARN("KV handshake: a peer claimed a pool that is not this node's (" +
                     describe_mismatch(reply.mismatch) + " differ): refused");
      }
      replies.push_back(
          {hello.reply_endpoint, kHelloReplyAmId, message_bytes(reply), nullptr, false});
    }
  }

  void send_replies() {
    for (auto& reply : replies) {
      if (reply.sent) continue;
      reply.sent = true;
      ucp_request_param_t params{};
      ucs_status_ptr_t result =
          ucp_am_send_nbx(reply.reply_endpoint, reply.am_id, reply.message.data(),
                          reply.message.size(), nullptr, 0, &params);
      if (UCS_PTR_IS_ERR(result)) {
        PDS_LOG_WARN("KV reply (active message " + std::to_string(reply.am_id) +
                     ") not sent: " + std::string(ucs_status_string(UCS_PTR_STATUS(result))));
      } else {
        reply.request = result;
      }
    }
    std::erase_if(replies, [](PendingReply& reply) {
      if (!reply.sent) return false;
      if (reply.request == nullptr) return true;
      if (ucp_request_check_status(reply.request) == UCS_INPROGRESS) return false;
      ucp_request_free(reply.request);
      return true;
    });
  }

  // Sends the claim to the peer's worker (connect()).
  Status send_hello(Peer& peer) {
    peer.hello.handshake_id = handshake_ids();
    peer.hello.pool_base = peer.descriptor.pool_base;
    peer.hello.pool_bytes = peer.descriptor.pool_bytes;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    return keep_request(ucp_am_send_nbx(peer.endpoint->get(), kHelloAmId, &peer.hello,
                                        sizeof peer.hello, peer.descriptor.packed_rkey.data(),
                                        peer.descriptor.packed_rkey.size(), &params),
                        peer.hello_requests, "KV handshake");
  }

  // Moves a handshaking peer on: confirmed (its key unpacked, the queued puts and flushes
  // posted), refused, or past its deadline. A failure goes through peer.failure.
  void advance_handshake(PeerId id, Peer& peer, std::chrono::steady_clock::time_point now) {
    if (Result<bool> sent = settle(peer.hello_requests); !sent.ok()) {
      fail_later(peer, sent.status().with_context("KV peer " + std::to_string(id)));
      return;
    }
    if (!peer.hello_answer) {
      if (now > peer.handshake_deadline) {
        fail_later(peer, deadline_exceeded("KV peer " + std::to_string(id) +
                                           " did not answer the handshake in time (is it a "
                                           "pdserve node of this version?)"));
      }
      return;
    }
    if (*peer.hello_answer != 0) {
      ++stats.claims_refused;
      for (auto& [transfer_id, transfer] : transfers) {
        if (transfer.peer == id) transfer.refused = true;
      }
      fail_later(peer,
                 permission_denied("KV peer " + std::to_string(id) +
                                   " refused the descriptor it was given: its " +
                                   describe_mismatch(*peer.hello_answer) +
                                   " differ from the peer's own registered pool; nothing was put"));
      return;
    }
    Result<std::unique_ptr<RemoteKey>> rkey =
        RemoteKey::create(*peer.endpoint, peer.descriptor.packed_rkey);
    if (!rkey.ok()) {
      fail_later(peer, rkey.status());
      return;
    }
    peer.rkey = std::move(rkey).value();
    peer.state = PeerState::kReady;
    for (auto& [transfer_id, transfer] : transfers) {
      if (peer.closed) break;  // a put or flush failed: every transfer to it has failed
      if (transfer.peer != id || transfer.stage == Stage::kDone ||
          transfer.stage == Stage::kFailed) {
        continue;
      }
      const bool close = std::exchange(transfer.close_queued, false);
      std::vector<QueuedPuts> queued = std::exchange(transfer.queued, {});
      bool issued = true;
      for (QueuedPuts& puts : queued) {
        if (!issued) {
          if (puts.on_released) puts.on_released();  // the transfer failed: never issued
          continue;
        }
        issued =
            issue_puts(transfer_id, transfer, peer, puts.copies, std::move(puts.on_released)).ok();
      }
      if (issued && close) flush(transfer_id, transfer, peer);
    }
  }

  // Marks the peer failed with the engine's own reason; progress() closes it.
  static void fail_later(Peer& peer, Status reason) {
    if (peer.failure != UCS_OK) return;
    peer.failure = UCS_ERR_REJECTED;
    peer.failure_reason = std::move(reason);
  }

  // Posts the puts of `copies` (the peer has confirmed its pool). Every range is checked
  // against both pools first, and nothing is issued when one is outside.
  Status issue_puts(TransferId id, Transfer& transfer, Peer& peer,
                    std::span<const BlockCopy> copies, std::function<void()> on_released) {
    if (Status bad = check_ranges(copies, pool_bytes, peer.descriptor.pool_bytes); !bad.ok()) {
      refuse(id, transfer, peer, bad);
      if (on_released) on_released();  // nothing of this call was issued
      return bad;
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
      ++stats.puts_posted;
      issued = keep_request(
          ucp_put_nbx(peer.endpoint->get(), pool_base + copy.local_offset, copy.bytes,
                      peer.descriptor.pool_base + copy.remote_offset, peer.rkey->get(), &params),
          *requests, "ucp_put_nbx");
      if (!issued.ok()) break;
      transfer.message.bytes += copy.bytes;
      ++transfer.message.blocks;
    }
    if (!issued.ok()) {
      // Reported through poll() like any later failure; the peer's endpoint is closed.
      transfer.error = issued.with_context("transfer " + std::to_string(id));
      fail_peer(transfer.peer, peer, transfer.error);
    }
    return issued;
  }

  // A range outside a pool fails the transfer; puts it already issued end with the peer's
  // endpoint.
  void refuse(TransferId id, Transfer& transfer, Peer& peer, const Status& bad) {
    transfer.error = bad.with_context("transfer " + std::to_string(id));
    transfer.refused = true;
    if (nothing_issued(transfer)) {
      drop_queued(transfer);
      transfer.stage = Stage::kFailed;
    } else {
      fail_peer(transfer.peer, peer, transfer.error);
    }
  }

  // The last puts are issued: flush them (remote completion), then the completion message.
  void flush(TransferId id, Transfer& transfer, Peer& peer) {
    ucp_request_param_t params{};
    const Status issued = keep_request(ucp_ep_flush_nbx(peer.endpoint->get(), &params),
                                       transfer.requests, "ucp_ep_flush_nbx");
    if (!issued.ok()) {
      transfer.error = issued.with_context("transfer " + std::to_string(id));
      fail_peer(transfer.peer, peer, transfer.error);
    }
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
    free_requests(peer.hello_requests);
    peer.closed = true;
    for (auto& [transfer_id, transfer] : transfers) {
      if (transfer.peer != id || transfer.stage == Stage::kDone ||
          transfer.stage == Stage::kFailed) {
        continue;
      }
      free_requests(transfer.requests);
      release_put_groups(transfer);  // the endpoint is closed: no put reads its buffer now
      drop_queued(transfer);
      transfer.stage = Stage::kFailed;
      if (transfer.error.ok()) transfer.error = reason;
    }
  }

  // Stops one transfer: no more puts, no completion message; it fails with `reason` once the
  // puts it issued are remotely complete (an endpoint flush), and the endpoint stays open.
  void begin_cancel(TransferId id, Transfer& transfer, Peer& peer, Status reason) {
    transfer.stage = Stage::kCancelling;
    transfer.error = std::move(reason);
    drop_queued(transfer);
    if (nothing_issued(transfer)) {
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
    if (peer.state == PeerState::kHandshaking) {
      // The peer has not confirmed its pool in all that time: it has failed, and nothing of
      // its transfers was put.
      transfer.error = reason.with_context("the peer never answered the KV handshake");
      fail_later(peer, transfer.error);
      return;
    }
    if (putting && nothing_issued(transfer)) {
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
    answer_hellos();
    send_replies();
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, peer] : peers) {
      if (peer->state == PeerState::kHandshaking && peer->failure == UCS_OK && !peer->closed) {
        advance_handshake(id, *peer, now);
      }
    }
    for (auto& [id, transfer] : transfers) {
      if (transfer.stage == Stage::kDone || transfer.stage == Stage::kFailed) continue;
      Peer& peer = *peers.at(transfer.peer);
      if (peer.failure != UCS_OK) continue;
      if (now > transfer.deadline) {
        expire(id, transfer, peer, now);
        continue;
      }
      if (peer.state == PeerState::kReady) advance(id, transfer, peer);
    }
    for (auto& [id, peer] : peers) {
      if (peer->failure == UCS_OK || peer->closed) continue;
      fail_peer(id, *peer,
                !peer->failure_reason.ok()
                    ? peer->failure_reason
                    : ucx_error(peer->failure, "KV peer " + std::to_string(id) + " failed"));
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

Result<PeerId> KvTransferEngine::connect(const PeerDescriptor& descriptor,
                                         std::chrono::milliseconds handshake_timeout) {
  if (descriptor.worker_address.empty() || descriptor.packed_rkey.empty() ||
      descriptor.pool_bytes == 0) {
    return invalid_argument("connect: incomplete KV peer descriptor");
  }
  if (descriptor.packed_rkey.size() > kMaxPackedRkeyBytes) {
    return invalid_argument("connect: the KV peer descriptor's key is " +
                            std::to_string(descriptor.packed_rkey.size()) + " bytes (at most " +
                            std::to_string(kMaxPackedRkeyBytes) + ")");
  }
  if (handshake_timeout.count() <= 0) {
    return invalid_argument("connect: the handshake timeout must be positive");
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
  // The key is unpacked only once the peer confirms it (advance_handshake).
  peer->handshake_deadline = std::chrono::steady_clock::now() + handshake_timeout;
  if (Status sent = impl_->send_hello(*peer); !sent.ok()) {
    free_requests(peer->hello_requests);
    return sent;
  }
  const PeerId id = impl_->next_peer++;
  impl_->peers.emplace(id, std::move(peer));
  return id;
}

bool KvTransferEngine::peer_confirmed(PeerId id) const {
  auto it = impl_->peers.find(id);
  return it != impl_->peers.end() && it->second->state == PeerState::kReady &&
         !it->second->closed && it->second->failure == UCS_OK;
}

Status KvTransferEngine::disconnect(PeerId id) {
  auto it = impl_->peers.find(id);
  if (it == impl_->peers.end()) return not_found("disconnect: no KV peer " + std::to_string(id));
  impl_->fail_peer(id, *it->second, cancelled("KV peer " + std::to_string(id) + " disconnected"));
  // Every transfer of it has failed, and none reads the peer again.
  impl_->peers.erase(it);
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
  if (peer.state == PeerState::kReady) {
    return impl_->issue_puts(id, transfer, peer, copies, std::move(on_released));
  }
  // The peer has not confirmed its pool yet: checked against the claim now (a bad range is
  // refused at once), posted, and checked again, once it has.
  if (Status bad = check_ranges(copies, impl_->pool_bytes, peer.descriptor.pool_bytes); !bad.ok()) {
    impl_->refuse(id, transfer, peer, bad);
    if (on_released) on_released();
    return bad;
  }
  transfer.queued.push_back({{copies.begin(), copies.end()}, std::move(on_released)});
  return {};
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
  if (peer.state != PeerState::kReady) {
    transfer.close_queued = true;  // flushed after its queued puts, once the peer confirms
    return {};
  }
  impl_->flush(id, transfer, peer);
  return transfer.stage == Stage::kFailed ? transfer.error : Status::ok_status();
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
    drop_queued(transfer);
    TransferStatus status{TransferState::kFailed, transfer.error, transfer.refused};
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

KvTransferEngineStats KvTransferEngine::stats() const {
  return impl_->stats;
}

}  // namespace pdserve::kv_transfer
