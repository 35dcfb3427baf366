// Issue #34: a peer's descriptor is a claim, and no put reaches UCX before the peer itself has
// confirmed it. Two engines (and two services, for the staged path) in one process over tcp and
// shared memory; the receiver's pool sits between two guard regions of the same allocation, so
// a put that a forged descriptor steers outside the pool would land (in this process) in a
// guard instead of crashing: the guards and the pool must stay zero, the sender must post no
// put (its counter stays 0), and the receiver must hear of no transfer. Before the handshake a
// wrong pool base or a larger pool size put KV into the guards, and a wrong key was not
// noticed at all (tcp's emulated puts check no key).
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "kv_transfer/host_pool_copier.h"
#include "kv_transfer/kv_transfer_engine.h"
#include "kv_transfer/kv_transfer_service.h"

namespace pdserve::kv_transfer {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kPoolBytes = 256 * 1024;
constexpr std::size_t kBlockBytes = 4096;

std::unique_ptr<KvTransferEngine> make_engine(const std::string& transports) {
  auto engine = KvTransferEngine::create({transports});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// [guard | pool | guard], all zero; only the pool is registered.
struct GuardedPool {
  std::vector<std::uint8_t> memory = std::vector<std::uint8_t>(3 * kPoolBytes, 0);
  std::uint8_t* pool() { return memory.data() + kPoolBytes; }
  bool all_zero() const {
    return std::all_of(memory.begin(), memory.end(), [](std::uint8_t b) { return b == 0; });
  }
};

// Drives both engines until the transfer finishes or `limit` passes.
TransferStatus wait_for(KvTransferEngine& sender, KvTransferEngine* receiver, TransferId id,
                        milliseconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    sender.progress();
    if (receiver != nullptr) receiver->progress();
    auto status = sender.poll(id);
    if (!status.ok() || status->state != TransferState::kPending) {
      return status.ok() ? *status : TransferStatus{TransferState::kFailed, status.status()};
    }
  }
  return {TransferState::kPending, deadline_exceeded("test gave up waiting")};
}

class PeerHandshake : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    sender = make_engine(GetParam());
    receiver = make_engine(GetParam());
    ASSERT_TRUE(sender && receiver);
    std::fill(source.begin(), source.end(), std::uint8_t{0xab});
    ASSERT_TRUE(sender->register_pool(source.data(), source.size()).ok());
    ASSERT_TRUE(receiver->register_pool(target.pool(), kPoolBytes).ok());
    auto descriptor = receiver->local_descriptor();
    ASSERT_TRUE(descriptor.ok());
    real = *descriptor;
  }

  std::unique_ptr<KvTransferEngine> sender;
  std::unique_ptr<KvTransferEngine> receiver;
  std::vector<std::uint8_t> source = std::vector<std::uint8_t>(kPoolBytes);
  GuardedPool target;
  PeerDescriptor real;
};

// Each forged descriptor (the real worker address, so the puts would reach the receiver) with
// a put that lies inside the pool it claims; where the claim is wrong, outside the real one.
struct Forgery {
  std::string name;
  PeerDescriptor descriptor;
  BlockCopy copy;
  std::string named;  // what the refusal must name
};

TEST_P(PeerHandshake, AForgedDescriptorIsRefusedBeforeAnyPut) {
  std::vector<Forgery> forgeries;
  PeerDescriptor wrong_base = real;
  wrong_base.pool_base -= kPoolBytes;  // the guard before the pool
  forgeries.push_back(
      {"a wrong pool base", wrong_base, {0, kBlockBytes, kBlockBytes}, "pool base address"});
  PeerDescriptor wrong_size = real;
  wrong_size.pool_bytes = 2 * kPoolBytes;  // the guard after the pool too
  forgeries.push_back({"a pool size larger than the real pool",
                       wrong_size,
                       {0, kPoolBytes + kBlockBytes, kBlockBytes},
                       "pool size"});
  // (Over tcp and shared memory a packed key names no region: every region's is the same
  // bytes. A key with one byte changed is another key.)
  PeerDescriptor wrong_rkey = real;
  wrong_rkey.packed_rkey.back() ^= 0x01;
  forgeries.push_back(
      {"a key with one byte changed", wrong_rkey, {0, 0, kBlockBytes}, "remote key"});
  PeerDescriptor garbage_rkey = real;
  std::fill(garbage_rkey.packed_rkey.begin(), garbage_rkey.packed_rkey.end(), std::uint8_t{0x5a});
  forgeries.push_back({"a garbage key", garbage_rkey, {0, 0, kBlockBytes}, "remote key"});

  for (const Forgery& forgery : forgeries) {
    SCOPED_TRACE(forgery.name);
    auto peer = sender->connect(forgery.descriptor);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    auto id = sender->submit_puts(*peer, std::span(&forgery.copy, 1), 9, milliseconds(10000));
    ASSERT_TRUE(id.ok()) << "within the claimed pool: " << id.status().to_string();
    const TransferStatus status = wait_for(*sender, receiver.get(), *id, milliseconds(15000));
    EXPECT_EQ(status.state, TransferState::kFailed);
    EXPECT_EQ(status.error.code(), StatusCode::kPermissionDenied) << status.error.to_string();
    EXPECT_NE(status.error.message().find(forgery.named), std::string::npos)
        << status.error.message();
    EXPECT_TRUE(status.refused);
    EXPECT_FALSE(sender->peer_usable(*peer));
    EXPECT_EQ(sender->stats().puts_posted, 0u) << "a put reached UCX";
    EXPECT_TRUE(target.all_zero()) << "bytes landed in or around the receiver's pool";
    EXPECT_TRUE(receiver->take_received().empty());
  }
  EXPECT_EQ(sender->stats().claims_refused, forgeries.size());
  EXPECT_EQ(receiver->stats().hellos_refused, forgeries.size());

  // The real descriptor still works, on the same engines: the bytes land, and only there.
  auto peer = sender->connect(real);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  const BlockCopy copy{0, 3 * kBlockBytes, 2 * kBlockBytes};
  auto id = sender->submit_puts(*peer, std::span(&copy, 1), 10, milliseconds(10000));
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  const TransferStatus status = wait_for(*sender, receiver.get(), *id, milliseconds(15000));
  ASSERT_EQ(status.state, TransferState::kDone) << status.error.to_string();
  EXPECT_TRUE(sender->peer_confirmed(*peer));
  EXPECT_EQ(sender->stats().puts_posted, 1u);
  std::vector<std::uint8_t> expected(3 * kPoolBytes, 0);
  std::fill_n(expected.begin() + kPoolBytes + 3 * kBlockBytes, 2 * kBlockBytes, std::uint8_t{0xab});
  EXPECT_TRUE(target.memory == expected);
  const std::vector<ReceivedTransfer> received = receiver->take_received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].request_tag, 10u);
}

// Ranges past the real pool, with the real descriptor: refused whether the peer has confirmed
// it yet or not, and none of the transfer's puts (the good ones queued beside it included)
// reaches UCX.
TEST_P(PeerHandshake, BlocksPastThePoolNeverReachUcx) {
  auto peer = sender->connect(real);
  ASSERT_TRUE(peer.ok());
  ASSERT_FALSE(sender->peer_confirmed(*peer)) << "confirmed without an answer";
  const BlockCopy good{0, 0, kBlockBytes};
  const BlockCopy past_end{0, kPoolBytes, kBlockBytes};
  const BlockCopy straddling{0, kPoolBytes - kBlockBytes / 2, kBlockBytes};

  // While the handshake is under way: a good put waits, then a bad one fails the transfer.
  auto early = sender->open_transfer(*peer, 1, milliseconds(10000));
  ASSERT_TRUE(early.ok());
  int released = 0;
  ASSERT_TRUE(sender->add_puts(*early, std::span(&good, 1), [&] { ++released; }).ok());
  EXPECT_EQ(sender->add_puts(*early, std::span(&past_end, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(released, 1) << "the queued put is handed back";
  const TransferStatus early_status = wait_for(*sender, receiver.get(), *early, milliseconds(5000));
  EXPECT_EQ(early_status.state, TransferState::kFailed);
  EXPECT_TRUE(early_status.refused);

  // Once confirmed.
  auto confirm = sender->submit_puts(*peer, std::span(&good, 1), 2, milliseconds(10000));
  ASSERT_TRUE(confirm.ok());
  ASSERT_EQ(wait_for(*sender, receiver.get(), *confirm, milliseconds(15000)).state,
            TransferState::kDone);
  ASSERT_TRUE(sender->peer_confirmed(*peer));
  const std::uint64_t posted = sender->stats().puts_posted;
  for (const BlockCopy& bad : {past_end, straddling}) {
    EXPECT_EQ(sender->submit_puts(*peer, std::span(&bad, 1), 3, milliseconds(1000)).status().code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(sender->stats().puts_posted, posted);
  // Only the confirmed put's block was written; the guards are untouched.
  EXPECT_TRUE(std::all_of(target.memory.begin(), target.memory.begin() + kPoolBytes,
                          [](std::uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::all_of(target.memory.begin() + kPoolBytes + kBlockBytes, target.memory.end(),
                          [](std::uint8_t b) { return b == 0; }));
}

// A worker that never answers (its engine is never progressed) gets no put: the transfer fails
// by the handshake's deadline.
TEST_P(PeerHandshake, APeerThatNeverAnswersGetsNoPut) {
  auto peer = sender->connect(real, milliseconds(300));
  ASSERT_TRUE(peer.ok());
  const BlockCopy copy{0, 0, kBlockBytes};
  auto id = sender->submit_puts(*peer, std::span(&copy, 1), 1, milliseconds(10000));
  ASSERT_TRUE(id.ok());
  const auto start = Clock::now();
  const TransferStatus status = wait_for(*sender, nullptr, *id, milliseconds(5000));
  EXPECT_EQ(status.state, TransferState::kFailed);
  EXPECT_EQ(status.error.code(), StatusCode::kDeadlineExceeded) << status.error.to_string();
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  EXPECT_EQ(sender->stats().puts_posted, 0u);
  for (int i = 0; i < 100; ++i) receiver->progress();
  EXPECT_TRUE(target.all_zero());
}

// The staged sender puts from its bounce buffers, through the same engine: a forged descriptor
// is refused there too, reported as refused, and lands nothing.
TEST_P(PeerHandshake, TheStagedPathRefusesAForgedDescriptorToo) {
  receiver.reset();  // the receiving side is a service here
  GuardedPool landed;
  auto service_receiver =
      KvTransferService::create({GetParam()}, landed.pool(), kPoolBytes, nullptr);
  ASSERT_TRUE(service_receiver.ok()) << service_receiver.status().to_string();
  auto wire = base64_decode((*service_receiver)->descriptor_base64());
  ASSERT_TRUE(wire.ok());
  auto descriptor = parse_descriptor(*wire);
  ASSERT_TRUE(descriptor.ok());
  PeerDescriptor forged = *descriptor;
  forged.pool_base += kPoolBytes;  // the guard after the pool
  const std::string forged_base64 = base64_encode(serialize_descriptor(forged));

  KvTransferServiceOptions options;
  options.transports = GetParam();
  options.path = TransferPath::kStaged;
  options.copier =
      std::make_shared<HostPoolCopier>(reinterpret_cast<std::byte*>(source.data()), source.size());
  options.send_bytes = 4 * kBlockBytes;
  options.staging_unit = kBlockBytes;
  auto staged = KvTransferService::create(options, source.data(), source.size(), nullptr);
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  ASSERT_TRUE((*staged)->staged());

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<KvTransferReport> reports;
  const auto send = [&](const std::string& descriptor_base64, std::vector<BlockCopy> copies) {
    (*staged)->send(descriptor_base64, std::move(copies), 1, milliseconds(10000),
                    [&](const KvTransferReport& report) {
                      std::lock_guard lock(mutex);
                      reports.push_back(report);
                      changed.notify_all();
                    });
    std::unique_lock lock(mutex);
    EXPECT_TRUE(changed.wait_for(lock, milliseconds(15000), [&] { return !reports.empty(); }));
    KvTransferReport report = reports.empty() ? KvTransferReport{} : reports.back();
    reports.clear();
    return report;
  };
  const KvTransferReport refused = send(forged_base64, {{0, 0, 2 * kBlockBytes}});
  EXPECT_EQ(refused.status.code(), StatusCode::kPermissionDenied) << refused.status.to_string();
  EXPECT_TRUE(refused.refused);
  EXPECT_TRUE(landed.all_zero());
  const KvTransferReport unreadable = send("not a descriptor", {{0, 0, kBlockBytes}});
  EXPECT_FALSE(unreadable.status.ok());
  EXPECT_TRUE(unreadable.refused);

  const KvTransferReport sent =
      send((*service_receiver)->descriptor_base64(), {{0, kBlockBytes, 2 * kBlockBytes}});
  ASSERT_TRUE(sent.status.ok()) << sent.status.to_string();
  EXPECT_FALSE(sent.refused);
  EXPECT_TRUE(std::all_of(landed.pool() + kBlockBytes, landed.pool() + 3 * kBlockBytes,
                          [](std::uint8_t b) { return b == 0xab; }));
  EXPECT_EQ(std::count(landed.memory.begin(), landed.memory.end(), std::uint8_t{0}),
            static_cast<long>(3 * kPoolBytes - 2 * kBlockBytes));
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerHandshake, ::testing::Values("tcp", "sm,self"),
                         [](const auto& param_info) {
                           return param_info.param == "tcp" ? std::string("tcp")
                                                            : std::string("shm");
                         });

}  // namespace
}  // namespace pdserve::kv_transfer
