// Unicode normalizers of tokenizer.json ("NFC", "NFD", "NFKC", "NFKD", or none), via utf8proc.
#pragma once

#include <string>
#include <string_view>

#include "common/core/status.h"

namespace pdserve::tokenizer_detail {

enum class NormalizationForm { kNone, kNfc, kNfd, kNfkc, kNfkd };

// Normalizes valid UTF-8 `text` into `out` (replacing its contents).
Status normalize(NormalizationForm form, std::string_view text, std::string& out);

}  // namespace pdserve::tokenizer_detail
