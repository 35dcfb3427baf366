// Tokens -> syntax tree, with @huggingface/jinja's grammar and operator precedence (filters
// bind tighter than tests, tests tighter than * and /; a bare `x if c` yields undefined when
// c is false). Syntax errors are InvalidArgument with the template line:column.
#pragma once

#include <string_view>

#include "common/chat/jinja_ast.h"
#include "common/core/status.h"

namespace pdserve::jinja {

Result<Program> parse_template(std::string_view source);

}  // namespace pdserve::jinja
