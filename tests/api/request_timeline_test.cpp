// The timeline's arithmetic against values worked out by hand: clock alignment, TPOT, spans per
// choice, the prefill node's spans shifted onto the decode node's clock.
#include "serving/openai/request_timeline.h"

#include <gtest/gtest.h>

#include <map>

namespace pdserve {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Json = nlohmann::ordered_json;

const SteadyTime kArrival = std::chrono::steady_clock::now();

SteadyTime at_ms(double ms) {
  return kArrival + std::chrono::duration_cast<SteadyTime::duration>(
                        std::chrono::duration<double, std::milli>(ms));
}

// The spans named `name`, by args.index.
std::map<int, Json> spans_named(const Json& timeline, const std::string& name) {
  std::map<int, Json> out;
  for (const Json& span : timeline["spans"]) {
    if (span["name"] == name) {
      EXPECT_FALSE(out.contains(span["args"]["index"].get<int>())) << name << " twice";
      out[span["args"]["index"].get<int>()] = span;
    }
  }
  return out;
}

int count_named(const Json& timeline, const std::string& name) {
  int count = 0;
  for (const Json& span : timeline["spans"]) count += span["name"] == name;
  return count;
}

TEST(RequestTimelineTest, AlignmentSplitsTheRoundTripEvenly) {
  // Sent at 10, head back at 30 (20 round trip), callee held it 4 ms: 8 ms each way.
  EXPECT_DOUBLE_EQ(aligned_receipt_ms(10, 30, 4), 18.0);
  // A callee that answered at once: half the round trip.
  EXPECT_DOUBLE_EQ(aligned_receipt_ms(0, 2, 0), 1.0);
  // A callee that claims to have held it longer than the round trip: received when sent.
  EXPECT_DOUBLE_EQ(aligned_receipt_ms(10, 12, 5), 10.0);
  // Whatever the delays, the receipt falls between sending and the head's return minus the
  // callee's own time.
  for (double held : {0.0, 1.0, 5.0, 9.0}) {
    const double receipt = aligned_receipt_ms(100, 110, held);
    EXPECT_GE(receipt, 100.0);
    EXPECT_LE(receipt + held, 110.0);
  }
}

TEST(RequestTimelineTest, TimePerOutputTokenNeedsTwoTokens) {
  EXPECT_DOUBLE_EQ(*time_per_output_token_ms(100, 400, 4), 100.0);
  EXPECT_DOUBLE_EQ(*time_per_output_token_ms(50, 60, 2), 10.0);
  EXPECT_FALSE(time_per_output_token_ms(50, 50, 1).has_value());
  EXPECT_FALSE(time_per_output_token_ms(0, 0, 0).has_value());
}

ChoiceTimeline colocated_choice(int index, double offset_ms, int tokens) {
  ChoiceTimeline choice;
  choice.index = index;
  RequestTimings& timings = choice.timings;
  timings.arrival = at_ms(1 + offset_ms);
  timings.first_scheduled = at_ms(3 + offset_ms);
  timings.prefill_chunks = {{at_ms(3 + offset_ms), at_ms(13 + offset_ms), 64, 70},
                            {at_ms(13 + offset_ms), at_ms(20 + offset_ms), 16, 20}};
  timings.first_token = at_ms(20 + offset_ms);
  timings.finished = at_ms(20 + offset_ms + 10.0 * (tokens - 1));
  choice.completion_tokens = tokens;
  choice.final_delta = at_ms(20.5 + offset_ms + 10.0 * (tokens - 1));
  return choice;
}

TEST(RequestTimelineTest, ColocatedRequestWithTwoChoices) {
  RequestTimelineInput input;
  input.request_id = "cmpl-1";
  input.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  input.node = "decode http://127.0.0.1:8200";
  input.arrival = kArrival;
  input.head_sent = at_ms(0.25);
  input.choices = {colocated_choice(0, 0, 5), colocated_choice(1, 2, 3)};
  for (int i = 0; i < 5; ++i) input.token_times.push_back(at_ms(20.5 + 10.0 * i));

  const Json timeline = build_request_timeline(input).to_json();
  EXPECT_EQ(timeline["version"], 1);
  EXPECT_EQ(timeline["request_id"], "cmpl-1");
  EXPECT_EQ(timeline["trace_id"], input.trace_id);
  EXPECT_EQ(timeline["origin"], "decode");
  EXPECT_NEAR(timeline["sync"]["head_sent_ms"].get<double>(), 0.25, 1e-3);
  EXPECT_EQ(timeline["output_tokens"], 5);
  ASSERT_EQ(timeline["tokens_ms"].size(), 5u);
  EXPECT_NEAR(timeline["tokens_ms"][4].get<double>(), 60.5, 1e-3);
  EXPECT_NEAR(timeline["ttft_ms"].get<double>(), 20.5, 1e-3);
  EXPECT_NEAR(timeline["e2e_ms"].get<double>(), 60.5, 1e-3);
  EXPECT_NEAR(timeline["tpot_ms"].get<double>(), 10.0, 1e-3);
  EXPECT_FALSE(timeline.contains("kv_transfer"));

  // Each engine-level span once per choice.
  for (const char* name : {"decode.request", "prefill.queue", "decode.queue", "decode.steps"}) {
    EXPECT_EQ(spans_named(timeline, name).size(), 2u) << name;
  }
  EXPECT_EQ(count_named(timeline, "prefill.chunk"), 4);
  EXPECT_EQ(count_named(timeline, "prefill.remote"), 0);
  EXPECT_EQ(count_named(timeline, "decode.kv_wait"), 0);

  const Json request1 = spans_named(timeline, "decode.request").at(1);
  EXPECT_EQ(request1["node"], input.node);
  EXPECT_NEAR(request1["start_ms"].get<double>(), 0.0, 1e-3);
  EXPECT_NEAR(request1["end_ms"].get<double>(), 42.5, 1e-3);
  const Json queue1 = spans_named(timeline, "prefill.queue").at(1);
  EXPECT_NEAR(queue1["start_ms"].get<double>(), 3.0, 1e-3);
  EXPECT_NEAR(queue1["end_ms"].get<double>(), 5.0, 1e-3);
  const Json steps0 = spans_named(timeline, "decode.steps").at(0);
  EXPECT_NEAR(steps0["start_ms"].get<double>(), 20.0, 1e-3);
  EXPECT_NEAR(steps0["end_ms"].get<double>(), 60.0, 1e-3);
  EXPECT_EQ(steps0["args"]["tokens"], 4);

  int chunk_tokens = 0;
  double previous_start = -1;
  for (const Json& span : timeline["spans"]) {
    EXPECT_GE(span["start_ms"].get<double>(), previous_start) << "spans are in start order";
    previous_start = span["start_ms"].get<double>();
    if (span["name"] == "prefill.chunk" && span["args"]["index"] == 0) {
      chunk_tokens += span["args"]["prompt_tokens"].get<int>();
      EXPECT_EQ(span["node"], input.node);
    }
  }
  EXPECT_EQ(chunk_tokens, 80);
}

// A prefix reloaded from the lower KV tiers (issue #32) before the last chunk.
TEST(RequestTimelineTest, AKvTierReloadIsASpanWithItsTiersBlocks) {
  RequestTimelineInput input;
  input.request_id = "cmpl-reload";
  input.node = "decode http://127.0.0.1:8200";
  input.arrival = kArrival;
  ChoiceTimeline choice = colocated_choice(0, 0, 2);
  choice.timings.prefill_chunks = {{at_ms(6), at_ms(8), 16, 16}};
  choice.timings.kv_reload = KvReloadTiming{at_ms(3), at_ms(6), 3, 1, 64, true};
  input.choices = {choice};
  const Json timeline = build_request_timeline(input).to_json();
  const Json reload = spans_named(timeline, "prefill.kv_reload").at(0);
  EXPECT_EQ(reload["node"], input.node);
  EXPECT_NEAR(reload["start_ms"].get<double>(), 3.0, 1e-3);
  EXPECT_NEAR(reload["end_ms"].get<double>(), 6.0, 1e-3);
  EXPECT_EQ(reload["args"]["host_blocks"], 3);
  EXPECT_EQ(reload["args"]["disk_blocks"], 1);
  EXPECT_EQ(reload["args"]["tokens"], 64);
  EXPECT_EQ(reload["args"]["ok"], 1);
  input.choices = {colocated_choice(0, 0, 2)};  // no reload: no span
  EXPECT_EQ(count_named(build_request_timeline(input).to_json(), "prefill.kv_reload"), 0);
}

// Prefilled on a prefill node whose answer's head came back 6 ms after the work was posted.
ChoiceTimeline remotely_prefilled_choice() {
  ChoiceTimeline choice;
  choice.index = 0;
  choice.completion_tokens = 3;
  RemotePrefillStats remote;
  remote.prefill_url = "http://127.0.0.1:8100";
  remote.work_posted = at_ms(2);
  remote.head_received = at_ms(8);  // 6 ms round trip, 2 ms held there: 2 ms each way
  remote.head_sent_ms = 2;
  remote.first_token_received = at_ms(40);
  remote.spans = {{"prefill.queue", 0.5, 3.0, {}},
                  {"prefill.chunk", 3.0, 30.0, {{"prompt_tokens", 96}, {"batch_tokens", 96}}},
                  {"kv.transfer", 30.0, 45.0, {{"bytes", 4096}, {"blocks", 2}}},
                  {"prefill.request", 0.0, 46.0, {}}};
  remote.transfer_bytes = 4096;
  remote.transfer_blocks = 2;
  remote.transfer_seconds = 0.015;
  remote.transfer_layers = 2;
  remote.transfer_layers_overlapped = 1;
  choice.remote_prefill = remote;
  choice.timings.arrival = at_ms(1);
  choice.timings.first_token = at_ms(40.5);
  choice.timings.kv_ready = at_ms(50);
  choice.timings.first_scheduled = at_ms(51);
  choice.timings.finished = at_ms(71);
  choice.final_delta = at_ms(71.5);
  return choice;
}

RequestTimelineInput remotely_prefilled_input() {
  RequestTimelineInput input;
  input.node = "decode http://127.0.0.1:8200";
  input.arrival = kArrival;
  input.head_sent = at_ms(41);
  input.token_times = {at_ms(41), at_ms(61), at_ms(71.5)};
  input.choices = {remotely_prefilled_choice()};
  return input;
}

TEST(RequestTimelineTest, RemotelyPrefilledSpansAreShiftedOntoThisClock) {
  ChoiceTimeline choice = remotely_prefilled_choice();
  RequestTimelineInput input = remotely_prefilled_input();
  const Json timeline = build_request_timeline(input).to_json();

  // The prefill node received the work at 2 + (6 - 2) / 2 = 4 ms on this clock.
  const Json queue = spans_named(timeline, "prefill.queue").at(0);
  EXPECT_EQ(queue["node"], "prefill http://127.0.0.1:8100");
  EXPECT_NEAR(queue["start_ms"].get<double>(), 4.5, 1e-3);
  EXPECT_NEAR(queue["end_ms"].get<double>(), 7.0, 1e-3);
  const Json transfer = spans_named(timeline, "kv.transfer").at(0);
  EXPECT_NEAR(transfer["end_ms"].get<double>(), 49.0, 1e-3);
  EXPECT_EQ(transfer["args"]["bytes"], 4096);
  EXPECT_TRUE(transfer["args"]["bytes"].is_number_integer()) << "counts print as integers";
  EXPECT_NEAR(spans_named(timeline, "prefill.request").at(0)["end_ms"].get<double>(), 50.0, 1e-3);
  const Json chunk = spans_named(timeline, "prefill.chunk").at(0);
  EXPECT_EQ(chunk["args"]["prompt_tokens"], 96);

  const Json exchange = spans_named(timeline, "prefill.remote").at(0);
  EXPECT_EQ(exchange["node"], input.node);
  EXPECT_EQ(exchange["args"]["prefill_url"], "http://127.0.0.1:8100");
  EXPECT_NEAR(exchange["start_ms"].get<double>(), 2.0, 1e-3);
  EXPECT_NEAR(exchange["end_ms"].get<double>(), 40.0, 1e-3);
  const Json kv_wait = spans_named(timeline, "decode.kv_wait").at(0);
  EXPECT_NEAR(kv_wait["start_ms"].get<double>(), 40.0, 1e-3);
  EXPECT_NEAR(kv_wait["end_ms"].get<double>(), 50.0, 1e-3);
  const Json queue_here = spans_named(timeline, "decode.queue").at(0);
  EXPECT_NEAR(queue_here["start_ms"].get<double>(), 50.0, 1e-3);
  EXPECT_NEAR(queue_here["end_ms"].get<double>(), 51.0, 1e-3);
  const Json steps = spans_named(timeline, "decode.steps").at(0);
  EXPECT_NEAR(steps["start_ms"].get<double>(), 51.0, 1e-3);
  EXPECT_EQ(steps["args"]["tokens"], 2);
  EXPECT_EQ(count_named(timeline, "prefill.queue"), 1) << "no local queue when prefilled remotely";

  const Json& kv = timeline["kv_transfer"];
  EXPECT_EQ(kv["bytes"], 4096);
  EXPECT_EQ(kv["blocks"], 2);
  EXPECT_NEAR(kv["ms"].get<double>(), 15.0, 1e-9);
  EXPECT_TRUE(kv["gb_per_s"].is_null()) << "an overlapped transfer is not a bandwidth";
  EXPECT_NEAR(kv["exposed_ms"].get<double>(), 45.0 - 30.0, 1e-9) << "after the last chunk";
  EXPECT_EQ(kv["layers"], 2);
  EXPECT_EQ(kv["layers_overlapped"], 1);

  // Without overlap the span is the link's: bytes / time.
  choice.remote_prefill->transfer_layers_overlapped = 0;
  input.choices = {choice};
  const Json plain = build_request_timeline(input).to_json()["kv_transfer"];
  EXPECT_NEAR(plain["gb_per_s"].get<double>(), 4096 / 0.015 / 1e9, 1e-12);
  EXPECT_NEAR(timeline["tpot_ms"].get<double>(), (71.5 - 41.0) / 2, 1e-3);
}

TEST(RequestTimelineTest, OneTokenHasNoTpotAndNoDecodeSteps) {
  RequestTimelineInput input;
  input.arrival = kArrival;
  input.head_sent = at_ms(1);
  input.choices = {colocated_choice(0, 0, 1)};
  input.token_times = {at_ms(20.5)};
  const Json timeline = build_request_timeline(input).to_json();
  EXPECT_TRUE(timeline["tpot_ms"].is_null());
  EXPECT_NEAR(timeline["ttft_ms"].get<double>(), 20.5, 1e-3);
  EXPECT_EQ(count_named(timeline, "decode.steps"), 0);
}

// Ended by its first token: the KV never landed, so no transfer figures and no kv_wait.
TEST(RequestTimelineTest, RemoteRequestEndedByItsFirstTokenHasNoTransfer) {
  ChoiceTimeline choice;
  choice.completion_tokens = 1;
  RemotePrefillStats remote;
  remote.prefill_url = "http://127.0.0.1:8100";
  remote.work_posted = at_ms(1);
  remote.head_received = at_ms(3);
  remote.first_token_received = at_ms(20);
  remote.spans = {{"prefill.queue", 0.0, 1.0, {}}};
  choice.remote_prefill = remote;
  choice.timings.arrival = at_ms(0.5);
  choice.timings.first_token = at_ms(20);
  choice.timings.finished = at_ms(20);
  choice.final_delta = at_ms(20.5);
  RequestTimelineInput input;
  input.arrival = kArrival;
  input.head_sent = at_ms(20.5);
  input.token_times = {at_ms(20.5)};
  input.choices = {choice};
  const Json timeline = build_request_timeline(input).to_json();
  EXPECT_FALSE(timeline.contains("kv_transfer"));
  EXPECT_EQ(count_named(timeline, "decode.kv_wait"), 0);
  EXPECT_EQ(count_named(timeline, "prefill.remote"), 1);
  // Received at 1 + (2 - 0) / 2 = 2.
  EXPECT_NEAR(spans_named(timeline, "prefill.queue").at(0)["start_ms"].get<double>(), 2.0, 1e-3);
}

// What the node writes, the proxy reads back unchanged through the wire text.
TEST(RequestTimelineTest, TheProxyReadsWhatTheNodeWrites) {
  RequestTimelineInput colocated;
  colocated.arrival = kArrival;
  colocated.head_sent = at_ms(0.25);
  colocated.choices = {colocated_choice(0, 0, 2), colocated_choice(1, 2, 1)};
  colocated.token_times = {at_ms(20.5), at_ms(30.5)};
  for (RequestTimelineInput input : {colocated, remotely_prefilled_input()}) {
    input.request_id = "cmpl-1";
    input.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    const RequestTimeline written = build_request_timeline(input);
    const Result<RequestTimeline> read =
        RequestTimeline::parse(nlohmann::json::parse(written.to_json().dump()));
    ASSERT_TRUE(read.ok()) << read.status().to_string() << "\n" << written.to_json().dump(2);
    EXPECT_EQ(*read, written);
  }
}

}  // namespace
}  // namespace pdserve
