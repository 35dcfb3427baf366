#include "common/chat/jinja_builtin_args.h"

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {

using Type = Value::Type;

Value make_method(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  return Value::function(std::move(name),
                         [fn = std::move(fn)](Interpreter& interpreter, Scope&, CallArgs& args) {
                           return fn(interpreter, args);
                         });
}

void reject_keywords(const CallArgs& args, std::string_view what) {
  if (!args.keyword.empty()) {
    fail(std::string(what) + "() got an unexpected keyword argument '" +
         args.keyword.front().first + "'");
  }
}

const Value* positional(const CallArgs& args, size_t index) {
  return index < args.positional.size() ? &args.positional[index] : nullptr;
}

bool js_truthy(const Value& v) {
  return v.identity() != nullptr || v.truthy();
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_none() && b.is_none()) return 0;
  if (a.is_none() || b.is_none()) fail("cannot compare " + type_of(a) + " with " + type_of(b));
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined())
    fail("cannot compare " + type_of(a) + " with " + type_of(b));
  auto numeric = [](const Value& v) { return v.is_number() || v.is(Type::kBool); };
  if (numeric(a) && numeric(b)) {
    double x = a.is(Type::kBool) ? (a.as_bool() ? 1 : 0) : a.as_number();
    double y = b.is(Type::kBool) ? (b.as_bool() ? 1 : 0) : b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type() != b.type()) fail("cannot compare " + type_of(a) + " with " + type_of(b));
  if (!a.is(Type::kString)) fail("cannot compare values of type " + type_of(a));
  std::string x = case_sensitive ? a.as_string() : to_lower(a.as_string());
  std::string y = case_sensitive ? b.as_string() : to_lower(b.as_string());
  return x < y ? -1 : x > y ? 1 : 0;
}

bool bool_option(const Value* value, bool fallback, std::string_view name) {
  if (value == nullptr) return fallback;
  if (!value->is(Type::kBool)) fail(std::string(name) + " must be a boolean");
  return value->as_bool();
}

Value attribute_path(const Value& item, const std::string& path) {
  Value value = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (value.is_attribute_container()) {
      const Value* found = value.as_object().find(part);
      value = found ? *found : Value();
    } else if (value.is_array()) {
      double index = 0;
      const auto& items = value.as_array().items;
      if (!js_parse_int(part, index) || index < 0 || index >= static_cast<double>(items.size()))
        return Value();
      value = items[static_cast<size_t>(index)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return value;
    start = dot + 1;
  }
}

}  // namespace pdserve::jinja
