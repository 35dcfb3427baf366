// SseRelay: events framed across any split of the stream, the timeline comment never reaches
// the client, the usage event is held and rewritten, and a non-streaming body's timeline.
#include "proxy/timeline_relay.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

const Json kTimeline = {{"version", 1},
                        {"request_id", "cmpl-7"},
                        {"sync", {{"head_sent_ms", 2.5}}},
                        {"spans", Json::array()}};

std::string data_event(const Json& value) {
  return "data: " + value.dump() + "\n\n";
}

// A decode node's stream without include_usage: deltas, the timeline comment, [DONE].
std::string comment_stream(std::string_view line_end) {
  std::string stream;
  for (int i = 0; i < 3; ++i) {
    stream += "data: {\"id\":\"cmpl-7\",\"choices\":[{\"text\":\"tok" + std::to_string(i) +
              "\"}]}" + std::string(line_end) + std::string(line_end);
  }
  stream +=
      ": pdserve_timeline " + kTimeline.dump() + std::string(line_end) + std::string(line_end);
  stream += "data: [DONE]" + std::string(line_end) + std::string(line_end);
  return stream;
}

// Feeds `stream` cut at `cuts` (sorted offsets) and returns everything forwarded.
std::string relay_in_pieces(SseRelay& relay, const std::string& stream,
                            const std::vector<size_t>& cuts) {
  std::string forwarded;
  size_t from = 0;
  for (size_t cut : cuts) {
    forwarded += relay.feed(std::string_view(stream).substr(from, cut - from));
    from = cut;
  }
  forwarded += relay.feed(std::string_view(stream).substr(from));
  return forwarded + relay.finish(nullptr);
}

TEST(SseRelay, EverySingleSplitStripsTheCommentAndKeepsTheRest) {
  for (std::string_view line_end : {"\n", "\r\n"}) {
    const std::string stream = comment_stream(line_end);
    const std::string comment =
        ": pdserve_timeline " + kTimeline.dump() + std::string(line_end) + std::string(line_end);
    std::string expected = stream;
    expected.erase(expected.find(comment), comment.size());
    for (size_t cut = 0; cut <= stream.size(); ++cut) {
      SseRelay relay;
      EXPECT_EQ(relay_in_pieces(relay, stream, {cut}), expected) << "cut at " << cut;
      ASSERT_TRUE(relay.timeline().has_value()) << "cut at " << cut;
      EXPECT_EQ(*relay.timeline(), kTimeline);
    }
  }
}

TEST(SseRelay, RandomSplitsIntoManyPieces) {
  const std::string stream = comment_stream("\n");
  std::mt19937 random(7);
  for (int round = 0; round < 500; ++round) {
    std::vector<size_t> cuts;
    const int pieces = 1 + static_cast<int>(random() % 40);
    for (int i = 0; i < pieces; ++i) cuts.push_back(random() % (stream.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    SseRelay relay;
    const std::string forwarded = relay_in_pieces(relay, stream, cuts);
    EXPECT_EQ(forwarded.find("pdserve_timeline"), std::string::npos);
    EXPECT_TRUE(forwarded.ends_with("data: [DONE]\n\n"));
    ASSERT_TRUE(relay.timeline().has_value());
  }
}

TEST(SseRelay, EventsAreForwardedAsSoonAsTheyAreComplete) {
  SseRelay relay;
  EXPECT_EQ(relay.feed("data: {\"a\":1}\n"), "");
  EXPECT_EQ(relay.feed("\ndata: {\"b\""), "data: {\"a\":1}\n\n");
  EXPECT_EQ(relay.feed(":2}\n\n"), "data: {\"b\":2}\n\n");
}

TEST(SseRelay, UsageEventIsHeldAndCarriesTheAlignedTimeline) {
  const Json usage_chunk = {{"id", "cmpl-7"},
                            {"choices", Json::array()},
                            {"usage", {{"prompt_tokens", 5}, {"pdserve_timeline", kTimeline}}}};
  const std::string delta = data_event({{"id", "cmpl-7"}, {"choices", {{{"text", "x"}}}}});
  SseRelay relay;
  EXPECT_EQ(relay.feed(delta), delta);
  // The usage event and everything after it wait for finish().
  EXPECT_EQ(relay.feed(data_event(usage_chunk) + "data: [DONE]\n\n"), "");
  ASSERT_TRUE(relay.timeline().has_value());
  EXPECT_EQ(*relay.timeline(), kTimeline);

  const Json aligned = {{"version", 1}, {"origin", "proxy"}};
  const std::string rest = relay.finish(&aligned);
  ASSERT_TRUE(rest.ends_with("\n\ndata: [DONE]\n\n")) << rest;
  const Json sent = Json::parse(rest.substr(6, rest.find("\n\n") - 6));
  EXPECT_EQ(sent["usage"]["pdserve_timeline"], aligned);
  EXPECT_EQ(sent["usage"]["prompt_tokens"], 5);
}

TEST(SseRelay, UsageEventLosesTheTimelineWhenTheClientDidNotAsk) {
  const Json usage_chunk = {{"id", "cmpl-7"},
                            {"choices", Json::array()},
                            {"usage", {{"prompt_tokens", 5}, {"pdserve_timeline", kTimeline}}}};
  SseRelay relay;
  EXPECT_EQ(relay.feed(data_event(usage_chunk) + "data: [DONE]\n\n"), "");
  const std::string rest = relay.finish(nullptr);
  EXPECT_EQ(rest.find("pdserve_timeline"), std::string::npos) << rest;
  const Json sent = Json::parse(rest.substr(6, rest.find("\n\n") - 6));
  EXPECT_EQ(sent["usage"]["prompt_tokens"], 5);
  EXPECT_TRUE(rest.ends_with("\n\ndata: [DONE]\n\n")) << rest;
}

TEST(SseRelay, CommentComesBackWithTheClientsTimelineBeforeDone) {
  const std::string stream = comment_stream("\n");
  SseRelay relay;
  const std::string forwarded = relay.feed(stream);
  EXPECT_EQ(forwarded.find("pdserve_timeline"), std::string::npos);
  EXPECT_EQ(forwarded.find("[DONE]"), std::string::npos) << "[DONE] waits for the timeline";
  const Json client_timeline = {{"origin", "proxy"}};
  EXPECT_EQ(relay.finish(&client_timeline),
            ": pdserve_timeline " + client_timeline.dump() + "\n\ndata: [DONE]\n\n");
}

TEST(SseRelay, ErrorEventsHaveTheirAddressesRedactedWhenAsked) {
  const std::string error_event =
      R"(data: {"error":{"message":"prefill node http://10.0.0.7:8100 answered HTTP 503","type":"server_error","code":503}})"
      "\n\n";
  SseRelay plain;
  EXPECT_EQ(plain.feed(error_event), error_event);
  SseRelay redacting;
  redacting.redact_errors("cluster-secret");
  const std::string sent = redacting.feed(error_event);
  EXPECT_EQ(sent.find("10.0.0.7"), std::string::npos) << sent;
  const Json error = Json::parse(sent.substr(6));
  EXPECT_EQ(error["error"]["message"], "prefill node <internal> answered HTTP 503");
  EXPECT_EQ(error["error"]["code"], 503);
  // Content chunks pass untouched, even when they mention an address.
  const std::string chunk = data_event({{"choices", {{{"text", "see http://example.com"}}}}});
  EXPECT_EQ(redacting.feed(chunk), chunk);
}

TEST(SseRelay, ErrorEventsLoseTheClusterTokenWhenAsked) {
  const std::string error_event =
      R"(data: {"error":{"message":"prefill refused Bearer cluster-secret","type":"server_error"}})"
      "\n\n";
  SseRelay redacting;
  redacting.redact_errors("cluster-secret");
  const std::string sent = redacting.feed(error_event);
  EXPECT_EQ(sent.find("cluster-secret"), std::string::npos) << sent;
  EXPECT_EQ(Json::parse(sent.substr(6))["error"]["message"], "prefill refused Bearer <redacted>");
}

// An event that never ends (no blank line) is not held without bound (issue #34: a 20 MB event
// was held whole, then cut the client's stream): past kMaxSseHeldBytes the relay overflows,
// drops what it held and forwards nothing more; the events before it were forwarded.
TEST(SseRelay, AnEventOverTheBoundOverflowsTheRelay) {
  SseRelay relay;
  const std::string first = "data: {\"a\":1}\n\n";
  EXPECT_EQ(relay.feed(first + "data: "), first);
  const std::string piece(1 << 20, 'x');
  size_t fed = 6;
  while (fed + piece.size() <= kMaxSseHeldBytes) {
    EXPECT_EQ(relay.feed(piece), "");
    fed += piece.size();
  }
  EXPECT_FALSE(relay.overflowed()) << fed << " bytes held";
  EXPECT_EQ(relay.feed(piece), "");
  EXPECT_TRUE(relay.overflowed());
  EXPECT_EQ(relay.feed("\n\ndata: {\"b\":2}\n\n"), "");
  EXPECT_EQ(relay.finish(nullptr), "");
}

TEST(SseRelay, UnreadableTimelinesAreReportedAndTheStreamUntouched) {
  SseRelay relay;
  const std::string broken = "data: {\"usage\": {\"pdserve_timeline\": 3}}\n\n";
  EXPECT_EQ(relay.feed(broken), broken);
  EXPECT_EQ(relay.feed(": pdserve_timeline {not json\n\n"), "");
  EXPECT_FALSE(relay.timeline().has_value());
  ASSERT_TRUE(relay.problem().has_value());
  EXPECT_NE(relay.problem()->message().find("pdserve_timeline"), std::string::npos);
}

TEST(SseRelay, IncompleteTrailingBytesComeOutAtTheEnd) {
  SseRelay relay;
  EXPECT_EQ(relay.feed("data: {\"a\":1}\n\ndata: {\"cut"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(relay.finish(nullptr), "data: {\"cut");
}

TEST(BodyTimeline, FoundReplacedOrAbsent) {
  const Json body = {{"id", "cmpl-7"}, {"usage", {{"pdserve_timeline", kTimeline}}}};
  Result<std::optional<TimelineBody>> found = parse_timeline_body(body.dump());
  ASSERT_TRUE(found.ok());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->timeline, kTimeline);

  const Json client_timeline = {{"origin", "proxy"}};
  const std::string replaced = (*found)->with_timeline(&client_timeline);
  EXPECT_EQ(Json::parse(replaced)["usage"]["pdserve_timeline"]["origin"], "proxy");
  // A client that did not ask gets usage without the timeline.
  const Json removed = Json::parse((*found)->with_timeline(nullptr));
  EXPECT_FALSE(removed["usage"].contains("pdserve_timeline"));
  EXPECT_EQ(removed["id"], "cmpl-7");

  Result<std::optional<TimelineBody>> none =
      parse_timeline_body(R"({"usage": {"prompt_tokens": 3}})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(parse_timeline_body(R"({"usage": {"pdserve_timeline": [1]}})").ok());
  EXPECT_FALSE(parse_timeline_body("pdserve_timeline but not json").ok());
}

// A resumable stream as a decode node writes it: a checkpoint before every event.
std::string checkpointed_stream() {
  const SamplerRng::State s1 = {1, 1, 1, 1}, s2 = {2, 2, 2, 2};
  std::string stream = StreamCheckpoint{"cmpl-7", 99, 1, 0, {}, std::nullopt}.to_comment();
  stream += StreamCheckpoint{"cmpl-7", 99, 1, 0, {10, 11}, s1}.to_comment();
  stream += "data: {\"id\":\"cmpl-7\",\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n";
  stream += StreamCheckpoint{"cmpl-7", 99, 1, 0, {12}, s2}.to_comment();
  stream += "data: {\"id\":\"cmpl-7\",\"choices\":[{\"text\":\"b\",\"finish_reason\":null}]}\n\n";
  return stream;
}

TEST(SseRelayResume, CheckpointsAreStrippedAndTheirTokensCountOnceTheNextEventIsForwarded) {
  const std::string stream = checkpointed_stream();
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<size_t> cuts;
    for (int k = 0; k < 4; ++k) cuts.push_back(rng() % (stream.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    SseRelay relay;
    const std::string forwarded = relay_in_pieces(relay, stream, cuts);
    EXPECT_EQ(forwarded.find("pdserve_resume"), std::string::npos) << forwarded;
    EXPECT_NE(forwarded.find("\"text\":\"b\""), std::string::npos);
    const DeliveredStream& delivered = relay.delivered();
    EXPECT_EQ(delivered.id, "cmpl-7");
    EXPECT_EQ(delivered.created, 99);
    ASSERT_EQ(delivered.choices.size(), 1u);
    EXPECT_EQ(delivered.choices[0].output_token_ids, (std::vector<int32_t>{10, 11, 12}));
    EXPECT_EQ(delivered.choices[0].sampler_state, (SamplerRng::State{2, 2, 2, 2}));
    EXPECT_TRUE(delivered.resumable());
  }
}

TEST(SseRelayResume, TokensWhoseEventNeverCameAreNotDelivered) {
  const std::string stream = checkpointed_stream();
  const size_t last_event = stream.rfind("data:");
  SseRelay relay;
  relay.feed(std::string_view(stream).substr(0, last_event + 10));  // cut inside the event
  EXPECT_EQ(relay.delivered().choices.at(0).output_token_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(relay.delivered().choices.at(0).sampler_state, (SamplerRng::State{1, 1, 1, 1}));

  // Another node continues: its checkpoints add to what was delivered.
  SseRelay next(relay.delivered());
  next.feed(StreamCheckpoint{"cmpl-7", 99, 1, 0, {}, std::nullopt}.to_comment());
  next.feed(StreamCheckpoint{"cmpl-7", 99, 1, 0, {12, 13}, SamplerRng::State{3, 3, 3, 3}}.to_comment());
  EXPECT_EQ(
      next.feed(
          "data: {\"choices\":[{\"index\":0,\"text\":\"bc\",\"finish_reason\":\"length\"}]}\n\n"),
      "data: {\"choices\":[{\"index\":0,\"text\":\"bc\",\"finish_reason\":\"length\"}]}\n\n");
  EXPECT_EQ(next.delivered().choices.at(0).output_token_ids,
            (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(next.delivered().choices.at(0).sampler_state, (SamplerRng::State{3, 3, 3, 3}));
  // A finished choice is not resumed: the client has its whole answer.
  EXPECT_TRUE(next.delivered().choices.at(0).finished);
  EXPECT_FALSE(next.delivered().resumable());
  const StreamResume resume = next.delivered().resume();
  EXPECT_EQ(resume.id, "cmpl-7");
  ASSERT_EQ(resume.choices.size(), 1u);
  EXPECT_EQ(resume.choices[0].output_token_ids, (std::vector<int32_t>{10, 11, 12, 13}));
}

// n = 3: interleaved events of three choices. Each checkpoint's tokens go to its own choice
// once its event is forwarded; a finish chunk finishes only its choice; the stream stays
// resumable while one choice is unfinished.
TEST(SseRelayResume, ChoicesAreTrackedApartAndTheStreamEndsWithItsLastChoice) {
  const auto checkpoint = [](int index, std::vector<int32_t> tokens, uint64_t state) {
    return StreamCheckpoint{"cmpl-3", 5, 3, index, std::move(tokens),
                            SamplerRng::State{state, state, state, state}}
        .to_comment();
  };
  const auto event = [](int index, const char* finish) {
    return "data: " +
           Json{{"choices", {{{"index", index}, {"text", "x"},
                              {"finish_reason", finish ? Json(finish) : Json()}}}}}
               .dump() +
           "\n\n";
  };
  SseRelay relay;
  relay.feed(StreamCheckpoint{"cmpl-3", 5, 3, 0, {}, std::nullopt}.to_comment());
  relay.feed(checkpoint(0, {}, 0) + event(0, nullptr));  // role chunks
  relay.feed(checkpoint(1, {}, 0) + event(1, nullptr));
  relay.feed(checkpoint(2, {}, 0) + event(2, nullptr));
  relay.feed(checkpoint(1, {20}, 1) + event(1, nullptr));
  relay.feed(checkpoint(0, {10, 11}, 2) + event(0, nullptr));
  relay.feed(checkpoint(1, {21}, 3) + event(1, "stop"));
  relay.feed(checkpoint(2, {30}, 4));  // its event never came
  const DeliveredStream& delivered = relay.delivered();
  ASSERT_EQ(delivered.choices.size(), 3u);
  EXPECT_EQ(delivered.choices[0].output_token_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(delivered.choices[1].output_token_ids, (std::vector<int32_t>{20, 21}));
  EXPECT_TRUE(delivered.choices[2].output_token_ids.empty());
  EXPECT_EQ(delivered.choices[0].sampler_state, (SamplerRng::State{2, 2, 2, 2}));
  EXPECT_EQ(delivered.choices[1].sampler_state, (SamplerRng::State{3, 3, 3, 3}));
  EXPECT_EQ(delivered.choices[2].sampler_state, (SamplerRng::State{0, 0, 0, 0}));
  EXPECT_FALSE(delivered.choices[0].finished);
  EXPECT_TRUE(delivered.choices[1].finished);
  EXPECT_FALSE(delivered.choices[2].finished);
  EXPECT_TRUE(delivered.resumable());

  relay.feed(event(2, "length"));
  EXPECT_EQ(relay.delivered().choices[2].output_token_ids, (std::vector<int32_t>{30}));
  EXPECT_TRUE(relay.delivered().choices[2].finished);
  EXPECT_TRUE(relay.delivered().resumable()) << "choice 0 is still going";
  relay.feed(checkpoint(0, {12}, 5) + event(0, "stop"));
  EXPECT_FALSE(relay.delivered().resumable());

  // A checkpoint that disagrees on the number of choices is a problem, not a crash.
  SseRelay odd;
  odd.feed(checkpoint(0, {}, 0));
  EXPECT_EQ(odd.feed(StreamCheckpoint{"cmpl-3", 5, 2, 1, {1}, std::nullopt}.to_comment()), "");
  EXPECT_TRUE(odd.problem().has_value());
}

TEST(SseRelayResume, AStreamWithoutCheckpointsIsNotResumableAndABadCheckpointIsAProblem) {
  SseRelay plain;
  plain.feed("data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n");
  EXPECT_FALSE(plain.delivered().resumable());
  EXPECT_FALSE(plain.problem().has_value());
  // A chunk whose choice has no index (not OpenAI's schema) passes as it came, as a problem.
  const std::string no_index = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
  EXPECT_EQ(plain.feed(no_index), no_index);
  ASSERT_TRUE(plain.problem().has_value());
  EXPECT_NE(plain.problem()->message().find("'index'"), std::string::npos);

  SseRelay bad;
  EXPECT_EQ(bad.feed(": pdserve_resume {not json}\n\n"), "");
  EXPECT_TRUE(bad.problem().has_value());
  EXPECT_FALSE(bad.delivered().resumable());
  // Content that spells a finish_reason is escaped in JSON and does not count as one.
  SseRelay content;
  content.feed(StreamCheckpoint{"cmpl-1", 1, 1, 0, {}, std::nullopt}.to_comment());
  content.feed("data: " + Json{{"choices", {{{"text", "\"finish_reason\":\"stop\""}}}}}.dump() +
               "\n\n");
  EXPECT_TRUE(content.delivered().resumable());
}

// Issue #29 item 4: the relay reads events as JSON, not as text. The same stream written with
// another spacing and key order (as another writer, or a later version of ours, may) finishes
// the same choices, has its error redacted and its usage timeline found; before, a finish
// reason written `"finish_reason": "stop"` went unnoticed (the finished choice would have been
// generated again on resumption) and an error event written `data: { "error"` passed with its
// addresses.
TEST(SseRelayResume, SpacingAndKeyOrderDoNotDecide) {
  const auto checkpoint = [](int index, std::vector<int32_t> tokens) {
    return StreamCheckpoint{"cmpl-2", 5, 2, index, std::move(tokens), SamplerRng::State{1, 1, 1, 1}}
        .to_comment();
  };
  SseRelay relay;
  relay.redact_errors("cluster-secret");
  relay.feed(checkpoint(0, {}));
  const std::string spaced =
      "data: { \"choices\" : [ { \"text\" : \"a\", \"finish_reason\" : \"stop\", "
      "\"index\" : 1 } ], \"id\" : \"cmpl-2\" }\r\n\r\n";
  EXPECT_EQ(relay.feed(checkpoint(1, {7}) + spaced), spaced) << "forwarded as it came";
  EXPECT_FALSE(relay.delivered().choices.at(0).finished);
  EXPECT_TRUE(relay.delivered().choices.at(1).finished);
  EXPECT_EQ(relay.delivered().choices.at(1).output_token_ids, (std::vector<int32_t>{7}));
  EXPECT_TRUE(relay.delivered().resumable());

  // Pretty-printed over several data lines: still choice 0's finish.
  std::string pretty;
  const std::string dumped = Json{{"index", 0}, {"finish_reason", "length"}, {"text", "b"}}.dump(1);
  pretty = "data: {\"choices\": [\n";
  for (size_t from = 0; from < dumped.size();) {
    const size_t end = std::min(dumped.find('\n', from), dumped.size());
    pretty += "data: " + dumped.substr(from, end - from) + "\n";
    from = end + 1;
  }
  pretty += "data: ]}\n\n";
  EXPECT_EQ(relay.feed(checkpoint(0, {8, 9}) + pretty), pretty);
  EXPECT_TRUE(relay.delivered().choices.at(0).finished);
  EXPECT_EQ(relay.delivered().choices.at(0).output_token_ids, (std::vector<int32_t>{8, 9}));
  EXPECT_FALSE(relay.delivered().resumable());
  EXPECT_FALSE(relay.problem().has_value()) << relay.problem()->to_string();

  const std::string error =
      "data: { \"error\" : { \"type\" : \"server_error\", \"message\" : "
      "\"prefill node http://10.0.0.7:8100 said Bearer cluster-secret\" } }\n\n";
  const std::string sent = relay.feed(error);
  EXPECT_EQ(sent.find("10.0.0.7"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("cluster-secret"), std::string::npos) << sent;
  EXPECT_EQ(Json::parse(sent.substr(6))["error"]["message"],
            "prefill node <internal> said Bearer <redacted>");

  const std::string usage =
      "data: {\"usage\": {\"pdserve_timeline\": " + kTimeline.dump(2) +
      ", \"completion_tokens\": 3, \"prompt_tokens\": 4}, \"choices\": []}\n\n";
  std::string one_line_usage = usage;
  std::erase(one_line_usage, '\n');
  one_line_usage += "\n\n";
  EXPECT_EQ(relay.feed(one_line_usage), "") << "held for the client's timeline";
  ASSERT_TRUE(relay.timeline().has_value());
  EXPECT_EQ(*relay.timeline(), kTimeline);
  ASSERT_TRUE(relay.usage().has_value());
  EXPECT_EQ(relay.usage()->prompt_tokens, 4);
  EXPECT_EQ(relay.usage()->completion_tokens, 3);
}

}  // namespace
}  // namespace pdserve::proxy
