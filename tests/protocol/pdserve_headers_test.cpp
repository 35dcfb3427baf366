#include "common/protocol/pdserve_headers.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(TimelineHeader, OneTrueOrOnAskInAnyCaseAnythingElseDoesNot) {
  for (const char* yes : {"1", "true", "TRUE", "on", "On"}) {
    EXPECT_TRUE(timeline_requested(std::string_view(yes))) << yes;
  }
  for (const char* no : {"0", "", "false", "off", "yes please", "11", " 1"}) {
    EXPECT_FALSE(timeline_requested(std::string_view(no))) << no;
  }
  EXPECT_FALSE(timeline_requested(std::nullopt));
}

}  // namespace
}  // namespace pdserve
