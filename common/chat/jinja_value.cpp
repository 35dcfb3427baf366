#include "common/chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {

Object::Object(std::vector<std::pair<std::string, Value>> distinct_entries)
    : entries_(std::move(distinct_entries)) {
  if (entries_.size() > kLinearScanLimit) {
    for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  }
}

const Value* Object::find(std::string_view key) const {
  if (index_.empty()) {
    for (const auto& entry : entries_) {
      if (entry.first == key) return &entry.second;
    }
    return nullptr;
  }
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Object::set(std::string key, Value value) {
  if (index_.empty()) {
    for (auto& entry : entries_) {
      if (entry.first == key) {
        entry.second = std::move(value);
        return;
      }
    }
    entries_.emplace_back(std::move(key), std::move(value));
    // Small objects (messages, loop) are scanned; larger ones get a hash index.
    if (entries_.size() > kLinearScanLimit) {
      for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
    }
    return;
  }
  auto [it, inserted] = index_.try_emplace(key, entries_.size());
  if (inserted) {
    entries_.emplace_back(std::move(key), std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
}

void Object::clear() {
  entries_.clear();
  index_.clear();
}

const Value* CallArgs::keyword_arg(std::string_view name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

const Value* CallArgs::arg(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return keyword_arg(name);
}

namespace {

void check_depth(int depth) {
  if (depth > kMaxValueDepth) {
    fail_resource("value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
}

}  // namespace

Value Value::array(std::vector<Value> items, bool is_tuple) {
  auto array = std::make_shared<Array>();
  for (const Value& item : items) array->depth = std::max(array->depth, item.depth() + 1);
  check_depth(array->depth);
  array->items = std::move(items);
  array->is_tuple = is_tuple;
  return Value(ArrayPtr(std::move(array)));
}

Value Value::object(Object object) {
  for (const auto& entry : object.entries())
    object.depth = std::max(object.depth, entry.second.depth() + 1);
  check_depth(object.depth);
  return Value(ObjectPtr(std::make_shared<Object>(std::move(object))));
}

Value Value::name_space(Object object) {
  return Value(std::make_shared<Object>(std::move(object)));
}

Value Value::function(std::string name, std::function<Value(Interpreter&, Scope&, CallArgs&)> fn) {
  return Value(FunctionPtr(std::make_shared<Function>(Function{std::move(name), std::move(fn)})));
}

const Object& Value::as_object() const {
  if (is(Type::kNamespace)) return *std::get<NamespacePtr>(data_);
  return *std::get<ObjectPtr>(data_);
}

const void* Value::identity() const {
  switch (type()) {
    case Type::kArray:
      return std::get<ArrayPtr>(data_).get();
    case Type::kObject:
      return std::get<ObjectPtr>(data_).get();
    case Type::kNamespace:
      return std::get<NamespacePtr>(data_).get();
    case Type::kFunction:
      return std::get<FunctionPtr>(data_).get();
    default:
      return nullptr;
  }
}

int Value::depth() const {
  switch (type()) {
    case Type::kArray:
      return as_array().depth;
    case Type::kObject:
      return as_object().depth;
    case Type::kNamespace:
      return 1;  // mutable: cycles are cut when the render ends
    default:
      return 0;
  }
}

bool Value::truthy() const {
  switch (type()) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return as_bool();
    case Type::kInt:
      return as_int() != 0;
    case Type::kFloat:
      return as_float() != 0 && !std::isnan(as_float());
    case Type::kString:
      return !as_string().empty();
    case Type::kArray:
      return !as_array().items.empty();
    case Type::kObject:
      return as_object().size() > 0;
    case Type::kNamespace:
    case Type::kFunction:
      return true;
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (type()) {
    case Type::kUndefined:
      return "undefined";
    case Type::kNone:
      return "none";
    case Type::kBool:
      return "boolean";
    case Type::kInt:
      return "integer";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "string";
    case Type::kArray:
      return is_tuple() ? "tuple" : "list";
    case Type::kObject:
      return "dict";
    case Type::kNamespace:
      return "namespace";
    case Type::kFunction:
      return "function";
  }
  return "?";
}

std::string type_of(const Value& value) {
  std::string_view name = value.type_name();
  if (value.is_undefined() || value.is_none()) return std::string(name);
  bool vowel =
      name[0] == 'a' || name[0] == 'e' || name[0] == 'i' || name[0] == 'o' || name[0] == 'u';
  return (vowel ? "an " : "a ") + std::string(name);
}

std::string float_to_string(double value) {
  if (value == 0 && std::signbit(value)) return "-0.0";
  if (std::isfinite(value) && std::floor(value) == value && std::fabs(value) < 1e21) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.1f", value);
    return buffer;
  }
  return js_number_to_string(value);
}

std::string to_output(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return "";
    case Value::Type::kBool:
      return value.as_bool() ? "true" : "false";
    case Value::Type::kInt:
      return std::to_string(value.as_int());
    case Value::Type::kFloat:
      return float_to_string(value.as_float());
    case Value::Type::kString:
      return value.as_string();
    case Value::Type::kArray:
    case Value::Type::kObject:
    case Value::Type::kNamespace: {
      JsonOptions options;
      options.undefined_as_null = false;
      options.python_floats = false;
      return to_json(value, options);
    }
    case Value::Type::kFunction:
      fail("cannot print function '" + value.as_function().name + "'");
  }
  return "";
}

std::string to_raw_string(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return "";
    case Value::Type::kFloat:
      return js_number_to_string(value.as_float());
    case Value::Type::kArray: {
      std::string out;
      for (size_t i = 0; i < value.as_array().items.size(); ++i) {
        const Value& item = value.as_array().items[i];
        if (i > 0) out += ',';
        out += item.is_none() ? "null" : item.is_undefined() ? "undefined" : to_output(item);
      }
      return out;
    }
    case Value::Type::kObject:
    case Value::Type::kNamespace:
      return "[object Map]";
    default:
      return to_output(value);
  }
}

namespace {

void append_json_string(std::string& out, std::string_view text, bool ensure_ascii) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto append_unit = [&](uint32_t unit) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(unit >> shift) & 0xF];
  };
  out += '"';
  for (size_t pos = 0; pos < text.size();) {
    size_t start = pos;
    char32_t cp = decode_utf8(text, pos);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      append_unit(cp);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        append_unit(0xD800 + ((cp - 0x10000) >> 10));
        append_unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        append_unit(cp);
      }
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  out += '"';
}

// Approximates String#localeCompare (ICU root collation) for object keys: case-insensitive
// first, then lower case before upper case.
bool locale_less(const std::string& a, const std::string& b) {
  std::string la = to_lower(a);
  std::string lb = to_lower(b);
  if (la != lb) return la < lb;
  return a > b;
}

void append_json(std::string& out, const Value& value, const JsonOptions& options, int depth) {
  if (depth > 2 * kMaxValueDepth) fail_resource("value nested too deeply to serialize (a cycle?)");
  std::string item_separator = options.custom_separators ? options.item_separator
                               : options.indent > 0      ? ","
                                                         : ", ";
  std::string key_separator = options.custom_separators ? options.key_separator : ": ";
  std::string indent_unit(static_cast<size_t>(options.indent), ' ');
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent_unit;
  std::string child_padding = base_padding + indent_unit;
  bool pretty = options.indent > 0;

  switch (value.type()) {
    case Value::Type::kUndefined:
      out += options.undefined_as_null ? "null" : "undefined";
      return;
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(value.as_int());
      return;
    case Value::Type::kFloat:
      if (!std::isfinite(value.as_float())) {
        out += "null";
      } else {
        out += options.python_floats ? python_float_repr(value.as_float())
                                     : js_number_to_string(value.as_float());
      }
      return;
    case Value::Type::kString:
      append_json_string(out, value.as_string(), options.ensure_ascii);
      return;
    case Value::Type::kArray: {
      if (value.is_tuple()) fail("cannot convert a tuple to JSON");
      const auto& items = value.as_array().items;
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        if (pretty) out += child_padding;
        append_json(out, items[i], options, depth + 1);
      }
      if (pretty && !items.empty()) out += base_padding;
      out += ']';
      return;
    }
    case Value::Type::kObject:
    case Value::Type::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.as_object().entries()) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          return locale_less(a->first, b->first);
        });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        if (pretty) out += child_padding;
        append_json_string(out, entries[i]->first, options.ensure_ascii);
        out += key_separator;
        append_json(out, entries[i]->second, options, depth + 1);
      }
      if (pretty && !entries.empty()) out += base_padding;
      out += '}';
      return;
    }
    case Value::Type::kFunction:
      fail("cannot convert function '" + value.as_function().name + "' to JSON");
  }
}

bool is_scalar(const Value& v) {
  return v.identity() == nullptr;
}

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  append_json(out, value, options, 0);
  return out;
}

bool strict_equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Type::kString:
      return a.as_string() == b.as_string();
    default:
      return a.identity() == b.identity();
  }
}

bool loose_equals(const Value& a, const Value& b) {
  bool a_nullish = a.is_undefined() || a.is_none();
  bool b_nullish = b.is_undefined() || b.is_none();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (a.is(Value::Type::kBool)) return loose_equals(Value::integer(a.as_bool() ? 1 : 0), b);
  if (b.is(Value::Type::kBool)) return loose_equals(a, Value::integer(b.as_bool() ? 1 : 0));
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.is(Value::Type::kString) && b.is(Value::Type::kString))
    return a.as_string() == b.as_string();
  if (a.is_number() && b.is(Value::Type::kString))
    return a.as_number() == js_string_to_number(b.as_string());
  if (a.is(Value::Type::kString) && b.is_number())
    return js_string_to_number(a.as_string()) == b.as_number();
  if (!is_scalar(a) && !is_scalar(b)) return a.identity() == b.identity();
  // A container against a primitive compares its string form (JS ToPrimitive).
  if (a.is(Value::Type::kFunction) || b.is(Value::Type::kFunction)) return false;
  if (!is_scalar(a)) return loose_equals(Value::string(to_raw_string(a)), b);
  return loose_equals(a, Value::string(to_raw_string(b)));
}

}  // namespace pdserve::jinja
