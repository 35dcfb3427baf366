// Template source -> tokens, following @huggingface/jinja's lexer: the template is first
// preprocessed with trim_blocks and lstrip_blocks (as transformers.js renders chat templates),
// one trailing newline is dropped, and transformers' {% generation %} markers are removed.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::jinja {

enum class TokenType {
  kText,
  kNumber,
  kString,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquare,
  kCloseSquare,
  kOpenCurly,
  kCloseCurly,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a sign that is not a binary operator
  kComment,
};

struct Token {
  TokenType type;
  std::string value;
  size_t offset;  // byte offset of the token in the original (unprocessed) source
};

// Throws LocatedError (InvalidArgument) on malformed input.
std::vector<Token> tokenize(std::string_view source);

}  // namespace pdserve::jinja
