#include "bench/tokenizer/corpus.h"

#include <random>
#include <string_view>

namespace pdserve::bench {
namespace {

constexpr std::string_view kEnglish[] = {
    "Large language models generate text one token at a time. Each step reads the whole key-value "
    "cache of the sequence so far, which is why decoding is usually limited by memory bandwidth "
    "rather than by arithmetic.",
    "The prefill phase is different: all prompt tokens are processed together, the matrices are "
    "large, and the GPU's tensor cores can be kept busy. Splitting prefill and decode across "
    "machines lets each side be tuned for its own bottleneck.",
    "In 1854, John Snow mapped cholera cases around a water pump on Broad Street in London. His "
    "map didn't just show where people died; it suggested why, and the pump's handle was removed.",
    "\"Don't worry,\" she said, \"we'll fix it tomorrow.\" He wasn't convinced. They'd promised "
    "the "
    "same thing last week, and the week before that, and nothing had changed.",
    "A tokenizer turns text into integers. Byte-level BPE starts from the 256 possible bytes and "
    "repeatedly merges the most frequent adjacent pair, so any string can be encoded, even one "
    "with emoji or misspelled words.",
    "The committee met on Tuesday, March 3rd, to review the budget: $4.2 million for operations, "
    "$1.1 million for research, and a reserve of roughly 12% for unexpected costs.",
    "Photosynthesis converts light energy into chemical energy. Plants absorb carbon dioxide and "
    "water and, using sunlight, produce glucose and oxygen; the process happens in chloroplasts.",
    "When the train finally arrived, forty minutes late, nobody complained. It was raining, the "
    "platform was cold, and everyone simply wanted to get home.",
};

constexpr std::string_view kCjk[] = {
    "大型语言模型每次生成一个词元。每一步都要读取整个序列的键值缓存，因此解码通常受限于内存带宽，而"
    "不是计算能力。",
    "预填充阶段则不同：所有提示词元一起处理，矩阵很大，可以让图形处理器的张量核心保持忙碌。",
    "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。交通網が非常に発達しています。",
    "今日はとても良い天気ですね。散歩に行きませんか？公園の桜がちょうど満開だそうです。",
    "인공지능 모델은 텍스트를 토큰 단위로 처리합니다. 토크나이저는 문자열을 정수 목록으로 "
    "바꿉니다.",
    "서울은 대한민국의 수도이며, 한강이 도시를 가로질러 흐릅니다. 많은 사람들이 지하철을 "
    "이용합니다.",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习，而无需进行明确的编程。",
    "彼は駅で友人を待っていたが、電車が遅れたため、約束の時間に間に合わなかった。",
};

constexpr std::string_view kCode[] = {
    "int sum(const std::vector<int>& values) {\n  int total = 0;\n  for (int v : values) {\n"
    "    total += v;\n  }\n  return total;\n}\n",
    "def softmax(x):\n\tm = max(x)\n\te = [math.exp(v - m) for v in x]\n\ts = sum(e)\n"
    "\treturn [v / s for v in e]\n",
    "for (size_t i = 0; i < n; ++i) {\r\n    out[i] = a[i] * b[i] + c[i];\r\n}\r\n",
    "SELECT u.id, u.name, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = "
    "u.id\n"
    "GROUP BY u.id, u.name\nHAVING COUNT(o.id) > 3;\n",
    "const config = {\n  host: \"localhost\",\n  port: 8080,\n  routes: ['/v1/chat/completions', "
    "'/health'],\n};\nexport default config;\n",
    "fn main() {\n    let words: Vec<&str> = \"a b c\".split(' ').collect();\n    "
    "println!(\"{:?}\", words);\n}\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.json; do\n  jq '.model.vocab | length' "
    "\"$f\"\ndone\n",
    "    if (status != 0) {\n        fprintf(stderr, \"error %d at %s:%d\\n\", status, __FILE__, "
    "__LINE__);\n"
    "        return -1;\n    }\n",
};

}  // namespace

const char* corpus_name(CorpusKind kind) {
  switch (kind) {
    case CorpusKind::kEnglish:
      return "english";
    case CorpusKind::kCjk:
      return "cjk";
    case CorpusKind::kCode:
      return "code";
  }
  return "?";
}

std::vector<std::string> make_corpus(CorpusKind kind, size_t total_bytes, size_t document_bytes,
                                     uint32_t seed) {
  const std::string_view* paragraphs = kind == CorpusKind::kEnglish ? kEnglish
                                       : kind == CorpusKind::kCjk   ? kCjk
                                                                    : kCode;
  constexpr size_t kCount = std::size(kEnglish);
  static_assert(std::size(kCjk) == kCount && std::size(kCode) == kCount);
  const std::string_view separator = kind == CorpusKind::kCode  ? "\n"
                                     : kind == CorpusKind::kCjk ? ""
                                                                : " ";
  std::mt19937 rng(seed);
  std::vector<std::string> documents;
  size_t produced = 0;
  while (produced < total_bytes) {
    std::string document;
    while (document.size() < document_bytes) {
      document += paragraphs[rng() % kCount];
      document += rng() % 4 == 0 ? std::string_view("\n\n") : separator;
    }
    produced += document.size();
    documents.push_back(std::move(document));
  }
  return documents;
}

}  // namespace pdserve::bench
