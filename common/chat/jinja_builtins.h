// The built-in filters, tests, methods and global functions, with @huggingface/jinja's
// behaviour (e.g. str.strip(chars) ignores `chars` and trims all whitespace, as the reference
// does; filters dispatch on the operand type and fail on types the reference rejects).
#pragma once

#include <string_view>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

class Interpreter;
class Scope;

// x.name / x[key]: dict entries, then dict/str/list methods; undefined when absent.
Value get_attribute(const Value& object, const Value& property);
// x[start:stop:step] on lists and strings (strings by code point); each bound may be undefined.
Value slice_value(const Value& object, const Value& start, const Value& stop, const Value& step);
// `operand | filter` where `filter` is a kFilter node and `args` its evaluated arguments.
Value apply_filter(Interpreter& interpreter, const Expr& filter, const Value& operand,
                   const CallArgs& args);
// `operand is name(args)`.
bool apply_test(std::string_view name, const Value& operand, const CallArgs& args);
// true/false/none (and the capitalised spellings), namespace, range, raise_exception,
// strftime_now.
void install_globals(Scope& globals);

}  // namespace pdserve::jinja
