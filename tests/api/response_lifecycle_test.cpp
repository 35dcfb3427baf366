// ResponseLifecycle transition by transition: what may be written when, and how a failure
// reaches the client (an HTTP error before anything was written, an SSE error event in an open
// stream, nothing once answered).
#include "serving/openai/response_lifecycle.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(ResponseLifecycle, AStreamOpensOnceAndFailsWithAnErrorEvent) {
  ResponseLifecycle lifecycle(/*stream=*/true);
  EXPECT_EQ(lifecycle.phase(), ResponsePhase::kAccepted);
  EXPECT_TRUE(lifecycle.open());
  EXPECT_EQ(lifecycle.phase(), ResponsePhase::kStreaming);
  EXPECT_FALSE(lifecycle.open()) << "a second open must not write a second head";
  EXPECT_EQ(lifecycle.fail(), FailureDelivery::kErrorEvent);
  EXPECT_TRUE(lifecycle.answered());
  EXPECT_EQ(lifecycle.fail(), FailureDelivery::kDropped);
  EXPECT_FALSE(lifecycle.finish());
  EXPECT_FALSE(lifecycle.open());
}

TEST(ResponseLifecycle, AStreamThatFailsBeforeItsHeadIsAnHttpError) {
  // A remotely prefilled stream's head waits for its first delta: a refusal before it is a
  // plain HTTP error the proxy can act on.
  ResponseLifecycle lifecycle(/*stream=*/true);
  EXPECT_EQ(lifecycle.fail(), FailureDelivery::kErrorResponse);
  EXPECT_EQ(lifecycle.phase(), ResponsePhase::kAnswered);
  EXPECT_FALSE(lifecycle.open());
}

TEST(ResponseLifecycle, AWholeAnswerHasNoHeadBeforeItsBody) {
  ResponseLifecycle lifecycle(/*stream=*/false);
  EXPECT_FALSE(lifecycle.open());
  EXPECT_EQ(lifecycle.phase(), ResponsePhase::kAccepted);
  EXPECT_FALSE(lifecycle.open());
  EXPECT_EQ(lifecycle.fail(), FailureDelivery::kErrorResponse) << "nothing was written yet";
}

TEST(ResponseLifecycle, FinishAnswersOnce) {
  for (const bool stream : {false, true}) {
    ResponseLifecycle lifecycle(stream);
    lifecycle.open();
    EXPECT_TRUE(lifecycle.finish());
    EXPECT_EQ(lifecycle.phase(), ResponsePhase::kAnswered);
    EXPECT_FALSE(lifecycle.finish());
    EXPECT_EQ(lifecycle.fail(), FailureDelivery::kDropped) << "a late failure writes nothing";
  }
}

TEST(ResponseLifecycle, AnsweredElsewhereDropsEveryLaterEvent) {
  ResponseLifecycle lifecycle(/*stream=*/true);
  lifecycle.answer_elsewhere();
  EXPECT_TRUE(lifecycle.answered());
  EXPECT_FALSE(lifecycle.open());
  EXPECT_FALSE(lifecycle.finish());
  EXPECT_EQ(lifecycle.fail(), FailureDelivery::kDropped);
}

TEST(ResponseLifecycle, PhasesHaveNames) {
  EXPECT_STREQ(response_phase_name(ResponsePhase::kAccepted), "accepted");
  EXPECT_STREQ(response_phase_name(ResponsePhase::kStreaming), "streaming");
  EXPECT_STREQ(response_phase_name(ResponsePhase::kAnswered), "answered");
}

}  // namespace
}  // namespace pdserve
