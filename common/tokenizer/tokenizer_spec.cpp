#include "common/tokenizer/tokenizer_spec.h"

#include <limits>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/core/files.h"

namespace pdserve::tokenizer_detail {
namespace {

using nlohmann::json;

// Ids above this are refused: they would make the id-indexed tables absurdly large.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// GPT-2's split pattern, used by ByteLevel when "use_regex" is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void fail(StatusCode code, const std::string& where, const std::string& what) {
  PDS_THROW(code, where + ": " + what);
}

std::string type_name(const json& value) {
  return value.type_name();
}

const json& member(const json& object, const char* key, const std::string& where) {
  if (!object.is_object())
    fail(StatusCode::kInvalidArgument, where, "expected an object, got " + type_name(object));
  auto it = object.find(key);
  if (it == object.end())
    fail(StatusCode::kInvalidArgument, where, std::string("missing key \"") + key + "\"");
  return *it;
}

// A member that may be absent or null.
const json* optional_member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const std::string& as_string(const json& value, const std::string& where) {
  if (!value.is_string())
    fail(StatusCode::kInvalidArgument, where, "expected a string, got " + type_name(value));
  return value.get_ref<const std::string&>();
}

bool as_bool(const json& value, const std::string& where) {
  if (!value.is_boolean())
    fail(StatusCode::kInvalidArgument, where, "expected a boolean, got " + type_name(value));
  return value.get<bool>();
}

bool optional_bool(const json& object, const char* key, bool fallback, const std::string& where) {
  const json* value = optional_member(object, key);
  return value == nullptr ? fallback : as_bool(*value, where + "." + key);
}

int32_t as_token_id(const json& value, const std::string& where) {
  if (!value.is_number_integer())
    fail(StatusCode::kInvalidArgument, where, "expected an integer id, got " + type_name(value));
  // Unsigned values above INT64_MAX read as negative here and are refused with the rest.
  const auto id = value.get<int64_t>();
  if (id < 0 || id > kMaxTokenId) {
    fail(StatusCode::kInvalidArgument, where,
         "token id " + value.dump() + " is outside [0, " + std::to_string(kMaxTokenId) + "]");
  }
  return static_cast<int32_t>(id);
}

const std::string& type_of(const json& object, const std::string& where) {
  return as_string(member(object, "type", where), where + ".type");
}

[[noreturn]] void unsupported(const std::string& where, const std::string& what) {
  fail(StatusCode::kUnimplemented, where, what + " is not supported");
}

NormalizationForm parse_normalization_type(const json& normalizer, const std::string& where) {
  const std::string& type = type_of(normalizer, where);
  if (type == "NFC") return NormalizationForm::kNfc;
  if (type == "NFD") return NormalizationForm::kNfd;
  if (type == "NFKC") return NormalizationForm::kNfkc;
  if (type == "NFKD") return NormalizationForm::kNfkd;
  if (type == "Sequence") {
    const json& list = member(normalizer, "normalizers", where);
    if (!list.is_array())
      fail(StatusCode::kInvalidArgument, where + ".normalizers", "expected an array");
    if (list.empty()) return NormalizationForm::kNone;
    if (list.size() > 1)
      unsupported(where + ".normalizers", "a sequence of more than one normalizer");
    return parse_normalization_type(list[0], where + ".normalizers[0]");
  }
  unsupported(where + ".type", "normalizer \"" + type + "\"");
}

void parse_split(const json& split, const std::string& where, std::vector<SplitSpec>& out) {
  const json& pattern = member(split, "pattern", where);
  SplitSpec spec;
  if (pattern.is_object() && pattern.contains("Regex")) {
    spec.pattern = as_string(pattern["Regex"], where + ".pattern.Regex");
  } else if (pattern.is_object() && pattern.contains("String")) {
    // A literal delimiter: \Q...\E quotes everything up to an \E, which needs re-escaping.
    const std::string& literal = as_string(pattern["String"], where + ".pattern.String");
    spec.pattern = "\\Q";
    for (size_t pos = 0; pos < literal.size(); ++pos) {
      if (literal.compare(pos, 2, "\\E") == 0) {
        spec.pattern += "\\E\\\\E\\Q";
        ++pos;
      } else {
        spec.pattern += literal[pos];
      }
    }
    spec.pattern += "\\E";
  } else {
    fail(StatusCode::kInvalidArgument, where + ".pattern",
         "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  if (spec.pattern.empty() || spec.pattern == "\\Q\\E")
    fail(StatusCode::kInvalidArgument, where + ".pattern", "empty pattern");
  const std::string& behavior = as_string(member(split, "behavior", where), where + ".behavior");
  if (behavior == "Isolated") {
    spec.behavior = SplitBehavior::kIsolated;
  } else if (behavior == "Removed") {
    spec.behavior = SplitBehavior::kRemoved;
  } else {
    unsupported(where + ".behavior", "split behavior \"" + behavior + "\"");
  }
  if (optional_bool(split, "invert", false, where)) unsupported(where + ".invert", "invert = true");
  out.push_back(std::move(spec));
}

void check_byte_level_options(const json& byte_level, const std::string& where) {
  if (optional_bool(byte_level, "add_prefix_space", false, where)) {
    unsupported(where + ".add_prefix_space", "add_prefix_space = true");
  }
}

// Fills `out` with the regex splits; `saw_byte_level` records that bytes are mapped afterwards.
void parse_pre_tokenizer(const json& pre_tokenizer, const std::string& where,
                         std::vector<SplitSpec>& out, bool& saw_byte_level) {
  const std::string& type = type_of(pre_tokenizer, where);
  if (saw_byte_level) unsupported(where, "a pre-tokenizer after ByteLevel");
  if (type == "Sequence") {
    const json& list = member(pre_tokenizer, "pretokenizers", where);
    if (!list.is_array())
      fail(StatusCode::kInvalidArgument, where + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      parse_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", out,
                          saw_byte_level);
    }
  } else if (type == "Split") {
    parse_split(pre_tokenizer, where, out);
  } else if (type == "ByteLevel") {
    check_byte_level_options(pre_tokenizer, where);
    if (optional_bool(pre_tokenizer, "use_regex", true, where))
      out.push_back({std::string(kGpt2Pattern), SplitBehavior::kIsolated});
    saw_byte_level = true;
  } else {
    unsupported(where + ".type", "pre-tokenizer \"" + type + "\"");
  }
}

void parse_model(const json& model, const std::string& where, TokenizerSpec& spec) {
  if (const json* type = optional_member(model, "type");
      type != nullptr && as_string(*type, where + ".type") != "BPE") {
    unsupported(where + ".type", "model \"" + type->get<std::string>() + "\"");
  }
  if (const json* dropout = optional_member(model, "dropout"); dropout != nullptr) {
    if (!dropout->is_number())
      fail(StatusCode::kInvalidArgument, where + ".dropout", "expected a number or null");
    if (dropout->get<double>() != 0.0) unsupported(where + ".dropout", "BPE dropout");
  }
  if (optional_bool(model, "byte_fallback", false, where))
    unsupported(where + ".byte_fallback", "byte_fallback = true");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* affix = optional_member(model, key);
        affix != nullptr && !as_string(*affix, where + "." + key).empty()) {
      unsupported(where + "." + key, std::string("a non-empty ") + key);
    }
  }
  spec.ignore_merges = optional_bool(model, "ignore_merges", false, where);

  const json& vocab = member(model, "vocab", where);
  if (!vocab.is_object())
    fail(StatusCode::kInvalidArgument, where + ".vocab",
         "expected an object, got " + type_name(vocab));
  spec.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    // The location string is built only for a bad entry: this loop runs 150k times at load.
    const bool plain_id = id.is_number_unsigned() && id.get<uint64_t>() <= kMaxTokenId;
    spec.vocab.emplace(token, plain_id ? static_cast<int32_t>(id.get<uint64_t>())
                                       : as_token_id(id, where + ".vocab[\"" + token + "\"]"));
  }

  const json& merges = member(model, "merges", where);
  if (!merges.is_array())
    fail(StatusCode::kInvalidArgument, where + ".merges",
         "expected an array, got " + type_name(merges));
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto at = [&] { return where + ".merges[" + std::to_string(i) + "]"; };
    const json& merge = merges[i];
    if (merge.is_string()) {  // legacy form "left right"
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
          text.find(' ', space + 1) != std::string::npos) {
        fail(StatusCode::kInvalidArgument, at(),
             "expected \"left right\" with exactly one space, got \"" + text + "\"");
      }
      spec.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec.merges.emplace_back(merge[0].get_ref<const std::string&>(),
                               merge[1].get_ref<const std::string&>());
    } else if (merge.is_array() && merge.size() == 2) {
      // One of the two is not a string: fail naming it.
      as_string(merge[0], at() + "[0]");
      as_string(merge[1], at() + "[1]");
    } else {
      fail(StatusCode::kInvalidArgument, at(), "expected a pair of strings, got " + merge.dump());
    }
  }
}

AddedTokenSpec parse_added_token(const json& token, int32_t id, const std::string& where) {
  AddedTokenSpec spec;
  spec.id = id;
  spec.content = as_string(member(token, "content", where), where + ".content");
  if (spec.content.empty())
    fail(StatusCode::kInvalidArgument, where + ".content", "empty added token");
  spec.special = optional_bool(token, "special", false, where);
  spec.normalized = optional_bool(token, "normalized", !spec.special, where);
  for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
    if (optional_bool(token, flag, false, where))
      unsupported(where + "." + flag, std::string(flag) + " = true");
  }
  return spec;
}

// The spec being filled, with indexes that keep added-token checks linear.
struct SpecBuilder {
  TokenizerSpec spec;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, size_t> added_by_content;
};

void add_token(SpecBuilder& builder, AddedTokenSpec token, const std::string& where) {
  TokenizerSpec& spec = builder.spec;
  if (auto it = builder.added_by_id.find(token.id); it != builder.added_by_id.end()) {
    const std::string& existing = spec.added_tokens[it->second].content;
    if (existing == token.content) return;  // listed again, the same token
    fail(StatusCode::kInvalidArgument, where,
         "id " + std::to_string(token.id) + " is both \"" + existing + "\" and \"" + token.content +
             "\"");
  }
  if (auto it = builder.added_by_content.find(token.content);
      it != builder.added_by_content.end()) {
    fail(StatusCode::kInvalidArgument, where,
         "\"" + token.content + "\" has two ids, " +
             std::to_string(spec.added_tokens[it->second].id) + " and " + std::to_string(token.id));
  }
  if (auto it = spec.vocab.find(token.content); it != spec.vocab.end() && it->second != token.id) {
    fail(StatusCode::kInvalidArgument, where,
         "\"" + token.content + "\" is id " + std::to_string(it->second) +
             " in the vocabulary but id " + std::to_string(token.id) + " here");
  }
  builder.added_by_id.emplace(token.id, spec.added_tokens.size());
  builder.added_by_content.emplace(token.content, spec.added_tokens.size());
  spec.added_tokens.push_back(std::move(token));
}

void parse_tokenizer_json(const json& root, SpecBuilder& builder) {
  TokenizerSpec& spec = builder.spec;
  if (!root.is_object())
    fail(StatusCode::kInvalidArgument, "top level", "expected an object, got " + type_name(root));
  if (const json* normalizer = optional_member(root, "normalizer"))
    spec.normalization = parse_normalization_type(*normalizer, "normalizer");
  bool saw_byte_level = false;
  if (const json* pre_tokenizer = optional_member(root, "pre_tokenizer")) {
    parse_pre_tokenizer(*pre_tokenizer, "pre_tokenizer", spec.splits, saw_byte_level);
  }
  if (!saw_byte_level)
    unsupported("pre_tokenizer", "a tokenizer without a ByteLevel pre-tokenizer");
  const json& decoder = member(root, "decoder", "top level");
  if (decoder.is_null() || type_of(decoder, "decoder") != "ByteLevel")
    unsupported("decoder", "a decoder other than ByteLevel");
  parse_model(member(root, "model", "top level"), "model", spec);
  if (const json* added = optional_member(root, "added_tokens")) {
    if (!added->is_array())
      fail(StatusCode::kInvalidArgument, "added_tokens",
           "expected an array, got " + type_name(*added));
    for (size_t i = 0; i < added->size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& token = (*added)[i];
      add_token(
          builder,
          parse_added_token(token, as_token_id(member(token, "id", where), where + ".id"), where),
          where);
    }
  }
}

void parse_tokenizer_config(const json& root, SpecBuilder& builder) {
  if (!root.is_object())
    fail(StatusCode::kInvalidArgument, "top level", "expected an object, got " + type_name(root));
  if (optional_bool(root, "split_special_tokens", false, "top level"))
    unsupported("split_special_tokens", "split_special_tokens = true");
  if (optional_bool(root, "clean_up_tokenization_spaces", false, "top level")) {
    unsupported("clean_up_tokenization_spaces", "clean_up_tokenization_spaces = true");
  }
  const json* decoder = optional_member(root, "added_tokens_decoder");
  if (decoder == nullptr) return;
  if (!decoder->is_object())
    fail(StatusCode::kInvalidArgument, "added_tokens_decoder",
         "expected an object, got " + type_name(*decoder));
  for (const auto& [key, token] : decoder->items()) {
    const std::string where = "added_tokens_decoder[\"" + key + "\"]";
    int64_t id = -1;
    try {
      size_t used = 0;
      id = std::stoll(key, &used);
      if (used != key.size()) id = -1;
    } catch (const std::exception&) {
      id = -1;
    }
    if (id < 0 || id > kMaxTokenId)
      fail(StatusCode::kInvalidArgument, where, "the key is not a token id");
    add_token(builder, parse_added_token(token, static_cast<int32_t>(id), where), where);
  }
}

Status parse_file(const std::filesystem::path& path, void (*parse)(const json&, SpecBuilder&),
                  SpecBuilder& builder) {
  PDS_ASSIGN_OR_RETURN(json root, read_json_file(path));
  Status status = capture_status([&]() -> Status {
    try {
      parse(root, builder);
    } catch (const json::exception& e) {  // a type mismatch the checks above did not foresee
      PDS_THROW(StatusCode::kInvalidArgument, e.what());
    }
    return {};
  });
  return status.with_context("in '" + path.string() + "'");
}

}  // namespace

Result<TokenizerSpec> load_tokenizer_spec(const std::filesystem::path& tokenizer_json) {
  SpecBuilder builder;
  PDS_RETURN_IF_ERROR(parse_file(tokenizer_json, &parse_tokenizer_json, builder));
  const std::filesystem::path config = tokenizer_json.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config, ec))
    PDS_RETURN_IF_ERROR(parse_file(config, &parse_tokenizer_config, builder));
  return std::move(builder.spec);
}

}  // namespace pdserve::tokenizer_detail
