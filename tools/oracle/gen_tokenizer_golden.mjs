// Generates the tokenizer golden files under tests/data/tokenizer/ from an independent
// implementation, @lenml/tokenizers (a JS port of transformers.js tokenizers):
//   golden.jsonl  one {"text", "nfc", "ids"} per line: encode(text) without added special
//                 tokens, and text.normalize("NFC") (the round-trip target of decode(encode)).
//   decode.jsonl  one {"ids", "skip_special", "text"} per line: decode(ids), including id
//                 sequences that cut multi-byte characters and random ids.
// The corpus is deterministic (seeded PRNG + hand-written cases); rerunning gives the same files.
//
// Optional cross-check: with HF_TOKENIZERS_DIR pointing at an installed `tokenizers` npm package
// (Hugging Face's Rust tokenizers, Node binding), every encode and decode is also compared with
// it and the script fails on any disagreement.
//
// Known differences between the JS oracle and Hugging Face (Rust/Oniguruma) that the random
// corpus avoids: JS `\s` matches U+FEFF but not U+0085 (Oniguruma, and PCRE2 in UCP mode, the
// other way round); property tables of different Unicode versions disagree on recently
// assigned characters, so random characters come from long-established blocks only.
//
// Usage: node tools/oracle/gen_tokenizer_golden.mjs   (from the repository root or anywhere)
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const assetDir = path.join(root, "configs/models/qwen3-tokenizer");
const outDir = path.join(root, "tests/data/tokenizer");

const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(assetDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(assetDir, "tokenizer_config.json"), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false });
const decode = (ids, skip) => tokenizer.decode(ids, { skip_special_tokens: skip });

function expectIds(text, expected) {
  const got = JSON.stringify(encode(text));
  if (got !== JSON.stringify(expected)) throw new Error(`oracle self-check: ${text} -> ${got}`);
}
expectIds("Explain KV cache in one sentence.", [840, 20772, 84648, 6500, 304, 825, 11652, 13]);
expectIds("Hello world", [9707, 1879]);

// ---- deterministic random source (mulberry32) ------------------------------------------
let seed = 0x5eed2026;
function random() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const randInt = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1)); // inclusive
const pick = (list) => list[randInt(0, list.length - 1)];
const fromRange = ([lo, hi]) => String.fromCodePoint(randInt(lo, hi));
const repeat = (n, fn) => Array.from({ length: n }, fn).join("");

// ---- character and word pools ---------------------------------------------------------
const englishWords = (
  "the of and to in is was he for it with as his on be at by had are but from or have an they " +
  "which one you were her all she there would their we him been has when who will more no if out " +
  "so said what up its about into than them can only other new some could time these two may then " +
  "do first any my now such like our over man me even most made after also did many before must " +
  "through back years where much your way well down should because each just those people how too " +
  "little state good very make world still own see men work long get here between both life being " +
  "under never day same another know while last might us great old year off come since against go " +
  "came right used take three cache tokenizer attention transformer inference latency throughput " +
  "prefill decode GPU kernel memory bandwidth sequence batch server request Explain KV sentence " +
  "Hello World OpenAI Qwen HTTP JSON UTF-8 McDonald's iPhone naïve café résumé coöperate Zürich"
).split(" ");
const punctuation = [".", ",", "!", "?", ";", ":", "...", " -", " —", "(", ")", '"', "'", "“", "”", "«", "»"];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'lL", "'D", "’s", "’ll"];
const specialTokens = [
  "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
  "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
  "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
];
const nearMissTokens = ["<|im_start", "<im_start|>", "<|IM_START|>", "< think>", "<think", "</think", "<|>", "<||>", "<tool_call", "<|endoftext|"];
// Long-established blocks only (see the header).
const ranges = {
  cjk: [0x4e00, 0x9fa5],
  hiragana: [0x3041, 0x3093],
  katakana: [0x30a1, 0x30f6],
  hangul: [0xac00, 0xd7a3],
  arabic: [0x0621, 0x064a],
  arabicMarks: [0x064b, 0x0652],
  devanagari: [0x0905, 0x0939],
  devanagariSigns: [0x093e, 0x094c],
  greek: [0x03b1, 0x03c9],
  cyrillic: [0x0430, 0x044f],
  latinExt: [0x00c0, 0x017f],
  combining: [0x0300, 0x036f],
  hebrew: [0x05d0, 0x05ea],
  thai: [0x0e01, 0x0e3a],
  digitsOther: [0x0660, 0x0669], // Arabic-Indic digits, \p{N}
  fullwidth: [0xff01, 0xff5e],
  boxDrawing: [0x2500, 0x257f],
  math: [0x2200, 0x22ff],
  emoji: [0x1f600, 0x1f64f],
  emojiMore: [0x1f300, 0x1f5ff],
};
const skinTones = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff].map((c) => String.fromCodePoint(c));
const ZWJ = "\u200d";
const VS16 = "\ufe0f";
const emojiSequences = [
  "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "👍🏿", "🧑🏻‍🤝‍🧑🏾", "❤️‍🔥", "🇯🇵", "🇺🇸🇩🇪", "1️⃣", "🤷🏼‍♀️", "👁️‍🗨️", "😀", "🫠",
];
const whitespace = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2003", "\u2028", "\f", "\v"];
const nonNfc = [
  "e\u0301", "A\u030a", "\u212b", "\u2126", "o\u0308", "u\u0308ber", "\u1100\u1161\u11a8",
  "\u1112\u1161\u11ab\u1100\u1173\u11af", "a\u0323\u0302", "a\u0302\u0323", "\u1e9b\u0323",
  "Ve\u0323\u0302t Nam", "\u0041\u030a\u0301", "\u0915\u093c", "\ufb01", "\u00c5", "\u0344", "\u0958",
  "n\u0303o", "\u05d1\u05bc", "\u2000", "\u0340\u0341", "\u1e0a\u0323", "\u0071\u0307\u0323",
];
const codeSnippets = [
  "def f(x):\n\treturn x * 2\n",
  "int main() {\r\n    printf(\"%d\\n\", 42);\r\n    return 0;\r\n}\r\n",
  "for (int i = 0; i < n; ++i) {\n\t\tsum += a[i];\n\t}\n",
  "const x = { a: 1, 'b': [2, 3], \"c\": null };\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
  "#include <vector>\n\ntemplate <typename T>\nT max_of(const std::vector<T>& v);\n",
  "if x != None and y == 0:\n    raise ValueError('bad')\n",
  "    \t  mixed indentation\n\t    here\n",
  "fn main() -> Result<(), Box<dyn Error>> {\n    Ok(())\n}\n",
  "<div class=\"row\">\n  <span>&nbsp;&amp;</span>\n</div>\n",
  "$ ls -la | grep '.cpp' && echo \"done\" > /dev/null 2>&1\n",
  "x=1;y=2;z=x+y;//comment\n/* block */\n",
];

// ---- generators per category ----------------------------------------------------------
function englishSentence() {
  let words = repeat(randInt(3, 18), () => " " + pick(englishWords)).trimStart();
  words = words[0].toUpperCase() + words.slice(1);
  if (random() < 0.3) words += pick(contractions);
  return words + pick([".", ".", "!", "?", "...", ":"]);
}
function englishProse() {
  return repeat(randInt(1, 6), () => englishSentence() + pick([" ", " ", "\n", "\n\n", "  "])).trimEnd();
}
function scriptText(rangeNames, minLen, maxLen) {
  return repeat(randInt(minLen, maxLen), () => {
    const r = random();
    if (r < 0.08) return " ";
    if (r < 0.12) return pick(["，", "。", "、", "！", "？", ".", ",", "「", "」"]);
    return fromRange(ranges[pick(rangeNames)]);
  });
}
function devanagariText() {
  return repeat(randInt(2, 12), () => fromRange(ranges.devanagari) + (random() < 0.5 ? fromRange(ranges.devanagariSigns) : "") + (random() < 0.3 ? " " : ""));
}
function arabicText() {
  return repeat(randInt(2, 20), () => fromRange(ranges.arabic) + (random() < 0.2 ? fromRange(ranges.arabicMarks) : "") + (random() < 0.2 ? " " : ""));
}
function emojiText() {
  return repeat(randInt(1, 10), () => {
    const r = random();
    if (r < 0.3) return pick(emojiSequences);
    let e = fromRange(ranges[pick(["emoji", "emojiMore"])]);
    if (random() < 0.4) e += pick(skinTones);
    if (random() < 0.3) e += ZWJ + fromRange(ranges.emoji);
    if (random() < 0.2) e += VS16;
    return e + (random() < 0.3 ? pick([" ", "", "!", " ok "]) : "");
  });
}
function codeText() {
  let text = repeat(randInt(1, 3), () => pick(codeSnippets));
  if (random() < 0.5) text = text.replaceAll("\n", "\r\n").replaceAll("\r\r\n", "\r\n");
  if (random() < 0.3) text = text.replaceAll("    ", "\t");
  return text;
}
function whitespaceRun() {
  const parts = repeat(randInt(1, 6), () => repeat(randInt(1, 12), () => pick(whitespace)) + (random() < 0.6 ? pick(englishWords) : ""));
  return random() < 0.5 ? parts : parts + repeat(randInt(1, 40), () => pick([" ", "\t", "\n"]));
}
function numbers() {
  return repeat(randInt(1, 5), () => {
    const r = random();
    if (r < 0.3) return String(randInt(0, 1e9));
    if (r < 0.5) return repeat(randInt(10, 80), () => String(randInt(0, 9)));
    if (r < 0.6) return `${randInt(0, 999)}.${randInt(0, 99999)}e-${randInt(1, 30)}`;
    if (r < 0.7) return "1,234,567.89";
    if (r < 0.8) return fromRange(ranges.digitsOther) + fromRange(ranges.digitsOther);
    return ` ${randInt(0, 100)}% of ${randInt(1, 5000)}`;
  }) + (random() < 0.5 ? " items" : "");
}
function contractionText() {
  return repeat(randInt(1, 8), () => pick(["I", "you", "WE", "They", "it", "don", "can", "SHE", "x", "O"]) + pick(contractions) + pick([" ", " ", ",", "\n", ""]));
}
function specialTokenText() {
  return repeat(randInt(1, 6), () => {
    const r = random();
    if (r < 0.45) return pick(specialTokens);
    if (r < 0.55) return pick(nearMissTokens);
    if (r < 0.75) return pick(["user\n", "assistant\n", "system\n", " ", "\n", "Hello", "思考"]);
    return englishSentence();
  });
}
function longWord() {
  const n = randInt(1000, 4000);
  const r = random();
  if (r < 0.2) return "a".repeat(n);
  if (r < 0.35) return repeat(n, () => String.fromCharCode(randInt(97, 122)));
  if (r < 0.5) return "ab".repeat(n >> 1);
  if (r < 0.6) return repeat(n >> 1, () => fromRange(ranges.cjk));
  if (r < 0.7) return "=".repeat(n);
  if (r < 0.8) return " ".repeat(n) + "x";
  if (r < 0.9) return repeat(n, () => String(randInt(0, 9)));
  return repeat(n >> 2, () => fromRange(ranges.latinExt));
}
function nonNfcText() {
  return repeat(randInt(1, 6), () => {
    const r = random();
    if (r < 0.5) return pick(nonNfc);
    if (r < 0.7) return fromRange(ranges.latinExt) + fromRange(ranges.combining) + (random() < 0.5 ? fromRange(ranges.combining) : "");
    if (r < 0.8) return String.fromCodePoint(randInt(0x1100, 0x1112), randInt(0x1161, 0x1175));
    return pick(englishWords) + " ";
  });
}
const allPools = [
  () => pick(englishWords), () => pick(punctuation), () => pick(whitespace), () => pick(contractions),
  () => pick(specialTokens), () => pick(nearMissTokens), () => pick(emojiSequences), () => pick(nonNfc),
  () => String(randInt(0, 99999)), () => String.fromCharCode(randInt(0x20, 0x7e)),
  () => String.fromCharCode(randInt(0x00, 0x1f)), () => "\u007f", () => "\u00ad",
  ...Object.values(ranges).map((r) => () => fromRange(r)),
];
function randomMixture() {
  return repeat(randInt(1, 40), () => pick(allPools)());
}

// ---- corpus ---------------------------------------------------------------------------
const handWritten = [
  "", " ", "  ", "\n", "\t", "\r\n", "a", "Hello world", "Hello, world!", "Explain KV cache in one sentence.",
  "The quick brown fox jumps over the lazy dog.", "I'm", "I'M", "You'll", "YOU'LL", "we'Ve", "it's", "IT'S",
  "don't", "DON'T", "'s", "'S", "x's", "''s", "'ll've", "the cat's toy's owner'll",
  "你好，世界！", "我喜欢自然语言处理。", "日本語のテキストです。", "カタカナとひらがな", "안녕하세요, 세계!",
  "مرحبا بالعالم", "नमस्ते दुनिया", "Привет, мир!", "Γειά σου Κόσμε", "שלום עולם", "สวัสดีชาวโลก",
  "👋🌍", "👨‍👩‍👧‍👦 family", "👍🏽👍🏿", "🏳️‍🌈", "🇫🇷🇩🇪", "I ❤️ NY",
  "\tindented\n\t\tmore\n", "a\r\nb\r\n\r\nc", "   leading", "trailing   ", "a  \n  b", " \n \n ",
  "x \t y", "\n\n\n\n", "    def foo():\n        pass\n",
  "0", "12", "123", "1234", "3.14159", "1,000,000", "2026-11-21", "+1 (555) 010-9999", "0x1F600",
  "12345678901234567890123456789012345678901234567890",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<think>\nLet me think.\n</think>\n\nThe answer is 4.", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
  "<|endoftext|><|endoftext|>", "a<|im_end|>b", " <|im_start|> ", "<|im_start|", "<<|im_start|>>", "<|im_start|><|im_end|>",
  "e\u0301", "caf\u0065\u0301", "\u212b", "A\u030a", "\u1100\u1161\u11a8", "a\u0323\u0302",
  "\u0000", "a\u0000b", "\u0001\u0002\u0003", "\u007f", "\u00ad", "\u200b", "\u2028", "\u3000x",
  "!!!", "...", "?!", "—", "--", "->", "=>", "::", "#!/bin/sh", "@user", "https://example.com/a?b=c&d=e",
  "ALL CAPS TEXT", "MiXeD CaSe", "snake_case_name", "camelCaseName", "kebab-case-name",
  "naïve café", "Zürich", "São Paulo", "Ελληνικά", "½ ¼ ¾", "™ © ®", "€100", "¥500", "£3",
  "The year 1999 and 2000.", "a1b2c3", "１２３", "ＡＢＣ", "ｶﾀｶﾅ",
];
const corpus = [...handWritten];
const generators = [
  [englishProse, 500], [() => scriptText(["cjk"], 1, 60), 150], [() => scriptText(["hiragana", "katakana", "cjk"], 1, 60), 120],
  [() => scriptText(["hangul"], 1, 40), 100], [arabicText, 80], [devanagariText, 80],
  [() => scriptText(["greek", "cyrillic", "hebrew", "thai"], 1, 50), 80], [emojiText, 120], [codeText, 150],
  [whitespaceRun, 150], [numbers, 120], [contractionText, 120], [specialTokenText, 150], [longWord, 12],
  [nonNfcText, 150], [randomMixture, 400],
];
for (const [generate, count] of generators) {
  for (let i = 0; i < count; ++i) corpus.push(generate());
}

// ---- optional cross-check with Hugging Face tokenizers (Rust) ----------------------------
let hf = null;
if (process.env.HF_TOKENIZERS_DIR) {
  const require = createRequire(import.meta.url);
  const { Tokenizer } = require(path.resolve(process.env.HF_TOKENIZERS_DIR));
  hf = Tokenizer.fromFile(path.join(assetDir, "tokenizer.json"));
}
let disagreements = 0;
async function crossCheck(what, ours, theirsPromise) {
  if (!hf) return;
  const theirs = await theirsPromise();
  if (JSON.stringify(ours) !== JSON.stringify(theirs)) {
    ++disagreements;
    console.error(`HF disagrees on ${what}: lenml ${JSON.stringify(ours)} vs HF ${JSON.stringify(theirs)}`);
  }
}

// ---- encode golden --------------------------------------------------------------------
const goldenLines = [];
const encoded = [];
for (const text of corpus) {
  const ids = encode(text);
  await crossCheck(`encode ${JSON.stringify(text).slice(0, 80)}`, ids, async () => (await hf.encode(text, null, { addSpecialTokens: false })).getIds());
  encoded.push(ids);
  goldenLines.push(JSON.stringify({ text, nfc: text.normalize("NFC"), ids }));
}

// ---- decode golden --------------------------------------------------------------------
const vocabSize = 151669;
const byteTokenIds = [];
// Single-character tokens are the 256 byte tokens of the byte-level alphabet.
for (const [token, id] of Object.entries(tokenizerJSON.model.vocab)) {
  if ([...token].length === 1) byteTokenIds.push(id);
}
const decodeCases = [];
for (let i = 0; i < 600; ++i) {
  const r = random();
  let ids;
  if (r < 0.5) {
    // A slice of a real encoding: often starts or ends inside a multi-byte character.
    const source = encoded[randInt(0, encoded.length - 1)];
    if (source.length === 0) continue;
    const begin = randInt(0, source.length - 1);
    ids = source.slice(begin, begin + randInt(1, 12));
  } else if (r < 0.75) {
    ids = Array.from({ length: randInt(1, 10) }, () => pick(byteTokenIds)); // raw bytes, often invalid UTF-8
  } else if (r < 0.9) {
    ids = Array.from({ length: randInt(1, 10) }, () => randInt(0, vocabSize - 1));
  } else {
    ids = Array.from({ length: randInt(1, 8) }, () => (random() < 0.4 ? randInt(151643, vocabSize - 1) : pick(byteTokenIds)));
  }
  for (const skip of [false, true]) {
    const text = decode(ids, skip);
    await crossCheck(`decode ${JSON.stringify(ids)} skip=${skip}`, text, () => hf.decode(ids, skip));
    decodeCases.push(JSON.stringify({ ids, skip_special: skip, text }));
  }
}

fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "golden.jsonl"), goldenLines.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "decode.jsonl"), decodeCases.join("\n") + "\n");
console.log(`wrote ${goldenLines.length} encode cases and ${decodeCases.length} decode cases to ${outDir}`);
if (hf) console.log(`cross-check with HF tokenizers: ${disagreements} disagreements`);
if (disagreements > 0) process.exit(1);
