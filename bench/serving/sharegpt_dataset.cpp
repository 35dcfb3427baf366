#include "bench/serving/sharegpt_dataset.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "common/core/files.h"

namespace pdserve::bench {
namespace {

using Json = nlohmann::json;

// The string "value" of turn `turn` of entry `index`, or what is wrong with it.
Result<std::string> turn_value(const Json& turns, size_t turn, const std::string& where) {
  const Json& entry = turns[turn];
  const std::string turn_where = where + "conversations[" + std::to_string(turn) + "]";
  if (!entry.is_object()) return invalid_argument(turn_where + " is not a JSON object");
  const auto value = entry.find("value");
  if (value == entry.end() || !value->is_string()) {
    return invalid_argument(turn_where + " has no string \"value\"");
  }
  return value->get<std::string>();
}

Result<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty()) {
    return invalid_argument(
        "--dataset-name sharegpt needs --tokenizer (tokenizer.json or the model directory "
        "holding it): prompts and replies are measured in tokens, as vLLM measures them");
  }
  Result<Tokenizer> tokenizer =
      std::filesystem::is_directory(path) ? Tokenizer::from_model_dir(path) : Tokenizer::load(path);
  if (!tokenizer.ok()) return tokenizer.status().with_context("--tokenizer");
  return tokenizer;
}

}  // namespace

bool passes_vllm_length_filter(int prompt_len, int output_len, bool output_len_is_fixed) {
  const bool prompt_too_short = prompt_len < kShareGptMinTokens;
  const bool output_too_short = !output_len_is_fixed && output_len < kShareGptMinTokens;
  const bool prompt_too_long = prompt_len > kShareGptMaxPromptTokens;
  const bool total_too_long = prompt_len + output_len > kShareGptMaxTotalTokens;
  return !(prompt_too_short || output_too_short || prompt_too_long || total_too_long);
}

Result<std::vector<ShareGptConversation>> parse_sharegpt(std::string_view json_text,
                                                         const std::string& source) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not a JSON document");
  if (!root.is_array()) {
    return invalid_argument(source + ": expected a JSON array of ShareGPT conversations");
  }
  std::vector<ShareGptConversation> conversations;
  for (size_t index = 0; index < root.size(); ++index) {
    const Json& entry = root[index];
    const std::string where = source + ": entry " + std::to_string(index) + ": ";
    if (!entry.is_object()) return invalid_argument(where + "not a JSON object");
    const auto turns = entry.find("conversations");
    if (turns == entry.end()) continue;  // vLLM skips it
    if (!turns->is_array()) return invalid_argument(where + "\"conversations\" is not an array");
    if (turns->size() < 2) continue;  // vLLM skips it: no reply to size the output by
    ShareGptConversation conversation;
    PDS_ASSIGN_OR_RETURN(conversation.prompt, turn_value(*turns, 0, where));
    PDS_ASSIGN_OR_RETURN(conversation.reply, turn_value(*turns, 1, where));
    conversations.push_back(std::move(conversation));
  }
  return conversations;
}

Result<std::vector<BenchRequest>> sample_sharegpt(const std::vector<ShareGptConversation>& all,
                                                  const Tokenizer& tokenizer,
                                                  const ShareGptSource& source, int num_prompts,
                                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (source.shuffle) std::shuffle(order.begin(), order.end(), rng);

  std::vector<BenchRequest> requests;
  // Counting tokens is the slow part on a full ShareGPT file: stop once enough are taken.
  for (size_t index : order) {
    if (requests.size() >= static_cast<size_t>(num_prompts)) break;
    const ShareGptConversation& conversation = all[index];
    PDS_ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, tokenizer.encode(conversation.prompt));
    int output_len = 0;
    if (source.output_len) {
      output_len = *source.output_len;
    } else {
      PDS_ASSIGN_OR_RETURN(std::vector<int32_t> reply_ids, tokenizer.encode(conversation.reply));
      output_len = static_cast<int>(reply_ids.size());
    }
    if (!passes_vllm_length_filter(static_cast<int>(prompt_ids.size()), output_len,
                                   source.output_len.has_value())) {
      continue;
    }
    BenchRequest request;
    request.prompt_text = conversation.prompt;
    request.output_len = output_len;
    requests.push_back(std::move(request));
  }
  if (requests.empty()) {
    return invalid_argument(source.path + ": no conversation passes vLLM's length filter (" +
                            std::to_string(all.size()) + " with two turns or more)");
  }
  if (source.oversample && requests.size() < static_cast<size_t>(num_prompts)) {
    std::uniform_int_distribution<size_t> pick(0, requests.size() - 1);
    while (requests.size() < static_cast<size_t>(num_prompts)) {
      BenchRequest repeated = requests[pick(rng)];
      requests.push_back(std::move(repeated));
    }
  }
  return requests;
}

Result<std::vector<BenchRequest>> read_sharegpt_workload(const ShareGptSource& source,
                                                         int num_prompts, uint64_t seed) {
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, load_tokenizer(source.tokenizer_path));
  PDS_ASSIGN_OR_RETURN(std::string text, read_text_file(source.path));
  PDS_ASSIGN_OR_RETURN(std::vector<ShareGptConversation> conversations,
                       parse_sharegpt(text, source.path));
  return sample_sharegpt(conversations, tokenizer, source, num_prompts, seed);
}

}  // namespace pdserve::bench
