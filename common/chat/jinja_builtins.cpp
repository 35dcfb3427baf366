#include "common/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include "common/chat/jinja_builtin_args.h"
#include "common/chat/jinja_error.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_methods.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {
namespace {

using Type = Value::Type;

// ---- globals --------------------------------------------------------------------------------

Value namespace_function(Interpreter& interpreter, Scope&, CallArgs& args) {
  if (args.positional.size() > 1) fail("namespace() takes at most 1 positional argument");
  Object entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is(Type::kObject)) {
      for (const auto& [key, value] : source.as_object().entries()) entries.set(key, value);
    } else if (source.is_array()) {
      for (const Value& pair : source.as_array().items) {
        if (!pair.is_array() || pair.as_array().items.size() != 2 ||
            !pair.as_array().items[0].is(Type::kString)) {
          fail("namespace() expects a dict or a list of [key, value] pairs");
        }
        entries.set(pair.as_array().items[0].as_string(), pair.as_array().items[1]);
      }
    } else {
      fail("namespace() cannot be built from " + type_of(source));
    }
  }
  for (auto& [key, value] : args.keyword) entries.set(key, value);
  return interpreter.make_namespace(std::move(entries));
}

Value range_function(Interpreter& interpreter, Scope&, CallArgs& args) {
  reject_keywords(args, "range");
  if (args.positional.empty() || args.positional.size() > 3) fail("range() takes 1 to 3 arguments");
  for (const Value& arg : args.positional) {
    if (!arg.is(Type::kInt)) fail("range() arguments must be integers");
  }
  int64_t start = args.positional.size() == 1 ? 0 : args.positional[0].as_int();
  int64_t stop =
      args.positional.size() == 1 ? args.positional[0].as_int() : args.positional[1].as_int();
  int64_t step = args.positional.size() == 3 ? args.positional[2].as_int() : 1;
  if (step == 0) fail("range() step must not be zero");
  double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                           static_cast<double>(step));
  interpreter.budget().check_list(count > 0 ? static_cast<size_t>(std::min(count, 1e18)) : 0);
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    items.push_back(Value::integer(i));
  return Value::array(std::move(items));
}

Value strftime_now_function(Interpreter&, Scope&, CallArgs& args) {
  reject_keywords(args, "strftime_now");
  if (args.positional.empty() || !args.positional[0].is(Type::kString))
    fail("strftime_now() needs a format string");
  static constexpr const char* kMonths[] = {"January",   "February", "March",    "April",
                                            "May",       "June",     "July",     "August",
                                            "September", "October",  "November", "December"};
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
  const std::string& format = args.positional[0].as_string();
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    char spec = format[++i];
    switch (spec) {
      case 'Y':
        out += std::to_string(local.tm_year + 1900);
        break;
      case 'm':
        out += pad2(local.tm_mon + 1);
        break;
      case 'd':
        out += pad2(local.tm_mday);
        break;
      case 'b':
        out += std::string(kMonths[local.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[local.tm_mon];
        break;
      case 'H':
        out += pad2(local.tm_hour);
        break;
      case 'M':
        out += pad2(local.tm_min);
        break;
      case '%':
        out += '%';
        break;
      default:
        out += '%';
        out += spec;
        break;
    }
  }
  return Value::string(std::move(out));
}

}  // namespace

Value get_attribute(const Value& object, const Value& property) {
  if (object.is_attribute_container()) {
    if (!property.is(Type::kString))
      fail("cannot index " + type_of(object) + " with " + type_of(property));
    if (const Value* found = object.as_object().find(property.as_string())) return *found;
    return object.is(Type::kObject) ? dict_method(object, property.as_string()) : Value();
  }
  if (object.is_array() || object.is(Type::kString)) {
    if (property.is(Type::kInt)) {
      if (object.is(Type::kString)) {
        std::string unit;
        return utf16_unit_at(object.as_string(), property.as_int(), unit) ? Value::string(unit)
                                                                          : Value();
      }
      const auto& items = object.as_array().items;
      int64_t index = property.as_int() < 0 ? property.as_int() + static_cast<int64_t>(items.size())
                                            : property.as_int();
      return index >= 0 && index < static_cast<int64_t>(items.size())
                 ? items[static_cast<size_t>(index)]
                 : Value();
    }
    if (!property.is(Type::kString))
      fail("cannot index " + type_of(object) + " with " + type_of(property));
    const std::string& name = property.as_string();
    if (object.is_array()) {
      return name == "length" ? Value::integer(static_cast<int64_t>(object.as_array().items.size()))
                              : Value();
    }
    if (name == "length")
      return Value::integer(static_cast<int64_t>(utf16_length(object.as_string())));
    return string_method(object.as_string(), name);
  }
  if (!property.is(Type::kString))
    fail("cannot index " + type_of(object) + " with " + type_of(property));
  return Value();
}

Value slice_value(const Value& object, const Value& start_value, const Value& stop_value,
                  const Value& step_value) {
  if (!object.is_array() && !object.is(Type::kString)) fail("cannot slice " + type_of(object));
  for (const Value* bound : {&start_value, &stop_value, &step_value}) {
    if (!bound->is(Type::kInt) && !bound->is_undefined()) fail("slice bounds must be integers");
  }
  std::vector<char32_t> code_points;
  int64_t length = 0;
  if (object.is_array()) {
    length = static_cast<int64_t>(object.as_array().items.size());
  } else {
    code_points = to_code_points(object.as_string());
    length = static_cast<int64_t>(code_points.size());
  }
  int64_t step = step_value.is_undefined() ? 1 : step_value.as_int();
  int64_t start = 0;
  int64_t stop = 0;
  if (step >= 0) {
    start = start_value.is_undefined() ? 0 : start_value.as_int();
    stop = stop_value.is_undefined() ? length : stop_value.as_int();
    start = start < 0 ? std::max<int64_t>(length + start, 0) : std::min(start, length);
    stop = stop < 0 ? std::max<int64_t>(length + stop, 0) : std::min(stop, length);
  } else {
    start = start_value.is_undefined() ? length - 1 : start_value.as_int();
    stop = stop_value.is_undefined() ? -1 : stop_value.as_int();
    start = start < 0 ? std::max<int64_t>(length + start, -1) : std::min(start, length - 1);
    stop = stop < -1 ? std::max<int64_t>(length + stop, -1) : std::min(stop, length - 1);
  }
  std::vector<int64_t> indices;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) indices.push_back(i);
  } else if (step < 0) {
    for (int64_t i = start; i > stop; i += step) indices.push_back(i);
  }
  if (object.is_array()) {
    std::vector<Value> items;
    for (int64_t i : indices) items.push_back(object.as_array().items[static_cast<size_t>(i)]);
    return Value::array(std::move(items));
  }
  std::string out;
  for (int64_t i : indices) append_utf8(out, code_points[static_cast<size_t>(i)]);
  return Value::string(std::move(out));
}

bool apply_test(std::string_view name, const Value& operand, const CallArgs& args) {
  if (name == "defined") return !operand.is_undefined();
  if (name == "undefined") return operand.is_undefined();
  if (name == "none") return operand.is_none();
  if (name == "boolean") return operand.is(Type::kBool);
  if (name == "true") return operand.is(Type::kBool) && operand.as_bool();
  if (name == "false") return operand.is(Type::kBool) && !operand.as_bool();
  if (name == "string") return operand.is(Type::kString);
  if (name == "number") return operand.is_number();
  if (name == "integer") return operand.is(Type::kInt);
  if (name == "iterable") return operand.is_array() || operand.is(Type::kString);
  if (name == "mapping") return operand.is(Type::kObject);
  if (name == "sequence")
    return operand.is_array() || operand.is(Type::kObject) || operand.is(Type::kString);
  if (name == "callable") return operand.is(Type::kFunction);
  if (name == "lower")
    return operand.is(Type::kString) && operand.as_string() == to_lower(operand.as_string());
  if (name == "upper")
    return operand.is(Type::kString) && operand.as_string() == to_upper(operand.as_string());
  if (name == "odd" || name == "even") {
    if (!operand.is(Type::kInt))
      fail("test '" + std::string(name) + "' needs an integer, got " + type_of(operand));
    return (operand.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq") {
    if (args.positional.empty())
      fail("test '" + std::string(name) + "' needs a value to compare with");
    return strict_equals(operand, args.positional[0]);
  }
  fail("unknown test '" + std::string(name) + "'");
}

void install_globals(Scope& globals) {
  globals.set("true", Value::boolean(true));
  globals.set("false", Value::boolean(false));
  globals.set("none", Value::none());
  globals.set("True", Value::boolean(true));
  globals.set("False", Value::boolean(false));
  globals.set("None", Value::none());
  globals.set("namespace", Value::function("namespace", namespace_function));
  globals.set("range", Value::function("range", range_function));
  globals.set("strftime_now", Value::function("strftime_now", strftime_now_function));
  globals.set("raise_exception",
              Value::function("raise_exception", [](Interpreter&, Scope&, CallArgs& args) -> Value {
                std::string message =
                    args.positional.empty() ? "" : to_raw_string(args.positional[0]);
                fail("template raised an exception: " + message);
              }));
}

}  // namespace pdserve::jinja
