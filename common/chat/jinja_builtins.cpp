#include "common/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <unordered_set>

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {
namespace {

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

// JavaScript truthiness of the underlying value: containers are always true.
bool js_truthy(const Value& v) {
  return v.identity() != nullptr || v.truthy();
}

// ---- comparisons used by sort and dictsort ------------------------------------------------

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

// "a.b.0" paths for sort(attribute=) and map(attribute=).
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

// ---- string methods -------------------------------------------------------------------------

bool matches_affix(const std::string& text, const Value& pattern, bool prefix,
                   std::string_view name) {
  auto test = [&](const std::string& affix) {
    return prefix ? text.starts_with(affix) : text.ends_with(affix);
  };
  if (pattern.is(Type::kString)) return test(pattern.as_string());
  if (pattern.is_array()) {
    for (const Value& item : pattern.as_array().items) {
      if (!item.is(Type::kString)) fail(std::string(name) + "() tuple elements must be strings");
      if (test(item.as_string())) return true;
    }
    return false;
  }
  fail(std::string(name) + "() argument must be a string or a tuple of strings");
}

Value split_string(Interpreter& interpreter, const std::string& text, const CallArgs& args) {
  reject_keywords(args, "split");
  Value separator = positional(args, 0) ? *positional(args, 0) : Value::none();
  if (!separator.is(Type::kString) && !separator.is_none())
    fail("split() separator must be a string or none");
  Value max_value = positional(args, 1) ? *positional(args, 1) : Value::integer(-1);
  if (!max_value.is(Type::kInt)) fail("split() maxsplit must be an integer");
  int64_t max_split = max_value.as_int();
  std::vector<std::string> parts;
  if (separator.is_none()) {
    std::string_view rest = js_trim_start(text);
    while (!rest.empty()) {
      if (max_split != -1 && static_cast<int64_t>(parts.size()) >= max_split) {
        parts.emplace_back(rest);
        break;
      }
      size_t end = 0;
      while (end < rest.size() && js_space_at(rest, end) == 0) ++end;
      parts.emplace_back(rest.substr(0, end));
      rest = js_trim_start(rest.substr(end));
    }
  } else {
    const std::string& sep = separator.as_string();
    if (sep.empty()) fail("split() separator must not be empty");
    size_t start = 0;
    while (true) {
      size_t found = text.find(sep, start);
      if (found == std::string::npos) break;
      parts.push_back(text.substr(start, found - start));
      start = found + sep.size();
    }
    parts.push_back(text.substr(start));
    if (max_split != -1 && static_cast<int64_t>(parts.size()) > max_split) {
      // Array#splice(max_split): a negative start counts from the end.
      int64_t size = static_cast<int64_t>(parts.size());
      size_t keep =
          static_cast<size_t>(max_split < 0 ? std::max<int64_t>(size + max_split, 0) : max_split);
      std::string joined;
      for (size_t i = keep; i < parts.size(); ++i) joined += (i > keep ? sep : "") + parts[i];
      parts.resize(keep);
      parts.push_back(std::move(joined));
    }
  }
  interpreter.budget().check_list(parts.size());
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::string(std::move(part)));
  return Value::array(std::move(items));
}

Value replace_string(Interpreter& interpreter, const std::string& text, const CallArgs& args) {
  if (args.positional.size() < 2) fail("replace() requires at least two arguments");
  const Value& old_value = args.positional[0];
  const Value& new_value = args.positional[1];
  if (!old_value.is(Type::kString) || !new_value.is(Type::kString))
    fail("replace() arguments must be strings");
  const Value* count_arg = args.arg(2, "count");
  Value count = count_arg ? *count_arg : Value::none();
  if (!count.is(Type::kInt) && !count.is_none()) fail("replace() count must be an integer or none");
  int64_t remaining =
      count.is_none() || count.as_int() < 0 ? std::numeric_limits<int64_t>::max() : count.as_int();
  const std::string& from = old_value.as_string();
  const std::string& to = new_value.as_string();
  std::string out;
  if (from.empty()) {
    // An empty pattern matches before every code point and at the end.
    for (size_t pos = 0; pos <= text.size();) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (pos == text.size()) break;
      size_t next = pos;
      decode_utf8(text, next);
      out.append(text, pos, next - pos);
      pos = next;
      interpreter.budget().check_string(out.size());
    }
  } else {
    size_t start = 0;
    while (remaining > 0) {
      size_t found = text.find(from, start);
      if (found == std::string::npos) break;
      out.append(text, start, found - start);
      out += to;
      start = found + from.size();
      --remaining;
      if (out.size() > interpreter.budget().limits().max_string_bytes)
        interpreter.budget().check_string(out.size());
    }
    out.append(text, start);
  }
  interpreter.budget().check_string(out.size());
  return Value::string(std::move(out));
}

Value string_method(const std::string& text, const std::string& name) {
  auto plain = [&](std::function<std::string(const std::string&)> fn) {
    return make_method(name, [text, fn, name](Interpreter&, CallArgs& args) {
      reject_keywords(args, name);
      return Value::string(fn(text));
    });
  };
  if (name == "upper") return plain([](const std::string& s) { return to_upper(s); });
  if (name == "lower") return plain([](const std::string& s) { return to_lower(s); });
  // Python's semantics, as transformers renders (Qwen3's template strips reasoning with
  // .strip('\n'), which keeps spaces; @huggingface/jinja ignores the argument).
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    StripSide side = name == "strip"    ? StripSide::kBoth
                     : name == "lstrip" ? StripSide::kStart
                                        : StripSide::kEnd;
    return make_method(name, [text, side, name](Interpreter&, CallArgs& args) {
      reject_keywords(args, name);
      if (args.positional.size() > 1) fail(name + "() takes at most one argument");
      if (args.positional.empty() || args.positional[0].is_none()) {
        return Value::string(python_strip(text, nullptr, side));
      }
      if (!args.positional[0].is(Type::kString)) fail(name + "() argument must be a string");
      return Value::string(python_strip(text, &args.positional[0].as_string(), side));
    });
  }
  if (name == "title") return plain([](const std::string& s) { return title_case_ascii_words(s); });
  if (name == "capitalize") return plain([](const std::string& s) { return capitalize_first(s); });
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return make_method(name, [text, prefix, name](Interpreter&, CallArgs& args) {
      if (args.positional.empty()) fail(name + "() requires an argument");
      return Value::boolean(matches_affix(text, args.positional[0], prefix, name));
    });
  }
  if (name == "split") {
    return make_method(
        name, [text](Interpreter& in, CallArgs& args) { return split_string(in, text, args); });
  }
  if (name == "replace") {
    return make_method(
        name, [text](Interpreter& in, CallArgs& args) { return replace_string(in, text, args); });
  }
  return Value();
}

// ---- dict methods ---------------------------------------------------------------------------

Value dict_items(const Object& object) {
  std::vector<Value> items;
  for (const auto& [key, value] : object.entries())
    items.push_back(Value::array({Value::string(key), value}));
  return Value::array(std::move(items));
}

Value dict_sort(const Object& object, const CallArgs& args) {
  bool case_sensitive = bool_option(args.arg(0, "case_sensitive"), false, "case_sensitive");
  const Value* by_arg = args.arg(1, "by");
  std::string by = "key";
  if (by_arg) {
    if (!by_arg->is(Type::kString)) fail("dictsort 'by' must be a string");
    by = by_arg->as_string();
  }
  if (by != "key" && by != "value") fail("dictsort 'by' must be 'key' or 'value'");
  bool reverse = bool_option(args.arg(2, "reverse"), false, "reverse");
  std::vector<std::pair<Value, Value>> entries;
  for (const auto& [key, value] : object.entries()) entries.emplace_back(Value::string(key), value);
  std::stable_sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
    int order = by == "key" ? compare_values(a.first, b.first, case_sensitive)
                            : compare_values(a.second, b.second, case_sensitive);
    return reverse ? order > 0 : order < 0;
  });
  std::vector<Value> items;
  for (auto& [key, value] : entries)
    items.push_back(Value::array({std::move(key), std::move(value)}));
  return Value::array(std::move(items));
}

Value dict_method(const Value& dict, const std::string& name) {
  if (name == "get") {
    return make_method(name, [dict](Interpreter&, CallArgs& args) {
      reject_keywords(args, "get");
      if (args.positional.empty() || !args.positional[0].is(Type::kString)) {
        fail("dict.get() key must be a string");
      }
      const Value* found = dict.as_object().find(args.positional[0].as_string());
      if (found) return *found;
      return args.positional.size() > 1 ? args.positional[1] : Value::none();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return make_method(name, [dict, name](Interpreter&, CallArgs&) {
      if (name == "items") return dict_items(dict.as_object());
      std::vector<Value> items;
      for (const auto& [key, value] : dict.as_object().entries()) {
        items.push_back(name == "keys" ? Value::string(key) : value);
      }
      return Value::array(std::move(items));
    });
  }
  if (name == "dictsort") {
    return make_method(
        name, [dict](Interpreter&, CallArgs& args) { return dict_sort(dict.as_object(), args); });
  }
  return Value();
}

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
