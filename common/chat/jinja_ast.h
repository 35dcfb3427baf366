// Syntax tree of a parsed template. Nodes keep the byte offset of their source construct for
// error messages. Expression depth is bounded by the parser (kMaxExpressionDepth) so that
// evaluating and destroying a tree never recurses without bound.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

inline constexpr int kMaxExpressionDepth = 64;
inline constexpr int kMaxStatementNesting = 64;

enum class ExprKind {
  kLiteral,  // literal
  kName,     // name
  kList,     // items
  kTuple,    // items
  kDict,     // items: key0, value0, key1, value1, ...
  kUnary,    // name: "not" "-" "+"; left: operand
  kBinary,   // name: operator; left, right
  kMember,   // left: object; right: property (a literal for x.name and x.0)
  kSlice,    // left: object; slice_start/stop/step (each may be null)
  kCall,     // left: callee; args
  kFilter,   // left: operand; name; args; call_form: written with parentheses
  kTest,     // left: operand; name; args; negated
  kTernary,  // condition ? left : right
  kSelect,   // left if condition (undefined otherwise)
};

// Operators of kUnary and kBinary nodes, resolved once by the parser.
enum class Op {
  kNone,
  kAnd,
  kOr,
  kNot,
  kEq,
  kNe,
  kLt,
  kGt,
  kLe,
  kGe,
  kIn,
  kNotIn,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat
};

Op operator_from_name(std::string_view name);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct CallArg {
  std::string keyword;  // empty for a positional argument
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  int depth = 1;
  Value literal;
  std::string name;
  Op op = Op::kNone;
  std::vector<ExprPtr> items;
  std::vector<CallArg> args;
  ExprPtr left, right, condition;
  ExprPtr slice_start, slice_stop, slice_step;
  bool call_form = false;
  bool negated = false;
};

enum class StmtKind {
  kText,         // text
  kOutput,       // expr
  kIf,           // branches (if, elif...); else_body
  kFor,          // targets (tuple_target); expr: iterable; condition (may be null); body; else_body
  kSet,          // targets (tuple_target) or target_object + target_attribute; expr or body
  kMacro,        // name; params; body; uses_kwargs/uses_varargs
  kFilterBlock,  // filter (a kFilter expression whose operand is null); body
  kBreak,
  kContinue,
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

struct IfBranch {
  ExprPtr test;
  std::vector<StmtPtr> body;
};

struct Stmt {
  StmtKind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  bool tuple_target = false;
  ExprPtr target_object;
  std::string target_attribute;
  std::vector<IfBranch> branches;
  std::vector<StmtPtr> body;
  std::vector<StmtPtr> else_body;
  std::string name;
  std::vector<MacroParam> params;
  bool uses_kwargs = false;
  bool uses_varargs = false;
  ExprPtr filter;
};

struct Program {
  std::string source;  // the original template, for error positions
  std::vector<StmtPtr> body;
};

}  // namespace pdserve::jinja
