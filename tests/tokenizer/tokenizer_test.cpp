#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/tokenizer/test_support.h"

namespace pdserve::tokenizer_test {
namespace {

using Ids = std::vector<int32_t>;

constexpr int32_t kImStart = 151644;
constexpr int32_t kImEnd = 151645;
constexpr int32_t kThink = 151667;  // added but not special
constexpr int32_t kHello = 9707;

TEST(Tokenizer, VocabularyLookups) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), 151669);
  EXPECT_EQ(tokenizer.token_to_id("<|im_start|>"), kImStart);
  EXPECT_EQ(tokenizer.token_to_id("Hello"), kHello);
  EXPECT_EQ(tokenizer.token_to_id("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_EQ(tokenizer.token_to_id("no such token at all"), std::nullopt);
  EXPECT_EQ(tokenizer.id_to_token(kHello), "Hello");
  EXPECT_EQ(tokenizer.id_to_token(kThink), "<think>");
  EXPECT_EQ(tokenizer.id_to_token(-1), std::nullopt);
  EXPECT_EQ(tokenizer.id_to_token(151669), std::nullopt);
  EXPECT_TRUE(tokenizer.is_special(kImStart));
  EXPECT_TRUE(tokenizer.is_special(151643));  // <|endoftext|>
  EXPECT_FALSE(tokenizer.is_special(kThink));
  EXPECT_FALSE(tokenizer.is_special(kHello));
  EXPECT_FALSE(tokenizer.is_special(1 << 30));
}

TEST(Tokenizer, AddedTokensAreMatchedBeforeTheRegex) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const Ids body = tokenizer.encode("user\nHello").value();
  Ids expected = {kImStart};
  expected.insert(expected.end(), body.begin(), body.end());
  expected.push_back(kImEnd);
  EXPECT_EQ(tokenizer.encode("<|im_start|>user\nHello<|im_end|>").value(), expected);
  EXPECT_EQ(tokenizer.encode("<think></think>").value(), (Ids{kThink, 151668}));
  // Not an added token: encoded as ordinary text.
  const Ids near_miss = tokenizer.encode("<|im_start").value();
  EXPECT_EQ(std::count(near_miss.begin(), near_miss.end(), kImStart), 0);
  EXPECT_GT(near_miss.size(), 1u);
}

TEST(Tokenizer, SkipSpecialTokensKeepsNonSpecialAddedTokens) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const Ids ids = {kImStart, kHello, kThink, kImEnd};
  EXPECT_EQ(tokenizer.decode(ids).value(), "<|im_start|>Hello<think><|im_end|>");
  EXPECT_EQ(tokenizer.decode(ids, /*skip_special_tokens=*/true).value(), "Hello<think>");
}

TEST(Tokenizer, NormalizesToNfcBeforeSplitting) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  EXPECT_EQ(tokenizer.encode("cafe\xCC\x81").value(), tokenizer.encode("caf\xC3\xA9").value());
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("cafe\xCC\x81").value()).value(), "caf\xC3\xA9");
}

TEST(Tokenizer, InvalidUtf8IsRejectedWithItsOffset) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const struct {
    std::string_view text;
    size_t offset;
  } cases[] = {
      {"ab\xFF", 2},           {"\xC0\xAF", 0},    {"x\xED\xA0\x80", 1},
      {"\xF4\x90\x80\x80", 0}, {"ok \xE4\xBD", 3}, {"<|im_start|>\x80", 12},
  };
  for (const auto& c : cases) {
    Result<Ids> ids = tokenizer.encode(c.text);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(c.offset)),
              std::string::npos)
        << ids.status().message();
  }
}

TEST(Tokenizer, UnknownIdsAreRejectedByDecode) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  for (int32_t bad : {-1, 151669, 1 << 30}) {
    const Ids ids = {kHello, bad};
    Result<std::string> text = tokenizer.decode(ids);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find(std::to_string(bad) + " at position 1"),
              std::string::npos)
        << text.status().message();
  }
}

TEST(Tokenizer, EmptyInputs) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  EXPECT_TRUE(tokenizer.encode("").value().empty());
  EXPECT_EQ(tokenizer.decode(Ids{}).value(), "");
}

TEST(Tokenizer, HugeRunsRoundTrip) {
  // One pre-token of a megabyte (the BPE heap path), long whitespace runs (the regex look-ahead)
  // and long digit runs: ASCII is NFC-invariant, so decode must give the input back exactly.
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const std::string word(1 << 20, 'a');
  const std::string spaces =
      std::string(1 << 20, ' ') + "x" + std::string(100000, '\n') + "\t \r\n";
  std::string digits;
  for (int i = 0; i < 200000; ++i) digits += static_cast<char>('0' + i * 7 % 10);
  for (const std::string* text :
       std::initializer_list<const std::string*>{&word, &spaces, &digits}) {
    Result<Ids> ids = tokenizer.encode(*text);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_LE(ids->size(), text->size());
    EXPECT_EQ(tokenizer.decode(*ids).value(), *text);
  }
  EXPECT_EQ(tokenizer.encode(digits).value().size(), digits.size());  // \p{N} splits every digit
}

TEST(Tokenizer, ConcurrentEncodesAgreeWithSequentialOnes) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  std::vector<std::string> texts;
  for (const nlohmann::json& line : read_jsonl("golden.jsonl"))
    texts.push_back(line["text"].get<std::string>());
  std::vector<Ids> expected;
  for (const std::string& text : texts) expected.push_back(tokenizer.encode(text).value());
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  const Tokenizer shared_copy = tokenizer;  // copies share the tables
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size() * 2; ++i) {  // each thread sees every text twice
        const size_t k = (i * 7 + static_cast<size_t>(t)) % texts.size();
        Result<Ids> ids = shared_copy.encode(texts[k]);
        if (!ids.ok() || *ids != expected[k]) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(Tokenizer, MissingFileIsNotFoundAndNamed) {
  Result<Tokenizer> tokenizer = Tokenizer::from_model_dir("/nonexistent/model");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tokenizer.status().message().find("/nonexistent/model/tokenizer.json"),
            std::string::npos);
}

}  // namespace
}  // namespace pdserve::tokenizer_test
