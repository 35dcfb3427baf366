// Evaluates a parsed template against variables, with @huggingface/jinja's semantics
// (scoping: `for` bodies get their own scope, `if` does not, macros see their caller's scope).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_error.h"
#include "common/chat/jinja_limits.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

// Variables of one block; lookups fall back to the enclosing scope.
class Scope {
 public:
  explicit Scope(Scope* parent = nullptr) : parent_(parent) {}
  Value lookup(const std::string& name) const;  // undefined when absent
  void set(const std::string& name, Value value) { variables_[name] = std::move(value); }
  bool has_local(const std::string& name) const { return variables_.count(name) > 0; }

 private:
  std::unordered_map<std::string, Value> variables_;
  Scope* parent_;
};

class Interpreter {
 public:
  Interpreter(const Program& program, const RenderLimits& limits);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders the whole program; throws pdserve::Error (located) on failure.
  std::string render(Scope& globals);

  Budget& budget() { return budget_; }
  // Namespaces are the only mutable values and may form cycles; they are emptied when the
  // render ends so that shared ownership never leaks.
  Value make_namespace(Object entries);
  Value call(const Value& callee, CallArgs& args, Scope& scope);
  Value call_macro(const Stmt& macro, CallArgs& args, Scope& caller_scope);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_block(const std::vector<StmtPtr>& body, Scope& scope, std::string& out);
  Flow exec(const Stmt& stmt, Scope& scope, std::string& out);
  Flow exec_for(const Stmt& stmt, Scope& scope, std::string& out);
  void exec_set(const Stmt& stmt, Scope& scope);
  void exec_macro(const Stmt& stmt, Scope& scope);
  void append(std::string& out, std::string_view text);

  Value eval(const Expr& expr, Scope& scope);
  Value eval_binary(const Expr& expr, Scope& scope);
  CallArgs eval_args(const std::vector<CallArg>& args, Scope& scope);
  Value eval_filter(const Expr& filter, Value operand, Scope& scope);

  LocatedError located(size_t offset, const Status& status) const;

  const Program& program_;
  Budget budget_;
  std::vector<NamespacePtr> namespaces_;
};

}  // namespace pdserve::jinja
