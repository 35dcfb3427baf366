#include "common/chat/jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <set>
#include <utility>

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_lexer.h"

namespace pdserve::jinja {

Op operator_from_name(std::string_view name) {
  static constexpr std::pair<std::string_view, Op> kOps[] = {
      {"and", Op::kAnd}, {"or", Op::kOr},  {"not", Op::kNot},      {"==", Op::kEq},
      {"!=", Op::kNe},   {"<", Op::kLt},   {">", Op::kGt},         {"<=", Op::kLe},
      {">=", Op::kGe},   {"in", Op::kIn},  {"not in", Op::kNotIn}, {"+", Op::kAdd},
      {"-", Op::kSub},   {"*", Op::kMul},  {"/", Op::kDiv},        {"//", Op::kFloorDiv},
      {"%", Op::kMod},   {"**", Op::kPow}, {"~", Op::kConcat}};
  for (const auto& [text, op] : kOps) {
    if (text == name) return op;
  }
  return Op::kNone;
}

namespace {

class Parser {
 public:
  Parser(std::string_view source, std::vector<Token> tokens)
      : source_(source), tokens_(std::move(tokens)) {}

  std::vector<StmtPtr> run() {
    std::vector<StmtPtr> body;
    while (pos_ < tokens_.size()) parse_any(body);
    return body;
  }

 private:
  // Bounds parser recursion (and so the depth of the tree).
  class DepthGuard {
   public:
    DepthGuard(Parser& parser, int& counter, int limit, std::string_view what) : counter_(counter) {
      if (++counter_ > limit) {
        parser.error("template nested too deeply (more than " + std::to_string(limit) + " " +
                     std::string(what) + ")");
      }
    }
    ~DepthGuard() { --counter_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    int& counter_;
  };

  [[noreturn]] void error(std::string_view message) const {
    size_t offset = pos_ < tokens_.size() ? tokens_[pos_].offset : source_.size();
    throw_at(source_, offset, StatusCode::kInvalidArgument, message);
  }
  [[noreturn]] void error_at(size_t offset, std::string_view message) const {
    throw_at(source_, offset, StatusCode::kInvalidArgument, message);
  }

  bool at_end() const { return pos_ >= tokens_.size(); }
  const Token& peek(size_t ahead = 0) const { return tokens_[pos_ + ahead]; }
  size_t offset() const { return at_end() ? source_.size() : peek().offset; }
  bool is(TokenType type, size_t ahead = 0) const {
    return pos_ + ahead < tokens_.size() && tokens_[pos_ + ahead].type == type;
  }
  bool is_identifier(std::string_view name, size_t ahead = 0) const {
    return is(TokenType::kIdentifier, ahead) && tokens_[pos_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(TokenType::kOpenStatement) || !is(TokenType::kIdentifier, 1)) return false;
    return std::find(names.begin(), names.end(), peek(1).value) != names.end();
  }

  static std::string_view describe(TokenType type) {
    switch (type) {
      case TokenType::kCloseStatement:
        return "'%}'";
      case TokenType::kCloseExpression:
        return "'}}'";
      case TokenType::kCloseParen:
        return "')'";
      case TokenType::kCloseSquare:
        return "']'";
      case TokenType::kColon:
        return "':'";
      case TokenType::kOpenParen:
        return "'('";
      default:
        return "token";
    }
  }

  const Token& expect(TokenType type, std::string_view context) {
    if (!is(type)) {
      std::string found = at_end() ? "end of template" : "'" + peek().value + "'";
      error("expected " + std::string(describe(type)) + " " + std::string(context) + ", found " +
            found);
    }
    return tokens_[pos_++];
  }

  void expect_identifier(std::string_view name) {
    if (!is_identifier(name)) error("expected '" + std::string(name) + "'");
    ++pos_;
  }

  // ---- statements ------------------------------------------------------------------------

  // Parses statements into `body` until one of the `{% end %}`-like names is next.
  void parse_body_until(std::vector<StmtPtr>& body, std::initializer_list<std::string_view> names,
                        size_t opened_at, std::string_view opener) {
    while (!is_statement(names)) {
      if (at_end()) {
        error_at(opened_at, "unexpected end of template: '" + std::string(opener) +
                                "' is never closed (expected '{% " +
                                std::string(*std::prev(names.end())) + " %}')");
      }
      parse_any(body);
    }
  }

  void parse_any(std::vector<StmtPtr>& body) {
    DepthGuard guard(*this, statement_depth_, kMaxStatementNesting, "nested blocks");
    const Token& token = peek();
    switch (token.type) {
      case TokenType::kComment:
        ++pos_;
        return;
      case TokenType::kText: {
        auto stmt = make_stmt(StmtKind::kText, token.offset);
        stmt->text = token.value;
        ++pos_;
        body.push_back(std::move(stmt));
        return;
      }
      case TokenType::kOpenStatement: {
        if (StmtPtr stmt = parse_statement()) body.push_back(std::move(stmt));
        return;
      }
      case TokenType::kOpenExpression: {
        auto stmt = make_stmt(StmtKind::kOutput, token.offset);
        ++pos_;
        stmt->expr = parse_expression();
        expect(TokenType::kCloseExpression, "to close '{{'");
        body.push_back(std::move(stmt));
        return;
      }
      default:
        error("unexpected '" + token.value + "' outside of a tag");
    }
  }

  static StmtPtr make_stmt(StmtKind kind, size_t at) {
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = kind;
    stmt->offset = at;
    return stmt;
  }

  StmtPtr parse_statement() {
    size_t start = offset();
    expect(TokenType::kOpenStatement, "");
    if (!is(TokenType::kIdentifier)) error("expected a statement name after '{%'");
    std::string name = peek().value;
    ++pos_;
    if (name == "set") return parse_set(start);
    if (name == "if") return parse_if(start);
    if (name == "for") return parse_for(start);
    if (name == "macro") return parse_macro(start);
    if (name == "filter") return parse_filter_block(start);
    if (name == "break" || name == "continue") {
      expect(TokenType::kCloseStatement, "after '" + name + "'");
      return make_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, start);
    }
    if (name == "call") error_at(start, "'{% call %}' blocks are not supported");
    error_at(start, "unknown statement '" + name + "'");
  }

  void close_block(std::string_view end_name) {
    expect(TokenType::kOpenStatement, "");
    expect_identifier(end_name);
    expect(TokenType::kCloseStatement, "after '" + std::string(end_name) + "'");
  }

  StmtPtr parse_if(size_t start) {
    auto stmt = make_stmt(StmtKind::kIf, start);
    while (true) {
      IfBranch branch;
      branch.test = parse_expression();
      expect(TokenType::kCloseStatement, "after the if condition");
      parse_body_until(branch.body, {"elif", "else", "endif"}, start, "if");
      stmt->branches.push_back(std::move(branch));
      if (!is_statement({"elif"})) break;
      pos_ += 2;
    }
    if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "after 'else'");
      parse_body_until(stmt->else_body, {"endif"}, start, "if");
    }
    close_block("endif");
    return stmt;
  }

  // A name or a comma-separated tuple of names (loop variables, set targets).
  void set_targets(Stmt& stmt, const Expr& target, std::string_view what) {
    if (target.kind == ExprKind::kName) {
      stmt.targets.push_back(target.name);
      return;
    }
    if (target.kind == ExprKind::kTuple) {
      stmt.tuple_target = true;
      for (const ExprPtr& item : target.items) {
        if (item->kind != ExprKind::kName)
          error_at(item->offset, std::string(what) + " must be names");
        stmt.targets.push_back(item->name);
      }
      return;
    }
    error_at(target.offset, std::string(what) + " must be a name or a tuple of names");
  }

  StmtPtr parse_for(size_t start) {
    auto stmt = make_stmt(StmtKind::kFor, start);
    ExprPtr target = parse_expression_sequence(/*primary=*/true);
    set_targets(*stmt, *target, "loop variables");
    if (!is_identifier("in")) error("expected 'in' after the loop variable");
    ++pos_;
    ExprPtr iterable = parse_expression();
    if (iterable->kind == ExprKind::kSelect) {
      stmt->condition = std::move(iterable->condition);
      stmt->expr = std::move(iterable->left);
    } else {
      stmt->expr = std::move(iterable);
    }
    expect(TokenType::kCloseStatement, "after the for loop header");
    parse_body_until(stmt->body, {"else", "endfor"}, start, "for");
    if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "after 'else'");
      parse_body_until(stmt->else_body, {"endfor"}, start, "for");
    }
    close_block("endfor");
    return stmt;
  }

  StmtPtr parse_set(size_t start) {
    auto stmt = make_stmt(StmtKind::kSet, start);
    ExprPtr target = parse_expression_sequence(/*primary=*/false);
    if (target->kind == ExprKind::kMember && target->right->kind == ExprKind::kLiteral &&
        target->right->literal.is(Value::Type::kString) && target->name == ".") {
      stmt->target_object = std::move(target->left);
      stmt->target_attribute = target->right->literal.as_string();
    } else {
      set_targets(*stmt, *target, "assignment targets");
    }
    if (is(TokenType::kEquals)) {
      ++pos_;
      stmt->expr = parse_expression_sequence(/*primary=*/false);
    } else {
      expect(TokenType::kCloseStatement, "after the set target");
      parse_body_until(stmt->body, {"endset"}, start, "set");
      expect(TokenType::kOpenStatement, "");
      expect_identifier("endset");
    }
    expect(TokenType::kCloseStatement, "to close 'set'");
    return stmt;
  }

  StmtPtr parse_macro(size_t start) {
    auto stmt = make_stmt(StmtKind::kMacro, start);
    if (!is(TokenType::kIdentifier)) error("expected the macro name");
    stmt->name = peek().value;
    ++pos_;
    std::vector<CallArg> params = parse_args(/*parameters=*/true);
    for (CallArg& param : params) {
      if (param.keyword.empty()) {
        stmt->params.push_back(MacroParam{param.value->name, nullptr});
      } else {
        stmt->params.push_back(MacroParam{param.keyword, std::move(param.value)});
      }
    }
    expect(TokenType::kCloseStatement, "after the macro signature");
    open_macros_.push_back(stmt.get());
    parse_body_until(stmt->body, {"endmacro"}, start, "macro");
    open_macros_.pop_back();
    close_block("endmacro");
    return stmt;
  }

  StmtPtr parse_filter_block(size_t start) {
    auto stmt = make_stmt(StmtKind::kFilterBlock, start);
    stmt->filter = parse_filter_spec(nullptr);
    expect(TokenType::kCloseStatement, "after the filter");
    parse_body_until(stmt->body, {"endfilter"}, start, "filter");
    close_block("endfilter");
    return stmt;
  }

  // ---- expressions -----------------------------------------------------------------------

  ExprPtr make_expr(ExprKind kind, size_t at, std::initializer_list<const Expr*> children = {}) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->offset = at;
    for (const Expr* child : children) {
      if (child != nullptr) expr->depth = std::max(expr->depth, child->depth + 1);
    }
    return expr;
  }

  // Recomputes depth after children were attached (lists, calls) and enforces the limit.
  ExprPtr checked(ExprPtr expr) {
    auto visit = [&](const ExprPtr& child) {
      if (child) expr->depth = std::max(expr->depth, child->depth + 1);
    };
    for (const ExprPtr& item : expr->items) visit(item);
    for (const CallArg& arg : expr->args) visit(arg.value);
    visit(expr->left);
    visit(expr->right);
    visit(expr->condition);
    visit(expr->slice_start);
    visit(expr->slice_stop);
    visit(expr->slice_step);
    if (expr->depth > kMaxExpressionDepth) {
      error_at(expr->offset, "expression nested too deeply (more than " +
                                 std::to_string(kMaxExpressionDepth) + " levels)");
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, size_t at) {
    auto expr = make_expr(ExprKind::kBinary, at);
    expr->op = operator_from_name(op);
    expr->name = std::move(op);
    expr->left = std::move(left);
    expr->right = std::move(right);
    return checked(std::move(expr));
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this, expression_depth_, kMaxExpressionDepth, "nested expressions");
    return parse_if_expression();
  }

  ExprPtr parse_expression_sequence(bool primary) {
    size_t start = offset();
    auto next = [&] { return primary ? parse_primary() : parse_expression(); };
    ExprPtr first = next();
    if (!is(TokenType::kComma)) return first;
    auto tuple = make_expr(ExprKind::kTuple, start);
    tuple->items.push_back(std::move(first));
    while (is(TokenType::kComma)) {
      ++pos_;
      tuple->items.push_back(next());
    }
    return checked(std::move(tuple));
  }

  ExprPtr parse_if_expression() {
    size_t start = offset();
    ExprPtr value = parse_or();
    if (!is_identifier("if")) return value;
    ++pos_;
    ExprPtr test = parse_or();
    if (is_identifier("else")) {
      ++pos_;
      auto ternary = make_expr(ExprKind::kTernary, start);
      ternary->condition = std::move(test);
      ternary->left = std::move(value);
      ternary->right = parse_expression();
      return checked(std::move(ternary));
    }
    auto select = make_expr(ExprKind::kSelect, start);
    select->condition = std::move(test);
    select->left = std::move(value);
    return checked(std::move(select));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_identifier("or")) {
      size_t at = offset();
      ++pos_;
      left = binary("or", std::move(left), parse_and(), at);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_identifier("and")) {
      size_t at = offset();
      ++pos_;
      left = binary("and", std::move(left), parse_not(), at);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (!is_identifier("not")) return parse_comparison();
    DepthGuard guard(*this, expression_depth_, kMaxExpressionDepth, "nested expressions");
    auto expr = make_expr(ExprKind::kUnary, offset());
    ++pos_;
    expr->name = "not";
    expr->op = Op::kNot;
    expr->left = parse_not();
    return checked(std::move(expr));
  }

  ExprPtr parse_comparison() {
    ExprPtr left = parse_additive();
    while (true) {
      size_t at = offset();
      std::string op;
      if (is_identifier("not") && is_identifier("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (is_identifier("in")) {
        op = "in";
        ++pos_;
      } else if (is(TokenType::kComparison)) {
        op = peek().value;
        ++pos_;
      } else {
        return left;
      }
      left = binary(std::move(op), std::move(left), parse_additive(), at);
    }
  }

  ExprPtr parse_additive() {
    ExprPtr left = parse_multiplicative();
    while (is(TokenType::kAdditive)) {
      size_t at = offset();
      std::string op = tokens_[pos_++].value;
      left = binary(std::move(op), std::move(left), parse_multiplicative(), at);
    }
    return left;
  }

  ExprPtr parse_multiplicative() {
    ExprPtr left = parse_power();
    while (is(TokenType::kMultiplicative)) {
      size_t at = offset();
      std::string op = tokens_[pos_++].value;
      left = binary(std::move(op), std::move(left), parse_power(), at);
    }
    return left;
  }

  ExprPtr parse_power() {
    ExprPtr left = parse_test();
    while (is(TokenType::kPower)) {
      size_t at = offset();
      ++pos_;
      left = binary("**", std::move(left), parse_test(), at);
    }
    return left;
  }

  ExprPtr parse_test() {
    ExprPtr operand = parse_filter();
    while (is_identifier("is")) {
      auto test = make_expr(ExprKind::kTest, offset());
      ++pos_;
      if (is_identifier("not")) {
        test->negated = true;
        ++pos_;
      }
      if (!is(TokenType::kIdentifier)) error("expected a test name after 'is'");
      test->name = peek().value;
      ++pos_;
      if (is(TokenType::kOpenParen)) test->args = parse_args(/*parameters=*/false);
      test->left = std::move(operand);
      operand = checked(std::move(test));
    }
    return operand;
  }

  // `name` or `name(args)` after '|' (or in {% filter %}), applied to `operand`.
  ExprPtr parse_filter_spec(ExprPtr operand) {
    auto filter = make_expr(ExprKind::kFilter, offset());
    if (!is(TokenType::kIdentifier)) error("expected a filter name");
    filter->name = peek().value;
    ++pos_;
    if (is(TokenType::kOpenParen)) {
      filter->call_form = true;
      filter->args = parse_args(/*parameters=*/false);
    }
    filter->left = std::move(operand);
    return checked(std::move(filter));
  }

  ExprPtr parse_filter() {
    ExprPtr operand = parse_unary_sign();
    while (is(TokenType::kPipe)) {
      ++pos_;
      operand = parse_filter_spec(std::move(operand));
    }
    return operand;
  }

  ExprPtr parse_unary_sign() {
    if ((is(TokenType::kUnary) || is(TokenType::kAdditive)) &&
        (peek().value == "-" || peek().value == "+")) {
      DepthGuard guard(*this, expression_depth_, kMaxExpressionDepth, "nested expressions");
      auto expr = make_expr(ExprKind::kUnary, offset());
      expr->name = peek().value;
      expr->op = operator_from_name(expr->name);
      ++pos_;
      expr->left = parse_unary_sign();
      return checked(std::move(expr));
    }
    return parse_postfix(parse_primary());
  }

  // Member access, subscripts, slices and calls after a primary expression.
  ExprPtr parse_postfix(ExprPtr expr) {
    while (true) {
      size_t at = offset();
      if (is(TokenType::kDot)) {
        ++pos_;
        ExprPtr property = parse_primary();
        bool is_integer =
            property->kind == ExprKind::kLiteral && property->literal.is(Value::Type::kInt);
        if (property->kind != ExprKind::kName && !is_integer) {
          error_at(property->offset, "expected a name or an integer after '.'");
        }
        if (property->kind == ExprKind::kName) {
          auto literal = make_expr(ExprKind::kLiteral, property->offset);
          literal->literal = Value::string(property->name);
          property = std::move(literal);
        }
        auto member = make_expr(ExprKind::kMember, at);
        member->name = ".";
        member->left = std::move(expr);
        member->right = std::move(property);
        expr = checked(std::move(member));
      } else if (is(TokenType::kOpenSquare)) {
        ++pos_;
        expr = parse_subscript(std::move(expr), at);
        expect(TokenType::kCloseSquare, "to close '['");
      } else if (is(TokenType::kOpenParen)) {
        auto call = make_expr(ExprKind::kCall, at);
        call->args = parse_args(/*parameters=*/false);
        call->left = std::move(expr);
        expr = checked(std::move(call));
      } else {
        return expr;
      }
    }
  }

  // x[i] or x[start:stop:step] (the '[' is consumed, the ']' is not).
  ExprPtr parse_subscript(ExprPtr object, size_t at) {
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    while (!is(TokenType::kCloseSquare)) {
      if (at_end()) error("expected ']'");
      if (is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++pos_;
        is_slice = true;
        continue;
      }
      parts.push_back(parse_expression());
      if (is(TokenType::kColon)) {
        ++pos_;
        is_slice = true;
      }
    }
    if (parts.empty()) error("expected an index or a slice inside '[]'");
    if (!is_slice) {
      if (parts.size() > 1) error("expected ']' after the index");
      auto member = make_expr(ExprKind::kMember, at);
      member->name = "[";
      member->left = std::move(object);
      member->right = std::move(parts[0]);
      return checked(std::move(member));
    }
    if (parts.size() > 3) error("a slice takes at most 3 parts");
    parts.resize(3);
    auto slice = make_expr(ExprKind::kSlice, at);
    slice->left = std::move(object);
    slice->slice_start = std::move(parts[0]);
    slice->slice_stop = std::move(parts[1]);
    slice->slice_step = std::move(parts[2]);
    return checked(std::move(slice));
  }

  std::vector<CallArg> parse_args(bool parameters) {
    expect(TokenType::kOpenParen, "");
    std::vector<CallArg> args;
    std::set<std::string> names;
    bool saw_keyword = false;
    while (!is(TokenType::kCloseParen)) {
      if (at_end()) error("expected ')'");
      if (is(TokenType::kPower) || (is(TokenType::kMultiplicative) && peek().value == "*")) {
        error("argument unpacking (* and **) is not supported");
      }
      size_t at = offset();
      CallArg arg;
      arg.value = parse_expression();
      if (is(TokenType::kEquals)) {
        ++pos_;
        if (arg.value->kind != ExprKind::kName) {
          error_at(at,
                   parameters ? "expected a parameter name" : "expected a keyword argument name");
        }
        arg.keyword = arg.value->name;
        arg.value = parse_expression();
        saw_keyword = true;
      } else if (saw_keyword) {
        error_at(at, parameters ? "non-default parameter follows a default parameter"
                                : "positional argument follows keyword arguments");
      }
      if (parameters) {
        if (arg.keyword.empty() && arg.value->kind != ExprKind::kName) {
          error_at(at, "expected a parameter name");
        }
        const std::string& name = arg.keyword.empty() ? arg.value->name : arg.keyword;
        if (!names.insert(name).second) error_at(at, "duplicate parameter '" + name + "'");
      }
      args.push_back(std::move(arg));
      if (is(TokenType::kComma)) ++pos_;
    }
    ++pos_;
    return args;
  }

  ExprPtr parse_literal_number(const Token& token) {
    auto expr = make_expr(ExprKind::kLiteral, token.offset);
    if (token.value.find('.') != std::string::npos) {
      expr->literal = Value::floating(std::strtod(token.value.c_str(), nullptr));
      return expr;
    }
    int64_t value = 0;
    const char* begin = token.value.data();
    const char* end = begin + token.value.size();
    if (*begin == '+') ++begin;
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || ptr != end)
      error_at(token.offset, "integer literal out of range: " + token.value);
    expr->literal = Value::integer(value);
    return expr;
  }

  ExprPtr parse_primary() {
    if (at_end()) error("unexpected end of template inside an expression");
    const Token& token = tokens_[pos_++];
    switch (token.type) {
      case TokenType::kNumber:
        return parse_literal_number(token);
      case TokenType::kString: {
        auto expr = make_expr(ExprKind::kLiteral, token.offset);
        std::string value = token.value;
        while (is(TokenType::kString)) value += tokens_[pos_++].value;
        expr->literal = Value::string(std::move(value));
        return expr;
      }
      case TokenType::kIdentifier: {
        auto expr = make_expr(ExprKind::kName, token.offset);
        expr->name = token.value;
        if (token.value == "kwargs" || token.value == "varargs") {
          for (Stmt* macro : open_macros_) {
            (token.value == "kwargs" ? macro->uses_kwargs : macro->uses_varargs) = true;
          }
        }
        return expr;
      }
      case TokenType::kOpenParen: {
        ExprPtr expr = parse_expression_sequence(/*primary=*/false);
        expect(TokenType::kCloseParen, "to close '('");
        return expr;
      }
      case TokenType::kOpenSquare: {
        auto list = make_expr(ExprKind::kList, token.offset);
        while (!is(TokenType::kCloseSquare)) {
          if (at_end()) error("expected ']'");
          list->items.push_back(parse_expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return checked(std::move(list));
      }
      case TokenType::kOpenCurly: {
        auto dict = make_expr(ExprKind::kDict, token.offset);
        while (!is(TokenType::kCloseCurly)) {
          if (at_end()) error("expected '}'");
          dict->items.push_back(parse_expression());
          expect(TokenType::kColon, "between a key and its value");
          dict->items.push_back(parse_expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return checked(std::move(dict));
      }
      default:
        error_at(token.offset, "unexpected '" + token.value + "' in an expression");
    }
  }

  std::string_view source_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int statement_depth_ = 0;
  int expression_depth_ = 0;
  std::vector<Stmt*> open_macros_;
};

}  // namespace

Result<Program> parse_template(std::string_view source) {
  return capture_status([&]() -> Result<Program> {
    Program program;
    program.source = std::string(source);
    program.body = Parser(program.source, tokenize(program.source)).run();
    return program;
  });
}

}  // namespace pdserve::jinja
