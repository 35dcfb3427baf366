#include "common/grammar/constraint.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>
#include <xgrammar/xgrammar.h>

namespace pdserve {
namespace {

// OpenAI's strict mode and Python's json.dumps: one line, ", " and ": ", no other whitespace.
const std::pair<std::string, std::string> kSeparators{", ", ": "};

xgrammar::Grammar json_grammar(const std::string& schema) {
  return xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false, std::nullopt,
                                           kSeparators, /*strict_mode=*/true);
}

// `text` as an EBNF string literal.
std::string ebnf_literal(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out + "\"";
}

xgrammar::Grammar literal_grammar(const std::string& text) {
  return xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(text));
}

// Qwen3's hermes tool calls (what its chat template tells the model to write):
//   <tool_call>\n{"name": "<name>", "arguments": <JSON per the tool's parameters>}\n</tool_call>
// one of them, or with "multiple" one or more separated by "\n".
xgrammar::Grammar tool_calls_grammar(const std::string& spec) {
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(spec);
  const nlohmann::ordered_json& tools = parsed.at("tools");
  if (!tools.is_array() || tools.empty()) {
    throw std::invalid_argument("a tool-call constraint needs at least one tool");
  }
  std::vector<xgrammar::Grammar> calls;
  for (const nlohmann::ordered_json& tool : tools) {
    const nlohmann::ordered_json name = tool.at("name").get<std::string>();
    const auto parameters = tool.find("parameters");
    const std::string schema = parameters == tool.end() || parameters->is_null()
                                   ? std::string(R"({"type": "object"})")
                                   : parameters->dump();
    calls.push_back(xgrammar::Grammar::Concat(
        {literal_grammar("<tool_call>\n{\"name\": " + name.dump() + ", \"arguments\": "),
         json_grammar(schema), literal_grammar("}\n</tool_call>")}));
  }
  xgrammar::Grammar one = calls.size() == 1 ? calls[0] : xgrammar::Grammar::Union(calls);
  if (!parsed.value("multiple", false)) return one;
  return xgrammar::Grammar::FromEBNF(
      one.ToString() + "\npdserve_tool_calls ::= root (\"\\n\" root)*\n", "pdserve_tool_calls");
}

// Runs an xgrammar call, turning its exceptions (malformed input) into InvalidArgument.
template <typename Fn>
auto capture_xgrammar(const StructuredOutput& output, Fn&& fn) -> Result<decltype(fn())> {
  try {
    return fn();
  } catch (const std::exception& e) {
    return invalid_argument(std::string("invalid ") + structured_output_kind_name(output.kind) +
                            " constraint: " + e.what());
  }
}

}  // namespace

StructuredOutput choice_output(std::span<const std::string> choices) {
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) ebnf += " | ";
    ebnf += ebnf_literal(choices[i]);
  }
  return {StructuredOutput::Kind::kGrammar, std::move(ebnf)};
}

class CompiledConstraint {
 public:
  CompiledConstraint(xgrammar::CompiledGrammar compiled, int vocab)
      : grammar(std::move(compiled)), vocab_size(vocab) {}
  xgrammar::CompiledGrammar grammar;
  int vocab_size;
};

Status check_structured_output(const StructuredOutput& output) {
  return capture_xgrammar(output, [&] {
           switch (output.kind) {
             case StructuredOutput::Kind::kJsonSchema:
               return json_grammar(output.spec);
             case StructuredOutput::Kind::kRegex:
               return xgrammar::Grammar::FromRegex(output.spec);
             case StructuredOutput::Kind::kGrammar:
               return xgrammar::Grammar::FromEBNF(output.spec);
             case StructuredOutput::Kind::kToolCalls:
               return tool_calls_grammar(output.spec);
           }
           throw std::invalid_argument("unknown kind");
         })
      .status();
}

struct ConstraintCompiler::Impl {
  Tokenizer tokenizer;
  int vocab_size;
  std::vector<int32_t> stop_token_ids;
  std::once_flag once;
  std::optional<xgrammar::GrammarCompiler> compiler;

  // The vocabulary's tables (a sorted copy of every token's bytes: tens of ms for Qwen3's).
  xgrammar::GrammarCompiler& get() {
    std::call_once(once, [&] {
      const int known = std::min(tokenizer.vocab_size(), vocab_size);
      std::vector<std::string> vocab(static_cast<size_t>(known));
      for (int32_t id = 0; id < known; ++id) {
        // An empty string is xgrammar's mark of a special token: never allowed.
        if (tokenizer.is_special(id)) continue;
        if (const auto bytes = tokenizer.token_bytes(id)) vocab[static_cast<size_t>(id)] = *bytes;
      }
      const xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size,
                                         stop_token_ids);
      const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
      compiler.emplace(info, threads, /*cache_enabled=*/true, kCacheBytes);
    });
    return *compiler;
  }

  static constexpr int64_t kCacheBytes = int64_t{256} << 20;
};

ConstraintCompiler::ConstraintCompiler(Tokenizer tokenizer, int vocab_size,
                                       std::vector<int32_t> stop_token_ids)
    : impl_(new Impl{std::move(tokenizer), vocab_size, std::move(stop_token_ids), {}, {}}) {}

ConstraintCompiler::~ConstraintCompiler() = default;

Result<ConstraintHandle> ConstraintCompiler::compile(const StructuredOutput& output) const {
  return capture_xgrammar(output, [&]() -> ConstraintHandle {
    xgrammar::GrammarCompiler& compiler = impl_->get();
    std::optional<xgrammar::CompiledGrammar> compiled;
    switch (output.kind) {
      case StructuredOutput::Kind::kJsonSchema:
        compiled = compiler.CompileJSONSchema(output.spec, /*any_whitespace=*/false, std::nullopt,
                                              kSeparators, /*strict_mode=*/true);
        break;
      case StructuredOutput::Kind::kRegex:
        compiled = compiler.CompileRegex(output.spec);
        break;
      case StructuredOutput::Kind::kGrammar:
        compiled = compiler.CompileGrammar(output.spec, "root");
        break;
      case StructuredOutput::Kind::kToolCalls:
        compiled = compiler.CompileGrammar(tool_calls_grammar(output.spec));
        break;
    }
    if (!compiled) throw std::invalid_argument("unknown kind");
    return std::make_shared<const CompiledConstraint>(std::move(*compiled), impl_->vocab_size);
  });
}

namespace {

Status check_logits_size(std::span<const float> logits, int vocab) {
  if (logits.size() == static_cast<size_t>(vocab)) return Status::ok_status();
  return invalid_argument("grammar mask: " + std::to_string(logits.size()) +
                          " logits for a vocabulary of " + std::to_string(vocab));
}

Status grammar_ended() {
  return failed_precondition("the grammar has ended: a stop token was accepted");
}

}  // namespace

void apply_token_bitmask(std::span<const int32_t> bitmask, std::span<float> logits) {
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  for (size_t word = 0; word < bitmask.size(); ++word) {
    const uint32_t bits = static_cast<uint32_t>(bitmask[word]);
    if (bits == 0xffffffffu) continue;
    const size_t first = word * 32;
    if (first >= logits.size()) break;
    const size_t end = std::min(first + 32, logits.size());
    if (bits == 0) {  // most words under a grammar: a plain fill the compiler vectorizes
      std::fill(logits.begin() + static_cast<ptrdiff_t>(first),
                logits.begin() + static_cast<ptrdiff_t>(end), kForbidden);
      continue;
    }
    for (size_t token = first; token < end; ++token) {
      if (((bits >> (token - first)) & 1u) == 0) logits[token] = kForbidden;
    }
  }
}

struct ConstraintMatcher::Impl {
  ConstraintHandle constraint;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bitmask;
};

ConstraintMatcher::ConstraintMatcher(ConstraintHandle constraint)
    : impl_(new Impl{constraint, xgrammar::GrammarMatcher(constraint->grammar), {}}) {
  impl_->bitmask.resize(static_cast<size_t>(xgrammar::GetBitmaskSize(constraint->vocab_size)));
}

ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;
ConstraintMatcher& ConstraintMatcher::operator=(ConstraintMatcher&&) noexcept = default;

Status ConstraintMatcher::allowed(std::vector<int32_t>& bitmask) {
  if (impl_->matcher.IsTerminated()) return grammar_ended();
  bitmask.resize(static_cast<size_t>(xgrammar::GetBitmaskSize(impl_->constraint->vocab_size)));
  int64_t shape[1] = {static_cast<int64_t>(bitmask.size())};
  DLTensor tensor{};
  tensor.data = bitmask.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  try {
    impl_->matcher.FillNextTokenBitmask(&tensor);
  } catch (const std::exception& e) {
    return internal_error(std::string("filling the grammar's token mask: ") + e.what());
  }
  return Status::ok_status();
}

Status ConstraintMatcher::mask(std::span<float> logits) {
  PDS_RETURN_IF_ERROR(check_logits_size(logits, impl_->constraint->vocab_size));
  PDS_RETURN_IF_ERROR(allowed(impl_->bitmask));
  apply_token_bitmask(impl_->bitmask, logits);
  return Status::ok_status();
}

struct ConstraintBatchMasker::Impl {
  // Every hardware thread: the model's workers are idle while a step samples.
  xgrammar::BatchGrammarMatcher batch{
      static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()))};
  std::vector<int32_t> bitmasks;  // mask(): one row per matcher
  std::vector<int32_t> filled;    // allowed(): one row per matcher the batch matcher fills
};

ConstraintBatchMasker::ConstraintBatchMasker() : impl_(std::make_unique<Impl>()) {}
ConstraintBatchMasker::~ConstraintBatchMasker() = default;

std::vector<Status> ConstraintBatchMasker::mask(std::span<ConstraintMatcher* const> matchers,
                                                std::span<const std::span<float>> logits) {
  if (matchers.size() != logits.size()) {
    return std::vector<Status>(
        matchers.size(),
        invalid_argument("grammar mask: " + std::to_string(matchers.size()) + " matchers for " +
                         std::to_string(logits.size()) + " logit rows"));
  }
  // One bitmask row per matcher, sized for its own vocabulary.
  std::vector<size_t> offsets;
  size_t total_words = 0;
  for (ConstraintMatcher* matcher : matchers) {
    offsets.push_back(total_words);
    total_words +=
        static_cast<size_t>(xgrammar::GetBitmaskSize(matcher->impl_->constraint->vocab_size));
  }
  impl_->bitmasks.assign(total_words, 0);
  std::vector<std::span<int32_t>> bitmasks;
  for (size_t i = 0; i < matchers.size(); ++i) {
    const size_t end = i + 1 < matchers.size() ? offsets[i + 1] : total_words;
    bitmasks.emplace_back(impl_->bitmasks.data() + offsets[i], end - offsets[i]);
  }
  std::vector<Status> statuses(matchers.size(), Status::ok_status());
  for (size_t i = 0; i < matchers.size(); ++i) {
    statuses[i] = check_logits_size(logits[i], matchers[i]->impl_->constraint->vocab_size);
  }
  std::vector<ConstraintMatcher*> checked;
  std::vector<std::span<int32_t>> checked_masks;
  std::vector<size_t> rows;
  for (size_t i = 0; i < matchers.size(); ++i) {
    if (!statuses[i].ok()) continue;
    checked.push_back(matchers[i]);
    checked_masks.push_back(bitmasks[i]);
    rows.push_back(i);
  }
  const std::vector<Status> filled = allowed(checked, checked_masks);
  for (size_t b = 0; b < rows.size(); ++b) {
    statuses[rows[b]] = filled[b];
    if (filled[b].ok()) apply_token_bitmask(bitmasks[rows[b]], logits[rows[b]]);
  }
  return statuses;
}

std::vector<Status> ConstraintBatchMasker::allowed(std::span<ConstraintMatcher* const> matchers,
                                                   std::span<const std::span<int32_t>> bitmasks) {
  std::vector<Status> statuses(matchers.size(), Status::ok_status());
  if (matchers.size() != bitmasks.size()) {
    std::ranges::fill(
        statuses,
        invalid_argument("grammar mask: " + std::to_string(matchers.size()) + " matchers for " +
                         std::to_string(bitmasks.size()) + " bitmasks"));
    return statuses;
  }
  // The rows that can be filled go to the batch matcher; a row's failure is its own.
  std::vector<xgrammar::GrammarMatcher> batch;
  std::vector<size_t> rows;
  int64_t words = 0;
  for (size_t i = 0; i < matchers.size(); ++i) {
    ConstraintMatcher::Impl& matcher = *matchers[i]->impl_;
    const int64_t row_words = xgrammar::GetBitmaskSize(matcher.constraint->vocab_size);
    if (static_cast<int64_t>(bitmasks[i].size()) != row_words) {
      statuses[i] =
          invalid_argument("grammar mask: a bitmask of " + std::to_string(bitmasks[i].size()) +
                           " words for " + std::to_string(row_words));
      continue;
    }
    if (matcher.matcher.IsTerminated()) statuses[i] = grammar_ended();
    if (!statuses[i].ok()) continue;
    if (words != 0 && row_words != words) {
      statuses[i] = invalid_argument("grammar mask: sequences of different vocabularies");
      continue;
    }
    words = row_words;
    batch.push_back(matcher.matcher);  // shares the sequence's state
    rows.push_back(i);
  }
  if (batch.empty()) return statuses;
  // xgrammar fills one [rows, words] tensor; the callers' rows need not be adjacent.
  std::vector<int32_t>& filled = impl_->filled;
  filled.assign(batch.size() * static_cast<size_t>(words), 0);
  int64_t shape[2] = {static_cast<int64_t>(batch.size()), words};
  DLTensor tensor{};
  tensor.data = filled.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 2;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  try {
    if (batch.size() == 1) {
      batch[0].FillNextTokenBitmask(&tensor, 0);  // no thread pool to start for one row
    } else {
      impl_->batch.BatchFillNextTokenBitmask(&batch, &tensor);
    }
  } catch (const std::exception& e) {
    const Status failed = internal_error(std::string("filling the grammar's token masks: ") +
                                         e.what());
    for (const size_t i : rows) statuses[i] = failed;
    return statuses;
  }
  for (size_t b = 0; b < rows.size(); ++b) {
    std::copy_n(filled.begin() + static_cast<ptrdiff_t>(b * static_cast<size_t>(words)), words,
                bitmasks[rows[b]].begin());
  }
  return statuses;
}

Status ConstraintMatcher::accept(int32_t token) {
  if (token < 0 || token >= impl_->constraint->vocab_size) {
    return invalid_argument("token " + std::to_string(token) + " is outside the vocabulary");
  }
  bool accepted = false;
  try {
    accepted = impl_->matcher.AcceptToken(token);
  } catch (const std::exception& e) {
    return internal_error(std::string("the grammar matcher failed: ") + e.what());
  }
  if (!accepted) {
    return invalid_argument("token " + std::to_string(token) + " is not allowed by the grammar");
  }
  return Status::ok_status();
}

bool ConstraintMatcher::complete() const {
  return impl_->matcher.IsCompleted() || impl_->matcher.IsTerminated();
}

}  // namespace pdserve
