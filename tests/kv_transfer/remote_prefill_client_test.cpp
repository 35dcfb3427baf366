// RemotePrefillClient without UCX: scripted prefill nodes (HTTP servers that answer the work
// as told) and a fake transport (the test reports completion messages with landed(tag) and
// says what checksums the landed blocks have). Each test walks one path of the exchange and
// checks what the engine is told (kFirstToken, kImportReady, kImportFailed) and when the
// blocks are freed (kImportReleased).
#include "kv_transfer/remote_prefill_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/http/http_server.h"
#include "common/http/route_table.h"
#include "common/protocol/prefill_protocol.h"

namespace pdserve::kv_transfer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::vector<uint64_t> kSentChecksums = {11, 22};
constexpr auto kTransferTimeout = milliseconds(1500);
constexpr auto kGrace = milliseconds(500);

// How a scripted prefill node answers each work.
struct Script {
  int status = 200;             // a refusal when not 200
  bool first_token = true;      // stream a first token (42); false: still prefilling
  bool send_kv = true;          // then kv_sent, carrying kSentChecksums, and the stream's end
  bool cancel_endpoint = true;  // false plays a prefill node without it (404)
  bool cancel_ends_stream = true;  // a cancel ends the work's stream with an error event
  // The cancel's answer: an older prefill node's (unsettled), or a settled one.
  std::string cancel_answer = "{\"found\":true}";
};

// A prefill node that answers each work as scripted. A cancel ends the work's stream with an
// error event, as prefill_server does.
class ScriptedPrefillNode {
 public:
  explicit ScriptedPrefillNode(Script script = {}) {
    http::RouteTable router;
    router.add("POST", "/internal/v1/prefill",
               [this, script](const http::HttpRequest& request,
                              std::shared_ptr<http::ResponseChannel> ch) {
                 Result<PrefillWork> work = parse_prefill_work(request.body);
                 EXPECT_TRUE(work.ok()) << work.status().to_string();
                 {
                   std::lock_guard lock(mutex_);
                   if (work.ok()) works_.push_back(*work);
                   stream_ = ch;
                   changed_.notify_all();
                 }
                 if (script.status != 200) {
                   ch->send({script.status, "application/json", {}, "{\"error\":\"busy\"}"});
                   return;
                 }
                 ch->start_stream(200, "application/x-ndjson", {});
                 ch->on_cancel([this] {
                   std::lock_guard lock(mutex_);
                   stream_closed_ = true;
                   changed_.notify_all();
                 });
                 if (!script.first_token) return;
                 PrefillEvent first;
                 first.kind = PrefillEvent::Kind::kFirstToken;
                 first.token = 42;
                 ch->write(prefill_event_line(first));
                 if (!script.send_kv) return;
                 PrefillEvent sent;
                 sent.kind = PrefillEvent::Kind::kKvSent;
                 sent.blocks = 2;
                 sent.block_checksums = kSentChecksums;
                 ch->write(prefill_event_line(sent));
                 ch->end_stream();
               });
    if (script.cancel_endpoint) {
      router.add(
          "POST", "/internal/v1/prefill/cancel",
          [this, script](const http::HttpRequest& request,
                         std::shared_ptr<http::ResponseChannel> ch) {
            std::shared_ptr<http::ResponseChannel> stream;
            {
              std::lock_guard lock(mutex_);
              cancels_.push_back(request.body);
              if (script.cancel_ends_stream) stream = std::move(stream_);
            }
            if (stream) {
              PrefillEvent event;
              event.kind = PrefillEvent::Kind::kError;
              event.error = "aborted: cancelled by the decode node";
              stream->write(prefill_event_line(event));
              stream->end_stream();
            }
            ch->send({200, "application/json", {}, script.cancel_answer});
          });
    }
    auto server = http::HttpServer::start({}, std::move(router));
    EXPECT_TRUE(server.ok()) << server.status().to_string();
    if (server.ok()) server_ = std::move(*server);
  }
  ~ScriptedPrefillNode() {
    {
      std::lock_guard lock(mutex_);
      stream_.reset();
    }
    if (server_) server_->stop();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<PrefillWork> works() {
    std::lock_guard lock(mutex_);
    return works_;
  }
  // Waits (up to 5 s) until `n` works have arrived.
  bool wait_for_works(size_t n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, milliseconds(5000), [&] { return works_.size() >= n; });
  }
  std::vector<std::string> cancels() {
    std::lock_guard lock(mutex_);
    return cancels_;
  }
  // Waits (up to 5 s) until the decode side has closed the work's call.
  bool wait_for_stream_closed() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, milliseconds(5000), [&] { return stream_closed_; });
  }

 private:
  bool stream_closed_ = false;
  std::condition_variable changed_;
  std::mutex mutex_;
  std::vector<PrefillWork> works_;
  std::vector<std::string> cancels_;
  std::shared_ptr<http::ResponseChannel> stream_;
  std::unique_ptr<http::HttpServer> server_;
};

// The decode side: a client whose landed blocks checksum as `landed_checksums` says (the
// test's stand-in for the pool), one import of a two-block prompt into blocks {3, 5}.
struct Decode {
  std::mutex mutex;
  std::vector<std::vector<uint64_t>> landed_answers;  // one per verification, then kSent
  int verifications = 0;
  std::condition_variable head_arrived;
  bool head_applied = false;  // the client's test hook saw the work's response head
  std::unique_ptr<RemotePrefillClient> client;
  std::vector<KvEvent> events;

  explicit Decode(bool verify = true) {
    RemotePrefillOptions options;
    options.transfer_timeout = kTransferTimeout;
    options.release_grace = kGrace;
    options.verify_checksums = verify;
    options.test_after_head = [this](const std::string&) {
      std::lock_guard lock(mutex);
      head_applied = true;
      head_arrived.notify_all();
    };
    auto created = RemotePrefillClient::create(
        options, {"descriptor", KvLayout{2, 8, 16, 1, 4, DType::kF32}},
        [this](std::span<const int32_t> blocks, int first_block, int num_prompt_tokens) {
          EXPECT_EQ(std::vector<int32_t>(blocks.begin(), blocks.end()),
                    (std::vector<int32_t>{3, 5}));
          EXPECT_EQ(first_block, 0);
          EXPECT_EQ(num_prompt_tokens, 20);
          std::lock_guard lock(mutex);
          const size_t i = static_cast<size_t>(verifications++);
          return i < landed_answers.size() ? landed_answers[i] : kSentChecksums;
        });
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (created.ok()) client = std::move(*created);
    if (client) client->set_wakeup([] {});
  }

  Status start(std::vector<std::string> urls) {
    InferenceRequest request;
    request.id = "req-1";
    request.prompt_tokens.assign(20, 7);  // two blocks
    request.sampling.max_tokens = 4;
    request.kv_import = KvImportSource{std::move(urls), milliseconds(60'000), ""};
    const std::vector<int32_t> blocks = {3, 5};
    return client->start(request, blocks, 0);
  }

  // Polls until `done` holds for the events so far or `limit` passes. poll() is how the engine
  // takes the client's events, on its own steps, and it enforces the hold deadlines itself:
  // there is no event to wait on, so the test polls as the engine does.
  template <typename Pred>
  bool poll_until(Pred done, milliseconds limit = milliseconds(5000)) {
    const auto give_up = Clock::now() + limit;
    for (;;) {
      for (KvEvent& event : client->poll()) events.push_back(std::move(event));
      if (done()) return true;
      if (Clock::now() > give_up) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  // Until the work's response head has reached the client (the import is kPrefilling).
  bool wait_for_head() {
    std::unique_lock lock(mutex);
    return head_arrived.wait_for(lock, milliseconds(5000), [&] { return head_applied; });
  }
  bool wait_for(KvEventKind kind) {
    return poll_until([&] { return count(kind) > 0; });
  }
  int count(KvEventKind kind) const {
    int n = 0;
    for (const KvEvent& event : events) n += event.kind == kind;
    return n;
  }
  const KvEvent* find(KvEventKind kind) const {
    for (const KvEvent& event : events) {
      if (event.kind == kind) return &event;
    }
    return nullptr;
  }
};

// Waits until `node` has received `n` works; returns the last one's transfer tag.
uint64_t wait_for_work(ScriptedPrefillNode& node, size_t n = 1) {
  node.wait_for_works(n);
  const std::vector<PrefillWork> works = node.works();
  EXPECT_EQ(works.size(), n);
  return works.empty() ? 0 : works.back().transfer_tag;
}

TEST(RemotePrefillClient, FirstTokenAtOnceThenReadyOnceTheKvLandedAndVerified) {
  ScriptedPrefillNode node;
  Decode decode;
  ASSERT_TRUE(decode.start({node.url()}).ok());
  const uint64_t tag = wait_for_work(node);
  const PrefillWork work = node.works().front();
  EXPECT_EQ(work.kv_descriptor, "descriptor");
  EXPECT_EQ(work.kv_num_blocks, 8);
  EXPECT_EQ(work.block_ids, (std::vector<int32_t>{3, 5}));
  EXPECT_TRUE(work.kv_checksum);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
  EXPECT_EQ(decode.find(KvEventKind::kFirstToken)->result->first_token, 42);
  // kv_sent is here, the completion message is not: no put has been proven to land.
  EXPECT_FALSE(decode.poll_until([&] { return decode.count(KvEventKind::kImportReady) > 0; },
                                 milliseconds(200)));
  EXPECT_EQ(decode.verifications, 0);
  decode.client->landed(tag);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  EXPECT_EQ(decode.verifications, 1);
  ASSERT_NE(decode.find(KvEventKind::kImportReady), nullptr);
  EXPECT_EQ(decode.find(KvEventKind::kImportReady)->stats->prefill_url, node.url());
  EXPECT_EQ(decode.find(KvEventKind::kImportReady)->stats->checksum_mismatches, 0);
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed), nullptr);
}

TEST(RemotePrefillClient, MismatchedKvIsFetchedAgainFromTheNextNodeUnderANewTag) {
  ScriptedPrefillNode first;
  ScriptedPrefillNode second;
  Decode decode;
  decode.landed_answers = {{11, 23}};  // the first landing's second block differs
  ASSERT_TRUE(decode.start({first.url(), second.url()}).ok());
  const uint64_t first_tag = wait_for_work(first);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
  decode.client->landed(first_tag);
  // The engine's poll verifies the landing, then posts the work to the next node.
  ASSERT_TRUE(decode.poll_until([&] { return !second.works().empty(); }));
  const uint64_t second_tag = wait_for_work(second);
  EXPECT_NE(second_tag, first_tag);
  EXPECT_EQ(second.works().front().block_ids, (std::vector<int32_t>{3, 5}))
      << "the next node rewrites the same blocks";
  // A late message under the old tag proves nothing about the new transfer.
  decode.client->landed(first_tag);
  EXPECT_FALSE(decode.poll_until([&] { return decode.count(KvEventKind::kImportReady) > 0; },
                                 milliseconds(300)));
  decode.client->landed(second_tag);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  EXPECT_EQ(decode.count(KvEventKind::kFirstToken), 1) << "the engine keeps its first token";
  const KvEvent* ready = decode.find(KvEventKind::kImportReady);
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(ready->stats->prefill_url, second.url());
  EXPECT_EQ(ready->stats->checksum_mismatches, 1);
  EXPECT_EQ(ready->stats->refetches, 1);
  EXPECT_EQ(decode.find(KvEventKind::kImportFailed), nullptr);
}

TEST(RemotePrefillClient, MismatchedKvFromTheLastNodeFailsWithDataLossAndFreesTheBlocks) {
  ScriptedPrefillNode only;
  Decode decode;
  decode.landed_answers = {{0, 22}};
  ASSERT_TRUE(decode.start({only.url()}).ok());
  const uint64_t tag = wait_for_work(only);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
  decode.client->landed(tag);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  const KvEvent* failed = decode.find(KvEventKind::kImportFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->status.code(), StatusCode::kDataLoss);
  ASSERT_TRUE(failed->stats.has_value());
  EXPECT_EQ(failed->stats->checksum_mismatches, 1);
  EXPECT_EQ(failed->stats->refetches, 0);
  EXPECT_EQ(decode.find(KvEventKind::kImportReady), nullptr);
}

TEST(RemotePrefillClient, ARefusingNodePassesTheWorkToTheNextOne) {
  ScriptedPrefillNode busy({.status = 503});
  ScriptedPrefillNode idle;
  Decode decode;
  ASSERT_TRUE(decode.start({busy.url(), idle.url()}).ok());
  wait_for_work(busy);
  const uint64_t tag = wait_for_work(idle);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
  EXPECT_EQ(decode.find(KvEventKind::kFirstToken)->result->stats.prefill_url, idle.url());
  decode.client->landed(tag);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  EXPECT_NE(decode.find(KvEventKind::kImportReady), nullptr);
}

TEST(RemotePrefillClient, EveryNodeRefusingFailsTheImportAndFreesTheBlocksAtOnce) {
  ScriptedPrefillNode busy({.status = 503});
  ScriptedPrefillNode full({.status = 429});
  Decode decode;
  ASSERT_TRUE(decode.start({busy.url(), full.url()}).ok());
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  const KvEvent* failed = decode.find(KvEventKind::kImportFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_NE(failed->status.message().find("429"), std::string::npos) << failed->status.message();
  EXPECT_EQ(decode.count(KvEventKind::kFirstToken), 0);
}

// Issue #15 item 6: a client that leaves before its KV lands must not hold its blocks for the
// transfer timeout plus grace: the prefill node is told, and its answer frees them. Before or
// after the first token.
TEST(RemotePrefillClient, ACancelAsksThePrefillNodeAndItsAnswerFreesTheBlocks) {
  for (const bool first_token : {false, true}) {
    SCOPED_TRACE(first_token ? "after the first token" : "before the first token");
    ScriptedPrefillNode node({.first_token = first_token, .send_kv = false});
    Decode decode;
    ASSERT_TRUE(decode.start({node.url()}).ok());
    const uint64_t tag = wait_for_work(node);
    if (first_token) {
      ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
    } else {
      ASSERT_TRUE(decode.wait_for_head());
    }
    const auto cancelled_at = Clock::now();
    decode.client->cancel("req-1");
    ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
    EXPECT_LT(Clock::now() - cancelled_at, milliseconds(1000))
        << "freed on the prefill node's answer, not at the hold deadline";
    const KvEvent* failed = decode.find(KvEventKind::kImportFailed);
    ASSERT_NE(failed, nullptr);
    EXPECT_EQ(failed->status.code(), StatusCode::kCancelled);
    const std::vector<std::string> cancels = node.cancels();
    ASSERT_EQ(cancels.size(), 1u);
    Result<PrefillCancel> cancel = parse_prefill_cancel(cancels[0]);
    ASSERT_TRUE(cancel.ok()) << cancel.status().to_string();
    EXPECT_EQ(cancel->request_id, "req-1");
    EXPECT_EQ(cancel->transfer_tag, tag);
  }
}

// A prefill node without the cancel endpoint (an older version) or one the cancel call cannot
// reach: the client closes the work's call instead (the prefill node then aborts the work when
// it sees its client leave) and, with nothing to confirm it, holds the blocks until the
// transfer timeout plus grace.
TEST(RemotePrefillClient, WithoutTheCancelEndpointTheCallIsClosedAndTheBlocksHeld) {
  ScriptedPrefillNode node({.first_token = false, .cancel_endpoint = false});
  Decode decode;
  ASSERT_TRUE(decode.start({node.url()}).ok());
  wait_for_work(node);
  ASSERT_TRUE(decode.wait_for_head());
  const auto cancelled_at = Clock::now();
  decode.client->cancel("req-1");
  // The cancel call found no endpoint, and the client closed the work's call instead: nothing
  // confirms, so the blocks stay held (checked at their release: not before the deadline).
  ASSERT_TRUE(node.wait_for_stream_closed()) << "the prefill node was not told";
  EXPECT_FALSE(decode.poll_until([&] { return decode.count(KvEventKind::kImportReleased) > 0; },
                                 milliseconds(0)));
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  EXPECT_GE(Clock::now() - cancelled_at, kTransferTimeout + kGrace);
  // Told apart from a confirmed release (logged, counted by the engine).
  const KvEvent* released = decode.find(KvEventKind::kImportReleased);
  EXPECT_EQ(released->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(released->status.message().find("2 KV blocks"), std::string::npos)
      << released->status.message();
  EXPECT_NE(released->status.message().find("was cancelled"), std::string::npos)
      << released->status.message();
}

// Issue #34 item 3: the prefill node answers a cancel only once no put of the work can land
// (settled); that answer alone frees the blocks, as the work's stream may be closed already
// (a cancel that raced the work's send: PrefillCancelTest.AnImportGivenUpWhileItsWorkGoesOut*).
// An older node's answer (unsettled) is no confirmation: its stream must confirm, or the hold
// deadline frees the blocks.
TEST(RemotePrefillClient, ASettledCancelAnswerFreesTheBlocksWithoutTheWorksStream) {
  for (const bool settled : {true, false}) {
    SCOPED_TRACE(settled ? "settled" : "an older node's answer");
    ScriptedPrefillNode node(
        {.first_token = true,
         .send_kv = false,
         .cancel_ends_stream = false,
         .cancel_answer = settled ? "{\"found\":true,\"settled\":true}" : "{\"found\":true}"});
    Decode decode;
    ASSERT_TRUE(decode.start({node.url()}).ok());
    wait_for_work(node);
    ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
    const auto cancelled_at = Clock::now();
    decode.client->cancel("req-1");
    ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
    const KvEvent* released = decode.find(KvEventKind::kImportReleased);
    if (settled) {
      EXPECT_LT(Clock::now() - cancelled_at, kTransferTimeout + kGrace) << "held to the deadline";
      EXPECT_TRUE(released->status.ok()) << released->status.to_string();
    } else {
      EXPECT_GE(Clock::now() - cancelled_at, kTransferTimeout + kGrace);
      EXPECT_EQ(released->status.code(), StatusCode::kDeadlineExceeded);
    }
    EXPECT_EQ(node.cancels().size(), 1u);
  }
}

TEST(RemotePrefillClient, WithChecksumsOffNoneAreAskedForOrVerified) {
  ScriptedPrefillNode node;
  Decode decode(/*verify=*/false);
  ASSERT_TRUE(decode.start({node.url()}).ok());
  const uint64_t tag = wait_for_work(node);
  EXPECT_FALSE(node.works().front().kv_checksum);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kFirstToken));
  decode.client->landed(tag);
  ASSERT_TRUE(decode.wait_for(KvEventKind::kImportReleased));
  EXPECT_NE(decode.find(KvEventKind::kImportReady), nullptr);
  EXPECT_EQ(decode.verifications, 0);
}

}  // namespace
}  // namespace pdserve::kv_transfer
