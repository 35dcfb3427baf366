// The proxy's Exchange lifecycle: every state x event (the table below, written from the
// behaviour the proxy had as flags: proxy_failover_test, proxy_server_test and the pd suites
// check that behaviour end to end), then whole exchanges as a fake node would drive them:
// retry on refusal, busy 429 reroute, first byte then node death (resume or error event), a
// refused resumption, the client leaving.
#include "proxy/exchange_state.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::proxy {
namespace {

using State = ExchangeState;
using End = ExchangeEnd;

constexpr NodeHead kStreamHead{200, true, false, true};
constexpr NodeHead kJsonHead{200, false, false, true};
constexpr NodeHead kFull{429, false, false, true};
constexpr NodeHead kUnavailable{503, false, false, true};
constexpr NodeHead kLastFull{429, false, false, false};  // no other node may be tried
constexpr NodeHead kNoContent{204, false, true, true};

// The machine brought into `state` by events; `resuming`: the client's stream is open (a call
// streamed to it and was cut resumably).
ExchangeLifecycle in(State state, bool resuming = false) {
  ExchangeLifecycle exchange;
  if (resuming) {
    exchange.call_started();
    exchange.head(kStreamHead);
    exchange.call_ended(false, true);
  }
  switch (state) {
    case State::kRouting:
      break;
    case State::kAwaitingHead:
      exchange.call_started();
      break;
    case State::kRefused:
      exchange.call_started();
      exchange.head(kUnavailable);
      break;
    case State::kBuffering:
      exchange.call_started();
      exchange.head(kJsonHead);
      break;
    case State::kStreaming:
      exchange.call_started();
      exchange.head(kStreamHead);
      break;
    case State::kDiscarding:
      exchange.call_started();
      exchange.head(kLastFull);
      break;
    case State::kDone:
      exchange.client_left();
      break;
  }
  EXPECT_EQ(exchange.state(), state) << "setting up " << exchange_state_name(state);
  EXPECT_EQ(exchange.client_stream_open(), resuming || state == State::kStreaming);
  return exchange;
}

struct Event {
  std::string name;
  std::function<ExchangeActions(ExchangeLifecycle&)> fire;
};

const std::vector<Event>& events() {
  static const std::vector<Event> all = {
      {"no_node", [](ExchangeLifecycle& e) { return e.no_node(); }},
      {"resume_unreadable", [](ExchangeLifecycle& e) { return e.resume_unreadable(); }},
      {"call_started",
       [](ExchangeLifecycle& e) {
         e.call_started();
         return ExchangeActions{};
       }},
      {"head_stream", [](ExchangeLifecycle& e) { return e.head(kStreamHead); }},
      {"head_json", [](ExchangeLifecycle& e) { return e.head(kJsonHead); }},
      {"head_429", [](ExchangeLifecycle& e) { return e.head(kFull); }},
      {"head_503", [](ExchangeLifecycle& e) { return e.head(kUnavailable); }},
      {"head_429_last", [](ExchangeLifecycle& e) { return e.head(kLastFull); }},
      {"head_204", [](ExchangeLifecycle& e) { return e.head(kNoContent); }},
      {"relay_overflowed", [](ExchangeLifecycle& e) { return e.relay_overflowed(); }},
      {"buffer_overflowed", [](ExchangeLifecycle& e) { return e.buffer_overflowed(); }},
      {"client_write_failed", [](ExchangeLifecycle& e) { return e.client_write_failed(); }},
      {"call_ok", [](ExchangeLifecycle& e) { return e.call_ended(true, false); }},
      {"call_failed_resumable", [](ExchangeLifecycle& e) { return e.call_ended(false, true); }},
      {"call_failed", [](ExchangeLifecycle& e) { return e.call_ended(false, false); }},
      {"client_left", [](ExchangeLifecycle& e) { return e.client_left(); }},
  };
  return all;
}

ExchangeActions ends(End end) {
  return {.end = end};
}
const ExchangeActions kNothing{};
const ExchangeActions kCancel{.cancel_call = true};
const ExchangeActions kOpen{.open_client_stream = true};
const ExchangeActions kNodeGoneRetry{.route_again = true, .node_failed = true};
const ExchangeActions kResume{.route_again = true, .node_failed = true, .count_resume = true};
const ExchangeActions kNodeFailed{.node_failed = true, .end = End::kNodeFailed};
const ExchangeActions kRetry503{.route_again = true, .keep_refusal = true, .count_retry = true};

struct Row {
  State from;
  bool resuming;
  std::string event;
  State to;
  ExchangeActions actions;
};

// Every state (kRouting twice: fresh and resuming) x every event.
const std::vector<Row> kTable = {
    // kRouting, fresh.
    {State::kRouting, false, "no_node", State::kDone, ends(End::kNoNode)},
    {State::kRouting, false, "resume_unreadable", State::kDone, ends(End::kResumeUnreadable)},
    {State::kRouting, false, "call_started", State::kAwaitingHead, kNothing},
    {State::kRouting, false, "head_stream", State::kRouting, kNothing},
    {State::kRouting, false, "head_json", State::kRouting, kNothing},
    {State::kRouting, false, "head_429", State::kRouting, kNothing},
    {State::kRouting, false, "head_503", State::kRouting, kNothing},
    {State::kRouting, false, "head_429_last", State::kRouting, kNothing},
    {State::kRouting, false, "head_204", State::kRouting, kNothing},
    {State::kRouting, false, "relay_overflowed", State::kRouting, kNothing},
    {State::kRouting, false, "buffer_overflowed", State::kRouting, kNothing},
    {State::kRouting, false, "client_write_failed", State::kDone, kNothing},
    {State::kRouting, false, "call_ok", State::kRouting, kNothing},
    {State::kRouting, false, "call_failed_resumable", State::kRouting, kNothing},
    {State::kRouting, false, "call_failed", State::kRouting, kNothing},
    {State::kRouting, false, "client_left", State::kDone, kNothing},
    // kRouting, resuming: failures are error events in the client's stream.
    {State::kRouting, true, "no_node", State::kDone, ends(End::kNoNodeToResume)},
    {State::kRouting, true, "resume_unreadable", State::kDone, ends(End::kResumeUnreadable)},
    {State::kRouting, true, "call_started", State::kAwaitingHead, kNothing},
    {State::kRouting, true, "head_stream", State::kRouting, kNothing},
    {State::kRouting, true, "call_ok", State::kRouting, kNothing},
    {State::kRouting, true, "client_left", State::kDone, kNothing},
    // kAwaitingHead.
    {State::kAwaitingHead, false, "no_node", State::kAwaitingHead, kNothing},
    {State::kAwaitingHead, false, "resume_unreadable", State::kAwaitingHead, kNothing},
    {State::kAwaitingHead, false, "call_started", State::kAwaitingHead, kNothing},
    {State::kAwaitingHead, false, "head_stream", State::kStreaming, kOpen},
    {State::kAwaitingHead, false, "head_json", State::kBuffering, kNothing},
    {State::kAwaitingHead, false, "head_429", State::kRefused, kNothing},
    {State::kAwaitingHead, false, "head_503", State::kRefused, kNothing},
    {State::kAwaitingHead, false, "head_429_last", State::kBuffering, kNothing},
    {State::kAwaitingHead, false, "head_204", State::kBuffering, kNothing},
    {State::kAwaitingHead, false, "relay_overflowed", State::kAwaitingHead, kNothing},
    {State::kAwaitingHead, false, "buffer_overflowed", State::kAwaitingHead, kNothing},
    {State::kAwaitingHead, false, "client_write_failed", State::kDone, kCancel},
    {State::kAwaitingHead, false, "call_ok", State::kRouting, kNodeGoneRetry},
    {State::kAwaitingHead, false, "call_failed_resumable", State::kRouting, kNodeGoneRetry},
    {State::kAwaitingHead, false, "call_failed", State::kRouting, kNodeGoneRetry},
    {State::kAwaitingHead, false, "client_left", State::kDone, kCancel},
    // kAwaitingHead, resuming: only a 200 stream continues the client's; no second head.
    {State::kAwaitingHead, true, "head_stream", State::kStreaming, kNothing},
    {State::kAwaitingHead, true, "head_json", State::kDiscarding, kNothing},
    {State::kAwaitingHead, true, "head_429", State::kRefused, kNothing},
    {State::kAwaitingHead, true, "head_429_last", State::kDiscarding, kNothing},
    {State::kAwaitingHead, true, "head_204", State::kDiscarding, kNothing},
    {State::kAwaitingHead, true, "call_failed", State::kRouting, kNodeGoneRetry},
    // kRefused (a 503 that another node may replace).
    {State::kRefused, false, "no_node", State::kRefused, kNothing},
    {State::kRefused, false, "resume_unreadable", State::kRefused, kNothing},
    {State::kRefused, false, "call_started", State::kRefused, kNothing},
    {State::kRefused, false, "head_stream", State::kRefused, kNothing},
    {State::kRefused, false, "head_json", State::kRefused, kNothing},
    {State::kRefused, false, "head_429", State::kRefused, kNothing},
    {State::kRefused, false, "head_503", State::kRefused, kNothing},
    {State::kRefused, false, "head_429_last", State::kRefused, kNothing},
    {State::kRefused, false, "head_204", State::kRefused, kNothing},
    {State::kRefused, false, "relay_overflowed", State::kRefused, kNothing},
    {State::kRefused, false, "buffer_overflowed", State::kRefused, kNothing},
    {State::kRefused, false, "client_write_failed", State::kDone, kCancel},
    {State::kRefused, false, "call_ok", State::kRouting, kRetry503},
    {State::kRefused, false, "call_failed_resumable", State::kDone, kNodeFailed},
    {State::kRefused, false, "call_failed", State::kDone, kNodeFailed},
    {State::kRefused, false, "client_left", State::kDone, kCancel},
    // kBuffering.
    {State::kBuffering, false, "no_node", State::kBuffering, kNothing},
    {State::kBuffering, false, "resume_unreadable", State::kBuffering, kNothing},
    {State::kBuffering, false, "call_started", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_stream", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_json", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_429", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_503", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_429_last", State::kBuffering, kNothing},
    {State::kBuffering, false, "head_204", State::kBuffering, kNothing},
    {State::kBuffering, false, "relay_overflowed", State::kBuffering, kNothing},
    {State::kBuffering, false, "buffer_overflowed", State::kDone,
     {.cancel_call = true, .end = End::kAnswerTooLarge}},
    {State::kBuffering, false, "client_write_failed", State::kDone, kCancel},
    {State::kBuffering, false, "call_ok", State::kDone, ends(End::kAnswer)},
    {State::kBuffering, false, "call_failed_resumable", State::kDone, kNodeFailed},
    {State::kBuffering, false, "call_failed", State::kDone, kNodeFailed},
    {State::kBuffering, false, "client_left", State::kDone, kCancel},
    // kStreaming.
    {State::kStreaming, false, "no_node", State::kStreaming, kNothing},
    {State::kStreaming, false, "resume_unreadable", State::kStreaming, kNothing},
    {State::kStreaming, false, "call_started", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_stream", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_json", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_429", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_503", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_429_last", State::kStreaming, kNothing},
    {State::kStreaming, false, "head_204", State::kStreaming, kNothing},
    {State::kStreaming,
     false,
     "relay_overflowed",
     State::kDone,
     {.cancel_call = true, .end = End::kEventTooLarge}},
    {State::kStreaming, false, "buffer_overflowed", State::kStreaming, kNothing},
    {State::kStreaming, false, "client_write_failed", State::kDone, kCancel},
    {State::kStreaming, false, "call_ok", State::kDone, ends(End::kAnswer)},
    {State::kStreaming, false, "call_failed_resumable", State::kRouting, kResume},
    {State::kStreaming, false, "call_failed", State::kDone, kNodeFailed},
    {State::kStreaming, false, "client_left", State::kDone, kCancel},
    // kDiscarding (a resumption answered 429 with no other node to try).
    {State::kDiscarding, true, "no_node", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "resume_unreadable", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "call_started", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_stream", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_json", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_429", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_503", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_429_last", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "head_204", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "relay_overflowed", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "buffer_overflowed", State::kDiscarding, kNothing},
    {State::kDiscarding, true, "client_write_failed", State::kDone, kCancel},
    {State::kDiscarding, true, "call_ok", State::kDone, ends(End::kResumeRefused)},
    {State::kDiscarding, true, "call_failed_resumable", State::kDone, kNodeFailed},
    {State::kDiscarding, true, "call_failed", State::kDone, kNodeFailed},
    {State::kDiscarding, true, "client_left", State::kDone, kCancel},
};

TEST(ExchangeLifecycle, EveryStateAndEvent) {
  for (const Row& row : kTable) {
    ExchangeLifecycle exchange = in(row.from, row.resuming);
    const auto event = std::ranges::find(events(), row.event, &Event::name);
    ASSERT_NE(event, events().end()) << row.event;
    const ExchangeActions actions = event->fire(exchange);
    const std::string where = std::string(exchange_state_name(row.from)) +
                              (row.resuming ? " (resuming)" : "") + " x " + row.event;
    EXPECT_EQ(exchange.state(), row.to) << where << " -> " << exchange_state_name(exchange.state());
    EXPECT_EQ(actions, row.actions) << where << " -> end " << static_cast<int>(actions.end);
  }
}

// kDone ignores every event: the client has its answer or left.
TEST(ExchangeLifecycle, DoneIgnoresEverything) {
  for (const Event& event : events()) {
    ExchangeLifecycle exchange = in(State::kDone);
    EXPECT_EQ(event.fire(exchange), kNothing) << event.name;
    EXPECT_EQ(exchange.state(), State::kDone) << event.name;
    EXPECT_EQ(exchange.body(), BodyAction{}) << event.name;
  }
}

TEST(ExchangeLifecycle, BodyBytesGoWhereTheStateSays) {
  EXPECT_EQ(in(State::kRouting).body(), BodyAction{});
  EXPECT_EQ(in(State::kAwaitingHead).body(), BodyAction{});
  EXPECT_EQ(in(State::kRefused).body(), (BodyAction{BodyUse::kRefusal, false}));
  EXPECT_EQ(in(State::kDiscarding, true).body(), (BodyAction{BodyUse::kDrop, true}));
  ExchangeLifecycle buffering = in(State::kBuffering);
  EXPECT_EQ(buffering.body(), (BodyAction{BodyUse::kBuffer, true}));
  EXPECT_EQ(buffering.body(), (BodyAction{BodyUse::kBuffer, false})) << "the first byte once";
  ExchangeLifecycle streaming = in(State::kStreaming);
  EXPECT_EQ(streaming.body(), (BodyAction{BodyUse::kRelay, true}));
  EXPECT_EQ(streaming.body(), (BodyAction{BodyUse::kRelay, false}));
}

// A 503 then a 429 on two nodes, then none left: 429 (the pool is full, not broken); a refusal's
// body is not the first byte of an answer.
TEST(ExchangeLifecycle, RefusalsRerouteAndABusyPoolIsA429) {
  ExchangeLifecycle exchange;
  exchange.call_started();
  EXPECT_EQ(exchange.head(kUnavailable), kNothing);
  EXPECT_EQ(exchange.body(), (BodyAction{BodyUse::kRefusal, false}));
  EXPECT_EQ(exchange.call_ended(true, false), kRetry503);
  EXPECT_FALSE(exchange.busy());
  exchange.call_started();
  EXPECT_EQ(exchange.status(), 0);
  exchange.head(kFull);
  EXPECT_EQ(exchange.status(), 429);
  EXPECT_EQ(exchange.call_ended(true, false),
            (ExchangeActions{.route_again = true, .count_retry = true}));
  EXPECT_TRUE(exchange.busy());
  EXPECT_EQ(exchange.no_node(), ends(End::kAllBusy));

  // Only 503s: the last refusal's reason goes to the client.
  ExchangeLifecycle unavailable;
  unavailable.call_started();
  unavailable.head(kUnavailable);
  unavailable.call_ended(true, false);
  EXPECT_EQ(unavailable.no_node(), ends(End::kNoNode));

  // The last node's refusal is its answer: relayed as it came.
  ExchangeLifecycle last;
  last.call_started();
  last.head(kLastFull);
  EXPECT_EQ(last.body(), (BodyAction{BodyUse::kBuffer, true}));
  EXPECT_EQ(last.call_ended(true, false), ends(End::kAnswer));
  EXPECT_EQ(last.status(), 429);
}

// The first byte reached the client, then the node died: with checkpoints another node
// continues the stream (whose failures are error events from then on); without, the stream
// ends with an error event.
TEST(ExchangeLifecycle, NodeDeathMidStreamResumesOrEndsWithAnErrorEvent) {
  ExchangeLifecycle resumed;
  resumed.call_started();
  EXPECT_EQ(resumed.head(kStreamHead), kOpen);
  EXPECT_EQ(resumed.body(), (BodyAction{BodyUse::kRelay, true}));
  EXPECT_EQ(resumed.call_ended(false, true), kResume);
  EXPECT_TRUE(resumed.client_stream_open());
  resumed.call_started();
  EXPECT_EQ(resumed.head(kStreamHead), kNothing) << "the client has its stream's head";
  EXPECT_EQ(resumed.body(), (BodyAction{BodyUse::kRelay, false}));
  EXPECT_EQ(resumed.call_ended(true, false), ends(End::kAnswer));

  ExchangeLifecycle cut;
  cut.call_started();
  cut.head(kStreamHead);
  cut.body();
  EXPECT_EQ(cut.call_ended(false, false), kNodeFailed);
  EXPECT_TRUE(cut.client_stream_open()) << "kNodeFailed is an error event in the stream";

  // The resuming node dies before its head: the next one is tried; none left: error event.
  ExchangeLifecycle none_left = in(State::kRouting, true);
  none_left.call_started();
  EXPECT_EQ(none_left.call_ended(false, false), kNodeGoneRetry);
  EXPECT_EQ(none_left.no_node(), ends(End::kNoNodeToResume));

  // The resuming node answers with an error body: the client's stream ends with an error.
  ExchangeLifecycle refused = in(State::kRouting, true);
  refused.call_started();
  refused.head({400, false, false, true});
  EXPECT_EQ(refused.body(), (BodyAction{BodyUse::kDrop, true}));
  EXPECT_EQ(refused.call_ended(true, false), ends(End::kResumeRefused));
}

TEST(ExchangeLifecycle, TheClientLeavingCancelsTheCallAndEndsNothing) {
  ExchangeLifecycle exchange = in(State::kStreaming);
  exchange.body();
  EXPECT_EQ(exchange.client_left(), kCancel);
  EXPECT_EQ(exchange.body(), BodyAction{});
  EXPECT_EQ(exchange.call_ended(false, true), kNothing) << "no resumption for a client gone";
  EXPECT_EQ(exchange.client_left(), kNothing);

  ExchangeLifecycle routing;
  EXPECT_EQ(routing.client_left(), kNothing) << "no call to cancel";
  routing.call_started();
  EXPECT_EQ(routing.state(), State::kDone) << "no call starts for a client gone";
}

// A client that stops taking the stream (gone, or too slow) ends the exchange as a client that
// left: the call's end that follows is the proxy's cancel, not the node's failure, so the node
// is not marked down and the stream is not resumed elsewhere.
TEST(ExchangeLifecycle, AClientThatStopsTakingTheStreamIsNotTheNodesFailure) {
  ExchangeLifecycle exchange = in(State::kStreaming);
  exchange.body();
  EXPECT_EQ(exchange.client_write_failed(), kCancel);
  EXPECT_EQ(exchange.state(), State::kDone);
  EXPECT_EQ(exchange.call_ended(false, true), kNothing);
}

}  // namespace
}  // namespace pdserve::proxy
