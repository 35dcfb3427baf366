// The decode side of UcxKvConnector over real UCX. Against a bare socket that takes the work
// and hangs up: when are a request's reserved blocks released (kImportReleased)? Issue #15
// item 7: a call that fails after the work went out must hold them (the prefill node may be
// writing), and only a refused connection frees them at once. (The HTTP exchange alone, e.g.
// a cancelled import, is remote_prefill_client_test.cpp's.) KV integrity: against a
// prefill node with a real exporting connector, the blocks that land are verified against the
// export's checksums before the import is ready; a corrupted landing fails with DataLoss and
// frees the blocks at once. The staged path (issue #14), host pools behind the host
// PoolCopier: whichever side stages (tcp and shared memory), the decode pool ends up with the
// same bytes as on the direct path and the checksums (of the staged copies) agree; a staged
// import waits for landing blocks first come first served within the transfer timeout, and
// one larger than the landing area is refused at once for a local prefill.
#include "kv_transfer/ucx_kv_connector.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "common/http/http_server.h"
#include "common/http/route_table.h"
#include "kv_transfer/host_pool_copier.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kTransferTimeout = milliseconds(1500);
constexpr auto kGrace = milliseconds(500);

KvLayout test_layout() {
  return KvLayout{2, 8, 16, 1, 4, DType::kF32};
}

// How a test node moves KV: over which transports, and whether it stages through host
// memory (its pool then seen only through a HostPoolCopier finishing batches out of order).
struct Path {
  std::string transports = "tcp";
  bool staged = false;
  int landing_blocks = 8;  // a staged decode node's landing area
};

// The staged path's options for a node whose pool is `pool`: a send ring of two one-block
// buffers (so every layer's K or V of a block waits for its own), or a landing area.
void stage(UcxKvConnectorOptions& options, void* pool, std::size_t bytes, const Path& path) {
  options.transports = path.transports;
  if (!path.staged) return;
  const KvLayout layout = test_layout();
  options.path = TransferPath::kStaged;
  options.copier = std::make_shared<HostPoolCopier>(
      static_cast<std::byte*>(pool), bytes, HostPoolCopierOptions{/*reorder=*/true, /*seed=*/17});
  options.staging_send_bytes = 2 * layout.layer_block_bytes();
  options.staging_receive_bytes =
      static_cast<std::uint64_t>(path.landing_blocks) * layout.bytes_per_block();
}

struct Decode {
  std::vector<float> pool;
  std::unique_ptr<UcxKvConnector> connector;
  std::vector<KvEvent> events;

  explicit Decode(int test_corrupt_every = 0, const Path& path = {}) {
    const KvLayout layout = test_layout();
    pool.assign(layout.offset(0, 0, true) * 2 / sizeof(float), 0.0f);
    UcxKvConnectorOptions options;
    options.transfer_timeout = kTransferTimeout;
    options.release_grace = kGrace;
    options.test_corrupt_every = test_corrupt_every;
    stage(options, pool.data(), pool.size() * sizeof(float), path);
    auto created =
        UcxKvConnector::create(options, pool.data(), pool.size() * sizeof(float), layout);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (created.ok()) connector = std::move(*created);
    if (connector) connector->set_wakeup([] {});
    if (connector) {
      EXPECT_EQ(connector->staged(), path.staged);
    }
  }

  Status start(const std::string& url, const std::string& id = "req-1",
               std::vector<int32_t> blocks = {3, 5}) {
    InferenceRequest request;
    request.id = id;
    request.prompt_tokens.assign(20, 7);  // two blocks
    request.sampling.max_tokens = 4;
    request.kv_import = KvImportSource{{url}, milliseconds(60'000), ""};
    return connector->start_import(request, blocks, 0);
  }

  // The index of the first event of `kind` for `id` among those polled so far; -1 if none.
  int index_of(KvEventKind kind, const std::string& id) const {
    for (size_t i = 0; i < events.size(); ++i) {
      if (events[i].kind == kind && events[i].request_id == id) return static_cast<int>(i);
    }
    return -1;
  }
  // poll() is how the engine takes the connector's events, on its own steps (and where the
  // connector's deadlines are enforced): the test polls as the engine does.
  bool wait_for(KvEventKind kind, const std::string& id, milliseconds limit) {
    const auto give_up = Clock::now() + limit;
    for (;;) {
      for (KvEvent& event : connector->poll()) events.push_back(event);
      if (index_of(kind, id) >= 0) return true;
      if (Clock::now() > give_up) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }

  // Polls until an event of `kind` has arrived (now or before) or `limit` passes; true when it
  // has. Every event polled is kept.
  bool wait_for(KvEventKind kind, milliseconds limit) {
    const auto give_up = Clock::now() + limit;
    for (;;) {
      for (KvEvent& event : connector->poll()) events.push_back(event);
      if (find(kind) != nullptr) return true;
      if (Clock::now() > give_up) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  const KvEvent* find(KvEventKind kind) const {
    for (const KvEvent& event : events) {
      if (event.kind == kind) return &event;
    }
    return nullptr;
  }
};

// A prefill node with a real exporting connector and its own pool of random KV: it answers the
// work with a first token, then puts the prompt's blocks (its blocks 1 and 2) into the decode
// node's over UCX tcp and reports kv_sent with the export's checksums, as prefill_server does.
class ExportingPrefillNode {
 public:
  static constexpr int32_t kLocalBlocks[] = {1, 2};

  explicit ExportingPrefillNode(const Path& path = {}) {
    const KvLayout layout = test_layout();
    pool_.resize(layout.offset(0, 0, true) * 2 / sizeof(float));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    for (float& v : pool_) v = value(rng);
    UcxKvConnectorOptions options;
    stage(options, pool_.data(), pool_.size() * sizeof(float), path);
    auto created =
        UcxKvConnector::create(options, pool_.data(), pool_.size() * sizeof(float), layout);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (!created.ok()) return;
    exporter_ = std::move(*created);
    exporter_->set_wakeup([] {});
    http::RouteTable router;
    router.add("POST", "/internal/v1/prefill",
               [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                 export_work(request.body, std::move(ch));
               });
    auto server = http::HttpServer::start({}, std::move(router));
    EXPECT_TRUE(server.ok()) << server.status().to_string();
    if (server.ok()) server_ = std::move(*server);
  }
  ~ExportingPrefillNode() {
    if (server_) server_->stop();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  const float* pool() const { return pool_.data(); }
  bool asked_for_checksums() const { return asked_for_checksums_; }

 private:
  void export_work(const std::string& body, std::shared_ptr<http::ResponseChannel> channel) {
    Result<PrefillWork> work = parse_prefill_work(body);
    ASSERT_TRUE(work.ok()) << work.status().to_string();
    asked_for_checksums_ = work->kv_checksum;
    channel->start_stream(200, "application/x-ndjson", {});
    PrefillEvent first;
    first.kind = PrefillEvent::Kind::kFirstToken;
    first.token = 5;
    channel->write(prefill_event_line(first));
    KvExportTarget target;
    target.peer_descriptor = work->kv_descriptor;
    target.peer_num_blocks = work->kv_num_blocks;
    target.peer_blocks = work->block_ids;
    target.first_block = work->first_block;
    target.transfer_tag = work->transfer_tag;
    target.timeout = milliseconds(work->timeout_ms);
    target.checksum = work->kv_checksum;
    target.on_finished = [channel](const KvTransferReport& report) {
      PrefillEvent event;
      event.kind = report.status.ok() ? PrefillEvent::Kind::kKvSent : PrefillEvent::Kind::kKvFailed;
      event.blocks = report.blocks;
      event.block_checksums = report.block_checksums;
      event.error = report.status.message();
      channel->write(prefill_event_line(event));
      channel->end_stream();
    };
    const Status started = exporter_->start_export(work->request_id, target, kLocalBlocks,
                                                   static_cast<int>(work->prompt_token_ids.size()));
    ASSERT_TRUE(started.ok()) << started.to_string();
    // Layer by layer, as a forward reports them.
    for (int layer = 0; layer < test_layout().num_layers; ++layer) exporter_->layer_written(layer);
    exporter_->finish_export(work->request_id);
  }

  std::vector<float> pool_;
  std::unique_ptr<UcxKvConnector> exporter_;
  std::atomic<bool> asked_for_checksums_{false};
  std::unique_ptr<http::HttpServer> server_;
};

// The prompt's 20 tokens as they lie in the decode pool's blocks 3 and 5 and the prefill
// pool's blocks 1 and 2.
bool prompt_kv_equal(const float* decode, const float* prefill) {
  const KvLayout layout = test_layout();
  const int32_t decode_blocks[] = {3, 5};
  const int tokens[] = {16, 4};
  for (int i = 0; i < 2; ++i) {
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (bool value_half : {false, true}) {
        const size_t bytes = static_cast<size_t>(tokens[i]) * layout.token_bytes();
        if (std::memcmp(reinterpret_cast<const std::byte*>(decode) +
                            layout.offset(layer, decode_blocks[i], value_half),
                        reinterpret_cast<const std::byte*>(prefill) +
                            layout.offset(layer, ExportingPrefillNode::kLocalBlocks[i], value_half),
                        bytes) != 0) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST(UcxKvConnectorIntegrity, TheLandedBlocksMatchTheExportsChecksumsAndTheImportIsReady) {
  ExportingPrefillNode prefill;
  Decode decode;
  ASSERT_TRUE(decode.connector);
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReady, milliseconds(10'000)));
  EXPECT_TRUE(prefill.asked_for_checksums()) << "checksums are on by default";
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed), nullptr);
  EXPECT_TRUE(prompt_kv_equal(decode.pool.data(), prefill.pool()));
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(1000)));
}

// Both paths, every pairing, over tcp and shared memory: the decode pool gets the prefill's
// blocks, byte for byte the same pool as on the direct path, and the checksums of the staged
// copies match those of the landed blocks.
class UcxKvConnectorPaths : public ::testing::TestWithParam<std::tuple<std::string, bool, bool>> {};

TEST_P(UcxKvConnectorPaths, TheDecodePoolGetsTheSameBytesWhicheverSideStages) {
  const auto& [transports, prefill_staged, decode_staged] = GetParam();
  ExportingPrefillNode prefill(Path{transports, prefill_staged});
  Decode decode(0, Path{transports, decode_staged});
  ASSERT_TRUE(decode.connector);
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReady, milliseconds(15'000)));
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed), nullptr)
      << decode.find(KvEventKind::kImportFailed)->status.to_string();
  EXPECT_TRUE(prefill.asked_for_checksums()) << "checksums work on staged pools too";
  EXPECT_TRUE(prompt_kv_equal(decode.pool.data(), prefill.pool()));
  // The whole pool, not only the prompt's bytes: what the direct path leaves (whole blocks
  // put, nothing else touched).
  Decode reference(0, Path{transports, false});
  ExportingPrefillNode direct_prefill(Path{transports, false});
  ASSERT_TRUE(reference.start(direct_prefill.url()).ok());
  ASSERT_TRUE(reference.wait_for(KvEventKind::kImportReady, milliseconds(15'000)));
  EXPECT_TRUE(decode.pool == reference.pool)
      << "the staged path's pool differs from the direct one's";
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(2000)));
  EXPECT_LT(decode.index_of(KvEventKind::kImportReady, "req-1"),
            decode.index_of(KvEventKind::kImportReleased, "req-1"));
}

INSTANTIATE_TEST_SUITE_P(
    Staging, UcxKvConnectorPaths,
    ::testing::Combine(::testing::Values("tcp", "sm,self"), ::testing::Bool(), ::testing::Bool()),
    [](const auto& param_info) {
      return std::string(std::get<0>(param_info.param) == "tcp" ? "tcp" : "shm") +
             (std::get<1>(param_info.param) ? "_StagedPrefill" : "_DirectPrefill") +
             (std::get<2>(param_info.param) ? "_StagedDecode" : "_DirectDecode");
    });

TEST(UcxKvConnectorIntegrity, ACorruptedBlockFailsTheImportWithDataLossAndFreesItAtOnce) {
  ExportingPrefillNode prefill;
  Decode decode(/*test_corrupt_every=*/2);  // the prompt's second block
  ASSERT_TRUE(decode.connector);
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportFailed, milliseconds(10'000)));
  const KvEvent* failed = decode.find(KvEventKind::kImportFailed);
  EXPECT_EQ(failed->status.code(), StatusCode::kDataLoss) << failed->status.to_string();
  EXPECT_NE(failed->status.message().find("1 of 2"), std::string::npos) << failed->status.message();
  EXPECT_EQ(decode.find(KvEventKind::kImportReady), nullptr);
  EXPECT_FALSE(prompt_kv_equal(decode.pool.data(), prefill.pool()));
  // The completion message came before the checksums: no put can land any more.
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(500)));
}

TEST(UcxKvConnectorIntegrity, WithChecksumsOffNoneAreAskedForAndTheImportIsReady) {
  ExportingPrefillNode prefill;
  Decode decode;
  ASSERT_TRUE(decode.connector);
  decode.connector->set_kv_checksum(false);
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReady, milliseconds(10'000)));
  EXPECT_FALSE(prefill.asked_for_checksums());
  EXPECT_TRUE(prompt_kv_equal(decode.pool.data(), prefill.pool()));
}

// A socket that reads one request and hangs up without answering (a prefill node that died
// after the work reached it).
class HangUpAfterTheWork {
 public:
  HangUpAfterTheWork() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      const int connection = ::accept(listener_, nullptr, nullptr);
      if (connection < 0) return;
      std::string request;
      char buffer[4096];
      for (;;) {
        const ssize_t n = ::read(connection, buffer, sizeof buffer);
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
        const size_t head_end = request.find("\r\n\r\n");
        const size_t length_at = request.find("Content-Length: ");
        if (head_end != std::string::npos && length_at != std::string::npos &&
            request.size() >= head_end + 4 + std::stoul(request.substr(length_at + 16))) {
          break;
        }
      }
      got_work_ = request.find("prompt_token_ids") != std::string::npos;
      ::close(connection);
    });
  }
  ~HangUpAfterTheWork() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  bool got_work() const { return got_work_; }

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> got_work_{false};
  std::thread thread_;
};

TEST(UcxKvConnectorImport, ACallThatFailsAfterTheWorkWentOutHoldsTheBlocks) {
  HangUpAfterTheWork prefill;
  Decode decode;
  ASSERT_TRUE(decode.connector);
  const auto started = Clock::now();
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportFailed, milliseconds(5000)));
  EXPECT_TRUE(prefill.got_work());
  EXPECT_EQ(decode.find(KvEventKind::kImportReleased), nullptr)
      << "released at once although the prefill node may be writing into the blocks";
  // Held for the transfer timeout plus grace after the failure, then released.
  EXPECT_FALSE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(1500)));
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(3000)));
  EXPECT_GE(Clock::now() - started, kTransferTimeout + kGrace);
}

TEST(UcxKvConnectorImport, ARefusedConnectionFreesTheBlocksAtOnce) {
  // A port with nothing listening: bind one, note it, close it.
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(probe);
  Decode decode;
  ASSERT_TRUE(decode.connector);
  const auto started = Clock::now();
  ASSERT_TRUE(decode.start("http://127.0.0.1:" + std::to_string(ntohs(address.sin_port))).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(5000)));
  EXPECT_LT(Clock::now() - started, milliseconds(1000));
  ASSERT_NE(decode.find(KvEventKind::kImportFailed), nullptr);
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed)->status.code(), StatusCode::kUnavailable);
}

TEST(UcxKvConnectorStaged, ACorruptedLandingFailsWithDataLossLeavesThePoolAndFreesItsBlocks) {
  ExportingPrefillNode prefill(Path{"tcp", true});
  Decode decode(/*test_corrupt_every=*/2, Path{"tcp", true, /*landing_blocks=*/2});
  ASSERT_TRUE(decode.connector);
  EXPECT_EQ(decode.connector->landing_blocks(), 2);
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportFailed, milliseconds(10'000)));
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed)->status.code(), StatusCode::kDataLoss)
      << decode.find(KvEventKind::kImportFailed)->status.to_string();
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(500)));
  EXPECT_EQ(decode.find(KvEventKind::kImportReady), nullptr);
  EXPECT_TRUE(std::all_of(decode.pool.begin(), decode.pool.end(), [](float v) { return v == 0; }))
      << "corrupted KV was copied into the pool";
  // Its landing blocks are free again: the next import (every landing block) lands. Its
  // prompt's second block is the fourth landed one, corrupted too... so check only that it
  // got its blocks and an answer.
  ASSERT_TRUE(decode.start(prefill.url(), "req-2", {6, 7}).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken, "req-2", milliseconds(10'000)));
}

TEST(UcxKvConnectorStaged, AnImportLargerThanTheLandingAreaIsRefusedAtOnceForALocalPrefill) {
  HangUpAfterTheWork prefill;
  Decode decode(0, Path{"tcp", true, /*landing_blocks=*/1});
  ASSERT_TRUE(decode.connector);
  const auto started = Clock::now();
  ASSERT_TRUE(decode.start(prefill.url()).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, milliseconds(2000)));
  EXPECT_LT(Clock::now() - started, milliseconds(500));
  const KvEvent* failed = decode.find(KvEventKind::kImportFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->status.code(), StatusCode::kResourceExhausted) << failed->status.to_string();
  EXPECT_NE(failed->status.message().find("--kv-staging-mib"), std::string::npos);
  EXPECT_LT(decode.index_of(KvEventKind::kImportFailed, "req-1"),
            decode.index_of(KvEventKind::kImportReleased, "req-1"));
  EXPECT_FALSE(prefill.got_work()) << "no prefill node is asked for KV that cannot land";
}

TEST(UcxKvConnectorStaged, ImportsWaitForLandingBlocksFirstComeFirstServed) {
  ExportingPrefillNode prefill(Path{"tcp", true});
  Decode decode(0, Path{"tcp", true, /*landing_blocks=*/2});
  ASSERT_TRUE(decode.connector);
  ASSERT_TRUE(decode.start(prefill.url(), "req-1", {3, 5}).ok());
  ASSERT_TRUE(decode.start(prefill.url(), "req-2", {6, 7}).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReady, "req-2", milliseconds(15'000)));
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, "req-2", milliseconds(2000)));
  // req-2 was sent to the prefill node only once req-1 had given its landing blocks back.
  EXPECT_LT(decode.index_of(KvEventKind::kImportReleased, "req-1"),
            decode.index_of(KvEventKind::kFirstToken, "req-2"));
  EXPECT_EQ(decode.index_of(KvEventKind::kImportFailed, "req-1"), -1);
  EXPECT_EQ(decode.index_of(KvEventKind::kImportFailed, "req-2"), -1);
  EXPECT_TRUE(prompt_kv_equal(decode.pool.data(), prefill.pool()));
  // req-2's blocks hold the same prompt KV as req-1's.
  const KvLayout layout = test_layout();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (bool value_half : {false, true}) {
      const auto* base = reinterpret_cast<const std::byte*>(decode.pool.data());
      EXPECT_EQ(std::memcmp(base + layout.offset(layer, 3, value_half),
                            base + layout.offset(layer, 6, value_half), layout.layer_block_bytes()),
                0);
    }
  }
}

TEST(UcxKvConnectorStaged, AWaitingImportFailsAtTheTransferTimeoutAndCanBeCancelled) {
  HangUpAfterTheWork prefill;  // holds req-1's landing blocks until deadline + grace
  Decode decode(0, Path{"tcp", true, /*landing_blocks=*/2});
  ASSERT_TRUE(decode.connector);
  const auto started = Clock::now();
  ASSERT_TRUE(decode.start(prefill.url(), "req-1", {3, 5}).ok());
  ASSERT_TRUE(decode.start(prefill.url(), "req-2", {6, 7}).ok());
  ASSERT_TRUE(decode.start(prefill.url(), "req-3", {1, 2}).ok());
  decode.connector->cancel_import("req-3");
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, "req-3", milliseconds(500)));
  const int cancelled_at = decode.index_of(KvEventKind::kImportFailed, "req-3");
  ASSERT_GE(cancelled_at, 0);
  EXPECT_EQ(decode.events[static_cast<size_t>(cancelled_at)].status.code(), StatusCode::kCancelled);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased, "req-2", milliseconds(5000)));
  const auto waited = Clock::now() - started;
  const int failed = decode.index_of(KvEventKind::kImportFailed, "req-2");
  ASSERT_GE(failed, 0);
  EXPECT_EQ(decode.events[static_cast<size_t>(failed)].status.code(),
            StatusCode::kResourceExhausted);
  EXPECT_GE(waited, kTransferTimeout);
  EXPECT_LT(waited, kTransferTimeout + milliseconds(450)) << "the wait has its own deadline";
  EXPECT_EQ(decode.index_of(KvEventKind::kImportReleased, "req-1"), -1)
      << "req-1 still holds its blocks (its prefill node may be writing)";
}

}  // namespace
}  // namespace pdserve::kv_transfer
