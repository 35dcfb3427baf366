#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <string>

namespace pdserve::tokenizer_detail {
namespace {

// Bounds on one match, so that a pathological pattern fails with a Status instead of hanging.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 100'000;

std::string pcre2_message(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int length = pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  return length < 0
             ? "PCRE2 error " + std::to_string(error_code)
             : std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

// Byte length of the UTF-8 character that starts with `lead`.
size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

}  // namespace

void MatchScratch::MatchDataDeleter::operator()(pcre2_match_data* data) const {
  pcre2_match_data_free(data);
}
void MatchScratch::ContextDeleter::operator()(pcre2_match_context* context) const {
  pcre2_match_context_free(context);
}
void RegexSplitter::CodeDeleter::operator()(pcre2_code* code) const {
  pcre2_code_free(code);
}

MatchScratch::MatchScratch()
    : match_data_(pcre2_match_data_create(1, nullptr)),
      context_(pcre2_match_context_create(nullptr)) {
  if (!match_data_ || !context_) throw std::bad_alloc();
  pcre2_set_match_limit(context_.get(), kMatchLimit);
  pcre2_set_depth_limit(context_.get(), kDepthLimit);
}

Result<RegexSplitter> RegexSplitter::compile(const SplitSpec& spec) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* raw =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spec.pattern.data()), spec.pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (raw == nullptr) {
    return invalid_argument("bad regex /" + spec.pattern + "/ at offset " +
                            std::to_string(error_offset) + ": " + pcre2_message(error_code));
  }
  std::shared_ptr<pcre2_code> code(raw, CodeDeleter());
  // Without JIT support (some platforms) matching falls back to the interpreter, same results.
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  return RegexSplitter(std::move(code), spec.behavior);
}

Status RegexSplitter::split(std::string_view text, TextPiece piece, MatchScratch& scratch,
                            std::vector<TextPiece>& out) const {
  // The piece is matched as a string of its own, as HF does: look-arounds and anchors cannot see
  // the text around it.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
  const size_t length = piece.end - piece.begin;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data());
  size_t gap_begin = 0;  // start of the text not yet covered by a match, relative to the piece
  size_t search_from = 0;
  while (search_from < length) {
    const int rc = pcre2_match(code_.get(), subject, length, search_from, PCRE2_NO_UTF_CHECK,
                               scratch.match_data(), scratch.context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return resource_exhausted("pre-tokenizer regex failed at byte " +
                                std::to_string(piece.begin + search_from) + ": " +
                                pcre2_message(rc));
    }
    const size_t match_begin = ovector[0];
    const size_t match_end = ovector[1];
    if (match_end == match_begin) {  // empty matches split nothing; step over one character
      if (match_begin >= length) break;
      search_from =
          match_begin + utf8_char_length(static_cast<unsigned char>(subject[match_begin]));
      continue;
    }
    if (match_begin > gap_begin)
      out.push_back({piece.begin + gap_begin, piece.begin + match_begin});
    if (behavior_ == SplitBehavior::kIsolated)
      out.push_back({piece.begin + match_begin, piece.begin + match_end});
    gap_begin = match_end;
    search_from = match_end;
  }
  if (length > gap_begin) out.push_back({piece.begin + gap_begin, piece.end});
  return {};
}

}  // namespace pdserve::tokenizer_detail
