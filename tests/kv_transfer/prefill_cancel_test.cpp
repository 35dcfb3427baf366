// The prefill node's side of a cancel (issue #15 item 6): POST /internal/v1/prefill/cancel
// aborts that work only and the answer comes on the work's own stream; a cancel that beats
// its work makes the node refuse the work when it arrives. The cancel itself is answered once
// no put of the work can land (issue #34 item 3), which also frees the blocks of a decode node
// whose work call was closed while the work went out (RemotePrefillClient against this node).
// The engine is a fake.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "common/cluster/cluster_auth.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/protocol/prefill_protocol.h"
#include "kv_transfer/remote_prefill_client.h"
#include "prefill_node/prefill_server.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const KvBlockLayout kLayout{1, 16, 1, 4, "float32"};
constexpr char kToken[] = "cluster-secret";

// Holds submitted requests; abort() ends one with the engine's cancelled error delta.
class FakeService : public InferenceService {
 public:
  Status submit(InferenceRequest request, DeltaSink sink) override {
    if (during_submit) during_submit();
    std::lock_guard lock(mutex_);
    if (request.kv_export) exports_.emplace(request.id, *request.kv_export);
    sinks_.emplace(request.id, std::move(sink));
    ++submissions_;
    changed_.notify_all();
    return Status::ok_status();
  }
  // A fault hook: runs inside submit(), while the prefill server admits the work.
  std::function<void()> during_submit;
  void abort(const std::string& request_id) override {
    DeltaSink sink;
    {
      std::lock_guard lock(mutex_);
      aborted_.push_back(request_id);
      changed_.notify_all();
      auto it = sinks_.find(request_id);
      if (it == sinks_.end()) return;
      sink = std::move(it->second);
      sinks_.erase(it);
    }
    SequenceDelta delta;
    delta.request_id = request_id;
    delta.finished = true;
    delta.error = cancelled("request '" + request_id + "' was aborted");
    sink(std::move(delta));
  }
  // What the engine does when a forward fails after the export started: the connector
  // cancels the export (its report comes later) and the request ends with an error.
  void fail_after_export_started(const std::string& request_id) {
    DeltaSink sink;
    {
      std::lock_guard lock(mutex_);
      if (const auto& started = exports_.at(request_id).on_started) started();
      sink = std::move(sinks_.at(request_id));
      sinks_.erase(request_id);
    }
    SequenceDelta delta;
    delta.request_id = request_id;
    delta.finished = true;
    delta.error = internal_error("the forward failed");
    sink(std::move(delta));
  }
  void finish_export(const std::string& request_id, const Status& status) {
    KvExportTarget target;
    {
      std::lock_guard lock(mutex_);
      target = exports_.at(request_id);
    }
    KvTransferReport report;
    report.status = status;
    target.on_finished(report);
  }

  ServiceStats stats() const override { return {}; }
  const ModelInfo& model_info() const override { return info_; }

  bool wait_for_requests(size_t n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, milliseconds(5000), [&] { return sinks_.size() >= n; });
  }
  // `n` requests were submitted (aborted or not).
  bool wait_for_submissions(size_t n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, milliseconds(5000), [&] { return submissions_ >= n; });
  }
  bool wait_for_aborts(size_t n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, milliseconds(5000), [&] { return aborted_.size() >= n; });
  }
  // Starts the export of a submitted request, as the engine does before the last chunk.
  void start_export(const std::string& request_id) {
    std::function<void()> started;
    {
      std::lock_guard lock(mutex_);
      started = exports_.at(request_id).on_started;
    }
    if (started) started();
  }
  std::vector<std::string> submitted() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> ids;
    for (const auto& [id, sink] : sinks_) ids.push_back(id);
    return ids;
  }
  std::vector<std::string> aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, DeltaSink> sinks_;
  std::map<std::string, KvExportTarget> exports_;
  std::vector<std::string> aborted_;
  size_t submissions_ = 0;
  ModelInfo info_;
};

// A cancel's answer, compared as a whole.
struct Answer {
  bool found = false;
  bool settled = false;
  bool operator==(const Answer&) const = default;
};
void PrintTo(const Answer& answer, std::ostream* out) {
  *out << "{found " << answer.found << ", settled " << answer.settled << "}";
}
Answer answer_of(const http::ClientResponse& response) {
  EXPECT_EQ(response.status, 200) << response.body;
  Result<PrefillCancelAnswer> parsed = parse_prefill_cancel_answer(response.body);
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string() << ": " << response.body;
  return parsed.ok() ? Answer{parsed->found, parsed->settled} : Answer{};
}

// One work's exchange as the decode node sees it.
struct WorkCall {
  std::mutex mutex;
  std::condition_variable changed;
  int status = 0;
  std::string body;
  std::optional<Status> done;

  bool wait_done() {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, milliseconds(5000), [&] { return done.has_value(); });
  }
  bool wait_head() {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, milliseconds(5000), [&] { return status != 0; });
  }
};

// What the prefill server's test hook saw: each handled engine delta, and whether the work's
// stream had ended after it.
class HandledDeltas {
 public:
  void record(const std::string& engine_request_id, bool ended) {
    std::lock_guard lock(mutex_);
    handled_.emplace_back(engine_request_id, ended);
    changed_.notify_all();
  }
  // Whether the stream had ended after the first handled delta of `engine_request_id`; nullopt
  // when none was handled within 5 s.
  std::optional<bool> wait_first(const std::string& engine_request_id) {
    std::unique_lock lock(mutex_);
    std::optional<bool> ended;
    changed_.wait_for(lock, milliseconds(5000), [&] {
      for (const auto& [id, stream_ended] : handled_) {
        if (id == engine_request_id) ended = stream_ended;
      }
      return ended.has_value();
    });
    return ended;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<std::string, bool>> handled_;
};

class PrefillCancelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Any KV peer: the fake service exports nothing over UCX.
    prefill_ = std::make_unique<PrefillServer>(service_, kLayout, kToken, [] { return false; },
                                               nullptr);
    prefill_->set_test_after_delta([this](const std::string& engine_request_id, bool ended) {
      handled_.record(engine_request_id, ended);
    });
    http::RouteTable router;
    prefill_->register_routes(router);
    auto server = http::HttpServer::start({}, std::move(router));
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    url_ = {"127.0.0.1", std::to_string(server_->port())};
    auto client = http::HttpClient::create(2);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->stop();
  }

  http::ClientRequest post(std::string target, std::string body, bool token = true) {
    http::ClientRequest request;
    request.method = "POST";
    request.target = std::move(target);
    request.body = std::move(body);
    if (token) request.headers.emplace_back("Authorization", cluster_auth_header_value(kToken));
    request.timeout = std::chrono::seconds(5);
    return request;
  }

  std::shared_ptr<WorkCall> send_work(const std::string& request_id, uint64_t tag) {
    PrefillWork work;
    work.request_id = request_id;
    work.transfer_tag = tag;
    work.prompt_token_ids = {1, 2, 3};
    work.sampling.max_tokens = 4;
    work.kv_descriptor = "AAAA";
    work.kv_num_blocks = 8;
    work.kv_layout = kLayout;
    work.block_ids = {5};
    work.timeout_ms = 1000;
    auto call = std::make_shared<WorkCall>();
    http::StreamCallbacks callbacks;
    callbacks.on_head = [call](int status, const http::HeaderList&) {
      std::lock_guard lock(call->mutex);
      call->status = status;
      call->changed.notify_all();
    };
    callbacks.on_body = [call](std::string_view bytes) {
      std::lock_guard lock(call->mutex);
      call->body.append(bytes);
    };
    callbacks.on_done = [call](const Status& outcome) {
      std::lock_guard lock(call->mutex);
      call->done = outcome;
      call->changed.notify_all();
    };
    calls_.push_back(client_->stream(
        url_, post("/internal/v1/prefill", prefill_work_to_json(work).dump()),
        std::move(callbacks)));
    return call;
  }

  Result<http::ClientResponse> cancel(const std::string& request_id, uint64_t tag,
                                      bool token = true) {
    return client_->fetch_and_wait(
        url_, post("/internal/v1/prefill/cancel",
                   prefill_cancel_to_json({request_id, tag}).dump(), token));
  }

  FakeService service_;
  HandledDeltas handled_;
  std::unique_ptr<PrefillServer> prefill_;
  std::unique_ptr<http::HttpServer> server_;
  std::unique_ptr<http::HttpClient> client_;
  std::vector<std::shared_ptr<http::ClientCall>> calls_;
  http::BaseUrl url_;
};

TEST_F(PrefillCancelTest, ACancelAbortsThatWorkOnlyAndTheAnswerComesOnItsStream) {
  std::shared_ptr<WorkCall> doomed = send_work("req-9", 4);
  std::shared_ptr<WorkCall> other = send_work("req-8", 3);
  ASSERT_TRUE(service_.wait_for_requests(2));

  // Another transfer tag of the same request id is not this work.
  Result<http::ClientResponse> miss = cancel("req-9", 5);
  ASSERT_TRUE(miss.ok()) << miss.status().to_string();
  EXPECT_EQ(answer_of(*miss), (Answer{.found = false, .settled = true}));
  EXPECT_TRUE(service_.aborted().empty());

  Result<http::ClientResponse> hit = cancel("req-9", 4);
  ASSERT_TRUE(hit.ok()) << hit.status().to_string();
  EXPECT_EQ(hit->status, 200);
  EXPECT_EQ(answer_of(*hit), (Answer{.found = true, .settled = true}));
  ASSERT_EQ(service_.aborted().size(), 1u);
  EXPECT_NE(service_.aborted()[0].find("req-9"), std::string::npos);

  // The work's stream carries the outcome: one error event, then its end.
  ASSERT_TRUE(doomed->wait_done());
  {
    std::lock_guard lock(doomed->mutex);
    EXPECT_EQ(doomed->status, 200);
    EXPECT_TRUE(doomed->done->ok()) << doomed->done->to_string();
    ASSERT_FALSE(doomed->body.empty());
    Result<PrefillEvent> event =
        parse_prefill_event(std::string_view(doomed->body).substr(0, doomed->body.find('\n')));
    ASSERT_TRUE(event.ok()) << event.status().to_string() << ": " << doomed->body;
    EXPECT_EQ(event->kind, PrefillEvent::Kind::kError);
  }
  // The other work goes on.
  const std::vector<std::string> left = service_.submitted();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left[0].find("req-8"), std::string::npos);
  {
    std::lock_guard lock(other->mutex);
    EXPECT_FALSE(other->done.has_value());
  }
  // Once its exchange ended, the work is forgotten: a second cancel finds nothing.
  Result<http::ClientResponse> again = cancel("req-9", 4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(answer_of(*again), (Answer{.found = false, .settled = true}));
}

// The decode node frees the blocks on the error event: after a failure that came once the
// export had started (its puts may be in flight until the export's cancel completes), the
// event must wait for the export's report.
TEST_F(PrefillCancelTest, AnErrorAfterTheExportStartedWaitsForTheExportsEnd) {
  std::shared_ptr<WorkCall> call = send_work("req-5", 1);
  ASSERT_TRUE(service_.wait_for_requests(1));
  const std::string engine_id = service_.submitted().at(0);
  ASSERT_TRUE(call->wait_head());
  service_.fail_after_export_started(engine_id);
  // The failure's delta has been handled on the connection's strand (the server's test hook):
  // an error event written then would have ended the work's stream.
  const std::optional<bool> ended = handled_.wait_first(engine_id);
  ASSERT_TRUE(ended.has_value()) << "the failure's delta was never handled";
  EXPECT_FALSE(*ended) << "the error event went out while a put may still land";
  {
    std::lock_guard lock(call->mutex);
    EXPECT_EQ(call->status, 200);
    EXPECT_TRUE(call->body.empty()) << "an error event while a put may still land: " << call->body;
    EXPECT_FALSE(call->done.has_value());
  }
  service_.finish_export(engine_id, cancelled("KV transfer 1 was cancelled"));
  ASSERT_TRUE(call->wait_done());
  std::lock_guard lock(call->mutex);
  Result<PrefillEvent> event =
      parse_prefill_event(std::string_view(call->body).substr(0, call->body.find('\n')));
  ASSERT_TRUE(event.ok()) << event.status().to_string() << ": " << call->body;
  EXPECT_EQ(event->kind, PrefillEvent::Kind::kError);
  EXPECT_NE(event->error.find("the forward failed"), std::string::npos) << event->error;
}

TEST_F(PrefillCancelTest, WorkThatArrivesAfterItsCancelIsRefused) {
  Result<http::ClientResponse> early = cancel("req-7", 2);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(answer_of(*early), (Answer{.found = false, .settled = true}));
  std::shared_ptr<WorkCall> late = send_work("req-7", 2);
  ASSERT_TRUE(late->wait_done());
  {
    std::lock_guard lock(late->mutex);
    EXPECT_NE(late->status, 200);
    EXPECT_GE(late->status, 400);
    EXPECT_LT(late->status, 500);
  }
  EXPECT_TRUE(service_.submitted().empty());
  // Another tag of that request is other work.
  send_work("req-7", 3);
  EXPECT_TRUE(service_.wait_for_requests(1));
}

// RFC 9110 section 11.6.1, and docs/RELIABILITY.md: every refusal names the scheme to use.
TEST_F(PrefillCancelTest, EveryRefusalWithoutTheClusterTokenSaysHowToAuthenticate) {
  for (const char* target : {"/internal/v1/prefill", "/internal/v1/prefill/cancel"}) {
    Result<http::ClientResponse> refused =
        client_->fetch_and_wait(url_, post(target, "{}", /*token=*/false));
    ASSERT_TRUE(refused.ok()) << target;
    EXPECT_EQ(refused->status, 401) << target;
    EXPECT_EQ(refused->header("WWW-Authenticate").value_or(""), "Bearer") << target;
    EXPECT_NE(refused->body.find("\"invalid_cluster_token\""), std::string::npos)
        << target << ": " << refused->body;
  }
  EXPECT_TRUE(service_.submitted().empty());
}

TEST_F(PrefillCancelTest, ACancelNeedsTheClusterTokenAndAWellFormedBody) {
  Result<http::ClientResponse> anonymous = cancel("req-1", 1, /*token=*/false);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->status, 401);
  Result<http::ClientResponse> bad =
      client_->fetch_and_wait(url_, post("/internal/v1/prefill/cancel", "{\"transfer_tag\":1}"));
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(parse_prefill_cancel("{\"request_id\":\"a\",\"transfer_tag\":\"x\"}").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_prefill_cancel("[]").status().code(), StatusCode::kInvalidArgument);
  Result<PrefillCancel> good = parse_prefill_cancel(prefill_cancel_to_json({"r", 9}).dump());
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->request_id, "r");
  EXPECT_EQ(good->transfer_tag, 9u);
}

// The decode node frees the blocks on the cancel's answer: with an export under way, the answer
// must wait for the export's end (its puts may land until then), as the error event does.
TEST_F(PrefillCancelTest, ACancelIsAnsweredOnlyOnceNoPutOfTheWorkCanLand) {
  std::shared_ptr<WorkCall> call = send_work("req-6", 1);
  ASSERT_TRUE(service_.wait_for_requests(1));
  const std::string engine_id = service_.submitted().at(0);
  service_.start_export(engine_id);
  struct Pending {
    std::mutex mutex;
    std::condition_variable changed;
    std::optional<Result<http::ClientResponse>> answer;
  };
  auto pending = std::make_shared<Pending>();
  client_->fetch(url_,
                 post("/internal/v1/prefill/cancel", prefill_cancel_to_json({"req-6", 1}).dump()),
                 [pending](Result<http::ClientResponse> response) {
                   std::lock_guard lock(pending->mutex);
                   pending->answer = std::move(response);
                   pending->changed.notify_all();
                 });
  ASSERT_TRUE(service_.wait_for_aborts(1));
  {
    // The abort ended the request, not its export: no answer yet.
    std::unique_lock lock(pending->mutex);
    EXPECT_FALSE(pending->changed.wait_for(lock, milliseconds(200),
                                           [&] { return pending->answer.has_value(); }))
        << "the cancel was answered while a put of its work could still land";
  }
  service_.finish_export(engine_id, cancelled("KV transfer 1 was cancelled"));
  std::unique_lock lock(pending->mutex);
  ASSERT_TRUE(pending->changed.wait_for(lock, milliseconds(5000),
                                        [&] { return pending->answer.has_value(); }));
  ASSERT_TRUE(pending->answer->ok()) << pending->answer->status().to_string();
  EXPECT_EQ(answer_of(**pending->answer), (Answer{.found = true, .settled = true}));
  ASSERT_TRUE(call->wait_done());
}

// Issue #34 item 3, the race behind blocks held for 30 s: a decode node gives an import up (its
// client left) while the work is going out. It closes the work's call, but the bytes are out:
// this node runs the work and aborts it when the connection closes, and the error event that
// would have confirmed it has nowhere to go. The cancel's answer, sent once the work ended, is
// the confirmation: the blocks are freed at once, not at the hold deadline (32 s here). A fault
// hook holds the work's send until the import was given up; the bytes then usually leave before
// the call's close runs, but not always (the close is queued behind the send on the call's
// strand): an attempt whose work never arrived checks that plain close instead (nothing sent,
// the blocks freed at once), and the test needs the race itself within five attempts.
TEST_F(PrefillCancelTest, AnImportGivenUpWhileItsWorkGoesOutIsFreedOnTheCancelsAnswer) {
  std::mutex mutex;
  std::condition_variable changed;
  bool sending = false;
  bool given_up = false;
  bool woken = false;
  kv_transfer::RemotePrefillOptions options;
  options.cluster_token = kToken;
  options.transfer_timeout = std::chrono::seconds(30);
  options.verify_checksums = false;
  options.test_before_work_sent = [&](const std::string&) {
    std::unique_lock lock(mutex);
    sending = true;
    changed.notify_all();
    changed.wait_for(lock, milliseconds(5000), [&] { return given_up; });
  };
  auto created = kv_transfer::RemotePrefillClient::create(
      options, {"AAAA", KvLayout{1, 8, 16, 1, 4, DType::kF32}},
      [](std::span<const int32_t>, int, int) { return std::vector<uint64_t>(); });
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<kv_transfer::RemotePrefillClient> decode = std::move(*created);
  decode->set_wakeup([&] {
    std::lock_guard lock(mutex);
    woken = true;
    changed.notify_all();
  });

  bool reproduced = false;
  for (int attempt = 0; attempt < 5 && !reproduced; ++attempt) {
    const std::string id = "req-34-" + std::to_string(attempt);
    {
      std::lock_guard lock(mutex);
      sending = given_up = false;
    }
    InferenceRequest request;
    request.id = id;
    request.prompt_tokens.assign(16, 7);  // one block
    request.sampling.max_tokens = 4;
    request.kv_import =
        KvImportSource{{"http://127.0.0.1:" + url_.port}, milliseconds(60'000), ""};
    const std::vector<int32_t> blocks = {5};
    ASSERT_TRUE(decode->start(request, blocks, 0).ok());
    {
      std::unique_lock lock(mutex);
      ASSERT_TRUE(changed.wait_for(lock, milliseconds(5000), [&] { return sending; }));
    }
    const auto given_up_at = Clock::now();
    decode->cancel(id);  // nothing sent as far as the import knows: it closes the call
    {
      std::lock_guard lock(mutex);
      given_up = true;
      changed.notify_all();
    }

    std::vector<KvEvent> events;
    const auto count = [&](KvEventKind kind) {
      return std::count_if(events.begin(), events.end(),
                           [&](const KvEvent& event) { return event.kind == kind; });
    };
    const auto give_up = Clock::now() + milliseconds(10'000);
    while (count(KvEventKind::kImportReleased) == 0 && Clock::now() < give_up) {
      {
        std::unique_lock lock(mutex);
        changed.wait_until(lock, give_up, [&] { return woken; });
        woken = false;
      }
      for (KvEvent& event : decode->poll()) events.push_back(std::move(event));
    }
    ASSERT_EQ(count(KvEventKind::kImportReleased), 1) << "the blocks are still held";
    EXPECT_LT(Clock::now() - given_up_at, milliseconds(10'000));
    for (const KvEvent& event : events) {
      if (event.kind == KvEventKind::kImportReleased) {
        EXPECT_TRUE(event.status.ok())
            << "freed by the hold deadline: " << event.status.to_string();
      }
      if (event.kind == KvEventKind::kImportFailed) {
        EXPECT_EQ(event.status.code(), StatusCode::kCancelled);
      }
    }
    EXPECT_EQ(count(KvEventKind::kImportFailed), 1);
    // Whether the work arrived: by the release it had, or it never will (its call is closed
    // and this node answers a cancel only once the work is settled).
    Result<http::ClientResponse> settled = cancel(id, 1);
    ASSERT_TRUE(settled.ok());
    const std::vector<std::string> aborted = service_.aborted();
    reproduced = std::any_of(aborted.begin(), aborted.end(), [&](const std::string& engine_id) {
      return engine_id.find(id) != std::string::npos;
    });
    // Either way this node has forgotten the work: a cancel finds nothing.
    EXPECT_EQ(answer_of(*settled), (Answer{.found = false, .settled = true}));
  }
  EXPECT_TRUE(reproduced) << "the race was not reproduced in five attempts: no work arrived";
}

// A cancel that arrives while its work is being admitted must find it, never answer "not here"
// (a confirmation that frees the decode node's blocks) and let the work run. The fault hook
// sends the cancel from inside submit() and gives it time to be answered there.
TEST_F(PrefillCancelTest, ACancelDuringTheWorksAdmissionFindsItAndAbortsIt) {
  struct Pending {
    std::mutex mutex;
    std::condition_variable changed;
    std::optional<Result<http::ClientResponse>> answer;
  };
  auto pending = std::make_shared<Pending>();
  service_.during_submit = [&] {
    service_.during_submit = nullptr;
    client_->fetch(url_,
                   post("/internal/v1/prefill/cancel", prefill_cancel_to_json({"req-3", 1}).dump()),
                   [pending](Result<http::ClientResponse> response) {
                     std::lock_guard lock(pending->mutex);
                     pending->answer = std::move(response);
                     pending->changed.notify_all();
                   });
    std::unique_lock lock(pending->mutex);
    EXPECT_FALSE(pending->changed.wait_for(lock, milliseconds(300),
                                           [&] { return pending->answer.has_value(); }))
        << "the cancel was answered while its work was being admitted";
  };
  std::shared_ptr<WorkCall> call = send_work("req-3", 1);
  {
    std::unique_lock lock(pending->mutex);
    ASSERT_TRUE(pending->changed.wait_for(lock, milliseconds(5000),
                                          [&] { return pending->answer.has_value(); }));
    ASSERT_TRUE(pending->answer->ok()) << pending->answer->status().to_string();
    EXPECT_EQ(answer_of(**pending->answer), (Answer{.found = true, .settled = true}));
  }
  ASSERT_EQ(service_.aborted().size(), 1u);
  EXPECT_NE(service_.aborted()[0].find("req-3"), std::string::npos);
  ASSERT_TRUE(call->wait_done());
}

TEST(PrefillCancelAnswer, ParsesTheSettledAnswerAndAnOlderNodesUnsettledOne) {
  Result<PrefillCancelAnswer> settled = parse_prefill_cancel_answer(
      prefill_cancel_answer_to_json({.found = true, .settled = true}).dump());
  ASSERT_TRUE(settled.ok()) << settled.status().to_string();
  EXPECT_TRUE(settled->found);
  EXPECT_TRUE(settled->settled);
  Result<PrefillCancelAnswer> older = parse_prefill_cancel_answer("{\"found\":false}");
  ASSERT_TRUE(older.ok()) << older.status().to_string();
  EXPECT_FALSE(older->settled) << "an older node's answer is no confirmation";
  EXPECT_EQ(parse_prefill_cancel_answer("{\"settled\":true}").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_prefill_cancel_answer("{\"found\":true,\"settled\":1}").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_prefill_cancel_answer("not json").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
