#include "common/chat/jinja_methods.h"

#include <algorithm>
#include <limits>

#include "common/chat/jinja_builtin_args.h"
#include "common/chat/jinja_error.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {

using Type = Value::Type;

// ---- string methods -------------------------------------------------------------------------

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace pdserve::jinja
