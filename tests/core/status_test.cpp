#include "common/core/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace pdserve {
namespace {

Result<int> parse_positive(int value) {
  if (value <= 0) return invalid_argument("not positive: " + std::to_string(value));
  return value;
}

Result<int> doubled(int value) {
  PDS_ASSIGN_OR_RETURN(int checked, parse_positive(value));
  return checked * 2;
}

Status validate_both(int a, int b) {
  PDS_RETURN_IF_ERROR(parse_positive(a).status());
  PDS_RETURN_IF_ERROR(parse_positive(b).status());
  return {};
}

TEST(Status, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status error = not_found("tensor x");
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.code(), StatusCode::kNotFound);
  EXPECT_EQ(error.to_string(), "NOT_FOUND: tensor x");
  EXPECT_EQ(error.with_context("loading y").message(), "loading y: tensor x");
}

TEST(Result, PropagatesThroughMacros) {
  EXPECT_EQ(doubled(4).value(), 8);
  Result<int> failed = doubled(-1);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "not positive: -1");
  EXPECT_TRUE(validate_both(1, 2).ok());
  EXPECT_EQ(validate_both(1, 0).code(), StatusCode::kInvalidArgument);
}

TEST(Result, HoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> boxed = std::make_unique<int>(7);
  ASSERT_TRUE(boxed.ok());
  std::unique_ptr<int> taken = std::move(boxed).value();
  EXPECT_EQ(*taken, 7);
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> confused = Status();
  EXPECT_FALSE(confused.ok());
  EXPECT_EQ(confused.status().code(), StatusCode::kInternal);
}

TEST(CaptureStatus, ConvertsModuleErrorsToStatus) {
  Result<int> thrown = capture_status([]() -> Result<int> {
    PDS_ENSURE(false, StatusCode::kDataLoss, "truncated");
    return 1;
  });
  EXPECT_EQ(thrown.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(thrown.status().message(), "truncated");
}

TEST(CheckDeathTest, AbortsWithFileAndLine) {
  EXPECT_DEATH(PDS_CHECK(1 + 1 == 3, "arithmetic is broken"),
               "status_test.cpp:[0-9]+: check failed: 1 \\+ 1 == 3: arithmetic is broken");
}

}  // namespace
}  // namespace pdserve
