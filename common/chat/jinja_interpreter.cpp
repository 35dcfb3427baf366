#include "common/chat/jinja_interpreter.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_error.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {

Value Scope::lookup(const std::string& name) const {
  for (const Scope* scope = this; scope != nullptr; scope = scope->parent_) {
    auto it = scope->variables_.find(name);
    if (it != scope->variables_.end()) return it->second;
  }
  return Value();
}

Interpreter::Interpreter(const Program& program, const RenderLimits& limits)
    : program_(program), budget_(limits) {}

Interpreter::~Interpreter() {
  for (const NamespacePtr& ns : namespaces_) ns->clear();
}

Value Interpreter::make_namespace(Object entries) {
  Value value = Value::name_space(std::move(entries));
  namespaces_.push_back(value.namespace_ptr());
  return value;
}

LocatedError Interpreter::located(size_t offset, const Status& status) const {
  return LocatedError(
      Status(status.code(),
             "template " + describe_position(program_.source, offset) + ": " + status.message()));
}

std::string Interpreter::render(Scope& globals) {
  std::string out;
  if (exec_block(program_.body, globals, out) != Flow::kNormal) {
    PDS_THROW(StatusCode::kInvalidArgument, "'break' or 'continue' outside of a for loop");
  }
  return out;
}

void Interpreter::append(std::string& out, std::string_view text) {
  if (out.size() + text.size() > budget_.limits().max_string_bytes) {
    fail_resource("rendered text exceeds " + std::to_string(budget_.limits().max_string_bytes) +
                  " bytes");
  }
  budget_.check_string(text.size());
  out.append(text);
}

Interpreter::Flow Interpreter::exec_block(const std::vector<StmtPtr>& body, Scope& scope,
                                          std::string& out) {
  for (const StmtPtr& stmt : body) {
    Flow flow = exec(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt, Scope& scope, std::string& out) {
  budget_.step();
  DepthScope depth(budget_);
  try {
    switch (stmt.kind) {
      case StmtKind::kText:
        append(out, stmt.text);
        return Flow::kNormal;
      case StmtKind::kOutput: {
        Value value = eval(*stmt.expr, scope);
        if (!value.is_undefined() && !value.is_none()) append(out, to_output(value));
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const IfBranch& branch : stmt.branches) {
          if (eval(*branch.test, scope).truthy()) return exec_block(branch.body, scope, out);
        }
        return exec_block(stmt.else_body, scope, out);
      case StmtKind::kFor:
        return exec_for(stmt, scope, out);
      case StmtKind::kSet: {
        if (stmt.expr) {
          exec_set(stmt, scope);
          return Flow::kNormal;
        }
        std::string captured;
        Flow flow = exec_block(stmt.body, scope, captured);
        if (flow != Flow::kNormal) return flow;
        scope.set(stmt.targets.at(0), Value::string(std::move(captured)));
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        exec_macro(stmt, scope);
        return Flow::kNormal;
      case StmtKind::kFilterBlock: {
        std::string captured;
        Flow flow = exec_block(stmt.body, scope, captured);
        if (flow != Flow::kNormal) return flow;
        Value result = eval_filter(*stmt.filter, Value::string(std::move(captured)), scope);
        if (!result.is_undefined() && !result.is_none()) append(out, to_output(result));
        return Flow::kNormal;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& error) {
    throw located(stmt.offset, error.status());
  }
}

namespace {

// The values a loop item unpacks into (one per target); fails like the reference on shapes
// it cannot unpack.
const std::vector<Value>& unpack_loop_item(const Stmt& stmt, const Value& item) {
  // The reference unpacks lists only (not tuples) in loops.
  if (!item.is_array() || item.is_tuple())
    fail("cannot unpack " + type_of(item) + " into loop variables");
  const auto& values = item.as_array().items;
  if (values.size() != stmt.targets.size()) {
    fail(std::string("too ") + (values.size() < stmt.targets.size() ? "few" : "many") +
         " items to unpack into loop variables");
  }
  return values;
}

void bind_targets(const Stmt& stmt, const Value& item, Scope& scope) {
  if (!stmt.tuple_target) {
    scope.set(stmt.targets[0], item);
    return;
  }
  const auto& values = unpack_loop_item(stmt, item);
  for (size_t i = 0; i < values.size(); ++i) scope.set(stmt.targets[i], values[i]);
}

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& stmt, Scope& scope, std::string& out) {
  Scope loop_scope(&scope);
  Value iterable = eval(*stmt.expr, loop_scope);
  std::vector<Value> candidates;
  if (iterable.is_array()) {
    candidates = iterable.as_array().items;
  } else if (iterable.is(Value::Type::kObject)) {
    for (const auto& entry : iterable.as_object().entries())
      candidates.push_back(Value::string(entry.first));
  } else {
    fail("cannot iterate over " + type_of(iterable));
  }

  std::vector<Value> items;
  for (Value& candidate : candidates) {
    budget_.step();
    if (stmt.condition) {
      Scope test_scope(&loop_scope);
      bind_targets(stmt, candidate, test_scope);
      if (!eval(*stmt.condition, test_scope).truthy()) continue;
    } else if (stmt.tuple_target) {
      unpack_loop_item(stmt, candidate);
    }
    items.push_back(std::move(candidate));
  }

  bool iterated = false;
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    budget_.step();
    std::vector<std::pair<std::string, Value>> loop;
    loop.reserve(9);
    loop.emplace_back("index", Value::integer(i + 1));
    loop.emplace_back("index0", Value::integer(i));
    loop.emplace_back("revindex", Value::integer(length - i));
    loop.emplace_back("revindex0", Value::integer(length - i - 1));
    loop.emplace_back("first", Value::boolean(i == 0));
    loop.emplace_back("last", Value::boolean(i == length - 1));
    loop.emplace_back("length", Value::integer(length));
    loop.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
    loop.emplace_back("nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value());
    loop_scope.set("loop", Value::object(Object(std::move(loop))));
    bind_targets(stmt, items[static_cast<size_t>(i)], loop_scope);
    // An iteration cut short by break/continue contributes nothing (as in the reference).
    std::string iteration;
    Flow flow = exec_block(stmt.body, loop_scope, iteration);
    if (flow == Flow::kContinue) continue;
    if (flow == Flow::kBreak) break;
    append(out, iteration);
    iterated = true;
  }
  if (!iterated) return exec_block(stmt.else_body, loop_scope, out);
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& stmt, Scope& scope) {
  Value value = eval(*stmt.expr, scope);
  if (stmt.target_object) {
    Value target = eval(*stmt.target_object, scope);
    if (!target.is(Value::Type::kNamespace)) {
      fail("cannot assign attribute '" + stmt.target_attribute + "' on " + type_of(target) +
           " (only namespace() objects are mutable)");
    }
    target.as_namespace().set(stmt.target_attribute, std::move(value));
    return;
  }
  if (!stmt.tuple_target) {
    scope.set(stmt.targets[0], std::move(value));
    return;
  }
  if (!value.is_array()) fail("cannot unpack " + type_of(value) + " in set");
  const auto& values = value.as_array().items;
  if (values.size() != stmt.targets.size()) {
    fail(std::string("too ") + (values.size() < stmt.targets.size() ? "few" : "many") +
         " items to unpack in set");
  }
  for (size_t i = 0; i < values.size(); ++i) scope.set(stmt.targets[i], values[i]);
}

void Interpreter::exec_macro(const Stmt& stmt, Scope& scope) {
  const Stmt* macro = &stmt;
  scope.set(stmt.name, Value::function(stmt.name, [macro](Interpreter& interpreter, Scope& caller,
                                                          CallArgs& args) {
              return interpreter.call_macro(*macro, args, caller);
            }));
}

Value Interpreter::call_macro(const Stmt& macro, CallArgs& args, Scope& caller_scope) {
  DepthScope depth(budget_);
  Scope scope(&caller_scope);
  std::vector<std::pair<std::string, Value>> keywords = std::move(args.keyword);
  std::vector<const MacroParam*> pending_defaults;
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const MacroParam& param = macro.params[i];
    Value value;
    bool given = i < args.positional.size();
    if (given) {
      value = args.positional[i];
    } else {
      for (auto it = keywords.begin(); it != keywords.end(); ++it) {
        if (it->first == param.name) {
          value = std::move(it->second);
          keywords.erase(it);
          given = true;
          break;
        }
      }
    }
    if (!given && param.default_value) pending_defaults.push_back(&param);
    scope.set(param.name, std::move(value));
  }
  if (macro.uses_kwargs) {
    Object kwargs;
    for (auto& [key, value] : keywords) kwargs.set(key, std::move(value));
    scope.set("kwargs", Value::object(std::move(kwargs)));
  } else if (!keywords.empty()) {
    fail("macro '" + macro.name + "' takes no keyword argument '" + keywords.front().first + "'");
  }
  if (macro.uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = macro.params.size(); i < args.positional.size(); ++i)
      extra.push_back(args.positional[i]);
    scope.set("varargs", Value::array(std::move(extra)));
  } else if (args.positional.size() > macro.params.size()) {
    fail("macro '" + macro.name + "' takes at most " + std::to_string(macro.params.size()) +
         " argument(s), got " + std::to_string(args.positional.size()));
  }
  for (const MacroParam* param : pending_defaults)
    scope.set(param->name, eval(*param->default_value, scope));
  std::string out;
  if (exec_block(macro.body, scope, out) != Flow::kNormal) {
    fail("'break' or 'continue' outside of a for loop in macro '" + macro.name + "'");
  }
  return Value::string(std::move(out));
}

Value Interpreter::call(const Value& callee, CallArgs& args, Scope& scope) {
  if (!callee.is(Value::Type::kFunction)) fail("cannot call " + type_of(callee));
  return callee.as_function().call(*this, scope, args);
}

CallArgs Interpreter::eval_args(const std::vector<CallArg>& args, Scope& scope) {
  CallArgs result;
  for (const CallArg& arg : args) {
    if (arg.keyword.empty()) result.positional.push_back(eval(*arg.value, scope));
  }
  for (const CallArg& arg : args) {
    if (arg.keyword.empty()) continue;
    for (const auto& existing : result.keyword) {
      if (existing.first == arg.keyword)
        fail("multiple values for keyword argument '" + arg.keyword + "'");
    }
    result.keyword.emplace_back(arg.keyword, eval(*arg.value, scope));
  }
  return result;
}

Value Interpreter::eval_filter(const Expr& filter, Value operand, Scope& scope) {
  CallArgs args = eval_args(filter.args, scope);
  return apply_filter(*this, filter, operand, args);
}

Value Interpreter::eval(const Expr& expr, Scope& scope) {
  budget_.step();
  DepthScope depth(budget_);
  try {
    switch (expr.kind) {
      case ExprKind::kLiteral:
        return expr.literal;
      case ExprKind::kName:
        return scope.lookup(expr.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& item : expr.items) items.push_back(eval(*item, scope));
        budget_.check_list(items.size());
        return Value::array(std::move(items), expr.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        Object object;
        for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          Value key = eval(*expr.items[i], scope);
          if (!key.is(Value::Type::kString)) fail("dict keys must be strings, got " + type_of(key));
          object.set(key.as_string(), eval(*expr.items[i + 1], scope));
        }
        return Value::object(std::move(object));
      }
      case ExprKind::kUnary: {
        Value operand = eval(*expr.left, scope);
        if (expr.op == Op::kNot) return Value::boolean(!operand.truthy());
        bool negate = expr.op == Op::kSub;
        if (operand.is(Value::Type::kFloat))
          return Value::floating(negate ? -operand.as_float() : operand.as_float());
        if (operand.is(Value::Type::kInt) || operand.is(Value::Type::kBool)) {
          int64_t v =
              operand.is(Value::Type::kBool) ? (operand.as_bool() ? 1 : 0) : operand.as_int();
          if (negate && v == std::numeric_limits<int64_t>::min()) fail("integer overflow");
          return Value::integer(negate ? -v : v);
        }
        fail("unary '" + expr.name + "' cannot be applied to " + type_of(operand));
      }
      case ExprKind::kBinary:
        return eval_binary(expr, scope);
      case ExprKind::kMember:
        return get_attribute(eval(*expr.left, scope), eval(*expr.right, scope));
      case ExprKind::kSlice: {
        Value object = eval(*expr.left, scope);
        auto bound = [&](const ExprPtr& e) { return e ? eval(*e, scope) : Value(); };
        Value start = bound(expr.slice_start);
        Value stop = bound(expr.slice_stop);
        Value step = bound(expr.slice_step);
        return slice_value(object, start, stop, step);
      }
      case ExprKind::kCall: {
        CallArgs args = eval_args(expr.args, scope);
        Value callee = eval(*expr.left, scope);
        return call(callee, args, scope);
      }
      case ExprKind::kFilter:
        return eval_filter(expr, eval(*expr.left, scope), scope);
      case ExprKind::kTest: {
        Value operand = eval(*expr.left, scope);
        CallArgs args = eval_args(expr.args, scope);
        return Value::boolean(apply_test(expr.name, operand, args) != expr.negated);
      }
      case ExprKind::kTernary:
        return eval(*expr.condition, scope).truthy() ? eval(*expr.left, scope)
                                                     : eval(*expr.right, scope);
      case ExprKind::kSelect:
        return eval(*expr.condition, scope).truthy() ? eval(*expr.left, scope) : Value();
    }
    return Value();
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& error) {
    throw located(expr.offset, error.status());
  }
}

namespace {

bool numeric_like(const Value& v) {
  return v.is_number() || v.is(Value::Type::kBool);
}

double numeric_value(const Value& v) {
  return v.is(Value::Type::kBool) ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
}

int64_t checked_int(bool overflow, int64_t value) {
  if (overflow) fail("integer overflow");
  return value;
}

Value integer_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  for (int64_t i = 0; i < exponent; ++i) {
    if (__builtin_mul_overflow(result, base, &result)) fail("integer overflow in '**'");
    if (result == 0 || result == 1) break;
    if (result == -1) {
      result = ((exponent - i - 1) % 2 == 0) ? -1 : 1;
      break;
    }
  }
  return Value::integer(result);
}

Value arithmetic(Op op, const Value& left, const Value& right) {
  bool both_int = left.is(Value::Type::kInt) && right.is(Value::Type::kInt);
  if (op == Op::kAdd || op == Op::kSub || op == Op::kMul) {
    if (both_int) {
      int64_t a = left.as_int();
      int64_t b = right.as_int();
      int64_t r = 0;
      bool overflow = op == Op::kAdd   ? __builtin_add_overflow(a, b, &r)
                      : op == Op::kSub ? __builtin_sub_overflow(a, b, &r)
                                       : __builtin_mul_overflow(a, b, &r);
      return Value::integer(checked_int(overflow, r));
    }
    double a = left.as_number();
    double b = right.as_number();
    return Value::floating(op == Op::kAdd ? a + b : op == Op::kSub ? a - b : a * b);
  }
  if (op == Op::kDiv || op == Op::kFloorDiv || op == Op::kMod) {
    if (right.as_number() == 0) fail("division by zero");
    if (op == Op::kDiv) return Value::floating(left.as_number() / right.as_number());
    if (both_int) {
      int64_t a = left.as_int();
      int64_t b = right.as_int();
      if (b == -1)
        return op == Op::kMod
                   ? Value::integer(0)
                   : Value::integer(checked_int(a == std::numeric_limits<int64_t>::min(), -a));
      if (op == Op::kMod) return Value::integer(a % b);  // sign of the dividend, like JS
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return Value::integer(q);
    }
    if (op == Op::kMod) return Value::floating(std::fmod(left.as_number(), right.as_number()));
    return Value::floating(std::floor(left.as_number() / right.as_number()));
  }
  double a = left.as_number();
  double b = right.as_number();
  if (op == Op::kLt) return Value::boolean(a < b);
  if (op == Op::kGt) return Value::boolean(a > b);
  if (op == Op::kLe) return Value::boolean(a <= b);
  if (op == Op::kGe) return Value::boolean(a >= b);
  return Value();  // not an arithmetic operator: the caller reports it
}

}  // namespace

Value Interpreter::eval_binary(const Expr& expr, Scope& scope) {
  const Op op = expr.op;
  const std::string& name = expr.name;
  Value left = eval(*expr.left, scope);
  if (op == Op::kAnd) return left.truthy() ? eval(*expr.right, scope) : left;
  if (op == Op::kOr) return left.truthy() ? left : eval(*expr.right, scope);
  Value right = eval(*expr.right, scope);
  if (op == Op::kEq) return Value::boolean(loose_equals(left, right));
  if (op == Op::kNe) return Value::boolean(!loose_equals(left, right));
  bool membership = op == Op::kIn || op == Op::kNotIn;

  if (left.is_undefined() || right.is_undefined()) {
    // `x in undefined` is false rather than an error.
    if (right.is_undefined() && membership) return Value::boolean(op == Op::kNotIn);
    fail("cannot apply '" + name + "' to an undefined value");
  }
  if (left.is_none() || right.is_none()) fail("cannot apply '" + name + "' to none");
  if (op == Op::kConcat) {
    std::string text = to_raw_string(left) + to_raw_string(right);
    budget_.check_string(text.size());
    return Value::string(std::move(text));
  }
  if (op == Op::kPow && numeric_like(left) && numeric_like(right)) {
    double a = numeric_value(left);
    double b = numeric_value(right);
    if (a == 0 && b < 0) fail("0 cannot be raised to a negative power");
    bool is_float = left.is(Value::Type::kFloat) || right.is(Value::Type::kFloat) || b < 0;
    if (!is_float) return integer_power(static_cast<int64_t>(a), static_cast<int64_t>(b));
    double result = std::pow(a, b);
    if (!std::isfinite(result)) fail("'**' result is not a finite real number");
    return Value::floating(result);
  }
  if (left.is_number() && right.is_number()) {
    Value result = arithmetic(op, left, right);
    if (!result.is_undefined()) return result;
  } else if (left.is_array() && right.is_array()) {
    if (op == Op::kAdd) {
      std::vector<Value> items = left.as_array().items;
      budget_.check_list(items.size() + right.as_array().items.size());
      items.insert(items.end(), right.as_array().items.begin(), right.as_array().items.end());
      return Value::array(std::move(items));
    }
  } else if (right.is_array() && membership) {
    bool found = false;
    for (const Value& item : right.as_array().items) {
      if (strict_equals(item, left)) {
        found = true;
        break;
      }
    }
    return Value::boolean(found == (op == Op::kIn));
  }
  bool left_string = left.is(Value::Type::kString);
  bool right_string = right.is(Value::Type::kString);
  if ((left_string || right_string) && op == Op::kAdd) {
    std::string text = to_raw_string(left) + to_raw_string(right);
    budget_.check_string(text.size());
    return Value::string(std::move(text));
  }
  if (left_string && right_string && membership) {
    bool found = right.as_string().find(left.as_string()) != std::string::npos;
    return Value::boolean(found == (op == Op::kIn));
  }
  if (left_string && right.is(Value::Type::kObject) && membership) {
    bool found = right.as_object().find(left.as_string()) != nullptr;
    return Value::boolean(found == (op == Op::kIn));
  }
  fail("unsupported operator '" + name + "' between " + type_of(left) + " and " + type_of(right));
}

}  // namespace pdserve::jinja
