// The decode side of UcxKvConnector over real UCX. Against a bare socket that takes the work
// and hangs up: when are a request's reserved blocks released (kImportReleased)? Issue #15
// item 7: a call that fails after the work went out must hold them (the prefill node may be
// writing), and only a refused connection frees them at once. (The HTTP exchange alone, e.g.
// a cancelled import, is remote_prefill_client_test.cpp's.) KV integrity: against a
// prefill node with a real exporting connector, the blocks that land are verified against the
// export's checksums before the import is ready; a corrupted landing fails with DataLoss and
// frees the blocks at once.
#include "kv_transfer/ucx_kv_connector.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "common/http/http_server.h"
#include "common/http/router.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kTransferTimeout = milliseconds(1500);
constexpr auto kGrace = milliseconds(500);

KvLayout test_layout() {
  return KvLayout{2, 8, 16, 1, 4, DType::kF32};
}

struct Decode {
  std::vector<float> pool;
  std::unique_ptr<UcxKvConnector> connector;
  std::vector<KvEvent> events;

  explicit Decode(int test_corrupt_every = 0) {
    const KvLayout layout = test_layout();
    pool.assign(layout.offset(0, 0, true) * 2 / sizeof(float), 0.0f);
    UcxKvConnectorOptions options;
    options.transports = "tcp";
    options.transfer_timeout = kTransferTimeout;
    options.release_grace = kGrace;
    options.test_corrupt_every = test_corrupt_every;
    auto created =
        UcxKvConnector::create(options, pool.data(), pool.size() * sizeof(float), layout);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (created.ok()) connector = std::move(*created);
    if (connector) connector->set_wakeup([] {});
  }

  Status start(const std::string& url) {
    InferenceRequest request;
    request.id = "req-1";
    request.prompt_tokens.assign(20, 7);  // two blocks
    request.sampling.max_tokens = 4;
    request.kv_import = KvImportSource{{url}, milliseconds(60'000), ""};
    const std::vector<int32_t> blocks = {3, 5};
    return connector->start_import(request, blocks, 0);
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

  ExportingPrefillNode() {
    const KvLayout layout = test_layout();
    pool_.resize(layout.offset(0, 0, true) * 2 / sizeof(float));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    for (float& v : pool_) v = value(rng);
    UcxKvConnectorOptions options;
    options.transports = "tcp";
    auto created =
        UcxKvConnector::create(options, pool_.data(), pool_.size() * sizeof(float), layout);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (!created.ok()) return;
    exporter_ = std::move(*created);
    exporter_->set_wakeup([] {});
    http::Router router;
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

}  // namespace
}  // namespace pdserve::kv_transfer
