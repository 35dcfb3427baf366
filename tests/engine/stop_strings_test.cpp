#include "common/engine/stop_strings.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

struct Streamed {
  std::string text;
  std::optional<StopMatch> match;
};

// Streams `pieces`, checking after every push that no full stop string was emitted, that at
// most (longest stop - 1) bytes are held back, and that what was emitted is never taken back
// (each emission extends the final text).
Streamed stream(const std::vector<std::string>& pieces, const std::vector<std::string>& stops,
                bool include_stop = false) {
  size_t longest = 0;
  for (const std::string& stop : stops) longest = std::max(longest, stop.size());
  StopStringMatcher matcher(stops, include_stop);
  Streamed out;
  std::vector<size_t> emitted_lengths;
  for (const std::string& piece : pieces) {
    out.text += matcher.push(piece);
    emitted_lengths.push_back(out.text.size());
    if (matcher.match()) continue;
    for (const std::string& stop : stops) {
      EXPECT_EQ(out.text.find(stop), std::string::npos) << "a full stop string was streamed";
    }
    EXPECT_LE(matcher.held_bytes(), longest == 0 ? 0 : longest - 1);
  }
  out.text += matcher.finish();
  out.match = matcher.match();
  for (size_t length : emitted_lengths) EXPECT_LE(length, out.text.size());
  return out;
}

std::vector<std::string> chars(std::string_view text) {
  std::vector<std::string> pieces;
  for (char c : text) pieces.emplace_back(1, c);
  return pieces;
}

// Independent oracle: scan end offsets in order; at the first end where some stop string ends,
// take the earliest-beginning one.
Streamed brute_force(std::string_view text, const std::vector<std::string>& stops,
                     bool include_stop) {
  for (size_t end = 1; end <= text.size(); ++end) {
    for (size_t begin = 0; begin < end; ++begin) {
      for (size_t i = 0; i < stops.size(); ++i) {
        if (text.substr(begin, end - begin) == stops[i]) {
          return {std::string(text.substr(0, include_stop ? end : begin)), StopMatch{i, stops[i]}};
        }
      }
    }
  }
  return {std::string(text), std::nullopt};
}

TEST(StopStrings, TruncatesBeforeTheMatchAndReportsIt) {
  Streamed out = stream({"Hello ", "wor", "ld"}, {"world"});
  EXPECT_EQ(out.text, "Hello ");
  ASSERT_TRUE(out.match);
  EXPECT_EQ(out.match->stop, "world");
  EXPECT_EQ(out.match->stop_index, 0u);
}

TEST(StopStrings, HoldsBackAPartialStopStringUntilItIsSettled) {
  StopStringMatcher matcher({"</end>"});
  EXPECT_EQ(matcher.push("abc</e"), "abc");
  EXPECT_EQ(matcher.held_bytes(), 3u);
  EXPECT_EQ(matcher.push("n"), "");
  EXPECT_EQ(matcher.push("x"), "</enx");  // no longer a prefix: released at once
  EXPECT_EQ(matcher.held_bytes(), 0u);
  EXPECT_EQ(matcher.push("</"), "");
  EXPECT_EQ(matcher.finish(), "</");  // the stream ended without a match
  EXPECT_FALSE(matcher.match());
}

TEST(StopStrings, StopSplitOneCharacterPerPiece) {
  Streamed out = stream(chars("The answer is 42.\n\nQuestion: next"), {"\n\nQuestion:"});
  EXPECT_EQ(out.text, "The answer is 42.");
  ASSERT_TRUE(out.match);
}

TEST(StopStrings, NothingAfterTheMatchIsEmitted) {
  StopStringMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.push("aSTOPb"), "a");
  EXPECT_EQ(matcher.push("more text"), "");
  EXPECT_EQ(matcher.finish(), "");
}

TEST(StopStrings, IncludeStopStringKeepsTheMatch) {
  Streamed out = stream(chars("x = 1; y = 2;"), {";"}, /*include_stop=*/true);
  EXPECT_EQ(out.text, "x = 1;");
}

TEST(StopStrings, OverlappingStopStringsTheFirstToCompleteWins) {
  // "abc" completes at offset 4, before "bcd" (5).
  EXPECT_EQ(stream(chars("xabcd"), {"bcd", "abc"}).text, "x");
  // "bc" completes before "abcd" even though "abcd" begins earlier.
  EXPECT_EQ(stream(chars("abcd"), {"abcd", "bc"}).text, "a");
  // Both end at the same offset: the longer (earlier-beginning) one is the match.
  Streamed tie = stream({"ab"}, {"b", "ab"});
  EXPECT_EQ(tie.text, "");
  EXPECT_EQ(tie.match->stop, "ab");
  // A stop string that is a prefix of another: the shorter completes first.
  EXPECT_EQ(stream(chars("say hello world"), {"hello world", "hello"}).text, "say ");
}

TEST(StopStrings, SelfOverlappingStopString) {
  // "aab" must be found in "aaab" although the first "aa" candidate fails.
  EXPECT_EQ(stream(chars("xaaab"), {"aab"}).text, "xa");
  EXPECT_EQ(stream({"xaa", "a", "b"}, {"aab"}).text, "xa");
}

TEST(StopStrings, UnicodeTextIsHeldAndReleasedOnCharacterBoundaries) {
  StopStringMatcher matcher({"日本語"});
  EXPECT_EQ(matcher.push("今日は日本"), "今日は");  // "日本" may start the stop string
  EXPECT_EQ(matcher.push("人です"), "日本人です");
  EXPECT_EQ(matcher.push("。日本語"), "。");
  ASSERT_TRUE(matcher.match());
  EXPECT_EQ(stream({"Grüße", " 👋🏽", "!"}, {"👋"}).text, "Grüße ");
}

TEST(StopStrings, SeveralStopStrings) {
  Streamed out = stream({"one, two", ", three. four"}, {"four", ".", "!!"});
  EXPECT_EQ(out.text, "one, two, three");
  EXPECT_EQ(out.match->stop_index, 1u);
}

TEST(StopStrings, WithoutStopStringsEverythingPassesStraightThrough) {
  StopStringMatcher matcher({});
  EXPECT_EQ(matcher.push("abc"), "abc");
  EXPECT_EQ(matcher.held_bytes(), 0u);
  EXPECT_EQ(matcher.finish(), "");
}

TEST(StopStrings, WholeTextFunctionMatchesTheStream) {
  StopStringResult result = apply_stop_strings("a.b!c", {"!", "."});
  EXPECT_EQ(result.text, "a");
  EXPECT_EQ(result.match->stop, ".");
  EXPECT_EQ(apply_stop_strings("abc", {"x"}).text, "abc");
  EXPECT_EQ(apply_stop_strings("a.b", {"."}, true).text, "a.");
}

// Property: on random texts over a small alphabet (so matches and near-matches are frequent),
// random stop sets and random splits, the stream equals the brute-force oracle.
TEST(StopStrings, RandomSplitsMatchTheBruteForceOracle) {
  std::mt19937 rng(1234);
  const std::vector<std::string> alphabet = {"a", "b", "c", "é", "\n"};
  auto random_text = [&](size_t max_units) {
    std::string text;
    size_t units = std::uniform_int_distribution<size_t>(0, max_units)(rng);
    for (size_t i = 0; i < units; ++i) text += alphabet[rng() % alphabet.size()];
    return text;
  };
  for (int round = 0; round < 4000; ++round) {
    std::vector<std::string> stops;
    size_t count = 1 + rng() % 4;
    while (stops.size() < count) {
      std::string stop = random_text(4);
      if (!stop.empty()) stops.push_back(stop);
    }
    std::string text = random_text(30);
    bool include_stop = rng() % 2 == 0;
    // Split between characters (the detokenizer only emits whole characters).
    std::vector<std::string> pieces;
    std::string current;
    for (size_t i = 0; i < text.size(); ++i) {
      current += text[i];
      bool boundary =
          i + 1 == text.size() || (static_cast<unsigned char>(text[i + 1]) & 0xC0) != 0x80;
      if (boundary && rng() % 3 == 0) {
        pieces.push_back(current);
        current.clear();
      }
    }
    if (!current.empty()) pieces.push_back(current);
    if (rng() % 5 == 0) pieces.insert(pieces.begin() + rng() % (pieces.size() + 1), "");

    Streamed expected = brute_force(text, stops, include_stop);
    Streamed streamed = stream(pieces, stops, include_stop);
    ASSERT_EQ(streamed.text, expected.text) << "round " << round << " text " << text;
    ASSERT_EQ(streamed.match.has_value(), expected.match.has_value()) << "round " << round;
    if (expected.match) {
      ASSERT_EQ(streamed.match->stop_index, expected.match->stop_index) << "round " << round;
    }
    StopStringResult whole = apply_stop_strings(text, stops, include_stop);
    ASSERT_EQ(whole.text, expected.text) << "round " << round;
  }
}

}  // namespace
}  // namespace pdserve
