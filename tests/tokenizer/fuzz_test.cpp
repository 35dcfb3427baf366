// Seeded mutation fuzzing: tokenizer.json files that are truncated, bit-flipped, missing keys,
// holding wrong types, bad merges or bad regexes must load to a clear Status (naming the file) or
// to a working tokenizer; random byte strings must encode to ids or to INVALID_ARGUMENT. Never a
// crash or a hang. Fixed seeds, so a failure reproduces; sized to run in a few seconds.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/core/files.h"
#include "tests/tokenizer/test_support.h"

namespace pdserve::tokenizer_test {
namespace {

using nlohmann::json;

constexpr uint32_t kSeed = 20261121;
constexpr int kJsonMutations = 1500;
constexpr int kRandomTexts = 3000;

// The GPT-2 byte alphabet, written out independently of the library.
std::string byte_symbol(int byte) {
  const bool printable =
      (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  int code_point = byte;
  if (!printable) {
    code_point = 256;
    for (int b = 0; b < byte; ++b) {
      if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++code_point;
    }
  }
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

// A small tokenizer.json of the Qwen3 kind: 256 byte tokens, a few merges, two added tokens.
json small_tokenizer_json() {
  json vocab = json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[byte_symbol(byte)] = byte;
  const std::string space = byte_symbol(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {space, "t"}, {space + "t", "he"}, {"i", "n"}, {space, "in"}, {"e", "r"}};
  json merge_list = json::array();
  for (const auto& [left, right] : merges) {
    if (!vocab.contains(left + right)) vocab[left + right] = static_cast<int>(vocab.size());
    merge_list.push_back({left, right});
  }
  const int next_id = static_cast<int>(vocab.size());
  return json{
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
      {"added_tokens",
       {{{"id", next_id}, {"content", "<|im_start|>"}, {"special", true}, {"normalized", false}},
        {{"id", next_id + 1}, {"content", "<think>"}, {"special", false}, {"normalized", false}}}},
  };
}

class Fuzzer {
 public:
  explicit Fuzzer(uint32_t seed) : rng_(seed) {}

  int below(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

  std::string random_bytes(int max_length) {
    std::string out(below(max_length + 1), '\0');
    for (char& c : out) c = static_cast<char>(below(256));
    return out;
  }

  // Encodes a random code point (surrogates and values past U+10FFFF included) the UTF-8 way.
  std::string random_code_point_text(int count) {
    std::string out;
    for (int i = 0; i < count; ++i) {
      const int kind = below(6);
      uint32_t cp = kind == 0   ? below(0x80)
                    : kind == 1 ? below(0x800)
                    : kind == 2 ? 0xD800 + below(0x800)
                    : kind == 3 ? below(0x10000)
                    : kind == 4 ? 0x10000 + below(0x100000)
                                : 0x110000 + below(0x1000);
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    return out;
  }

  std::string random_text() {
    static const std::vector<std::string> kFragments = {
        "<|im_start|>", "<|im_end|>", "<think>",   "</think>",     "<|",
        "|>",           " ",          "\n",        "\r\n",         "\t",
        "'s",           "'LL",        "e\xCC\x81", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80",
        "123",          "the",        "   ",       "\xEF\xBB\xBF"};
    switch (below(3)) {
      case 0:
        return random_bytes(64);
      case 1:
        return random_code_point_text(below(40));
      default: {
        std::string out;
        for (int i = below(20); i > 0; --i)
          out += kFragments[below(static_cast<int>(kFragments.size()))];
        return out;
      }
    }
  }

  json random_value() {
    switch (below(10)) {
      case 0:
        return nullptr;
      case 1:
        return 0;
      case 2:
        return -1;
      case 3:
        return 1e300;
      case 4:
        return "x";
      case 5:
        return json::array();
      case 6:
        return json::object();
      case 7:
        return true;
      case 8:
        return 4294967296LL;
      default:
        return json::array({"a", "b", "c"});
    }
  }

  // A random node of `root` (objects and arrays are descended into at random).
  json& random_node(json& root) {
    json* node = &root;
    while ((node->is_object() || node->is_array()) && !node->empty() && below(4) != 0) {
      auto it = node->begin();
      std::advance(it, below(static_cast<int>(std::min<size_t>(node->size(), 300))));
      node = &*it;
    }
    return *node;
  }

  // doc[key] when doc is an object holding key, else nullptr.
  static json* child(json& doc, const char* key) {
    return doc.is_object() && doc.contains(key) ? &doc[key] : nullptr;
  }

  std::string mutate(const json& original) {
    json doc = original;
    for (int round = below(3) + 1; round > 0; --round) {
      switch (below(6)) {
        case 0: {  // delete a key or element
          json& node = random_node(doc);
          if ((node.is_object() || node.is_array()) && !node.empty()) {
            if (node.is_object()) {
              auto it = node.begin();
              std::advance(it, below(static_cast<int>(node.size())));
              node.erase(it.key());
            } else {
              node.erase(below(static_cast<int>(node.size())));
            }
          }
          break;
        }
        case 1:
          random_node(doc) = random_value();
          break;
        case 2: {  // bad merges
          static const std::vector<json> kBadMerges = {json("h"),
                                                       json("h  e"),
                                                       json("zz q"),
                                                       json::array({"h"}),
                                                       json::array({"h", "e", "r"}),
                                                       json(7),
                                                       json::array({1, 2}),
                                                       json::array({"q", "q"}),
                                                       json(" e")};
          json* model = child(doc, "model");
          json* merges = model != nullptr ? child(*model, "merges") : nullptr;
          if (merges != nullptr && merges->is_array()) {
            merges->push_back(kBadMerges[below(static_cast<int>(kBadMerges.size()))]);
          }
          break;
        }
        case 3: {  // bad or hostile regex
          static const std::vector<std::string> kPatterns = {
              "(",   "[a-",     "\\",     "a{2,1}", "(?<x", "\\p{Nope}", "*",
              "(?!", "(a|a)*b", "(a+)+$", "",       "\\Q",  "(?i"};
          std::string pattern = kPatterns[below(static_cast<int>(kPatterns.size()))];
          if (below(3) == 0) {
            pattern.clear();
            for (int i = below(12); i > 0; --i) pattern += static_cast<char>(0x20 + below(0x5F));
          }
          json* pre = child(doc, "pre_tokenizer");
          json* list = pre != nullptr ? child(*pre, "pretokenizers") : nullptr;
          if (list != nullptr && list->is_array() && !list->empty() && (*list)[0].is_object()) {
            (*list)[0]["pattern"] = {{"Regex", pattern}};
          }
          break;
        }
        case 4: {  // odd added tokens
          static const std::vector<json> kTokens = {
              {{"id", 0}, {"content", "<zz>"}},
              {{"id", 5}, {"content", ""}},
              {{"content", "<a>"}},
              {{"id", 300}, {"content", "<|im_start|>"}},
              {{"id", -3}, {"content", "<b>"}},
              {{"id", 301}, {"content", "<c>"}, {"lstrip", true}},
              {{"id", 16777216}, {"content", "<d>"}}};
          json* added = child(doc, "added_tokens");
          if (added != nullptr && added->is_array())
            added->push_back(kTokens[below(static_cast<int>(kTokens.size()))]);
          break;
        }
        default:
          break;  // text-level mutation below
      }
    }
    std::string text = doc.dump();
    switch (below(8)) {  // mostly structural damage; malformed JSON is one quick error path
      case 0:
        text.resize(below(static_cast<int>(text.size()) + 1));
        break;
      case 1:
        for (int i = below(4) + 1; i > 0 && !text.empty(); --i)
          text[below(static_cast<int>(text.size()))] ^= static_cast<char>(1 << below(8));
        break;
      default:
        break;
    }
    return text;
  }

 private:
  std::mt19937 rng_;
};

// A loaded tokenizer must answer every call with a value or a Status.
void exercise(const Tokenizer& tokenizer, Fuzzer& fuzzer) {
  for (int i = 0; i < 3; ++i) {
    const std::string text = fuzzer.random_text();
    Result<std::vector<int32_t>> ids = tokenizer.encode(text);
    if (ids.ok()) {
      Result<std::string> decoded = tokenizer.decode(*ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    }
  }
  std::vector<int32_t> ids;
  for (int i = fuzzer.below(8); i > 0; --i)
    ids.push_back(fuzzer.below(tokenizer.vocab_size() + 3) - 1);
  Result<std::string> decoded = tokenizer.decode(ids);
  if (decoded.ok()) {
    EXPECT_TRUE(is_valid_utf8(*decoded));
  }
}

TEST(TokenizerFuzz, BaseOfTheMutationsLoadsAndEncodes) {
  const auto path = std::filesystem::temp_directory_path() / "pdserve_tokenizer_fuzz_base.json";
  ASSERT_TRUE(write_file(path, small_tokenizer_json().dump()).ok());
  Result<Tokenizer> tokenizer = Tokenizer::load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  const int32_t the = tokenizer->token_to_id(byte_symbol(' ') + "the").value();
  EXPECT_EQ(tokenizer->encode(" the").value(), (std::vector<int32_t>{the}));
  EXPECT_EQ(tokenizer->encode("<|im_start|> the").value(),
            (std::vector<int32_t>{tokenizer->vocab_size() - 2, the}));
  std::filesystem::remove(path);
}

TEST(TokenizerFuzz, MutatedTokenizerJsonLoadsOrFailsClearly) {
  const json base = small_tokenizer_json();
  const auto dir = std::filesystem::temp_directory_path() / "pdserve_tokenizer_fuzz";
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  Fuzzer fuzzer(kSeed);
  int loaded = 0;
  for (int i = 0; i < kJsonMutations; ++i) {
    ASSERT_TRUE(write_file(path, fuzzer.mutate(base)).ok());
    Result<Tokenizer> tokenizer = Tokenizer::load(path);
    if (tokenizer.ok()) {
      ++loaded;
      exercise(*tokenizer, fuzzer);
    } else {
      EXPECT_NE(tokenizer.status().code(), StatusCode::kInternal)
          << "mutation " << i << ": " << tokenizer.status().to_string();
      EXPECT_NE(tokenizer.status().message().find(path.string()), std::string::npos)
          << "mutation " << i << ": " << tokenizer.status().message();
    }
    if (HasFailure()) break;
  }
  // Both outcomes must be exercised for the test to mean anything.
  EXPECT_GT(loaded, kJsonMutations / 20);
  EXPECT_LT(loaded, kJsonMutations - kJsonMutations / 20);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerFuzz, TruncatedRealTokenizerJsonIsMalformed) {
  const std::string original =
      read_text_file(PDSERVE_ASSETS_DIR "/qwen3-tokenizer/tokenizer.json").value();
  const auto dir = std::filesystem::temp_directory_path() / "pdserve_tokenizer_fuzz_real";
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  Fuzzer fuzzer(kSeed + 1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        write_file(path, original.substr(0, fuzzer.below(static_cast<int>(original.size()) - 1)))
            .ok());
    Result<Tokenizer> tokenizer = Tokenizer::load(path);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tokenizer.status().message().find(path.string()), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(TokenizerFuzz, RandomTextEncodesOrNamesTheBadByte) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  Fuzzer fuzzer(kSeed + 2);
  for (int i = 0; i < kRandomTexts; ++i) {
    const std::string text = fuzzer.random_text();
    Result<std::vector<int32_t>> ids = tokenizer.encode(text);
    if (std::optional<size_t> bad = first_invalid_utf8(text)) {
      ASSERT_FALSE(ids.ok()) << i;
      EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(*bad)),
                std::string::npos)
          << ids.status().message();
      continue;
    }
    ASSERT_TRUE(ids.ok()) << i << ": " << ids.status().to_string();
    Result<std::string> decoded = tokenizer.decode(*ids);
    ASSERT_TRUE(decoded.ok());
    EXPECT_TRUE(is_valid_utf8(*decoded));
    bool ascii = true;
    for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii) {
      EXPECT_EQ(*decoded, text) << "ASCII is NFC-invariant, so it must round-trip exactly";
    }
  }
}

}  // namespace
}  // namespace pdserve::tokenizer_test
