// The typed events of a decode node's stream: every kind round-trips through to_sse and
// parse_stream_event; the typed view does not depend on the writer's spacing, key order, line
// ends or data-line split (the property the proxy's substring checks lacked); malformed events
// are InvalidArgument naming what is wrong.
#include "common/protocol/stream_event.h"

#include <gtest/gtest.h>

#include "common/protocol/openai_response.h"
#include "common/protocol/request_timeline.h"

namespace pdserve {
namespace {

using Ordered = nlohmann::ordered_json;

const ResponseMeta kMeta{"chatcmpl-9", 1764000000, "qwen3"};

StreamEvent parsed(std::string_view text) {
  Result<StreamEvent> event = parse_stream_event(text);
  EXPECT_TRUE(event.ok()) << text << ": " << event.status().to_string();
  return event.ok() ? std::move(event).value() : StreamEvent(DoneEvent{});
}

void expect_refused(std::string_view text, std::string_view mention) {
  Result<StreamEvent> event = parse_stream_event(text);
  ASSERT_FALSE(event.ok()) << text;
  EXPECT_EQ(event.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(event.status().message().find(mention), std::string::npos)
      << text << ": " << event.status().to_string();
}

TEST(StreamEvent, EveryKindRoundTrips) {
  const StreamOptions usage_on{true};
  CompletionChoice finished;
  finished.index = 2;
  finished.text = "end";
  finished.finish_reason = FinishReason::kLength;
  Ordered usage = usage_chunk(kMeta, true, {7, 3});
  usage["usage"][kTimelineUsageField] = {{"version", 1}, {"request_id", kMeta.id}};
  const std::vector<StreamEvent> events = {
      ChunkEvent::of(chat_role_chunk(kMeta, usage_on, 0)),
      ChunkEvent::of(chat_delta_chunk(kMeta, usage_on, 1, "think", "Hi \"there\"", nullptr)),
      ChunkEvent::of(chat_finish_chunk(kMeta, usage_on, 1, FinishReason::kStop, true)),
      ChunkEvent::of(completion_chunk(kMeta, {}, finished)),
      UsageEvent::of(usage),
      UsageEvent::of(usage_chunk(kMeta, false, {1, 0})),
      ErrorEvent::of(service_unavailable("the decode node failed", 1)),
      DoneEvent{},
      CheckpointEvent{{kMeta.id, kMeta.created, 3, 2, {5, 151645}, SamplerRng::State{1, 2, 3, 4}}},
      CheckpointEvent{{kMeta.id, kMeta.created, 1, 0, {}, std::nullopt}},
      TimelineEvent{{{"version", 1}, {"spans", Ordered::array()}}},
      CommentEvent{"keep-alive"},
      CommentEvent{"two\nlines"},
  };
  for (const StreamEvent& event : events) {
    const std::string text = to_sse(event);
    EXPECT_TRUE(text.ends_with("\n\n")) << text;
    EXPECT_EQ(text.find("\n\n"), text.size() - 2) << "one event: " << text;
    EXPECT_EQ(parsed(text), event) << text;
  }
}

TEST(StreamEvent, TheTypedViewReadsTheEnvelope) {
  const StreamEvent finish =
      parsed(to_sse(ChunkEvent::of(chat_finish_chunk(kMeta, {}, 3, FinishReason::kStop, true))));
  ASSERT_TRUE(std::holds_alternative<ChunkEvent>(finish));
  EXPECT_EQ(std::get<ChunkEvent>(finish).choices,
            (std::vector<ChunkChoice>{{3, std::string("tool_calls")}}));

  const StreamEvent delta =
      parsed(to_sse(ChunkEvent::of(chat_delta_chunk(kMeta, {}, 0, "", "x", nullptr))));
  EXPECT_EQ(std::get<ChunkEvent>(delta).choices, (std::vector<ChunkChoice>{{0, std::nullopt}}));

  const StreamEvent usage = parsed(to_sse(UsageEvent::of(usage_chunk(kMeta, false, {11, 4}))));
  ASSERT_TRUE(std::holds_alternative<UsageEvent>(usage));
  EXPECT_EQ(std::get<UsageEvent>(usage).usage, (UsageCounts{11, 4}));
  EXPECT_FALSE(std::get<UsageEvent>(usage).timeline.has_value());

  const StreamEvent error = parsed(to_sse(ErrorEvent::of(bad_gateway("no node"))));
  ASSERT_TRUE(std::holds_alternative<ErrorEvent>(error));
  EXPECT_EQ(std::get<ErrorEvent>(error).message, "no node");
  EXPECT_EQ(std::get<ErrorEvent>(error).type, "server_error");
  // "error": null is no error.
  EXPECT_TRUE(std::holds_alternative<ChunkEvent>(
      parsed("data: {\"error\": null, \"choices\": [{\"index\": 0}]}\n\n")));
}

// The same events as another writer may spell them: spaces around every token, keys in another
// order, CRLF line ends, the JSON pretty-printed over several data lines, no space after
// "data:", and a comment with blanks around its tag. The typed view is the same.
TEST(StreamEvent, SpacingKeyOrderAndLineSplitDoNotMatter) {
  const StreamEvent finish = parsed(
      "data:  {  \"choices\" : [ { \"finish_reason\" : \"length\" , \"index\" : 1 , "
      "\"text\" : \"\" } ] , \"id\" : \"cmpl-1\" }\r\n\r\n");
  EXPECT_EQ(std::get<ChunkEvent>(finish).choices,
            (std::vector<ChunkChoice>{{1, std::string("length")}}));

  const Ordered pretty = {{"usage", {{"completion_tokens", 2}, {"prompt_tokens", 9}}},
                          {"choices", Ordered::array()},
                          {"id", "cmpl-1"}};
  std::string multiline;
  const std::string dumped = pretty.dump(2);
  for (size_t from = 0; from < dumped.size();) {
    const size_t end = std::min(dumped.find('\n', from), dumped.size());
    multiline += "data:" + dumped.substr(from, end - from) + "\n";
    from = end + 1;
  }
  const StreamEvent usage = parsed(multiline + "\n");
  ASSERT_TRUE(std::holds_alternative<UsageEvent>(usage));
  EXPECT_EQ(std::get<UsageEvent>(usage).usage, (UsageCounts{9, 2}));

  const StreamEvent error =
      parsed("data: { \"error\" : { \"type\" : \"server_error\", \"message\" : \"gone\" } }\n\n");
  ASSERT_TRUE(std::holds_alternative<ErrorEvent>(error));
  EXPECT_EQ(std::get<ErrorEvent>(error).message, "gone");

  const StreamEvent checkpoint = parsed(
      ":pdserve_resume\t{ \"token_ids\" : [4], \"index\" : 0, \"created\" : 1, \"id\" : \"x\" }"
      "\r\n\r\n");
  ASSERT_TRUE(std::holds_alternative<CheckpointEvent>(checkpoint));
  EXPECT_EQ(std::get<CheckpointEvent>(checkpoint).checkpoint.token_ids, (std::vector<int32_t>{4}));

  EXPECT_TRUE(std::holds_alternative<TimelineEvent>(parsed(":  pdserve_timeline {}\n\n")));
  EXPECT_TRUE(std::holds_alternative<DoneEvent>(parsed("data:[DONE]\r\n\r\n")));
  // event: and id: lines are not the data.
  EXPECT_TRUE(std::holds_alternative<DoneEvent>(parsed("event: end\nid: 7\ndata: [DONE]\n\n")));
}

// Generated text that spells a finish_reason or an error is content: JSON escapes its quotes.
TEST(StreamEvent, ContentThatSpellsTheEnvelopeIsContent) {
  const StreamEvent content = parsed(to_sse(ChunkEvent::of(chat_delta_chunk(
      kMeta, {}, 0, "", "\"finish_reason\":\"stop\"} data: {\"error\":{}}", nullptr))));
  ASSERT_TRUE(std::holds_alternative<ChunkEvent>(content));
  EXPECT_EQ(std::get<ChunkEvent>(content).choices, (std::vector<ChunkChoice>{{0, std::nullopt}}));
  // A comment that merely starts like a tag is a plain comment.
  EXPECT_EQ(parsed(": pdserve_resumed soon\n\n"),
            StreamEvent(CommentEvent{"pdserve_resumed soon"}));
}

TEST(StreamEvent, MalformedEventsAreRefused) {
  expect_refused("data: {\"choices\": [\n\n", "not valid JSON");
  expect_refused("data: [1]\n\n", "not a JSON object");
  expect_refused("data: {\"id\": \"x\"}\n\n", "neither a chunk");
  expect_refused("data: {\"choices\": 3}\n\n", "'choices' is not an array");
  expect_refused("data: {\"choices\": [{\"text\": \"a\"}]}\n\n", "'index'");
  expect_refused("data: {\"choices\": [{\"index\": -1}]}\n\n", "'index'");
  expect_refused("data: {\"choices\": [{\"index\": 0, \"finish_reason\": 1}]}\n\n",
                 "'finish_reason'");
  expect_refused("data: {\"choices\": [7]}\n\n", "not a JSON object");
  expect_refused("data: {\"error\": \"text\"}\n\n", "error.message");
  expect_refused("data: {\"choices\": [], \"usage\": {\"pdserve_timeline\": 3}}\n\n",
                 "pdserve_timeline");
  expect_refused(": pdserve_resume {not json}\n\n", "checkpoint");
  expect_refused(": pdserve_resume {\"id\": \"x\", \"created\": 1}\n\n", "token_ids");
  expect_refused(": pdserve_timeline [1]\n\n", "pdserve_timeline");
  expect_refused(": pdserve_resume {}\ndata: [DONE]\n\n", "shares its event");
  expect_refused("event: ping\n\n", "neither data nor a comment");
  expect_refused("data: " + std::string(100, '[') + std::string(100, ']') + "\n\n", "deeper");
}

}  // namespace
}  // namespace pdserve
