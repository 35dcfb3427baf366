#include "common/tokenizer/normalizer.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

namespace pdserve::tokenizer_detail {
namespace {

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

utf8proc_option_t options_for(NormalizationForm form) {
  // The same flags as utf8proc_NFC() and friends, without NUL termination.
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNone:
      break;
  }
  return static_cast<utf8proc_option_t>(options);
}

}  // namespace

Status normalize(NormalizationForm form, std::string_view text, std::string& out) {
  // ASCII is invariant under every normalization form.
  if (form == NormalizationForm::kNone || is_ascii(text)) {
    out.assign(text);
    return {};
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result, options_for(form));
  if (length < 0) {
    return invalid_argument(std::string("Unicode normalization failed: ") +
                            utf8proc_errmsg(length));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  out.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
  return {};
}

}  // namespace pdserve::tokenizer_detail
