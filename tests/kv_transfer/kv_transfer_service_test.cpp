// KvTransferService (the engine plus its thread), two in one process over loopback: aborting
// one stream must spare the other streams to the same receiver (issue #15 item 8; before, an
// abort closed the peer's endpoint and failed them all). The staged path (issue #14), with a
// host pool behind the host PoolCopier (batches finishing out of order): a staged sender lands
// the same bytes as a direct one, into a direct receiver's pool and a staged receiver's
// landing area, through a send ring much smaller than the transfer; its puts' bytes are seen
// as staged; a stream waiting for a free send buffer fails at its deadline and lands nothing;
// an aborted one is cancelled while the others go on.
#include "kv_transfer/kv_transfer_service.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>

#include "kv_transfer/host_pool_copier.h"

namespace pdserve::kv_transfer {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kPoolBytes = 1 << 20;
constexpr std::size_t kBlockBytes = 4096;

// The reports of a service's streams, by name, as they come (on the transfer thread).
struct Reports {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, KvTransferReport> by_name;
  std::vector<uint64_t> received_tags;

  std::function<void(const KvTransferReport&)> callback(const std::string& name) {
    return [this, name](const KvTransferReport& report) {
      std::lock_guard lock(mutex);
      by_name.emplace(name, report);
      changed.notify_all();
    };
  }
  bool wait(const std::string& name, milliseconds limit) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, [&] { return by_name.contains(name); });
  }
  // The receiver hears of a transfer on its own thread, possibly after the sender's report.
  bool wait_received(size_t count, milliseconds limit) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, [&] { return received_tags.size() >= count; });
  }
};

class KvTransferServiceLoopback : public ::testing::TestWithParam<std::string> {};

TEST_P(KvTransferServiceLoopback, AbortingOneStreamSparesTheReceiversOtherStreams) {
  std::vector<std::uint8_t> source(kPoolBytes);
  std::iota(source.begin(), source.end(), std::uint8_t{3});
  std::vector<std::uint8_t> destination(kPoolBytes, 0);
  Reports reports;
  auto receiver = KvTransferService::create({GetParam()}, destination.data(), destination.size(),
                                            [&](const ReceivedTransfer& received) {
                                              std::lock_guard lock(reports.mutex);
                                              reports.received_tags.push_back(received.request_tag);
                                              reports.changed.notify_all();
                                            });
  auto sender =
      KvTransferService::create({GetParam()}, source.data(), source.size(), nullptr);
  ASSERT_TRUE(receiver.ok() && sender.ok());
  const std::string peer = (*receiver)->descriptor_base64();

  const std::optional<uint64_t> doomed =
      (*sender)->open(peer, 1, milliseconds(10000), reports.callback("doomed"));
  const std::optional<uint64_t> survivor =
      (*sender)->open(peer, 2, milliseconds(10000), reports.callback("survivor"));
  ASSERT_TRUE(doomed && survivor);
  (*sender)->put(*doomed, {{0, 0, 4 * kBlockBytes}});
  (*sender)->put(*survivor, {{8 * kBlockBytes, 8 * kBlockBytes, 4 * kBlockBytes}});
  (*sender)->abort(*doomed);
  (*sender)->put(*survivor, {{16 * kBlockBytes, 16 * kBlockBytes, kBlockBytes}});
  (*sender)->close(*survivor);

  ASSERT_TRUE(reports.wait("doomed", milliseconds(15000)));
  ASSERT_TRUE(reports.wait("survivor", milliseconds(15000)));
  ASSERT_TRUE(reports.wait_received(1, milliseconds(15000)));
  std::lock_guard lock(reports.mutex);
  EXPECT_EQ(reports.by_name.at("doomed").status.code(), StatusCode::kCancelled)
      << reports.by_name.at("doomed").status.to_string();
  const KvTransferReport& spared = reports.by_name.at("survivor");
  ASSERT_TRUE(spared.status.ok()) << spared.status.to_string();
  EXPECT_EQ(spared.bytes, 5 * kBlockBytes);
  EXPECT_TRUE(std::equal(source.begin() + 8 * kBlockBytes, source.begin() + 12 * kBlockBytes,
                         destination.begin() + 8 * kBlockBytes));
  EXPECT_TRUE(std::equal(source.begin() + 16 * kBlockBytes, source.begin() + 17 * kBlockBytes,
                         destination.begin() + 16 * kBlockBytes));
  EXPECT_EQ(reports.received_tags, std::vector<uint64_t>{2});
}

// A receiver on the direct path whose completion messages go to `reports`.
Result<std::unique_ptr<KvTransferService>> direct_receiver(const std::string& transports,
                                                           std::vector<std::uint8_t>& pool,
                                                           Reports& reports) {
  return KvTransferService::create({transports}, pool.data(), pool.size(),
                                   [&reports](const ReceivedTransfer& received) {
                                     std::lock_guard lock(reports.mutex);
                                     reports.received_tags.push_back(received.request_tag);
                                     reports.changed.notify_all();
                                   });
}

// A sender on the staged path over `pool`, seen through `copier`, with a send ring of
// `ring_bytes` (in buffers of whole kBlockBytes units).
Result<std::unique_ptr<KvTransferService>> staged_sender(const std::string& transports,
                                                         std::vector<std::uint8_t>& pool,
                                                         std::shared_ptr<PoolCopier> copier,
                                                         std::uint64_t ring_bytes) {
  KvTransferServiceOptions options;
  options.transports = transports;
  options.path = TransferPath::kStaged;
  options.copier = std::move(copier);
  options.send_bytes = ring_bytes;
  options.staging_unit = kBlockBytes;
  return KvTransferService::create(options, pool.data(), pool.size(), nullptr);
}

TEST_P(KvTransferServiceLoopback, StagedAndDirectSendersLandTheSameBytes) {
  std::vector<std::uint8_t> source(kPoolBytes);
  std::mt19937 rng(21);
  for (std::uint8_t& b : source) b = static_cast<std::uint8_t>(rng());
  // 40 runs of 1..6 blocks from anywhere in the source to distinct places in the receivers.
  std::vector<BlockCopy> copies;
  std::vector<std::uint64_t> destinations(kPoolBytes / kBlockBytes / 6);  // 42 places
  std::iota(destinations.begin(), destinations.end(), 0);
  std::shuffle(destinations.begin(), destinations.end(), rng);
  std::uint64_t total = 0;
  for (int i = 0; i < 40; ++i) {
    const std::uint64_t blocks = 1 + rng() % 6;
    const std::uint64_t from = rng() % (kPoolBytes / kBlockBytes - blocks);
    copies.push_back({from * kBlockBytes,
                      destinations[static_cast<std::size_t>(i)] * 6 * kBlockBytes,
                      blocks * kBlockBytes});
    total += blocks * kBlockBytes;
  }
  std::vector<std::uint8_t> expected(kPoolBytes, 0);
  for (const BlockCopy& copy : copies) {
    std::copy_n(source.begin() + static_cast<std::ptrdiff_t>(copy.local_offset), copy.bytes,
                expected.begin() + static_cast<std::ptrdiff_t>(copy.remote_offset));
  }

  Reports reports;
  std::vector<std::uint8_t> direct_landed(kPoolBytes, 0), staged_landed(kPoolBytes, 0);
  auto receiver_of_direct = direct_receiver(GetParam(), direct_landed, reports);
  auto receiver_of_staged = direct_receiver(GetParam(), staged_landed, reports);
  // A staged receiver: its landing area is what peers write.
  std::vector<std::uint8_t> unused_pool(kBlockBytes);
  KvTransferServiceOptions landing_options;
  landing_options.transports = GetParam();
  landing_options.path = TransferPath::kStaged;
  landing_options.copier = std::make_shared<HostPoolCopier>(
      reinterpret_cast<std::byte*>(unused_pool.data()), unused_pool.size());
  landing_options.landing_bytes = kPoolBytes;
  landing_options.staging_unit = kBlockBytes;
  auto landing_receiver = KvTransferService::create(
      landing_options, unused_pool.data(), unused_pool.size(), [&](const ReceivedTransfer& r) {
        std::lock_guard lock(reports.mutex);
        reports.received_tags.push_back(r.request_tag);
        reports.changed.notify_all();
      });
  ASSERT_TRUE(receiver_of_direct.ok() && receiver_of_staged.ok() && landing_receiver.ok());
  ASSERT_TRUE((*landing_receiver)->staged());
  ASSERT_NE((*landing_receiver)->landing_area(), nullptr);
  EXPECT_EQ((*landing_receiver)->landing_bytes(), kPoolBytes);

  auto direct = KvTransferService::create({GetParam()}, source.data(), source.size(), nullptr);
  auto copier = std::make_shared<HostPoolCopier>(
      reinterpret_cast<std::byte*>(source.data()), source.size(),
      HostPoolCopierOptions{/*reorder=*/true, /*seed=*/4, std::chrono::microseconds(20)});
  // Two buffers of 8 blocks: the transfer (about 140 blocks) cycles them many times.
  auto staged = staged_sender(GetParam(), source, copier, 16 * kBlockBytes);
  ASSERT_TRUE(direct.ok() && staged.ok());
  EXPECT_FALSE((*direct)->staged());
  ASSERT_TRUE((*staged)->staged());
  EXPECT_EQ((*staged)->send_slots(), 2);
  EXPECT_EQ((*staged)->send_slot_bytes(), 8 * kBlockBytes);

  // Puts one copy at a time, as layers become ready; the staged stream's bytes are watched.
  std::mutex seen_mutex;
  std::uint64_t seen_bytes = 0;
  bool seen_match = true;
  const StagedBytes watch = [&](std::uint64_t pool_offset, const std::byte* data,
                                std::uint64_t bytes) {
    std::lock_guard lock(seen_mutex);
    seen_bytes += bytes;
    seen_match = seen_match && std::memcmp(data, source.data() + pool_offset, bytes) == 0;
  };
  const auto stream = [&](KvTransferService& sender, KvTransferService& receiver, uint64_t tag,
                          const std::string& name, StagedBytes staged_bytes) {
    const std::optional<uint64_t> id =
        sender.open(receiver.descriptor_base64(), tag, milliseconds(20000), reports.callback(name),
                    std::move(staged_bytes));
    ASSERT_TRUE(id.has_value());
    for (const BlockCopy& copy : copies) sender.put(*id, {copy});
    sender.close(*id);
  };
  stream(**direct, **receiver_of_direct, 1, "direct", {});
  stream(**staged, **receiver_of_staged, 2, "staged", watch);
  stream(**staged, **landing_receiver, 3, "staged to landing", {});
  for (const char* name : {"direct", "staged", "staged to landing"}) {
    ASSERT_TRUE(reports.wait(name, milliseconds(30000))) << name;
  }
  ASSERT_TRUE(reports.wait_received(3, milliseconds(15000)));
  std::lock_guard lock(reports.mutex);
  for (const char* name : {"direct", "staged", "staged to landing"}) {
    const KvTransferReport& report = reports.by_name.at(name);
    ASSERT_TRUE(report.status.ok()) << name << ": " << report.status.to_string();
    EXPECT_EQ(report.bytes, total) << name;
  }
  EXPECT_TRUE(direct_landed == expected) << "the direct path's bytes";
  EXPECT_TRUE(staged_landed == expected) << "the staged path's bytes differ from the direct path's";
  EXPECT_TRUE(
      std::equal(expected.begin(), expected.end(),
                 reinterpret_cast<const std::uint8_t*>((*landing_receiver)->landing_area())))
      << "a staged receiver's landing area";
  std::lock_guard seen_lock(seen_mutex);
  EXPECT_EQ(seen_bytes, total);
  EXPECT_TRUE(seen_match) << "the staged bytes seen differ from the pool's";
}

TEST_P(KvTransferServiceLoopback, AStagedStreamWaitingForAFreeBufferFailsAtItsDeadline) {
  std::vector<std::uint8_t> source(kPoolBytes);
  std::iota(source.begin(), source.end(), std::uint8_t{7});
  std::vector<std::uint8_t> destination(kPoolBytes, 0);
  Reports reports;
  auto receiver = direct_receiver(GetParam(), destination, reports);
  auto copier =
      std::make_shared<HostPoolCopier>(reinterpret_cast<std::byte*>(source.data()), source.size());
  auto sender = staged_sender(GetParam(), source, copier, 8 * kBlockBytes);  // 2 x 4 blocks
  ASSERT_TRUE(receiver.ok() && sender.ok());
  const std::string peer = (*receiver)->descriptor_base64();
  // While the copier is held, the first stream's pieces keep both buffers busy.
  copier->set_paused(true);
  const auto busy = (*sender)->open(peer, 1, milliseconds(20000), reports.callback("busy"));
  ASSERT_TRUE(busy);
  (*sender)->put(*busy, {{0, 0, 16 * kBlockBytes}});
  (*sender)->close(*busy);
  const auto started = std::chrono::steady_clock::now();
  const auto starved = (*sender)->open(peer, 2, milliseconds(300), reports.callback("starved"));
  ASSERT_TRUE(starved);
  (*sender)->put(*starved, {{64 * kBlockBytes, 64 * kBlockBytes, kBlockBytes}});
  (*sender)->close(*starved);
  ASSERT_TRUE(reports.wait("starved", milliseconds(5000)));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  {
    std::lock_guard lock(reports.mutex);
    const Status& why = reports.by_name.at("starved").status;
    EXPECT_EQ(why.code(), StatusCode::kDeadlineExceeded) << why.to_string();
    EXPECT_NE(why.message().find("staging buffer"), std::string::npos) << why.message();
    EXPECT_FALSE(reports.by_name.contains("busy"));
  }
  EXPECT_LT(waited, 2.0) << "the wait for a buffer is bounded by the stream's deadline";
  // Let go, the first stream lands whole; nothing of the starved one ever does.
  copier->set_paused(false);
  ASSERT_TRUE(reports.wait("busy", milliseconds(15000)));
  ASSERT_TRUE(reports.wait_received(1, milliseconds(15000)));
  std::lock_guard lock(reports.mutex);
  ASSERT_TRUE(reports.by_name.at("busy").status.ok())
      << reports.by_name.at("busy").status.to_string();
  EXPECT_TRUE(std::equal(source.begin(), source.begin() + 16 * kBlockBytes, destination.begin()));
  EXPECT_TRUE(std::all_of(destination.begin() + 64 * kBlockBytes,
                          destination.begin() + 65 * kBlockBytes,
                          [](std::uint8_t b) { return b == 0; }));
  EXPECT_EQ(reports.received_tags, std::vector<uint64_t>{1});
}

TEST_P(KvTransferServiceLoopback, AbortingAStagedStreamSparesTheOthers) {
  std::vector<std::uint8_t> source(kPoolBytes);
  std::iota(source.begin(), source.end(), std::uint8_t{9});
  std::vector<std::uint8_t> destination(kPoolBytes, 0);
  Reports reports;
  auto receiver = direct_receiver(GetParam(), destination, reports);
  auto copier =
      std::make_shared<HostPoolCopier>(reinterpret_cast<std::byte*>(source.data()), source.size());
  auto sender = staged_sender(GetParam(), source, copier, 8 * kBlockBytes);
  ASSERT_TRUE(receiver.ok() && sender.ok());
  const std::string peer = (*receiver)->descriptor_base64();
  copier->set_paused(true);
  const auto doomed = (*sender)->open(peer, 1, milliseconds(20000), reports.callback("doomed"));
  const auto survivor = (*sender)->open(peer, 2, milliseconds(20000), reports.callback("survivor"));
  ASSERT_TRUE(doomed && survivor);
  (*sender)->put(*doomed, {{0, 0, 12 * kBlockBytes}});
  (*sender)->put(*survivor, {{32 * kBlockBytes, 32 * kBlockBytes, 6 * kBlockBytes}});
  (*sender)->close(*survivor);
  (*sender)->abort(*doomed);
  copier->set_paused(false);
  ASSERT_TRUE(reports.wait("doomed", milliseconds(15000)));
  ASSERT_TRUE(reports.wait("survivor", milliseconds(15000)));
  ASSERT_TRUE(reports.wait_received(1, milliseconds(15000)));
  std::lock_guard lock(reports.mutex);
  EXPECT_EQ(reports.by_name.at("doomed").status.code(), StatusCode::kCancelled)
      << reports.by_name.at("doomed").status.to_string();
  ASSERT_TRUE(reports.by_name.at("survivor").status.ok())
      << reports.by_name.at("survivor").status.to_string();
  EXPECT_TRUE(std::equal(source.begin() + 32 * kBlockBytes, source.begin() + 38 * kBlockBytes,
                         destination.begin() + 32 * kBlockBytes));
  EXPECT_EQ(reports.received_tags, std::vector<uint64_t>{2});
}

TEST(KvTransferServiceOptions, TheStagedPathNeedsACopierAndMemory) {
  std::vector<std::uint8_t> pool(kPoolBytes);
  KvTransferServiceOptions options;
  options.transports = "tcp";
  options.path = TransferPath::kStaged;
  options.send_bytes = kPoolBytes;
  EXPECT_EQ(KvTransferService::create(options, pool.data(), pool.size(), nullptr).status().code(),
            StatusCode::kInvalidArgument)
      << "no copier";
  options.copier =
      std::make_shared<HostPoolCopier>(reinterpret_cast<std::byte*>(pool.data()), pool.size());
  options.send_bytes = 0;
  EXPECT_EQ(KvTransferService::create(options, pool.data(), pool.size(), nullptr).status().code(),
            StatusCode::kInvalidArgument)
      << "no staging memory";
  // Auto on a host pool is the direct path, whatever staging was offered.
  options.path = TransferPath::kAuto;
  options.send_bytes = kPoolBytes;
  auto automatic = KvTransferService::create(options, pool.data(), pool.size(), nullptr);
  ASSERT_TRUE(automatic.ok()) << automatic.status().to_string();
  EXPECT_FALSE((*automatic)->staged());
  for (const char* name : {"auto", "direct", "staged"}) {
    Result<TransferPath> path = parse_transfer_path(name);
    ASSERT_TRUE(path.ok());
    EXPECT_EQ(transfer_path_name(*path), name);
  }
  EXPECT_EQ(parse_transfer_path("zero-copy").status().code(), StatusCode::kInvalidArgument);
}

// The thread that drives UCX binds to the pool's device before anything else; a bind that
// fails fails the service with its reason instead of a thread on the wrong device.
TEST(KvTransferServiceOptions, ATransferThreadThatCannotBindFailsTheServiceWithItsReason) {
  std::vector<std::uint8_t> pool(kPoolBytes);
  KvTransferServiceOptions options;
  options.transports = "tcp";
  bool bound = false;
  options.bind_thread = [&bound] {
    bound = true;
    return Status::ok_status();
  };
  auto service = KvTransferService::create(options, pool.data(), pool.size(), nullptr);
  ASSERT_TRUE(service.ok()) << service.status().to_string();
  EXPECT_TRUE(bound);
  options.bind_thread = [] { return unavailable("no CUDA device 7"); };
  auto refused = KvTransferService::create(options, pool.data(), pool.size(), nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("no CUDA device 7"), std::string::npos)
      << refused.status().message();
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferServiceLoopback,
                         ::testing::Values("tcp", "sm,self"), [](const auto& param_info) {
                           return param_info.param == "tcp" ? std::string("tcp")
                                                            : std::string("shm");
                         });

}  // namespace
}  // namespace pdserve::kv_transfer
