#include "kv_transfer/descriptor.h"

#include <gtest/gtest.h>

namespace pdserve::kv_transfer {
namespace {

// RFC 4648 section 10 test vectors.
TEST(Base64, MatchesRfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    auto decoded = base64_decode(encoded);
    ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    EXPECT_EQ(*decoded, plain);
  }
}

TEST(Base64, RoundTripsEveryByteValue) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  for (std::size_t length = 0; length <= bytes.size(); length += 37) {
    const std::string slice = bytes.substr(0, length);
    auto decoded = base64_decode(base64_encode(slice));
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, slice);
  }
}

TEST(Base64, RejectsMalformedText) {
  EXPECT_EQ(base64_decode("Zm9").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(base64_decode("Zm9*").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(base64_decode("Z===").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(base64_decode("Zg==Zm9v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(base64_decode("Zm=v").status().code(), StatusCode::kInvalidArgument);
}

PeerDescriptor sample_descriptor() {
  return {{1, 2, 3, 4, 5}, {9, 8, 7}, 0x7f0012345000ull, 1ull << 30};
}

TEST(PeerDescriptor, RoundTripsThroughBytesAndBase64) {
  const PeerDescriptor original = sample_descriptor();
  auto parsed = parse_descriptor(serialize_descriptor(original));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(*parsed, original);
  auto bytes = base64_decode(base64_encode(serialize_descriptor(original)));
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*parse_descriptor(*bytes), original);
}

TEST(PeerDescriptor, EveryTruncationIsRejected) {
  const std::string bytes = serialize_descriptor(sample_descriptor());
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    auto parsed = parse_descriptor(std::string_view(bytes).substr(0, length));
    EXPECT_FALSE(parsed.ok()) << "accepted a descriptor cut at " << length;
  }
}

TEST(PeerDescriptor, RejectsBadMagicVersionTrailingBytesAndEmptyPool) {
  std::string bytes = serialize_descriptor(sample_descriptor());
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_EQ(parse_descriptor(bad_magic).status().code(), StatusCode::kInvalidArgument);
  std::string bad_version = bytes;
  bad_version[4] = 9;
  EXPECT_EQ(parse_descriptor(bad_version).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_descriptor(bytes + "x").status().code(), StatusCode::kDataLoss);
  PeerDescriptor empty_pool = sample_descriptor();
  empty_pool.pool_bytes = 0;
  EXPECT_EQ(parse_descriptor(serialize_descriptor(empty_pool)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::kv_transfer
