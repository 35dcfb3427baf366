// Deterministic benchmark text: built-in paragraphs shuffled with a seeded generator and
// concatenated into documents until the requested size is reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pdserve::bench {

enum class CorpusKind { kEnglish, kCjk, kCode };

const char* corpus_name(CorpusKind kind);

// Documents of about `document_bytes` each, `total_bytes` in all (never cutting a paragraph).
std::vector<std::string> make_corpus(CorpusKind kind, size_t total_bytes, size_t document_bytes,
                                     uint32_t seed);

}  // namespace pdserve::bench
