// Argument handling and value comparison shared by the Jinja built-ins (methods, filters and
// globals): keyword rejection, optional positionals, JavaScript truthiness, the ordering that
// sort and dictsort use, and "a.b.0" attribute paths.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

class Interpreter;

// A bound method: a function value that ignores the caller's scope.
Value make_method(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
// Fails naming `what` when the call has any keyword argument.
void reject_keywords(const CallArgs& args, std::string_view what);
// The positional argument at `index`, or null when there are fewer.
const Value* positional(const CallArgs& args, size_t index);
// JavaScript truthiness of the underlying value: containers are always true.
bool js_truthy(const Value& v);
// -1, 0 or 1; numbers and booleans compare as numbers, strings optionally case-insensitively;
// anything else fails as the reference does.
int compare_values(const Value& a, const Value& b, bool case_sensitive);
// A boolean option (fails when it is not a boolean), or `fallback` when absent.
bool bool_option(const Value* value, bool fallback, std::string_view name);
// "a.b.0" paths for sort(attribute=) and map(attribute=); undefined when a step is missing.
Value attribute_path(const Value& item, const std::string& path);

}  // namespace pdserve::jinja
