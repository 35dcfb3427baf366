// Two engines in one process, one thread, over loopback with UCX's tcp and shared-memory
// transports: scattered blocks must land byte-exact, the receiver must learn of the transfer,
// and a transfer to a destroyed peer must fail within its deadline.
#include "kv_transfer/kv_transfer_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace pdserve::kv_transfer {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kPoolBytes = 1 << 20;
constexpr std::size_t kBlockBytes = 4096;
constexpr std::size_t kBlocks = kPoolBytes / kBlockBytes;

std::unique_ptr<KvTransferEngine> make_engine(const std::string& transports) {
  auto engine = KvTransferEngine::create({transports});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// Drives both engines until the transfer finishes or `limit` passes.
TransferStatus wait_for(KvTransferEngine& sender, KvTransferEngine* receiver, TransferId id,
                        milliseconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    sender.progress();
    if (receiver != nullptr) receiver->progress();
    auto status = sender.poll(id);
    EXPECT_TRUE(status.ok()) << status.status().to_string();
    if (!status.ok() || status->state != TransferState::kPending) {
      return status.ok() ? *status : TransferStatus{TransferState::kFailed, status.status()};
    }
  }
  return {TransferState::kPending, deadline_exceeded("test gave up waiting")};
}

class KvTransferLoopback : public ::testing::TestWithParam<std::string> {};

// A sender connected to a receiver, for the tests of one transfer failing beside another: the
// sender's pool counts up from `first_byte`, the receiver's is zero.
struct ConnectedPair {
  static constexpr BlockCopy kDoomedCopy{0, 0, 4 * kBlockBytes};
  static constexpr BlockCopy kSurvivorCopy{8 * kBlockBytes, 8 * kBlockBytes, 4 * kBlockBytes};

  std::unique_ptr<KvTransferEngine> sender;
  std::unique_ptr<KvTransferEngine> receiver;
  std::vector<std::uint8_t> source = std::vector<std::uint8_t>(kPoolBytes);
  std::vector<std::uint8_t> destination = std::vector<std::uint8_t>(kPoolBytes, 0);
  PeerId peer = 0;

  // Two open transfers to the peer with their puts issued: the doomed one (tag 1, with
  // `doomed_timeout`) and the survivor (tag 2).
  std::pair<TransferId, TransferId> open_doomed_and_survivor(milliseconds doomed_timeout) {
    auto doomed = sender->open_transfer(peer, 1, doomed_timeout);
    auto survivor = sender->open_transfer(peer, 2, milliseconds(10000));
    EXPECT_TRUE(doomed.ok() && survivor.ok());
    EXPECT_TRUE(sender->add_puts(*doomed, std::span(&kDoomedCopy, 1)).ok());
    EXPECT_TRUE(sender->add_puts(*survivor, std::span(&kSurvivorCopy, 1)).ok());
    return {*doomed, *survivor};
  }

  // The survivor, closed now, lands whole and is the only transfer the receiver heard of.
  void expect_survivor_lands(TransferId survivor) {
    ASSERT_TRUE(sender->close_transfer(survivor).ok());
    const TransferStatus status = wait_for(*sender, receiver.get(), survivor, milliseconds(15000));
    ASSERT_EQ(status.state, TransferState::kDone) << status.error.to_string();
    EXPECT_TRUE(std::equal(source.begin() + 8 * kBlockBytes, source.begin() + 12 * kBlockBytes,
                           destination.begin() + 8 * kBlockBytes));
    const std::vector<ReceivedTransfer> received = receiver->take_received();
    ASSERT_EQ(received.size(), 1u);  // no completion message for the doomed one
    EXPECT_EQ(received[0].request_tag, 2u);
  }
};

std::unique_ptr<ConnectedPair> connect_pair(const std::string& transports,
                                            std::uint8_t first_byte) {
  auto pair = std::make_unique<ConnectedPair>();
  pair->sender = make_engine(transports);
  pair->receiver = make_engine(transports);
  if (!pair->sender || !pair->receiver) return nullptr;
  std::iota(pair->source.begin(), pair->source.end(), first_byte);
  EXPECT_TRUE(pair->sender->register_pool(pair->source.data(), pair->source.size()).ok());
  EXPECT_TRUE(
      pair->receiver->register_pool(pair->destination.data(), pair->destination.size()).ok());
  Result<PeerId> peer = pair->sender->connect(*pair->receiver->local_descriptor());
  EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  if (!peer.ok()) return nullptr;
  pair->peer = *peer;
  return pair;
}

TEST_P(KvTransferLoopback, ScatteredBlocksLandExactlyAndTheReceiverIsNotified) {
  auto sender = make_engine(GetParam());
  auto receiver = make_engine(GetParam());
  ASSERT_TRUE(sender && receiver);
  std::vector<std::uint8_t> source(kPoolBytes);
  std::vector<std::uint8_t> destination(kPoolBytes, 0);
  std::mt19937 rng(42);
  std::generate(source.begin(), source.end(), [&] { return static_cast<std::uint8_t>(rng()); });
  ASSERT_TRUE(sender->register_pool(source.data(), source.size()).ok());
  ASSERT_TRUE(receiver->register_pool(destination.data(), destination.size()).ok());

  // The descriptor travels as base64 text, as it would through the control plane.
  auto descriptor = receiver->local_descriptor();
  ASSERT_TRUE(descriptor.ok());
  auto wire = base64_decode(base64_encode(serialize_descriptor(*descriptor)));
  ASSERT_TRUE(wire.ok());
  auto parsed = parse_descriptor(*wire);
  ASSERT_TRUE(parsed.ok());
  auto peer = sender->connect(*parsed);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();

  // 40 source blocks (some of several block lengths) to shuffled, disjoint destination blocks.
  std::vector<std::size_t> source_blocks(kBlocks), destination_blocks(kBlocks);
  std::iota(source_blocks.begin(), source_blocks.end(), 0);
  std::iota(destination_blocks.begin(), destination_blocks.end(), 0);
  std::shuffle(source_blocks.begin(), source_blocks.end(), rng);
  std::shuffle(destination_blocks.begin(), destination_blocks.end(), rng);
  std::vector<BlockCopy> copies;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < 40; ++i) {
    const std::size_t bytes = i % 7 == 0 ? kBlockBytes / 3 : kBlockBytes;  // partial blocks too
    copies.push_back({source_blocks[i] * kBlockBytes, destination_blocks[i] * kBlockBytes, bytes});
    total += bytes;
  }
  auto id = sender->submit_puts(*peer, copies, /*request_tag=*/777, milliseconds(10000));
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  const TransferStatus status = wait_for(*sender, receiver.get(), *id, milliseconds(15000));
  ASSERT_EQ(status.state, TransferState::kDone) << status.error.to_string();
  EXPECT_EQ(sender->poll(*id).status().code(), StatusCode::kNotFound);  // reported once

  std::vector<std::uint8_t> expected(kPoolBytes, 0);
  for (const BlockCopy& copy : copies) {
    std::copy_n(source.begin() + static_cast<std::ptrdiff_t>(copy.local_offset), copy.bytes,
                expected.begin() + static_cast<std::ptrdiff_t>(copy.remote_offset));
  }
  EXPECT_TRUE(destination == expected) << "received bytes differ from the scattered blocks";

  const std::vector<ReceivedTransfer> received = receiver->take_received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].request_tag, 777u);
  EXPECT_EQ(received[0].bytes, total);
  EXPECT_EQ(received[0].blocks, copies.size());
  EXPECT_TRUE(receiver->take_received().empty());
}

// Layer-by-layer sending (puts added in groups while the transfer is open, progress in
// between, as during a forward) must leave the same bytes and the same completion message as
// one submission of all the copies.
TEST_P(KvTransferLoopback, PutsAddedInStepsLandTheSameBytesAsOneSubmission) {
  auto sender = make_engine(GetParam());
  auto whole = make_engine(GetParam());
  auto layered = make_engine(GetParam());
  ASSERT_TRUE(sender && whole && layered);
  std::vector<std::uint8_t> source(kPoolBytes);
  std::mt19937 rng(7);
  std::generate(source.begin(), source.end(), [&] { return static_cast<std::uint8_t>(rng()); });
  std::vector<std::uint8_t> whole_pool(kPoolBytes, 0), layered_pool(kPoolBytes, 0);
  ASSERT_TRUE(sender->register_pool(source.data(), source.size()).ok());
  ASSERT_TRUE(whole->register_pool(whole_pool.data(), whole_pool.size()).ok());
  ASSERT_TRUE(layered->register_pool(layered_pool.data(), layered_pool.size()).ok());
  auto whole_peer = sender->connect(*whole->local_descriptor());
  auto layered_peer = sender->connect(*layered->local_descriptor());
  ASSERT_TRUE(whole_peer.ok() && layered_peer.ok());

  // 4 "layers" of 8 scattered blocks each.
  constexpr int kLayers = 4;
  std::vector<std::size_t> targets(kBlocks);
  std::iota(targets.begin(), targets.end(), 0);
  std::shuffle(targets.begin(), targets.end(), rng);
  std::vector<std::vector<BlockCopy>> layers(kLayers);
  std::vector<BlockCopy> all;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (std::size_t i = 0; i < 8; ++i) {
      const std::size_t n = static_cast<std::size_t>(layer) * 8 + i;
      layers[static_cast<std::size_t>(layer)].push_back(
          {n * 3 * kBlockBytes, targets[n] * kBlockBytes, kBlockBytes});
    }
    all.insert(all.end(), layers[static_cast<std::size_t>(layer)].begin(),
               layers[static_cast<std::size_t>(layer)].end());
  }

  auto one_shot = sender->submit_puts(*whole_peer, all, 5, milliseconds(10000));
  ASSERT_TRUE(one_shot.ok()) << one_shot.status().to_string();
  ASSERT_EQ(wait_for(*sender, whole.get(), *one_shot, milliseconds(15000)).state,
            TransferState::kDone);

  auto stepped = sender->open_transfer(*layered_peer, 5, milliseconds(10000));
  ASSERT_TRUE(stepped.ok()) << stepped.status().to_string();
  for (const std::vector<BlockCopy>& layer : layers) {
    ASSERT_TRUE(sender->add_puts(*stepped, layer).ok());
    for (int i = 0; i < 20; ++i) {
      sender->progress();
      layered->progress();
    }
    // Not closed: the receiver hears nothing yet and the sender still waits.
    EXPECT_TRUE(layered->take_received().empty());
    EXPECT_EQ(sender->poll(*stepped)->state, TransferState::kPending);
  }
  ASSERT_TRUE(sender->close_transfer(*stepped).ok());
  EXPECT_EQ(sender->add_puts(*stepped, layers[0]).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender->close_transfer(*stepped).code(), StatusCode::kFailedPrecondition);
  const TransferStatus status = wait_for(*sender, layered.get(), *stepped, milliseconds(15000));
  ASSERT_EQ(status.state, TransferState::kDone) << status.error.to_string();

  EXPECT_TRUE(layered_pool == whole_pool) << "layer-by-layer puts landed different bytes";
  EXPECT_NE(std::count(whole_pool.begin(), whole_pool.end(), 0), static_cast<long>(kPoolBytes));
  const std::vector<ReceivedTransfer> a = whole->take_received();
  const std::vector<ReceivedTransfer> b = layered->take_received();
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].request_tag, a[0].request_tag);
  EXPECT_EQ(b[0].bytes, a[0].bytes);
  EXPECT_EQ(b[0].blocks, a[0].blocks);
  EXPECT_EQ(b[0].bytes, all.size() * kBlockBytes);

  // A bad range fails the transfer.
  auto bad = sender->open_transfer(*layered_peer, 7, milliseconds(10000));
  ASSERT_TRUE(bad.ok());
  const BlockCopy outside{0, kPoolBytes, kBlockBytes};
  EXPECT_EQ(sender->add_puts(*bad, std::span(&outside, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sender->poll(*bad)->state, TransferState::kFailed);

  // A transfer left open fails at its deadline.
  auto forgotten = sender->open_transfer(*layered_peer, 6, milliseconds(50));
  ASSERT_TRUE(forgotten.ok());
  ASSERT_TRUE(sender->add_puts(*forgotten, layers[1]).ok());
  EXPECT_EQ(wait_for(*sender, layered.get(), *forgotten, milliseconds(5000)).state,
            TransferState::kFailed);
  EXPECT_EQ(sender->add_puts(12345, layers[0]).code(), StatusCode::kFailedPrecondition);
}

TEST_P(KvTransferLoopback, TransferToADestroyedPeerFailsWithinItsDeadline) {
  auto sender = make_engine(GetParam());
  auto receiver = make_engine(GetParam());
  ASSERT_TRUE(sender && receiver);
  std::vector<std::uint8_t> source(kPoolBytes, 1);
  // Outlives the receiver's engine: in one process a late put must not hit freed memory.
  std::vector<std::uint8_t> destination(kPoolBytes, 0);
  ASSERT_TRUE(sender->register_pool(source.data(), source.size()).ok());
  ASSERT_TRUE(receiver->register_pool(destination.data(), destination.size()).ok());
  auto peer = sender->connect(*receiver->local_descriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  receiver.reset();

  const BlockCopy copy{0, 0, kBlockBytes};
  const auto timeout = milliseconds(500);
  const auto start = Clock::now();
  auto id = sender->submit_puts(*peer, std::span(&copy, 1), 1, timeout);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  const TransferStatus status = wait_for(*sender, nullptr, *id, milliseconds(5000));
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(status.state, TransferState::kFailed);
  EXPECT_FALSE(status.error.ok());
  // Where UCX watches the peer, the transfer first gets a 1 s grace to flush its puts.
  EXPECT_LT(elapsed, timeout + milliseconds(sender->detects_peer_failure(*peer) ? 2000 : 1000))
      << status.error.to_string();
  // The peer is now unusable.
  EXPECT_EQ(sender->submit_puts(*peer, std::span(&copy, 1), 2, timeout).status().code(),
            StatusCode::kUnavailable);
}

// Issue #14: the staging path reuses a bounce buffer once UCX reads it no more. A release
// callback given with add_puts runs exactly once: after the puts completed, at once when the
// call issued nothing, and when the transfer failed with its peer.
TEST_P(KvTransferLoopback, APutsReleaseCallbackRunsOnceWhenUcxReadsItsBytesNoMore) {
  const auto pair = connect_pair(GetParam(), 3);
  ASSERT_TRUE(pair);
  KvTransferEngine& sender = *pair->sender;
  int released = 0;
  auto id = sender.open_transfer(pair->peer, 1, milliseconds(10000));
  ASSERT_TRUE(id.ok());
  const BlockCopy copy{0, 0, 4 * kBlockBytes};
  ASSERT_TRUE(sender.add_puts(*id, std::span(&copy, 1), [&] { ++released; }).ok());
  ASSERT_TRUE(sender.close_transfer(*id).ok());
  const TransferStatus done = wait_for(sender, pair->receiver.get(), *id, milliseconds(15000));
  ASSERT_EQ(done.state, TransferState::kDone) << done.error.to_string();
  EXPECT_EQ(released, 1);
  EXPECT_TRUE(std::equal(pair->source.begin(), pair->source.begin() + 4 * kBlockBytes,
                         pair->destination.begin()));
  // Nothing issued: released at once, by the call itself.
  int refused = 0;
  EXPECT_EQ(sender.add_puts(*id, std::span(&copy, 1), [&] { ++refused; }).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused, 1);
  auto bad = sender.open_transfer(pair->peer, 2, milliseconds(10000));
  ASSERT_TRUE(bad.ok());
  const BlockCopy outside{kPoolBytes, 0, kBlockBytes};
  EXPECT_EQ(sender.add_puts(*bad, std::span(&outside, 1), [&] { ++refused; }).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(refused, 2);
  // The peer goes away with puts in flight: released when the transfer fails.
  int failed_released = 0;
  auto doomed = sender.open_transfer(pair->peer, 3, milliseconds(500));
  ASSERT_TRUE(doomed.ok());
  pair->receiver.reset();
  for (int i = 0; i < 8; ++i) {
    const BlockCopy piece{static_cast<std::uint64_t>(i) * kBlockBytes,
                          static_cast<std::uint64_t>(i) * kBlockBytes, kBlockBytes};
    (void)sender.add_puts(*doomed, std::span(&piece, 1), [&] { ++failed_released; });
  }
  (void)sender.close_transfer(*doomed);
  const TransferStatus failed = wait_for(sender, nullptr, *doomed, milliseconds(10000));
  EXPECT_EQ(failed.state, TransferState::kFailed);
  EXPECT_EQ(failed_released, 8) << "every group released once, whatever ended them";
}

// Issue #15 item 8: cancelling one transfer spares the peer's others. The cancelled one fails
// (Cancelled) after its issued puts are flushed, sends no completion message; a transfer open
// beside it lands and is acknowledged, and the peer needs no new connection.
TEST_P(KvTransferLoopback, CancellingOneTransferSparesThePeersOthers) {
  const auto pair = connect_pair(GetParam(), 1);
  ASSERT_TRUE(pair);
  KvTransferEngine& sender = *pair->sender;
  const auto [doomed, survivor] = pair->open_doomed_and_survivor(milliseconds(10000));

  ASSERT_TRUE(sender.cancel_transfer(doomed).ok());
  EXPECT_EQ(sender.add_puts(doomed, std::span(&ConnectedPair::kDoomedCopy, 1)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender.close_transfer(doomed).code(), StatusCode::kFailedPrecondition);
  const TransferStatus cancelled_status =
      wait_for(sender, pair->receiver.get(), doomed, milliseconds(15000));
  EXPECT_EQ(cancelled_status.state, TransferState::kFailed);
  EXPECT_EQ(cancelled_status.error.code(), StatusCode::kCancelled)
      << cancelled_status.error.to_string();
  pair->expect_survivor_lands(survivor);

  // The peer is still connected: a later transfer goes through on the same endpoint.
  EXPECT_TRUE(sender.peer_usable(pair->peer));
  auto later = sender.submit_puts(pair->peer, std::span(&ConnectedPair::kDoomedCopy, 1), 3,
                                  milliseconds(10000));
  ASSERT_TRUE(later.ok()) << later.status().to_string();
  EXPECT_EQ(wait_for(sender, pair->receiver.get(), *later, milliseconds(15000)).state,
            TransferState::kDone);
  // A transfer with no put yet fails at once; a finished one cannot be cancelled.
  auto empty = sender.open_transfer(pair->peer, 4, milliseconds(10000));
  ASSERT_TRUE(empty.ok());
  ASSERT_TRUE(sender.cancel_transfer(*empty).ok());
  EXPECT_EQ(sender.poll(*empty)->state, TransferState::kFailed);
  EXPECT_EQ(sender.cancel_transfer(*later).code(), StatusCode::kNotFound);
}

// A transfer that runs past its deadline fails alone (DeadlineExceeded) where UCX reports peer
// failures itself: a transfer beside it lands and the peer stays connected (netfault finding:
// one slow transfer failed every transfer to that decode node). Where the deadline is the only
// failure detector, it fails the peer.
TEST_P(KvTransferLoopback, ATransferPastItsDeadlineFailsAloneWhereUcxWatchesThePeer) {
  const auto pair = connect_pair(GetParam(), 3);
  ASSERT_TRUE(pair);
  KvTransferEngine& sender = *pair->sender;
  // The doomed one is left open (its last layer never comes) until its 300 ms deadline.
  const auto [late, survivor] = pair->open_doomed_and_survivor(milliseconds(300));
  const TransferStatus late_status =
      wait_for(sender, pair->receiver.get(), late, milliseconds(5000));
  EXPECT_EQ(late_status.state, TransferState::kFailed);
  EXPECT_EQ(late_status.error.code(), StatusCode::kDeadlineExceeded)
      << late_status.error.to_string();
  if (!sender.detects_peer_failure(pair->peer)) {
    EXPECT_FALSE(sender.peer_usable(pair->peer));
    return;
  }
  EXPECT_TRUE(sender.peer_usable(pair->peer));
  pair->expect_survivor_lands(survivor);
}

// `ucx_info -d` (UCX's own tool, another process) names the memory domains this UCX build
// loads; a CUDA one (cuda_cpy, cuda_ipc, gdr_copy) is what lets it address device memory.
bool ucx_info_lists_a_cuda_memory_domain() {
  FILE* pipe = popen("ucx_info -d 2>/dev/null", "r");
  EXPECT_NE(pipe, nullptr) << "ucx_info (Debian ucx-utils) is needed";
  if (pipe == nullptr) return false;
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0);
  EXPECT_NE(output.find("# Memory domain:"), std::string::npos) << "ucx_info -d printed no domain";
  for (const char* name : {"Memory domain: cuda", "Memory domain: gdr_copy"}) {
    if (output.find(name) != std::string::npos) return true;
  }
  return false;
}

// The run-time detection agrees with UCX's own listing, and a CUDA pool on a build without
// CUDA support is refused with a reason instead of being registered as host memory.
TEST(KvTransferPoolMemory, CudaSupportIsDetectedAndAnUnsupportedCudaPoolIsRefused) {
  KvTransferOptions options;  // every transport UCX has, as ucx_info lists them
  auto engine = KvTransferEngine::create(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const bool supported = (*engine)->supports_cuda_memory();
  EXPECT_EQ(supported, ucx_info_lists_a_cuda_memory_domain());
  if (supported) return;  // zero-copy registration needs device memory: tests/kernels_gpu
  std::vector<std::uint8_t> pool(kPoolBytes);
  const Status refused = (*engine)->register_pool(pool.data(), pool.size(), PoolMemory::kCuda);
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented) << refused.to_string();
  EXPECT_NE(refused.message().find("CUDA"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("staged"), std::string::npos)
      << "names the staging path: " << refused.message();
  EXPECT_EQ((*engine)->local_descriptor().status().code(), StatusCode::kFailedPrecondition)
      << "nothing was registered";
}

TEST_P(KvTransferLoopback, RejectsBadRequests) {
  auto sender = make_engine(GetParam());
  auto receiver = make_engine(GetParam());
  ASSERT_TRUE(sender && receiver);
  std::vector<std::uint8_t> source(kPoolBytes), destination(kPoolBytes / 2);
  const BlockCopy copy{0, 0, kBlockBytes};
  EXPECT_EQ(sender->submit_puts(1, std::span(&copy, 1), 0, milliseconds(100)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender->local_descriptor().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sender->register_pool(source.data(), source.size()).ok());
  EXPECT_EQ(sender->register_pool(source.data(), source.size()).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(receiver->register_pool(destination.data(), destination.size()).ok());
  EXPECT_EQ(sender->connect(PeerDescriptor{}).status().code(), StatusCode::kInvalidArgument);
  auto peer = sender->connect(*receiver->local_descriptor());
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(
      sender->submit_puts(*peer + 1, std::span(&copy, 1), 0, milliseconds(100)).status().code(),
      StatusCode::kNotFound);
  const BlockCopy past_remote_end{0, kPoolBytes / 2 - 100, kBlockBytes};
  const BlockCopy past_local_end{kPoolBytes - 100, 0, kBlockBytes};
  const BlockCopy wrapping{0, ~std::uint64_t{0} - 10, kBlockBytes};
  const BlockCopy empty{0, 0, 0};
  for (const BlockCopy& bad : {past_remote_end, past_local_end, wrapping, empty}) {
    EXPECT_EQ(sender->submit_puts(*peer, std::span(&bad, 1), 0, milliseconds(100)).status().code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(sender->submit_puts(*peer, {}, 0, milliseconds(100)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sender->submit_puts(*peer, std::span(&copy, 1), 0, milliseconds(0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sender->poll(12345).status().code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferLoopback, ::testing::Values("tcp", "sm,self"),
                         [](const auto& param_info) {
                           return param_info.param == "tcp" ? std::string("tcp")
                                                            : std::string("shm");
                         });

}  // namespace
}  // namespace pdserve::kv_transfer
