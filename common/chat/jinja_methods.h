// The methods of strings and dicts (x.upper(), d.items(), ...), with @huggingface/jinja's
// behaviour; the filters reuse some of them.
#pragma once

#include <string>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

class Interpreter;

// The bound method `name` of a string, or undefined when strings have none by that name.
Value string_method(const std::string& text, const std::string& name);
// The bound method `name` of a dict, or undefined when dicts have none by that name.
Value dict_method(const Value& dict, const std::string& name);
// [[key, value], ...] in insertion order.
Value dict_items(const Object& object);
// str.replace(old, new[, count]).
Value replace_string(Interpreter& interpreter, const std::string& text, const CallArgs& args);

}  // namespace pdserve::jinja
