// The stream resumption messages: each round-trips through its one serialiser and parser, and
// malformed ones are InvalidArgument naming the field.
#include "common/protocol/stream_resume.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::json;

const SamplerRng::State kState = {1, 0xFFFFFFFFFFFFFFFFull, 3, 0x8000000000000000ull};

TEST(StreamCheckpoint, RoundTripsAsAnSseComment) {
  const StreamCheckpoint checkpoint{"cmpl-1f", 1764000000, 4, 3, {5, 151645, 0}, kState};
  const std::string comment = checkpoint.to_comment();
  EXPECT_TRUE(comment.starts_with(kStreamCheckpointPrefix));
  EXPECT_TRUE(comment.ends_with("}\n\n"));
  EXPECT_EQ(comment.find('\n'), comment.size() - 2) << "one line: " << comment;
  Result<StreamCheckpoint> parsed = StreamCheckpoint::parse_comment(comment);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->id, checkpoint.id);
  EXPECT_EQ(parsed->created, checkpoint.created);
  EXPECT_EQ(parsed->choices, 4);
  EXPECT_EQ(parsed->index, 3);
  EXPECT_EQ(parsed->token_ids, checkpoint.token_ids);
  EXPECT_EQ(parsed->sampler_state, kState);

  const StreamCheckpoint first{"chatcmpl-2", 7, 1, 0, {}, std::nullopt};
  Result<StreamCheckpoint> no_state = StreamCheckpoint::parse_comment(first.to_comment());
  ASSERT_TRUE(no_state.ok()) << no_state.status().to_string();
  EXPECT_TRUE(no_state->token_ids.empty());
  EXPECT_FALSE(no_state->sampler_state.has_value());

  // Without "choices" and "index" (a node of an older version): choice 0 of 1.
  Result<StreamCheckpoint> older = StreamCheckpoint::parse_comment(
      ": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[4]}");
  ASSERT_TRUE(older.ok()) << older.status().to_string();
  EXPECT_EQ(older->choices, 1);
  EXPECT_EQ(older->index, 0);
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
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[],\"choices\":0}",
          "'choices'");
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[],\"choices\":2,"
          "\"index\":2}",
          "'index'");
  refused(": pdserve_resume {\"id\":\"x\",\"created\":1,\"token_ids\":[],\"index\":-1}",
          "'index'");
}

TEST(StreamResume, RoundTripsAsJson) {
  const StreamResume resume{
      "cmpl-9", 42, {{{1, 2, 3}, kState, false}, {{}, std::nullopt, false}, {{7}, std::nullopt, true}}};
  Result<StreamResume> parsed = StreamResume::parse(Json::parse(resume.to_json().dump()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->id, resume.id);
  EXPECT_EQ(parsed->created, resume.created);
  ASSERT_EQ(parsed->choices.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parsed->choices[i].output_token_ids, resume.choices[i].output_token_ids) << i;
    EXPECT_EQ(parsed->choices[i].sampler_state, resume.choices[i].sampler_state) << i;
    EXPECT_EQ(parsed->choices[i].finished, resume.choices[i].finished) << i;
  }
}

TEST(StreamResume, TokensNeedTheSamplerStateAndBadFieldsAreRefused) {
  const auto with_choices = [](Json choices) {
    return Json{{"id", "cmpl-1"}, {"created", 1}, {"choices", std::move(choices)}};
  };
  Result<StreamResume> before_any_token = StreamResume::parse(
      with_choices({{{"index", 0}, {"output_token_ids", Json::array()}}}));
  ASSERT_TRUE(before_any_token.ok()) << before_any_token.status().to_string();
  // A finished choice is not continued: it needs no sampler state.
  Result<StreamResume> finished = StreamResume::parse(with_choices(
      {{{"index", 0}, {"output_token_ids", {4}}, {"finished", true}},
       {{"index", 1}, {"output_token_ids", Json::array()}}}));
  ASSERT_TRUE(finished.ok()) << finished.status().to_string();
  EXPECT_TRUE(finished->choices[0].finished);
  EXPECT_FALSE(finished->choices[1].finished);
  const auto refused = [](const Json& json, const std::string& mention) {
    Result<StreamResume> parsed = StreamResume::parse(json);
    ASSERT_FALSE(parsed.ok()) << json.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(mention), std::string::npos)
        << parsed.status().to_string();
  };
  refused(with_choices({{{"index", 0}, {"output_token_ids", {4}}}}), "sampler_state");
  refused(Json::array(), "not a JSON object");
  refused({{"created", 1}, {"choices", Json::array()}}, "'id'");
  refused({{"id", "c"}, {"created", "yesterday"}, {"choices", Json::array()}}, "created");
  refused({{"id", "c"}, {"created", 1}}, "'choices'");
  refused(with_choices(Json::array()), "'choices'");
  refused(with_choices({{{"index", 0}, {"output_token_ids", {1.5}}}}), "output_token_ids");
  refused(with_choices({{{"index", 1}, {"output_token_ids", Json::array()}}}), "'index' must be 0");
  refused(with_choices({{{"index", 0}, {"output_token_ids", Json::array()}},
                        {{"index", 0}, {"output_token_ids", Json::array()}}}),
          "choices[1]: 'index' must be 1");
  refused(with_choices({{{"index", 0}, {"output_token_ids", Json::array()}}, 3}),
          "choices[1] is not a JSON object");
  refused(with_choices({{{"index", 0}, {"output_token_ids", Json::array()}, {"finished", 1}}}),
          "finished");
}

}  // namespace
}  // namespace pdserve
