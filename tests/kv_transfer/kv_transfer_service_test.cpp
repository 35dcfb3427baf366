// KvTransferService (the engine plus its thread), two in one process over loopback: aborting
// one stream must spare the other streams to the same receiver (issue #15 item 8; before, an
// abort closed the peer's endpoint and failed them all).
#include "kv_transfer/kv_transfer_service.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <string>

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

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferServiceLoopback,
                         ::testing::Values("tcp", "sm,self"), [](const auto& param_info) {
                           return param_info.param == "tcp" ? std::string("tcp")
                                                            : std::string("shm");
                         });

}  // namespace
}  // namespace pdserve::kv_transfer
