#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer_spec.h"
#include "common/tokenizer/utf8.h"

namespace pdserve {
namespace tokenizer_detail {

// Everything a loaded tokenizer knows; immutable, shared by copies of a Tokenizer.
struct TokenizerTables {
  NormalizationForm normalization = NormalizationForm::kNone;
  std::vector<RegexSplitter> splitters;
  BpeModel bpe;
  AddedTokenMatcher raw_added_tokens;         // matched on the text as given
  AddedTokenMatcher normalized_added_tokens;  // matched after normalization
  std::unordered_map<std::string, int32_t> token_to_id;
  std::vector<std::string> id_to_token;
  std::vector<std::string> id_to_bytes;  // what each id decodes to
  std::vector<bool> known;               // ids present in the vocabulary or the added tokens
  std::vector<bool> special;
};

namespace {

// Per-call working memory of encode().
struct EncodeScratch {
  MatchScratch match;
  BpeScratch bpe;
  std::vector<AddedTokenMatcher::Segment> segments;
  std::vector<AddedTokenMatcher::Segment> normalized_segments;
  std::vector<TextPiece> pieces;
  std::vector<TextPiece> next_pieces;
  std::string normalized;
};

Result<std::shared_ptr<const TokenizerTables>> build_tables(TokenizerSpec spec) {
  auto tables = std::make_shared<TokenizerTables>();
  tables->normalization = spec.normalization;
  for (size_t i = 0; i < spec.splits.size(); ++i) {
    Result<RegexSplitter> splitter = RegexSplitter::compile(spec.splits[i]);
    if (!splitter.ok())
      return splitter.status().with_context("pre-tokenizer split " + std::to_string(i));
    tables->splitters.push_back(std::move(splitter).value());
  }
  const ByteLevelAlphabet alphabet;
  PDS_ASSIGN_OR_RETURN(tables->bpe, BpeModel::build(spec, alphabet));

  int32_t size = 0;
  for (const auto& [token, id] : spec.vocab) size = std::max(size, id + 1);
  for (const AddedTokenSpec& token : spec.added_tokens) size = std::max(size, token.id + 1);
  tables->id_to_token.resize(size);
  tables->id_to_bytes.resize(size);
  tables->known.assign(size, false);
  tables->special.assign(size, false);
  const auto add = [&](const std::string& token, int32_t id) -> Status {
    if (tables->known[id] && tables->id_to_token[id] != token) {
      return invalid_argument("id " + std::to_string(id) + " is both \"" + tables->id_to_token[id] +
                              "\" and \"" + token + "\"");
    }
    tables->known[id] = true;
    tables->id_to_token[id] = token;
    // As HF's ByteLevel decoder: a token with characters outside the alphabet stands for itself.
    std::optional<std::string> bytes = alphabet.decode_token(token);
    tables->id_to_bytes[id] = bytes ? std::move(*bytes) : token;
    return {};
  };
  for (const auto& [token, id] : spec.vocab)
    PDS_RETURN_IF_ERROR(add(token, id).with_context("model.vocab"));

  std::vector<AddedTokenMatcher::Token> raw_tokens;
  std::vector<AddedTokenMatcher::Token> normalized_tokens;
  for (const AddedTokenSpec& token : spec.added_tokens) {
    PDS_RETURN_IF_ERROR(add(token.content, token.id).with_context("added_tokens"));
    tables->special[token.id] = token.special;
    (token.normalized ? normalized_tokens : raw_tokens).push_back({token.content, token.id});
    spec.vocab.insert_or_assign(token.content, token.id);
  }
  tables->raw_added_tokens = AddedTokenMatcher(std::move(raw_tokens));
  tables->normalized_added_tokens = AddedTokenMatcher(std::move(normalized_tokens));
  tables->token_to_id = std::move(spec.vocab);
  return std::shared_ptr<const TokenizerTables>(std::move(tables));
}

// Pre-tokenizes and BPE-encodes text[begin, end) (no added tokens in it).
Status encode_plain(const TokenizerTables& tables, std::string_view text, size_t begin, size_t end,
                    EncodeScratch& scratch, std::vector<int32_t>& ids) {
  scratch.pieces.assign(1, TextPiece{begin, end});
  for (const RegexSplitter& splitter : tables.splitters) {
    scratch.next_pieces.clear();
    for (const TextPiece& piece : scratch.pieces) {
      PDS_RETURN_IF_ERROR(splitter.split(text, piece, scratch.match, scratch.next_pieces));
    }
    std::swap(scratch.pieces, scratch.next_pieces);
  }
  for (const TextPiece& piece : scratch.pieces) {
    tables.bpe.encode_word(text.substr(piece.begin, piece.end - piece.begin), scratch.bpe, ids);
  }
  return {};
}

Status encode_text(const TokenizerTables& tables, std::string_view text, EncodeScratch& scratch,
                   std::vector<int32_t>& ids) {
  tables.raw_added_tokens.split(text, scratch.segments);
  for (const AddedTokenMatcher::Segment& segment : scratch.segments) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    PDS_RETURN_IF_ERROR(normalize(tables.normalization,
                                  text.substr(segment.begin, segment.end - segment.begin),
                                  scratch.normalized));
    const std::string_view normalized = scratch.normalized;
    scratch.normalized_segments.clear();
    tables.normalized_added_tokens.split(normalized, scratch.normalized_segments);
    for (const AddedTokenMatcher::Segment& part : scratch.normalized_segments) {
      if (part.token_id >= 0) {
        ids.push_back(part.token_id);
      } else {
        PDS_RETURN_IF_ERROR(encode_plain(tables, normalized, part.begin, part.end, scratch, ids));
      }
    }
  }
  return {};
}

}  // namespace
}  // namespace tokenizer_detail

using tokenizer_detail::TokenizerTables;

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  PDS_ASSIGN_OR_RETURN(tokenizer_detail::TokenizerSpec spec,
                       tokenizer_detail::load_tokenizer_spec(tokenizer_json));
  Result<std::shared_ptr<const TokenizerTables>> tables =
      capture_status([&] { return tokenizer_detail::build_tables(std::move(spec)); });
  if (!tables.ok()) return tables.status().with_context("in '" + tokenizer_json.string() + "'");
  return Tokenizer(std::move(tables).value());
}

Result<Tokenizer> Tokenizer::from_model_dir(const std::filesystem::path& dir) {
  return load(dir / "tokenizer.json");
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  if (std::optional<size_t> bad = tokenizer_detail::find_invalid_utf8(text)) {
    return invalid_argument("text is not valid UTF-8 at byte offset " + std::to_string(*bad));
  }
  return capture_status([&]() -> Result<std::vector<int32_t>> {
    tokenizer_detail::EncodeScratch scratch;
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 4 + 1);
    PDS_RETURN_IF_ERROR(tokenizer_detail::encode_text(*tables_, text, scratch, ids));
    return ids;
  });
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string_view> piece = token_bytes(ids[i]);
    if (!piece) {
      return invalid_argument("token id " + std::to_string(ids[i]) + " at position " +
                              std::to_string(i) + " is not in the vocabulary (size " +
                              std::to_string(vocab_size()) + ")");
    }
    if (!(skip_special_tokens && is_special(ids[i]))) bytes.append(*piece);
  }
  std::string text;
  text.reserve(bytes.size());
  tokenizer_detail::append_utf8_lossy(bytes, text, /*keep_incomplete_tail=*/false);
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(tables_->id_to_token.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = tables_->token_to_id.find(std::string(token));
  if (it == tables_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !tables_->known[id]) return std::nullopt;
  return tables_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && tables_->special[id];
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !tables_->known[id]) return std::nullopt;
  return tables_->id_to_bytes[id];
}

}  // namespace pdserve
