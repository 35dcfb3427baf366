// The filters (`x | name(args)`), with @huggingface/jinja's behaviour: they dispatch on the
// operand type and fail on types the reference rejects.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "common/chat/jinja_builtin_args.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_error.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_methods.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {
namespace {

using Type = Value::Type;

// ---- filters --------------------------------------------------------------------------------

Value sort_list(const Value& list, const CallArgs& args) {
  bool reverse = bool_option(args.arg(0, "reverse"), false, "reverse");
  bool case_sensitive = bool_option(args.arg(1, "case_sensitive"), false, "case_sensitive");
  const Value* attribute = args.arg(2, "attribute");
  std::string path;
  if (attribute && attribute->is(Type::kString)) {
    path = attribute->as_string();
  } else if (attribute && attribute->is(Type::kInt)) {
    path = std::to_string(attribute->as_int());
  } else if (attribute && !attribute->is_none()) {
    fail("sort attribute must be a string, an integer or none");
  }
  auto key = [&](const Value& item) { return path.empty() ? item : attribute_path(item, path); };
  std::vector<Value> items = list.as_array().items;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    int order = compare_values(key(a), key(b), case_sensitive);
    return reverse ? order > 0 : order < 0;
  });
  return Value::array(std::move(items));
}

Value unique_list(const Value& list) {
  std::vector<Value> out;
  for (const Value& item : list.as_array().items) {
    bool seen = false;
    for (const Value& kept : out) {
      if (strict_equals(kept, item) ||
          (kept.is_number() && item.is_number() && std::isnan(kept.as_number()) &&
           std::isnan(item.as_number()))) {
        seen = true;
        break;
      }
    }
    if (!seen) out.push_back(item);
  }
  return Value::array(std::move(out));
}

Value join_values(Interpreter& interpreter, const std::vector<std::string>& parts,
                  const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
    if (out.size() > interpreter.budget().limits().max_string_bytes)
      interpreter.budget().check_string(out.size());
  }
  interpreter.budget().check_string(out.size());
  return Value::string(std::move(out));
}

std::vector<std::string> raw_strings(const Value& list) {
  std::vector<std::string> parts;
  for (const Value& item : list.as_array().items) parts.push_back(to_raw_string(item));
  return parts;
}

Value indent_text(Interpreter& interpreter, const std::string& text, int64_t width, bool first,
                  bool blank) {
  if (width < 0) fail("indent width must not be negative");
  interpreter.budget().check_string(static_cast<size_t>(width));
  std::string padding(static_cast<size_t>(width), ' ');
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    size_t end = text.find('\n', start);
    std::string_view current = std::string_view(text).substr(
        start, end == std::string::npos ? std::string::npos : end - start);
    bool skip = (!first && line == 0) || (!blank && current.empty());
    if (!skip) out += padding;
    out += current;
    if (end == std::string::npos) break;
    out += '\n';
    start = end + 1;
    interpreter.budget().check_string(out.size());
  }
  return Value::string(std::move(out));
}

Value round_number(const Value& operand, const CallArgs& args) {
  const Value* precision_arg = args.arg(0, "precision");
  int64_t precision = precision_arg && precision_arg->is(Type::kInt) ? precision_arg->as_int() : 0;
  if (precision_arg && !precision_arg->is(Type::kInt)) fail("round precision must be an integer");
  const Value* method_arg = args.arg(1, "method");
  std::string method =
      method_arg && method_arg->is(Type::kString) ? method_arg->as_string() : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("round method must be common, ceil or floor");
  if (precision < 0 || precision > 15) fail("round precision must be between 0 and 15");
  double value = operand.as_number();
  double scale = std::pow(10.0, static_cast<double>(precision));
  double result = 0;
  if (method == "ceil") {
    result = std::ceil(value * scale) / scale;
  } else if (method == "floor") {
    result = std::floor(value * scale) / scale;
  } else {
    // Correctly rounded to `precision` decimals, ties to even (Python's round()).
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(precision), value);
    result = std::strtod(buffer, nullptr);
  }
  return Value::floating(result);
}

bool string_literal_args(const Expr& filter) {
  return std::all_of(filter.args.begin(), filter.args.end(), [](const CallArg& arg) {
    return arg.keyword.empty() && arg.value->kind == ExprKind::kLiteral &&
           arg.value->literal.is(Type::kString);
  });
}

Value select_or_reject(const Expr& filter, const Value& operand, const CallArgs& args) {
  bool select = filter.name == "selectattr";
  for (const Value& item : operand.as_array().items) {
    if (!item.is_attribute_container())
      fail(filter.name + " can only be applied to a list of dicts");
  }
  if (!string_literal_args(filter))
    fail("arguments of " + filter.name + " must be string literals");
  if (args.positional.empty()) fail(filter.name + " needs an attribute name");
  const std::string& attribute = args.positional[0].as_string();
  std::vector<Value> out;
  for (const Value& item : operand.as_array().items) {
    const Value* value = item.as_object().find(attribute);
    bool passed = false;
    if (value != nullptr) {
      if (args.positional.size() > 1) {
        CallArgs test_args;
        if (args.positional.size() > 2) test_args.positional.push_back(args.positional[2]);
        passed = apply_test(args.positional[1].as_string(), *value, test_args);
      } else {
        passed = value->truthy();
      }
    }
    if (passed == select) out.push_back(item);
  }
  return Value::array(std::move(out));
}

Value map_attribute(const Value& operand, const CallArgs& args) {
  const Value* attribute = args.keyword_arg("attribute");
  if (attribute == nullptr) fail("map() without attribute= is not supported");
  if (!attribute->is(Type::kString)) fail("map attribute must be a string");
  const Value* fallback = args.keyword_arg("default");
  std::vector<Value> out;
  for (const Value& item : operand.as_array().items) {
    if (!item.is_attribute_container()) fail("map(attribute=) needs a list of dicts");
    Value value = attribute_path(item, attribute->as_string());
    out.push_back(value.is_undefined() && fallback ? *fallback : value);
  }
  return Value::array(std::move(out));
}

Value to_number_filter(const Value& operand, bool integer, const Value& fallback,
                       std::string_view name) {
  if (operand.is(Type::kString)) {
    double parsed = 0;
    bool ok = integer ? js_parse_int(operand.as_string(), parsed)
                      : js_parse_float(operand.as_string(), parsed);
    if (!ok) return fallback;
    if (!integer) return Value::floating(parsed);
    if (!(std::fabs(parsed) < 9.2e18)) fail("integer out of range: " + operand.as_string());
    return Value::integer(static_cast<int64_t>(parsed));
  }
  if (operand.is(Type::kBool)) {
    return integer ? Value::integer(operand.as_bool() ? 1 : 0)
                   : Value::floating(operand.as_bool() ? 1.0 : 0.0);
  }
  fail("cannot apply filter '" + std::string(name) + "' to " + type_of(operand));
}

Value tojson_filter(const Value& operand, const CallArgs& args) {
  JsonOptions options;
  if (const Value* indent = args.keyword_arg("indent"); indent && !indent->is_none()) {
    if (!indent->is(Type::kInt)) fail("tojson indent must be an integer");
    if (indent->as_int() < 0 || indent->as_int() > 64)
      fail("tojson indent must be between 0 and 64");
    options.indent = static_cast<int>(indent->as_int());
  }
  options.ensure_ascii = bool_option(args.keyword_arg("ensure_ascii"), false, "ensure_ascii");
  options.sort_keys = bool_option(args.keyword_arg("sort_keys"), false, "sort_keys");
  if (const Value* separators = args.keyword_arg("separators");
      separators && !separators->is_none()) {
    if (!separators->is_array() || separators->as_array().items.size() != 2 ||
        !separators->as_array().items[0].is(Type::kString) ||
        !separators->as_array().items[1].is(Type::kString)) {
      fail("tojson separators must be a pair of strings");
    }
    options.custom_separators = true;
    options.item_separator = separators->as_array().items[0].as_string();
    options.key_separator = separators->as_array().items[1].as_string();
  }
  return Value::string(to_json(operand, options));
}

[[noreturn]] void unknown_filter(const std::string& name, const Value& operand) {
  fail("unknown filter '" + name + "' for " + type_of(operand));
}

Value bare_filter(Interpreter& interpreter, const std::string& name, const Value& operand) {
  if (operand.is_array()) {
    const auto& items = operand.as_array().items;
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "length") return Value::integer(static_cast<int64_t>(items.size()));
    if (name == "reverse") return Value::array(std::vector<Value>(items.rbegin(), items.rend()));
    if (name == "sort") return sort_list(operand, CallArgs{});
    if (name == "join") return join_values(interpreter, raw_strings(operand), "");
    if (name == "string") {
      JsonOptions options;
      options.undefined_as_null = false;
      return Value::string(to_json(operand, options));
    }
    if (name == "unique") return unique_list(operand);
    unknown_filter(name, operand);
  }
  if (operand.is(Type::kString)) {
    const std::string& text = operand.as_string();
    if (name == "length") return Value::integer(static_cast<int64_t>(utf16_length(text)));
    if (name == "upper") return Value::string(to_upper(text));
    if (name == "lower") return Value::string(to_lower(text));
    if (name == "title") return Value::string(title_case_ascii_words(text));
    if (name == "capitalize") return Value::string(capitalize_first(text));
    if (name == "trim") return Value::string(python_strip(text, nullptr, StripSide::kBoth));
    if (name == "indent") return indent_text(interpreter, text, 4, false, false);
    if (name == "join" || name == "string") return operand;
    if (name == "int") return to_number_filter(operand, true, Value::integer(0), name);
    if (name == "float") return to_number_filter(operand, false, Value::floating(0), name);
    unknown_filter(name, operand);
  }
  if (operand.is_number()) {
    bool is_int = operand.is(Type::kInt);
    if (name == "abs") {
      if (is_int && operand.as_int() == std::numeric_limits<int64_t>::min())
        fail("integer overflow");
      return is_int ? Value::integer(std::llabs(operand.as_int()))
                    : Value::floating(std::fabs(operand.as_float()));
    }
    if (name == "int") {
      double floored = std::floor(operand.as_number());
      if (!(std::fabs(floored) < 9.2e18)) fail("number out of integer range");
      return is_int ? operand : Value::integer(static_cast<int64_t>(floored));
    }
    if (name == "float") return Value::floating(operand.as_number());
    if (name == "string") return Value::string(to_output(operand));
    if (name == "round") return round_number(operand, CallArgs{});
    unknown_filter(name, operand);
  }
  if (operand.is(Type::kObject)) {
    if (name == "items") return dict_items(operand.as_object());
    if (name == "length") return Value::integer(static_cast<int64_t>(operand.as_object().size()));
    Value method = dict_method(operand, name);
    if (method.is_undefined()) unknown_filter(name, operand);
    CallArgs none;
    Scope unused;
    return interpreter.call(method, none, unused);
  }
  if (operand.is(Type::kBool)) {
    if (name == "bool") return operand;
    if (name == "int") return Value::integer(operand.as_bool() ? 1 : 0);
    if (name == "float") return Value::floating(operand.as_bool() ? 1.0 : 0.0);
    if (name == "string") return Value::string(operand.as_bool() ? "true" : "false");
    unknown_filter(name, operand);
  }
  fail("cannot apply filter '" + name + "' to " + type_of(operand));
}

Value call_filter(Interpreter& interpreter, const Expr& filter, const Value& operand,
                  const CallArgs& args) {
  const std::string& name = filter.name;
  if (name == "tojson") return tojson_filter(operand, args);
  if (name == "join") {
    std::vector<std::string> parts;
    if (operand.is(Type::kString)) {
      for (char32_t cp : to_code_points(operand.as_string())) {
        parts.emplace_back();
        append_utf8(parts.back(), cp);
      }
    } else if (operand.is_array()) {
      parts = raw_strings(operand);
    } else {
      fail("cannot apply filter 'join' to " + type_of(operand));
    }
    const Value* separator = args.arg(0, "separator");
    if (separator && !separator->is(Type::kString)) fail("join separator must be a string");
    return join_values(interpreter, parts, separator ? separator->as_string() : "");
  }
  if (name == "int" || name == "float") {
    bool integer = name == "int";
    const Value* fallback = args.arg(0, "default");
    Value default_value = fallback ? *fallback : integer ? Value::integer(0) : Value::floating(0);
    if (operand.is_number()) return operand;
    return to_number_filter(operand, integer, default_value, name);
  }
  if (name == "default") {
    Value fallback = positional(args, 0) ? *positional(args, 0) : Value::string("");
    bool boolean = bool_option(args.arg(1, "boolean"), false, "boolean");
    return operand.is_undefined() || (boolean && !operand.truthy()) ? fallback : operand;
  }
  if (name == "round" && operand.is_number()) return round_number(operand, args);
  if (operand.is_array()) {
    if (name == "sort") return sort_list(operand, args);
    if (name == "selectattr" || name == "rejectattr")
      return select_or_reject(filter, operand, args);
    if (name == "map") return map_attribute(operand, args);
    unknown_filter(name, operand);
  }
  if (operand.is(Type::kString)) {
    if (name == "indent") {
      const Value* width = args.arg(0, "width");
      if (width && !width->is(Type::kInt)) fail("indent width must be an integer");
      const Value* first = args.arg(1, "first");
      const Value* blank = args.arg(2, "blank");
      return indent_text(interpreter, operand.as_string(), width ? width->as_int() : 4,
                         first && js_truthy(*first), blank && js_truthy(*blank));
    }
    if (name == "replace") return replace_string(interpreter, operand.as_string(), args);
    unknown_filter(name, operand);
  }
  if (operand.is(Type::kObject)) {
    Value method = dict_method(operand, name);
    if (method.is_undefined()) unknown_filter(name, operand);
    CallArgs copy = args;
    Scope unused;
    return interpreter.call(method, copy, unused);
  }
  fail("cannot apply filter '" + name + "' to " + type_of(operand));
}

}  // namespace

Value apply_filter(Interpreter& interpreter, const Expr& filter, const Value& operand,
                   const CallArgs& args) {
  const std::string& name = filter.name;
  if (name == "safe") return operand;
  if (!filter.call_form) {
    if (name == "tojson") return Value::string(to_json(operand, JsonOptions{}));
    if (name == "default") return operand.is_undefined() ? Value::string("") : operand;
    return bare_filter(interpreter, name, operand);
  }
  return call_filter(interpreter, filter, operand, args);
}

}  // namespace pdserve::jinja
