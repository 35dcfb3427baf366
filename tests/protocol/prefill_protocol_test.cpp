// The prefill node's event stream: what the decode node needs for the request's timeline
// survives a round trip, and malformed timeline fields are refused naming the field.
#include "common/protocol/prefill_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace pdserve {
namespace {

PrefillEvent first_token_event() {
  PrefillEvent event;
  event.kind = PrefillEvent::Kind::kFirstToken;
  event.token = 42;
  event.rng_state = {1, 2, 3, 4};
  event.cached_tokens = 16;
  event.queue_ms = 1.5;
  event.compute_ms = 20.25;
  event.head_sent_ms = 0.75;
  event.spans = {{"prefill.queue", 0.5, 2.0, {}},
                 {"prefill.chunk", 2.0, 12.5, {{"prompt_tokens", 32}, {"batch_tokens", 40}}},
                 {"prefill.chunk", 12.5, 22.25, {{"prompt_tokens", 8}, {"batch_tokens", 8}}}};
  return event;
}

// The line without its '\n', as the reader hands it over.
std::string line_of(const PrefillEvent& event) {
  std::string line = prefill_event_line(event);
  EXPECT_EQ(line.back(), '\n');
  line.pop_back();
  return line;
}

TEST(PrefillEventTest, FirstTokenKeepsSpansAndHeadTime) {
  const PrefillEvent sent = first_token_event();
  Result<PrefillEvent> parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->kind, PrefillEvent::Kind::kFirstToken);
  EXPECT_EQ(parsed->token, 42);
  EXPECT_DOUBLE_EQ(parsed->head_sent_ms, 0.75);
  ASSERT_EQ(parsed->spans.size(), 3u);
  EXPECT_EQ(parsed->spans[1].name, "prefill.chunk");
  EXPECT_DOUBLE_EQ(parsed->spans[1].start_ms, 2.0);
  EXPECT_DOUBLE_EQ(parsed->spans[1].end_ms, 12.5);
  // args come back as an object (keys in any order).
  std::vector<std::pair<std::string, double>> args = parsed->spans[1].args;
  std::ranges::sort(args);
  EXPECT_EQ(args, (std::vector<std::pair<std::string, double>>{{"batch_tokens", 40},
                                                               {"prompt_tokens", 32}}));
  EXPECT_TRUE(parsed->spans[0].args.empty());
}

TEST(PrefillEventTest, KvSentKeepsLayersAndSpans) {
  PrefillEvent sent;
  sent.kind = PrefillEvent::Kind::kKvSent;
  sent.bytes = 117440512;
  sent.blocks = 64;
  sent.transfer_ms = 210.5;
  sent.layers = 28;
  sent.layers_overlapped = 27;
  sent.spans = {{"kv.transfer", 20.0, 230.5, {{"bytes", 117440512}, {"blocks", 64}}},
                {"prefill.request", 0.0, 231.0, {}}};
  Result<PrefillEvent> parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->bytes, 117440512u);
  EXPECT_EQ(parsed->blocks, 64);
  EXPECT_EQ(parsed->layers, 28);
  EXPECT_EQ(parsed->layers_overlapped, 27);
  ASSERT_EQ(parsed->spans.size(), 2u);
  EXPECT_EQ(parsed->spans[0].name, "kv.transfer");
  EXPECT_DOUBLE_EQ(parsed->spans[0].end_ms, 230.5);
  EXPECT_EQ(parsed->spans[1].name, "prefill.request");
}

TEST(PrefillEventTest, KvSentKeepsItsBlockChecksumsBitExact) {
  PrefillEvent sent;
  sent.kind = PrefillEvent::Kind::kKvSent;
  sent.blocks = 3;
  // Above 2^53 and 2^63: a JSON double would round them.
  sent.block_checksums = {0, 0x0123456789abcdefULL, 0xfedcba9876543211ULL};
  Result<PrefillEvent> parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->block_checksums, sent.block_checksums);
  // Without checksums the field is left out and comes back empty.
  sent.block_checksums.clear();
  EXPECT_EQ(line_of(sent).find("block_checksums"), std::string::npos);
  parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->block_checksums.empty());
}

// A three-token prompt for one block of an eight-block pool: what each test then changes.
PrefillWork minimal_work() {
  PrefillWork work;
  work.request_id = "r";
  work.prompt_token_ids = {1, 2, 3};
  work.kv_descriptor = "AAAA";
  work.kv_num_blocks = 8;
  work.kv_layout = {2, 16, 8, 128, "float32"};
  work.block_ids = {5};
  return work;
}

TEST(PrefillWorkTest, TheChecksumRequestSurvivesARoundTripAndDefaultsToOff) {
  PrefillWork work = minimal_work();
  work.kv_checksum = true;
  nlohmann::json json = prefill_work_to_json(work);
  Result<PrefillWork> parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->kv_checksum);
  json["kv"].erase("checksum");
  parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_FALSE(parsed->kv_checksum);
}

// An FP8 pool's dtype and per-layer scales travel bit-exact, so that a prefill node can refuse
// blocks quantized otherwise; a pool without scales sends none and reads back empty.
TEST(PrefillWorkTest, TheKvDtypeAndFp8ScalesSurviveARoundTripAndDecideEquality) {
  PrefillWork work = minimal_work();
  work.kv_layout = kv_block_layout(KvLayout{2, 8, 16, 8, 128, DType::kF8E4M3}, {0.1f, 3.0e-3f},
                                   {1.0f / 3.0f, 448.0f});
  EXPECT_EQ(work.kv_layout.dtype, "float8_e4m3fn");
  nlohmann::json json = prefill_work_to_json(work);
  Result<PrefillWork> parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->kv_layout, work.kv_layout);
  EXPECT_NE(parsed->kv_layout.to_string().find("k_scale [0.1, 0.003]"), std::string::npos)
      << parsed->kv_layout.to_string();
  KvBlockLayout unit = work.kv_layout;
  unit.k_scales.clear();
  unit.v_scales.clear();
  EXPECT_FALSE(unit == work.kv_layout) << "other scales are another layout";
  KvBlockLayout bf16 = unit;
  bf16.dtype = "bfloat16";
  EXPECT_FALSE(bf16 == unit) << "another dtype is another layout";
  json["kv"]["layout"].erase("k_scales");
  json["kv"]["layout"].erase("v_scales");
  parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->kv_layout, unit);
  json["kv"]["layout"]["k_scales"] = {1.0, -2.0};
  parsed = parse_prefill_work(json.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("k_scales"), std::string::npos);
}

// The prefill node samples the first token: the request's logit_bias must reach it.
TEST(PrefillWorkTest, LogitBiasSurvivesARoundTripAndMalformedOnesAreRefused) {
  PrefillWork work = minimal_work();
  work.sampling.logit_bias = {{7, 100.0f}, {3, -2.5f}};
  nlohmann::json json = prefill_work_to_json(work);
  Result<PrefillWork> parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->sampling.logit_bias, work.sampling.logit_bias);
  json["sampling"].erase("logit_bias");
  parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->sampling.logit_bias.empty());
  json["sampling"]["logit_bias"] = {{7}};
  parsed = parse_prefill_work(json.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("logit_bias"), std::string::npos);
}

TEST(PrefillWorkTest, AScriptedOutputTravelsWithTheSampling) {
  PrefillWork work = minimal_work();
  work.sampling.scripted_output = {151657, 198};
  Result<PrefillWork> parsed = parse_prefill_work(prefill_work_to_json(work).dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->sampling.scripted_output, work.sampling.scripted_output);
  work.sampling.scripted_output.clear();
  const nlohmann::json plain = prefill_work_to_json(work);
  EXPECT_FALSE(plain["sampling"].contains("scripted_output"));
  parsed = parse_prefill_work(plain.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->sampling.scripted_output.empty());
}

TEST(PrefillWorkTest, PromptLogprobsTravelWithTheSamplingAndDefaultToNone) {
  PrefillWork work = minimal_work();
  work.sampling.prompt_logprobs = 3;
  Result<PrefillWork> parsed = parse_prefill_work(prefill_work_to_json(work).dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->sampling.prompt_logprobs, 3);
  work.sampling.prompt_logprobs.reset();
  parsed = parse_prefill_work(prefill_work_to_json(work).dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_FALSE(parsed->sampling.prompt_logprobs.has_value());
}

// The prompt's logprobs ride on the first token, bit-exact (a float's shortest decimal form
// reads back as the same float).
TEST(PrefillEventTest, PromptLogprobsSurviveARoundTripBitExact) {
  PrefillEvent sent = first_token_event();
  sent.prompt_logprobs = std::vector<PromptTokenLogprob>{
      {7, -0.1234567f, 2, {{9, -0.0312f}, {7, -0.1234567f}}}, {151645, -17.25f, 9001, {}}};
  Result<PrefillEvent> parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_TRUE(parsed->prompt_logprobs.has_value());
  EXPECT_EQ(*parsed->prompt_logprobs, *sent.prompt_logprobs);
  // Absent (no prompt logprobs asked) and empty (a one-token prompt) stay apart.
  EXPECT_FALSE(parse_prefill_event(line_of(first_token_event()))->prompt_logprobs.has_value());
  sent.prompt_logprobs.emplace();
  parsed = parse_prefill_event(line_of(sent));
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(parsed->prompt_logprobs.has_value());
  EXPECT_TRUE(parsed->prompt_logprobs->empty());
}

TEST(PrefillEventTest, MalformedPromptLogprobsAreRefused) {
  nlohmann::json json = nlohmann::json::parse(line_of(first_token_event()));
  for (const nlohmann::json& bad :
       {nlohmann::json(7), nlohmann::json::array({nlohmann::json::array({1, -0.5, 1})}),
        nlohmann::json::array({nlohmann::json::array({1, -0.5, 1, nlohmann::json::array({1})})}),
        nlohmann::json::array({nlohmann::json::array({"x", -0.5, 1, nlohmann::json::array()})})}) {
    json["prompt_logprobs"] = bad;
    const Result<PrefillEvent> parsed = parse_prefill_event(json.dump());
    ASSERT_FALSE(parsed.ok()) << bad.dump();
    EXPECT_NE(parsed.status().message().find("prompt_logprobs"), std::string::npos);
  }
}

// The prefill node samples the first token under the decode node's constraint.
TEST(PrefillWorkTest, TheStructuredOutputSurvivesARoundTrip) {
  PrefillWork work = minimal_work();
  work.sampling.structured_output =
      StructuredOutput{StructuredOutput::Kind::kToolCalls, R"({"tools": [{"name": "f"}]})"};
  nlohmann::json json = prefill_work_to_json(work);
  Result<PrefillWork> parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->sampling.structured_output, work.sampling.structured_output);
  json["sampling"]["structured_output"]["kind"] = "yaml";
  parsed = parse_prefill_work(json.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("structured_output.kind"), std::string::npos);
  json["sampling"].erase("structured_output");
  parsed = parse_prefill_work(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_FALSE(parsed->sampling.structured_output.has_value());
}

// Replaces `from` (which must occur) in the event's line by `to`.
std::string edited(const PrefillEvent& event, const std::string& from, const std::string& to) {
  std::string line = line_of(event);
  const size_t at = line.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in " << line;
  if (at != std::string::npos) line.replace(at, from.size(), to);
  return line;
}

void expect_refused(const std::string& line, const std::string& message_part) {
  Result<PrefillEvent> parsed = parse_prefill_event(line);
  ASSERT_FALSE(parsed.ok()) << line;
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find(message_part), std::string::npos)
      << parsed.status().message() << " does not say " << message_part;
}

TEST(PrefillEventTest, MalformedTimelineFieldsAreRefusedByName) {
  const PrefillEvent event = first_token_event();
  expect_refused(edited(event, "\"head_sent_ms\":0.75", "\"head_sent_ms\":-1"), "head_sent_ms");
  expect_refused(edited(event, "\"head_sent_ms\":0.75", "\"head_sent_ms\":\"soon\""),
                 "'head_sent_ms' must be a number");
  expect_refused(edited(event, "\"head_sent_ms\":0.75,", ""), "'head_sent_ms' is missing");
  // The second chunk ends before it starts.
  expect_refused(edited(event, "\"end_ms\":12.5", "\"end_ms\":1.0"),
                 "spans[1] ('prefill.chunk'): needs 0 <= start_ms <= end_ms");
  expect_refused(edited(event, "\"prompt_tokens\":32.0", "\"prompt_tokens\":\"32\""),
                 "spans[1]: args.prompt_tokens must be a number");
  expect_refused(edited(event, "\"name\":\"prefill.queue\"", "\"name\":\"\""),
                 "spans[0]: 'name' is empty");
  expect_refused(edited(event, "\"name\":\"prefill.queue\",", ""), "spans[0]: 'name' is missing");
  expect_refused(edited(event, "\"spans\":[", "\"spans\":\"none\",\"x\":["),
                 "'spans' must be an array");
}

TEST(PrefillEventTest, KvSentWithMoreOverlappedLayersThanLayersIsRefused) {
  PrefillEvent sent;
  sent.kind = PrefillEvent::Kind::kKvSent;
  sent.layers = 2;
  sent.layers_overlapped = 3;
  expect_refused(line_of(sent), "layers_overlapped");
  sent.layers_overlapped = 2;
  EXPECT_TRUE(parse_prefill_event(line_of(sent)).ok());
  expect_refused(edited(sent, "\"layers\":2,", ""), "'layers' is missing");
  expect_refused(edited(sent, ",\"spans\":[]", ""), "'spans' must be an array");
  sent.block_checksums = {7};
  expect_refused(edited(sent, "[7]", "[-7]"), "'block_checksums' must hold unsigned integers");
  expect_refused(edited(sent, "[7]", "7"), "'block_checksums' is no array");
}

TEST(PrefillProtocolTest, DeeplyNestedWorkAndEventsAreRefusedBeforeParsing) {
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  expect_refused(edited(first_token_event(), "\"spans\":[", "\"spans\":" + deep + ",\"x\":["),
                 "prefill event nests deeper than 64 levels");
  Result<PrefillWork> work =
      parse_prefill_work(R"({"request_id": "r", "kv": {"layout": )" + deep + "}}");
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(work.status().message().find("prefill work nests deeper than 64 levels"),
            std::string::npos)
      << work.status().message();
}

}  // namespace
}  // namespace pdserve
