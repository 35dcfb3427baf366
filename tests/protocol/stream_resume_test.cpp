// The stream resumption messages: each round-trips through its one serialiser and parser, and
// malformed ones are InvalidArgument naming the field.
#include "common/protocol/stream_resume.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::json;

const SamplerRng::State kState = {1, 0xFFFFFFFFFFFFFFFFull, 3, 0x8000000000000000ull};

TEST(StreamCheckpoint, RoundTripsAsAnSseComment) {
  const StreamCheckpoint checkpoint{"cmpl-1f", 1764000000, {5, 151645, 0}, kState};
  const std::string comment = checkpoint.to_comment();
  EXPECT_TRUE(comment.starts_with(kStreamCheckpointPrefix));
  EXPECT_TRUE(comment.ends_with("}\n\n"));
  EXPECT_EQ(comment.find('\n'), comment.size() - 2) << "one line: " << comment;
  Result<StreamCheckpoint> parsed = StreamCheckpoint::parse_comment(comment);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->id, checkpoint.id);
  EXPECT_EQ(parsed->created, checkpoint.created);
  EXPECT_EQ(parsed->token_ids, checkpoint.token_ids);
  EXPECT_EQ(parsed->sampler_state, kState);

  const StreamCheckpoint first{"chatcmpl-2", 7, {}, std::nullopt};
  Result<StreamCheckpoint> no_state = StreamCheckpoint::parse_comment(first.to_comment());
  ASSERT_TRUE(no_state.ok()) << no_state.status().to_string();
  EXPECT_TRUE(no_state->token_ids.empty());
  EXPECT_FALSE(no_state->sampler_state.has_value());
}

TEST(StreamCheckpoint, MalformedCommentsAreRefused) {
  const auto refused = [](const std::string& event, const std::string& mention) {
    Result<StreamCheckpoint> parsed = StreamCheckpoint::parse_comment(event);
    ASSERT_FALSE(parsed.ok()) << event;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(mention), std::string::npos)
        << parsed.status().to_string();
  };
  refused(": pdserve_timeline {}", "does not start");
  refused(": pdserve_resume [1]", "not a JSON object");
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1}", "token_ids");
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[-1]}", "token_ids");
  refused(": pdserve_resume {\"id\":\"\",\"created\":1,\"token_ids\":[]}", "'id' is empty");
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[],\"sampler_state\":[1,2]}",
          "sampler_state");
  refused(
      ": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[],"
      "\"sampler_state\":[1,2,3,-4]}",
      "sampler_state");
  refused(": pdserve_resume " + std::string(100000, '['), "");
}

TEST(StreamResume, RoundTripsAsJson) {
  const StreamResume resume{"cmpl-9", 42, {1, 2, 3}, kState};
  Result<StreamResume> parsed = StreamResume::parse(Json::parse(resume.to_json().dump()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->id, resume.id);
  EXPECT_EQ(parsed->created, resume.created);
  EXPECT_EQ(parsed->output_token_ids, resume.output_token_ids);
  EXPECT_EQ(parsed->sampler_state, kState);
}

TEST(StreamResume, TokensNeedTheSamplerStateAndBadFieldsAreRefused) {
  Result<StreamResume> before_any_token =
      StreamResume::parse({{"id", "cmpl-1"}, {"created", 1}, {"output_token_ids", Json::array()}});
  ASSERT_TRUE(before_any_token.ok()) << before_any_token.status().to_string();
  const auto refused = [](const Json& json, const std::string& mention) {
    Result<StreamResume> parsed = StreamResume::parse(json);
    ASSERT_FALSE(parsed.ok()) << json.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(mention), std::string::npos)
        << parsed.status().to_string();
  };
  refused({{"id", "cmpl-1"}, {"created", 1}, {"output_token_ids", {4}}}, "sampler_state");
  refused(Json::array(), "not a JSON object");
  refused({{"created", 1}, {"output_token_ids", Json::array()}}, "'id'");
  refused({{"id", "c"}, {"created", "yesterday"}, {"output_token_ids", Json::array()}}, "created");
  refused({{"id", "c"}, {"created", 1}, {"output_token_ids", {1.5}}}, "output_token_ids");
}

}  // namespace
}  // namespace pdserve
