// Runtime values of the template engine, modelled on @huggingface/jinja's so templates render
// the same bytes: integers and floats are distinct (1.0 prints "1.0"), none and undefined
// print nothing, booleans print "true"/"false", lists and dicts print as JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace pdserve::jinja {

class Value;
class Interpreter;
class Scope;

// Containers deeper than this are refused when built, so that printing, serializing and
// destroying values never recurse without bound.
inline constexpr int kMaxValueDepth = 128;

struct Array {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;
};

// An insertion-ordered string-keyed map (JS Map semantics).
class Object {
 public:
  Object() = default;
  // From entries whose keys are known to be distinct (JSON objects, the loop variable).
  explicit Object(std::vector<std::pair<std::string, Value>> distinct_entries);

  const Value* find(std::string_view key) const;
  // Inserts or overwrites in place (keeps the original position, as Map#set does).
  void set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  void clear();
  int depth = 1;

 private:
  static constexpr size_t kLinearScanLimit = 16;
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;  // built once entries_ outgrows a scan
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  const Value* keyword_arg(std::string_view name) const;
  // positional[index], else keyword `name`, else nullptr.
  const Value* arg(size_t index, std::string_view name) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, Scope&, CallArgs&)> call;
};

struct Undefined {};
struct None {};

using ArrayPtr = std::shared_ptr<const Array>;
using ObjectPtr = std::shared_ptr<const Object>;
using NamespacePtr = std::shared_ptr<Object>;  // the only mutable container
using FunctionPtr = std::shared_ptr<const Function>;

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,
    kFunction
  };

  Value() = default;
  static Value none() { return Value(None{}); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value floating(double d) { return Value(d); }
  static Value string(std::string s) { return Value(std::move(s)); }
  // Throw (ResourceExhausted) when nesting exceeds kMaxValueDepth.
  static Value array(std::vector<Value> items, bool is_tuple = false);
  static Value object(Object object);
  static Value name_space(Object object);
  static Value function(std::string name, std::function<Value(Interpreter&, Scope&, CallArgs&)> fn);

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is(Type t) const { return type() == t; }
  bool is_undefined() const { return is(Type::kUndefined); }
  bool is_none() const { return is(Type::kNone); }
  bool is_number() const { return is(Type::kInt) || is(Type::kFloat); }
  bool is_array() const { return is(Type::kArray); }
  bool is_tuple() const { return is_array() && as_array().is_tuple; }
  // Object or namespace: things with string-keyed attributes.
  bool is_attribute_container() const { return is(Type::kObject) || is(Type::kNamespace); }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  double as_number() const { return is(Type::kInt) ? static_cast<double>(as_int()) : as_float(); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const Array& as_array() const { return *std::get<ArrayPtr>(data_); }
  const Object& as_object() const;  // object or namespace
  Object& as_namespace() const { return *std::get<NamespacePtr>(data_); }
  const NamespacePtr& namespace_ptr() const { return std::get<NamespacePtr>(data_); }
  const Function& as_function() const { return *std::get<FunctionPtr>(data_); }
  // Identity of a container (for equality and membership): nullptr for scalars.
  const void* identity() const;
  int depth() const;

  // Python-style truthiness as the reference implements it.
  bool truthy() const;
  // Name used in error messages ("StringValue"-like, but readable).
  std::string_view type_name() const;

 private:
  template <typename T>
  explicit Value(T value) : data_(std::move(value)) {}

  std::variant<Undefined, None, bool, int64_t, double, std::string, ArrayPtr, ObjectPtr,
               NamespacePtr, FunctionPtr>
      data_;
};

// The type with an article for error messages: "a string", "an integer", "undefined".
std::string type_of(const Value& value);

// What {{ value }} prints (undefined and none print nothing; functions cannot be printed).
std::string to_output(const Value& value);
// JavaScript's String(raw value), used by ~, string + and join: floats print like JS numbers
// ("1", not "1.0"); none/undefined give "" in joins.
std::string to_raw_string(const Value& value);
// The float printing rule: integral values keep ".0".
std::string float_to_string(double value);

struct JsonOptions {
  int indent = 0;  // 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool custom_separators = false;
  std::string item_separator;
  std::string key_separator;
  bool undefined_as_null = true;  // false when printing containers ("undefined" literally)
  // tojson writes floats as Python's json.dumps does (transformers' tojson); printing a
  // container keeps the JavaScript number format of the rest of the interpreter.
  bool python_floats = true;
};
// The reference's toJSON (Python json.dumps-like: ", " and ": " separators, no ASCII escaping
// by default, key order preserved). Tuples and functions cannot be serialized.
std::string to_json(const Value& value, const JsonOptions& options);

// JavaScript `==` on the underlying values (1 == "1", none == undefined; containers by identity).
bool loose_equals(const Value& a, const Value& b);
// JavaScript `===` on the underlying values (1 === 1.0; containers by identity).
bool strict_equals(const Value& a, const Value& b);

}  // namespace pdserve::jinja
